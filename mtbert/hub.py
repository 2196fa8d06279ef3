"""Where a pretrained model comes from: a local folder, the Hugging Face cache, or the hub.

Offline, transformers spends about a minute in retries before it fails on a hub name, and a
sweep would pay that once per process. So a hub name is looked up in the local cache first
(no network at all when it is there), and the hub is asked only after a short connection
check, which turns "no network" into one line at once.
"""
from __future__ import annotations

import functools
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

CONNECT_TIMEOUT_S = 3.0
_PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def looks_local(name: str) -> bool:
    """Hub ids are "name" or "org/name"; anything else with a path shape means a folder."""
    return (name.startswith((".", "/", "~")) or "\\" in name or name.count("/") > 1
            or Path(name).expanduser().exists())


def _cached(name: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(name, "config.json"), str)


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _unreachable(endpoint: str) -> str | None:
    """Why the hub cannot be reached, or None when it can (or a proxy decides)."""
    if any(os.environ.get(v) for v in _PROXY_VARS):
        return None  # the proxy, not a direct connection, decides: let the download try
    url = urlparse(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return None


def pretrained_source(name: str, error: type[Exception]) -> tuple[str, dict]:
    """(what to give from_pretrained, its keyword arguments) for `model.name_or_path`, or
    `error` with one line saying why the model cannot be had."""
    if looks_local(name):  # looked at each time: a folder can go (or come) while a process lives
        path = Path(name).expanduser()
        source, kwargs, problem = (str(path.resolve()), {}, None) if path.is_dir() else (name, {}, f"{name} not found")
    else:
        source, kwargs, problem = _resolve(name)
    if problem:
        raise error(f"model.name_or_path: {problem}")
    return source, kwargs


@functools.lru_cache(maxsize=None)
def _resolve(name: str) -> tuple[str, dict, str | None]:
    """Once per hub name and process: the tokenizer, the config check and the weights all
    ask, and the connection check should not run three times."""
    if _cached(name):
        return name, {"local_files_only": True}, None
    if _offline():
        return name, {}, (f"'{name}' is not in the Hugging Face cache and HF_HUB_OFFLINE is set; "
                          "download it where there is network, or give a local folder")
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    reason = _unreachable(endpoint)
    if reason:
        return name, {}, (f"'{name}' is neither a local folder nor in the Hugging Face cache, and {endpoint} "
                          f"is unreachable ({reason}); give a local folder or pre-download it")
    return name, {}, None
