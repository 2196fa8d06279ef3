"""Absolute paths before launch: Ray trials run in their own working directory (and maybe on
another node), so a relative data dir or sqlite URI would point somewhere else there."""
from __future__ import annotations

import os
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

RUNS_DIR = "runs"  # Ray Tune storage (one folder per sweep run) under the launch directory
DEFAULT_DB = "mlflow.db"


def tool(name: str) -> str:
    """How to type this environment's `name` (mtbert, mlflow) so that a command printed for the
    user runs as printed: the bare name where the shell finds this copy, else its path (relative
    to the working folder when inside it, e.g. .venv/bin/mtbert after `make demo`)."""
    here = Path(sys.executable).parent / name
    found = shutil.which(name)
    if not here.exists() or (found and Path(found).resolve() == here.resolve()):
        return name
    try:
        return str(here.relative_to(Path.cwd()))
    except ValueError:
        return str(here)


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
                    for key in ("train", "dev", "test"):
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


def sqlite_path(uri: str) -> str | None:
    """The database file of a sqlite:/// URI (its ?options dropped), None for any other store."""
    if not uri.startswith("sqlite:///"):
        return None
    return uri[len("sqlite:///"):].split("?", 1)[0]


def default_tracking_uri(cwd: Path | None = None) -> str:
    return f"sqlite:///{(cwd or Path.cwd()).resolve() / DEFAULT_DB}"


# Stores MLflow 3 can use as a tracking URI (the file store is off by default there).
TRACKING_SCHEMES = ("http", "https", "sqlite", "postgresql", "mysql", "mssql", "databricks")


def check_uri_shape(uri: str, where: str) -> None:
    """One line of our own for a malformed URI (MLflow's talks about its model registry)."""
    from orchestration.errors import SweepError

    if ":" not in uri and uri.endswith(".db"):
        return  # a bare path to a sqlite file (absolute_tracking_uri makes it a URI)
    scheme = uri.split(":", 1)[0].split("+", 1)[0].lower() if ":" in uri else ""
    expected = "expected http://host:port, sqlite:///path/to/mlflow.db or a database URL"
    if scheme not in TRACKING_SCHEMES:
        raise SweepError(f"{where} {uri!r}: unknown tracking store scheme '{scheme or uri}' ({expected})")
    rest = uri.split(":", 1)[1]
    if scheme == "sqlite" and not rest.startswith("///"):
        raise SweepError(f"{where} {uri!r}: a sqlite URI needs three slashes (sqlite:///relative.db "
                         "or sqlite:////absolute/path.db)")
    if scheme in ("http", "https") and (not rest.startswith("//") or not rest[2:].split("/", 1)[0]):
        raise SweepError(f"{where} {uri!r}: expected {scheme}://host:port")


def resolve_tracking_uri(cli_uri: str | None, sweep_uri: str | None, cwd: Path | None = None) -> str:
    """--tracking-uri, then the sweep's tracking.uri, then $MLFLOW_TRACKING_URI, then the default."""
    where = ("--tracking-uri" if cli_uri else "tracking.uri" if sweep_uri
             else "$MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI") else "tracking uri")
    uri = cli_uri or sweep_uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(cwd)
    check_uri_shape(uri, where)
    return absolute_tracking_uri(uri, cwd)


@contextmanager
def fluent_tracking_uri(uri: str) -> Iterator[None]:
    """MLflow's fluent calls (search_runs, start_run, log_model) read one process-wide URI,
    and setting it also writes $MLFLOW_TRACKING_URI for subprocesses: a library call that
    set it and left would send the caller's next default-store read to this store."""
    import mlflow

    before = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(before)  # None clears both again


def runs_dir(cwd: Path | None = None) -> Path:
    return ((cwd or Path.cwd()) / RUNS_DIR).resolve()
