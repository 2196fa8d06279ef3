"""Absolute paths before launch: Ray trials run in their own working directory (and maybe on
another node), so a relative data dir or sqlite URI would point somewhere else there."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

RUNS_DIR = "runs"  # Ray Tune storage (one folder per sweep run) under the launch directory
DEFAULT_DB = "mlflow.db"


def _absolute(value: Any, cwd: Path) -> Any:
    if not isinstance(value, str) or not value or "://" in value:
        return value
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else (cwd / path).resolve())


def _looks_local(name: str, cwd: Path) -> bool:
    """A model name is a local directory when it exists or is written as a path; otherwise
    it is a hub id such as bert-base-uncased (which must stay as written)."""
    if name.startswith(("/", "./", "../", "~")):
        return True
    return (cwd / name).is_dir()


def absolute_config_paths(raw: dict[str, Any], cwd: Path | None = None) -> dict[str, Any]:
    """Rewrite the path-valued keys of a nested config dict (in place) to absolute paths."""
    cwd = cwd or Path.cwd()
    data = raw.get("data")
    if isinstance(data, dict):
        for key in ("dir", "cache_dir"):
            if key in data:
                data[key] = _absolute(data[key], cwd)
        if "cache_dir" not in data:
            # The default cache_dir is relative too; pin it so every trial shares one cache.
            from mtbert.config import DataConfig

            data["cache_dir"] = _absolute(DataConfig().cache_dir, cwd)
        files = data.get("files")
        if isinstance(files, dict):
            for entry in files.values():
                if isinstance(entry, dict):
                    for key in ("train", "dev"):
                        if key in entry:
                            entry[key] = _absolute(entry[key], cwd)
    else:
        from mtbert.config import DataConfig

        raw["data"] = {"cache_dir": _absolute(DataConfig().cache_dir, cwd)}
    model = raw.get("model")
    if isinstance(model, dict) and isinstance(model.get("name_or_path"), str):
        name = model["name_or_path"]
        if name != "tiny" and _looks_local(name, cwd):
            model["name_or_path"] = _absolute(name, cwd)
    return raw


def absolute_tracking_uri(uri: str, cwd: Path | None = None) -> str:
    """sqlite:///relative.db -> sqlite:////abs/relative.db; a bare *.db path -> sqlite URI."""
    cwd = cwd or Path.cwd()
    if "://" not in uri:
        if uri.endswith(".db"):
            return f"sqlite:///{_absolute(uri, cwd)}"
        return uri
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        rest = uri[len("sqlite:///"):]
        if rest and rest != ":memory:":
            return f"sqlite:///{_absolute(rest, cwd)}"
    return uri


def default_tracking_uri(cwd: Path | None = None) -> str:
    return f"sqlite:///{(cwd or Path.cwd()).resolve() / DEFAULT_DB}"


def resolve_tracking_uri(cli_uri: str | None, sweep_uri: str | None, cwd: Path | None = None) -> str:
    """--tracking-uri, then the sweep's tracking.uri, then $MLFLOW_TRACKING_URI, then the default."""
    uri = cli_uri or sweep_uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(cwd)
    return absolute_tracking_uri(uri, cwd)


def runs_dir(cwd: Path | None = None) -> Path:
    return ((cwd or Path.cwd()) / RUNS_DIR).resolve()
