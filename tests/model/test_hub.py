"""Hub names: taken from the local Hugging Face cache with no network, and a clear line at
once (not a minute of retries) when the model is neither cached nor reachable.

Each case runs in a fresh interpreter: huggingface_hub reads its environment at import."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MINILM = ROOT / ".." / "shared" / "models" / "all-MiniLM-L6-v2"
HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"

PROBE = """
import json, sys, time
from mtbert.config import ConfigError, build_config
from mtbert.data.readers import DataError
from mtbert.data.tokenize import get_tokenizer
from mtbert.model.encoder import load_encoder
cfg = build_config({"model": {"name_or_path": sys.argv[1]}})
out = {}
for what, load in (("tokenizer", lambda: get_tokenizer(cfg)), ("encoder", lambda: load_encoder(cfg))):
    t0 = time.perf_counter()
    try:
        obj = load()
        out[what] = {"ok": type(obj).__name__}
    except (ConfigError, DataError) as exc:
        out[what] = {"error": str(exc)}
    out[what]["seconds"] = time.perf_counter() - t0
print(json.dumps(out))
"""


def closed_endpoint() -> str:
    with socket.socket() as s:  # a port nobody listens on: connection refused at once
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def probe(name: str, cache: Path, **env: str) -> dict:
    full = {k: v for k, v in os.environ.items() if not k.startswith("HF_") and "proxy" not in k.lower()}
    full.update(HF_HUB_CACHE=str(cache), HF_ENDPOINT=closed_endpoint(), **env)
    proc = subprocess.run([sys.executable, "-c", PROBE, name], env=full, capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_uncached_hub_name_fails_at_once_when_the_hub_is_unreachable(tmp_path):
    out = probe("bert-base-uncased", tmp_path / "empty-cache")
    for what in ("tokenizer", "encoder"):
        assert out[what]["error"].startswith("model.name_or_path: 'bert-base-uncased' is neither a local folder "
                                             "nor in the Hugging Face cache"), out
        assert "unreachable" in out[what]["error"]
        assert out[what]["seconds"] < 10, out  # transformers alone retries for about a minute


def test_offline_mode_says_so(tmp_path):
    out = probe("bert-base-uncased", tmp_path / "empty-cache", HF_HUB_OFFLINE="1")
    assert "HF_HUB_OFFLINE is set" in out["encoder"]["error"] and out["encoder"]["seconds"] < 10


@pytest.mark.shared
@pytest.mark.skipif(not MINILM.is_dir(), reason="../shared/models/all-MiniLM-L6-v2 absent")
def test_cached_hub_name_loads_without_network(tmp_path):
    # The hub cache layout, as a download leaves it: refs/main names a snapshot of the files.
    repo = tmp_path / "hub" / f"models--{HUB_ID.replace('/', '--')}"
    revision = "0" * 40
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    for f in MINILM.iterdir():
        if f.is_file():
            (snapshot / f.name).symlink_to(f.resolve())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    t0 = time.perf_counter()
    out = probe(HUB_ID, tmp_path / "hub")
    assert out["tokenizer"]["ok"] == "BertTokenizer" and out["encoder"]["ok"] == "Bert", out  # mtbert's own BERT, from the snapshot
    assert time.perf_counter() - t0 < 60
