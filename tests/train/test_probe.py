"""train.probe (linear probe, then fine-tune): the heads train on the frozen encoder first and
fine-tuning starts from them; the probe's cost counts; a resume does not probe again."""
from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest
import torch

from mtbert.config import build_config
from mtbert.data.tokenize import prepare
from mtbert.model.multitask import MultitaskModel
from mtbert.train.loop import _probe, autocast_for, epoch_metrics, evaluate, train

from .test_resume import SMALL, _stopped_after_first_epoch, figures


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    return build_config({}, {**SMALL, "train.probe": True, "data.cache_dir": str(tmp_path_factory.mktemp("cache"))})


@pytest.fixture(scope="module")
def straight(cfg):
    return train(cfg, log=None)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_fine_tuning_starts_where_the_probe_left_the_heads(cfg, precision):
    """After the probe the model holds the probe's heads (and its encoder, untrained) and
    scores what the probe scored, evaluated under the precision the probe ran in (named
    here, not `auto`, so every CPU class runs both paths; bf16 is emulated where the CPU
    lacks it)."""
    cfg = copy.deepcopy(cfg)
    cfg.train.precision = precision
    prepared = prepare(cfg, log=None)
    pad = prepared.tokenizer.pad_token_id
    model = MultitaskModel(cfg, vocab_size=len(prepared.tokenizer), pad_token_id=pad)
    lines: list[str] = []
    probed = _probe(model, cfg, prepared, lines.append)
    _, autocast = autocast_for(precision, torch.device("cpu"))
    scores = evaluate(model, prepared.dev, cfg, torch.device("cpu"), pad, autocast, None)
    assert epoch_metrics(scores)["overall"] == pytest.approx(probed["overall"], abs=1e-4)
    assert lines[-1].startswith("probe: heads trained on the frozen encoder"), lines


def test_probed_heads_beat_random_ones_after_the_same_steps(cfg):
    """The point of it: after one short epoch the probed run is well ahead (the synthetic
    data's default size: the probe sees a few hundred rows per task)."""
    short = {"train.epochs": 1, "sampling.steps_per_epoch": 5, "train.device": "cpu",
             "data.cache_dir": cfg.data.cache_dir}
    probed = train(build_config({}, {**short, "train.probe": True}), log=None)
    plain = train(build_config({}, short), log=None)
    assert "probe_overall" not in plain.metrics
    assert probed.metrics["overall"] > plain.metrics["overall"] + 0.05, (probed.metrics, plain.metrics)


def test_the_probe_counts_in_training_time(cfg, straight):
    plain = train(build_config({}, {**SMALL, "data.cache_dir": cfg.data.cache_dir}), log=None)
    assert straight.epochs[0]["train_time_s"] > straight.epochs[0]["epoch_time_s"]
    assert plain.epochs[0]["train_time_s"] == pytest.approx(plain.epochs[0]["epoch_time_s"])


def test_a_resumed_probed_run_equals_the_straight_one_and_does_not_probe_again(cfg, straight, tmp_path):
    ckpt = _stopped_after_first_epoch(cfg, tmp_path / "out")
    lines: list[str] = []
    resumed = train(cfg, reporter=lambda m, c: None, resume_from=Path(shutil.copytree(ckpt, tmp_path / "c")),
                    log=lines.append)
    assert not [line for line in lines if line.startswith("probe:")], lines
    assert figures(resumed) == figures(straight)
    assert resumed.metrics["probe_overall"] == straight.metrics["probe_overall"]
    assert torch.load(ckpt / "state.pt", weights_only=False)["history"][0]["probe_overall"]


def test_a_pal_model_is_probed_on_its_heads_alone(cfg):
    """A fresh PAL adds nothing, so a PAL model's probe is the plain model's probe: the same
    heads and score, its PALs untouched (V^D still zero), and no backward through the encoder
    (the probe reads the frozen-layer cache). PALs train with fine-tuning, as in the arms
    without them."""
    pal = build_config({}, {**SMALL, "train.probe": True, "sharing.pal_size": 16,
                            "data.cache_dir": cfg.data.cache_dir})
    prepared = prepare(pal, log=None)
    pad = prepared.tokenizer.pad_token_id
    with_pals = MultitaskModel(pal, vocab_size=len(prepared.tokenizer), pad_token_id=pad)
    plain = MultitaskModel(cfg, vocab_size=len(prepared.tokenizer), pad_token_id=pad)
    lines: list[str] = []
    scores = ("sst_acc", "para_acc", "sts_corr", "overall")
    probed, plain_probed = _probe(with_pals, pal, prepared, lines.append), _probe(plain, cfg, prepared, lambda _m: None)
    assert {k: probed[k] for k in scores} == {k: plain_probed[k] for k in scores}
    assert [line for line in lines if "frozen layers" in line], lines  # the cache, not a backward
    assert all(float(p.decoder.weight.abs().max()) == 0.0 for p in with_pals.pals.values())
    heads = {k: v for k, v in plain.state_dict().items() if k.startswith("heads")}
    assert heads and all(torch.equal(with_pals.state_dict()[k], v) for k, v in heads.items())
