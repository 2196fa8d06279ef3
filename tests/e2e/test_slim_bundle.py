"""A trial stores what it trained: a run with frozen layers from a pretrained model leaves them
out of its bundle and its resumable state and names them (the model, a digest); the bundle
still predicts exactly as a self-contained one, a missing or changed model is one line, and a
resume from a slim checkpoint equals an uninterrupted run.

The pretrained model here is a small random BERT saved as a local Hugging Face folder (what
`model.name_or_path` reads for MiniLM), so every test runs in seconds; the MiniLM ones are
marked `shared`."""
import json
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

import mtbert
from mtbert.bundle import BundleError, make_self_contained, save_bundle
from mtbert.config import build_config
from mtbert.data.synthetic import vocabulary
from mtbert.data.tokenize import _wrap, train_wordpiece
from mtbert.train.frozen import frozen_digest
from mtbert.train.loop import train
from mtbert.train.state import CHECKPOINT_STATE

# 3-bert (every layer a private copy per task) with its first layer frozen: the frozen part is
# the embeddings and three copies of layer 0. The frozen-layer cache is off in the run whose
# dev scores the bundle must reproduce: evaluation then runs the frozen layers in the same
# forward as a bundle does (the cache stores their output in fp32, a bf16 forward does not).
SMALL = {"freeze.layers": 1, "sharing.encoder_shared_layers": 0, "train.epochs": 2,
         "sampling.steps_per_epoch": 5, "data.synthetic.train_size": 80, "data.synthetic.dev_size": 40,
         "train.device": "cpu", "model.max_length": 32, "train.batch_size": 8}


def save_encoder(folder: Path, seed: int = 0) -> Path:
    """A 2-layer BERT over the synthetic vocabulary, saved as a pretrained model folder."""
    from transformers import BertConfig, BertModel

    folder.mkdir(parents=True)
    (folder.parent / f"{folder.name}-tokenizer.json").write_text(train_wordpiece(vocabulary()).to_str())
    tokenizer = _wrap(folder.parent / f"{folder.name}-tokenizer.json")
    tokenizer.save_pretrained(folder)
    torch.manual_seed(seed)
    BertModel(BertConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=128, max_position_embeddings=128)).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("slim")
    encoder = save_encoder(root / "encoder")
    cfg = build_config({}, {**SMALL, "model.name_or_path": str(encoder), "data.cache_dir": str(root / "cache"),
                            "train.frozen_cache_mb": 0})
    result = train(cfg, output_dir=root / "out", log=None)
    return root, encoder, cfg, result


@contextmanager
def moved(folder: Path):
    """The folder gone for the duration (as on a machine without it), then put back."""
    away = folder.with_name(folder.name + "-away")
    folder.rename(away)
    try:
        yield away
    finally:
        away.rename(folder)


def _cli(*args, **kw):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, "-m", "mtbert.cli", *args], capture_output=True, text=True,
                          timeout=300, env=env, **kw)


def _dev_predictions(bundle) -> dict:
    from mtbert.data.synthetic import make_synthetic
    from mtbert.tasks import get_task

    out = {}
    for task in bundle.tasks:
        examples = make_synthetic(get_task(task), 40, 7)
        out[task] = bundle.predict_dataset(bundle.encode(task, examples))[0]
    return out


def test_the_bundle_and_the_state_leave_the_frozen_tensors_out_and_name_them(run):
    root, encoder, _, result = run
    frozen = result.model.frozen_keys()
    assert any(k.startswith("embeddings.") for k in frozen)
    assert {t for t in ("sst", "para", "sts") if f"task_layers.{t}.0.output.dense.weight" in frozen} == \
           {"sst", "para", "sts"}  # every private copy of the frozen layer
    meta = json.loads((root / "out" / "best" / "bundle.json").read_text())
    assert meta["frozen"] == {"from": str(encoder.resolve()), "digest": frozen_digest(result.model), "layers": 1}
    stored = torch.load(root / "out" / "best" / "model.pt", weights_only=True)
    assert set(stored) == set(result.model.state_dict()) - frozen
    state = torch.load(root / "out" / "last" / CHECKPOINT_STATE, weights_only=False)
    assert set(state["model"]) == set(result.model.state_dict()) - frozen
    assert state["frozen"] == meta["frozen"]


def test_a_slim_bundle_predicts_exactly_as_a_self_contained_one(run, tmp_path):
    root, encoder, _, _ = run
    slim = mtbert.load_model(root / "out" / "best", device="cpu")
    full_dir = make_self_contained(root / "out" / "best", tmp_path / "full")
    assert "frozen" not in json.loads((full_dir / "bundle.json").read_text())
    assert set(torch.load(full_dir / "model.pt", weights_only=True)) == set(slim.model.state_dict())
    with moved(encoder):  # the self-contained one needs no pretrained model
        full = mtbert.load_model(full_dir, device="cpu")
        got, want = _dev_predictions(full), _dev_predictions(slim)
    assert got.keys() == want.keys() and all(torch.equal(got[t], want[t]) for t in got)
    assert (full_dir / "model.pt").stat().st_size > (root / "out" / "best" / "model.pt").stat().st_size


def test_predict_on_a_slim_bundle_scores_what_the_run_did(run, tmp_path, predicts_best_epoch):
    root, _, _, result = run
    predicts_best_epoch(root / "out" / "best", tmp_path / "pred", result)


def test_a_missing_pretrained_model_is_one_line_and_encoder_points_elsewhere(run, tmp_path):
    root, encoder, _, result = run
    best = root / "out" / "best"
    with moved(encoder) as away:
        with pytest.raises(BundleError) as err:
            mtbert.load_model(best, device="cpu")
        proc = _cli("predict", "--model", str(best), "--split", "dev", "--output", str(tmp_path / "no"),
                    "--device", "cpu")
        # The same model in another folder: --encoder finds it (the digest vouches for it).
        moved_ok = _cli("predict", "--model", str(best), "--split", "dev", "--output", str(tmp_path / "pred"),
                        "--device", "cpu", "--encoder", str(away))
    message = str(err.value)
    assert str(best) in message and str(encoder.resolve()) in message and "mtbert bundle" in message
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and message in proc.stderr
    assert moved_ok.returncode == 0, moved_ok.stderr[-2000:]
    best_epoch = result.epochs[result.metrics["best_epoch"] - 1]
    assert json.loads((tmp_path / "pred" / "scores-dev.json").read_text())["sst"] == best_epoch["sst_acc"]


def test_other_frozen_weights_are_one_line(run, tmp_path):
    root, encoder, _, _ = run
    other = save_encoder(tmp_path / "other", seed=1)  # the same architecture, other weights
    with pytest.raises(BundleError, match="not the ones it was trained with") as err:
        mtbert.load_model(root / "out" / "best", device="cpu", encoder=str(other))
    assert str(other) in str(err.value) and str(encoder.resolve()) in str(err.value)
    proc = _cli("predict", "--model", str(root / "out" / "best"), "--encoder", str(other), "--device", "cpu")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "digest" in proc.stderr


def test_the_bundle_command_makes_it_self_contained_in_place(run, tmp_path):
    root, encoder, _, _ = run
    bundle = Path(shutil.copytree(root / "out" / "best", tmp_path / "best"))
    want = _dev_predictions(mtbert.load_model(bundle, device="cpu"))
    proc = _cli("bundle", str(bundle))
    assert proc.returncode == 0 and "self-contained" in proc.stdout, proc.stderr[-2000:]
    with moved(encoder):
        got = _dev_predictions(mtbert.load_model(bundle, device="cpu"))
    assert all(torch.equal(got[t], want[t]) for t in want)
    assert not list(bundle.glob(".*.tmp"))


def test_train_bundle_full_stores_every_weight(run, tmp_path):
    root, _, cfg, result = run
    full = build_config({}, {**SMALL, "model.name_or_path": cfg.model.name_or_path, "train.bundle": "full"})
    tokenizer = mtbert.load_model(root / "out" / "best", device="cpu").tokenizer
    save_bundle(tmp_path / "full", result.model, full, tokenizer)
    assert "frozen" not in json.loads((tmp_path / "full" / "bundle.json").read_text())
    assert set(torch.load(tmp_path / "full" / "model.pt", weights_only=True)) == set(result.model.state_dict())


def test_a_frozen_tiny_encoder_is_stored_it_exists_nowhere_else(tmp_path):
    cfg = build_config({}, {**SMALL, "train.epochs": 1, "data.cache_dir": str(tmp_path / "cache")})
    assert cfg.model.name_or_path == "tiny"
    result = train(cfg, output_dir=tmp_path / "out", log=None)
    assert "frozen" not in json.loads((tmp_path / "out" / "best" / "bundle.json").read_text())
    assert set(torch.load(tmp_path / "out" / "best" / "model.pt", weights_only=True)) == \
           set(result.model.state_dict())
    state = torch.load(tmp_path / "out" / "last" / CHECKPOINT_STATE, weights_only=False)
    assert state["frozen"] is None and set(state["model"]) == set(result.model.state_dict())


# ---------------------------------------------------------------------------- resume

# Dropout in the trained layers and heads, random task draws, the frozen-layer cache on.
RESUME = {**SMALL, "train.frozen_cache_mb": 64, "train.epochs": 3, "sampling.strategy": "proportional",
          "heads.dropout": 0.3}


class Interrupted(Exception):
    pass


def figures(result) -> list[dict]:
    keep = ("epoch", "sst_acc", "para_acc", "sts_corr", "overall", "loss_sst", "loss_para", "loss_sts", "best_epoch")
    return [{k: e[k] for k in keep} for e in result.epochs]


@pytest.fixture(scope="module")
def resumable(run, tmp_path_factory):
    """A straight run and the checkpoint a trial stopped after epoch 1 left (its reporter's)."""
    root, encoder, _, _ = run
    tmp = tmp_path_factory.mktemp("resume")
    cfg = build_config({}, {**RESUME, "model.name_or_path": str(encoder), "data.cache_dir": str(tmp / "cache")})
    straight = train(cfg, output_dir=tmp / "straight", log=None)

    def reporter(metrics, checkpoint_dir):
        if metrics["epoch"] == 1:
            shutil.copytree(checkpoint_dir, tmp / "ckpt")
            raise Interrupted

    with pytest.raises(Interrupted):
        train(cfg, reporter=reporter, output_dir=tmp / "trial", log=None)
    return cfg, straight, tmp


def test_resume_from_a_slim_checkpoint_equals_the_straight_run(resumable, tmp_path):
    cfg, straight, tmp = resumable
    ckpt = Path(shutil.copytree(tmp / "ckpt", tmp_path / "ckpt"))
    state = torch.load(ckpt / CHECKPOINT_STATE, weights_only=False)
    assert state["frozen"] and not set(state["model"]) & straight.model.frozen_keys()
    resumed = train(cfg, reporter=lambda m, c: None, resume_from=ckpt, output_dir=tmp_path / "out", log=None)
    assert figures(resumed) == figures(straight)
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    best_a = torch.load(tmp / "straight" / "best" / "model.pt", weights_only=True)
    best_b = torch.load(tmp_path / "out" / "best" / "model.pt", weights_only=True)
    assert best_a.keys() == best_b.keys() and all(torch.equal(best_a[k], best_b[k]) for k in best_a)


def test_resume_with_other_frozen_weights_is_one_line(resumable, tmp_path):
    """The guard on the test above: the digest is checked, not trusted."""
    cfg, _, tmp = resumable
    other = save_encoder(tmp_path / "other", seed=1)
    changed = build_config({}, {**RESUME, "model.name_or_path": str(other), "data.cache_dir": str(tmp / "cache")})
    with pytest.raises(BundleError,
                       match=rf"{CHECKPOINT_STATE}: the frozen encoder weights in .*other are not the ones"):
        train(changed, resume_from=tmp / "ckpt", log=None)


def test_a_trials_output_best_becomes_a_link_to_its_checkpoint(resumable, tmp_path):
    """One copy of a trial's model: once the trial has ended, output/best links into its last
    checkpoint (orchestration/run/trainable.py, on the driver, with the trial as Tune describes
    it: its folder and its checkpoint); a retry resuming from that checkpoint trains into a
    copy of its best/ and never writes through the link."""
    from types import SimpleNamespace

    from ray import tune

    from orchestration.run.trainable import keep_one_model

    cfg, straight, tmp = resumable
    trial = tmp_path / "trial"
    ckpt = Path(shutil.copytree(tmp / "ckpt", trial / "checkpoint_000000"))
    out = Path(shutil.copytree(tmp / "trial", trial / "output"))
    (out / ".checkpoint-stopped" / "best").mkdir(parents=True)  # a report the trial was stopped in
    keep_one_model(SimpleNamespace(path=str(trial), checkpoint=tune.Checkpoint.from_directory(str(ckpt))))
    before = (ckpt / "best" / "model.pt").read_bytes()  # compacted there (bundle.compact_bundle)
    assert (out / "best").is_symlink() and (out / "best").resolve() == (ckpt / "best").resolve()
    assert not os.path.isabs(os.readlink(out / "best"))  # the sweep folder can move
    assert sorted(p.name for p in out.iterdir()) == ["best"]
    assert mtbert.load_model(out / "best", device="cpu").tasks == ["sst", "para", "sts"]

    resumed = train(cfg, reporter=lambda m, c: None, resume_from=ckpt, output_dir=out, log=None)
    assert figures(resumed) == figures(straight)
    assert not (out / "best").is_symlink() and (ckpt / "best" / "model.pt").read_bytes() == before


# ---------------------------------------------------------------------------- MiniLM

ROOT = Path(__file__).resolve().parents[2]
MINILM = ROOT / ".." / "shared" / "models" / "all-MiniLM-L6-v2"
MINBERT = ROOT / ".." / "shared" / "data" / "minbert"


@pytest.mark.shared
@pytest.mark.skipif(not (MINILM.is_dir() and MINBERT.is_dir()),
                    reason="../shared/models/all-MiniLM-L6-v2 or ../shared/data/minbert absent")
def test_a_head_only_minilm_trial_stores_what_it_trained(tmp_path):
    """The frozen reference on MiniLM as a sweep trial: its checkpoint (final state and best/)
    holds the trained heads, a tokenizer and a few small files, under 5 MB where the encoder
    alone is 87 MB; the slim bundle scores the run's dev split to the last digit."""
    from mtbert.config import reference_settings
    from mtbert.data.tokenize import prepare

    cfg = build_config({}, {**reference_settings(), "model.name_or_path": str(MINILM), "data.source": "cs224n",
                            "data.dir": str(MINBERT), "data.max_train_examples": 32, "data.max_dev_examples": 24,
                            "data.cache_dir": str(tmp_path / "cache"), "train.epochs": 1,
                            "sampling.strategy": "tuple", "sampling.steps_per_epoch": 2, "model.max_length": 32,
                            "train.device": "cpu", "train.frozen_cache_mb": 0})
    kept = []

    def reporter(metrics, checkpoint_dir):
        kept.append(Path(shutil.copytree(checkpoint_dir, tmp_path / "checkpoint")))

    result = train(cfg, reporter=reporter, output_dir=tmp_path / "output", log=None)
    [ckpt] = kept
    size = sum(p.stat().st_size for p in ckpt.rglob("*") if p.is_file())
    assert size < 5 * 2**20, size
    trained = 4 * result.metrics["params_trainable"]  # fp32
    assert trained < (ckpt / "best" / "model.pt").stat().st_size < trained + 2**16
    bundle = mtbert.load_model(ckpt / "best", device="cpu")
    dev = prepare(cfg, log=None).dev
    m = result.metrics
    assert {t: bundle.score(ds) for t, ds in dev.items()} == {"sst": m["sst_acc"], "para": m["para_acc"],
                                                              "sts": m["sts_corr"]}
