"""The fine-tuning recipe: schedules against their formulas, parameter groups, grad_accum,
patience, resume on the same LR curve, the frozen-layer cache, bf16 against fp32, and the
defaults a pretrained encoder gets."""
from __future__ import annotations

import json
import math
import os
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch

from mtbert.config import RECIPES, ConfigError, build_config
from mtbert.data.tokenize import prepare
from mtbert.model.multitask import MultitaskModel
from mtbert.train.frozen import FrozenCache
from mtbert.train.loop import make_lr_schedule, make_optimizer, param_rates, train

MINILM = Path(__file__).resolve().parents[2] / ".." / "shared" / "models" / "all-MiniLM-L6-v2"
DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "minbert"
QUICK = {"sampling.strategy": "tuple", "sampling.steps_per_epoch": 20, "train.epochs": 2,
         "data.synthetic.train_size": 200, "data.synthetic.dev_size": 60}


def _cfg(tmp_path, **over):
    return build_config({}, {**QUICK, "data.cache_dir": str(tmp_path / "cache"), **over})


@pytest.mark.parametrize("schedule", ["constant", "linear", "cosine"])
def test_schedule_follows_its_formula(schedule, tmp_path):
    cfg = _cfg(tmp_path, **{"optim.schedule": schedule, "optim.warmup": 0.2, "optim.lr": 1e-3})
    model = MultitaskModel(cfg, vocab_size=50)
    opt = make_optimizer(model, cfg)
    total, warm = 50, 10  # warmup 0.2 of 50 optimizer steps
    sched = make_lr_schedule(opt, cfg, total)
    seen = []
    for _ in range(total):
        seen.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()

    def expected(t: int) -> float:
        if t < warm:
            return 1e-3 * t / warm
        progress = (t - warm) / (total - warm)
        return 1e-3 * {"constant": 1.0, "linear": 1 - progress,
                       "cosine": 0.5 * (1 + math.cos(math.pi * progress))}[schedule]
    for t in (0, 5, 10, 25, 40, 49):
        assert seen[t] == pytest.approx(expected(t), rel=1e-6, abs=1e-12), (schedule, t)


def test_warmup_as_a_step_count(tmp_path):
    cfg = _cfg(tmp_path, **{"optim.schedule": "linear", "optim.warmup": 4, "optim.lr": 1e-3})
    opt = make_optimizer(MultitaskModel(cfg, vocab_size=50), cfg)
    sched = make_lr_schedule(opt, cfg, 100)
    for _ in range(4):
        opt.step()
        sched.step()
    assert sched.get_last_lr()[0] == pytest.approx(1e-3)


def test_head_and_encoder_groups_get_their_own_rates(tmp_path):
    cfg = _cfg(tmp_path, **{"optim.lr": 2e-5, "optim.head_lr": 1e-3, "optim.layer_decay": 0.5,
                            "sharing.encoder_shared_layers": 1})
    model = MultitaskModel(cfg, vocab_size=50)
    rates = param_rates(model, cfg)
    n = model.num_layers  # tiny: 2 layers, the first shared
    assert all(rates[id(p)] == pytest.approx(2e-5 * 0.5 ** n) for p in model.embeddings.parameters())
    assert all(rates[id(p)] == pytest.approx(2e-5 * 0.5) for p in model.shared_layers[0].parameters())
    assert all(rates[id(p)] == pytest.approx(2e-5) for p in model.task_layers["sst"][0].parameters())
    assert all(rates[id(p)] == 1e-3 for p in model.heads.parameters())
    groups = make_optimizer(model, cfg).param_groups
    # Every trainable parameter sits in exactly one group, at its rate.
    assert sum(len(g["params"]) for g in groups) == len({id(p) for p in model.parameters()})
    for g in groups:
        assert all(rates[id(p)] == g["lr"] for p in g["params"])


def test_adamw_is_fused_only_where_this_torch_runs_it(tmp_path, monkeypatch):
    """torch 2.1-2.3 refuse fused=True for CPU parameters (CUDA only): there the optimizer is
    torch's default AdamW, where a torch with the kernel gets the fused one."""
    from mtbert.train import loop

    model = MultitaskModel(_cfg(tmp_path), vocab_size=50)
    loop.fused_adamw.cache_clear()
    assert make_optimizer(model, _cfg(tmp_path)).defaults["fused"]  # torch 2.13 on a CPU: fused
    real = torch.optim.AdamW

    def cuda_only(params, *args, fused=None, **kwargs):  # torch 2.1's AdamW, for CPU parameters
        if fused:
            raise RuntimeError("`fused=True` requires all the params to be CUDA, floating point Tensor")
        return real(params, *args, fused=fused, **kwargs)

    monkeypatch.setattr(torch.optim, "AdamW", cuda_only)
    loop.fused_adamw.cache_clear()
    try:
        opt = make_optimizer(model, _cfg(tmp_path))
        assert not opt.defaults["fused"]
        opt.step()  # and it steps
    finally:
        loop.fused_adamw.cache_clear()  # what this process's torch really does is asked again


def test_recipe_defaults_by_encoder_kind():
    tiny = build_config({})
    assert (tiny.optim.lr, tiny.optim.head_lr, tiny.optim.schedule) == (1e-3, 1e-3, "constant")
    assert tiny.sts.head == "regression"
    pre = build_config({}, {"model.name_or_path": "some/encoder"})
    expected = RECIPES["pretrained"]
    assert (pre.optim.lr, pre.optim.head_lr, pre.optim.schedule, pre.optim.warmup) == (
        expected["lr"], expected["head_lr"], expected["schedule"], expected["warmup"])
    assert pre.sts.head == "cosine"
    assert build_config({}, {"model.name_or_path": "x", "optim.lr": 3e-5}).optim.lr == 3e-5
    with pytest.raises(ConfigError, match="optim.warmup"):
        build_config({}, {"optim.warmup": 2.5})
    with pytest.raises(ConfigError, match="train.patience"):
        build_config({}, {"train.patience": 0})


def test_patience_stops_and_keeps_the_best(tmp_path):
    # A rate this high makes no progress after the first epoch: patience 1 stops at epoch 2.
    cfg = _cfg(tmp_path, **{"train.epochs": 6, "train.patience": 1, "optim.lr": 0.3, "optim.grad_clip": 0.0})
    result = train(cfg, log=None)
    history = result.epochs
    best = max(history, key=lambda m: m["overall"])
    assert len(history) < 6
    assert all(m["overall"] <= best["overall"] for m in history[best["epoch"]:])
    assert len(history) == best["epoch"] + 1
    assert result.metrics["overall"] == best["overall"] and result.metrics["best_epoch"] == best["epoch"]


def test_grad_accum_makes_fewer_optimizer_steps(tmp_path):
    one = train(_cfg(tmp_path, **{"train.epochs": 1, "optim.schedule": "linear"}), log=None)
    four = train(_cfg(tmp_path, **{"train.epochs": 1, "optim.schedule": "linear", "train.grad_accum": 4}),
                 log=None)
    # Linear decay to 0 at the last optimizer step either way; both runs train and score.
    assert one.epochs[-1]["lr"] == 0.0 and four.epochs[-1]["lr"] == 0.0
    assert four.metrics["overall"] != one.metrics["overall"]


def test_resumed_run_continues_the_schedule(tmp_path):
    cfg = _cfg(tmp_path, **{"train.epochs": 3, "optim.schedule": "linear", "optim.warmup": 0.1})
    saved = {}

    def keep(metrics, ckpt):
        if metrics["epoch"] == 1 and ckpt:
            import shutil
            shutil.copytree(ckpt, tmp_path / "ckpt")
        saved[metrics["epoch"]] = metrics["lr"]

    train(cfg, reporter=keep, log=None)
    lrs = {}
    train(cfg, reporter=lambda m, _c: lrs.__setitem__(m["epoch"], m["lr"]), resume_from=tmp_path / "ckpt",
          log=None)
    assert lrs[2] == pytest.approx(saved[2]) and lrs[3] == pytest.approx(saved[3])


@pytest.mark.parametrize("depth", [1, -1])
def test_cached_frozen_outputs_equal_recomputed_ones(depth, tmp_path):
    cfg = _cfg(tmp_path, **{"freeze.layers": depth, "train.precision": "fp32"})
    prepared = prepare(cfg, log=None)
    torch.manual_seed(0)
    model = MultitaskModel(cfg, vocab_size=len(prepared.tokenizer)).eval()
    cache = FrozenCache(model, {"dev": prepared.dev}, 0, torch.device("cpu"), nullcontext, "fp32",
                        tmp_path / "frozen")
    from mtbert.data.tokenize import collate
    from mtbert.data.types import Batch
    from mtbert.model.multitask import pack

    idx = list(range(7))
    with torch.no_grad():
        for task, ds in prepared.dev.items():
            batch = collate(ds, idx, 0)
            packed = pack([batch])
            want = model.from_embeddings(packed, model.embed(packed))[task]
            cpacked, h = cache.pack("dev", [(Batch(task, [], ds.labels[idx]), torch.tensor(idx))])
            got = model.from_embeddings(cpacked, h, cache.start)[task]
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # A second cache over the same weights reads what the first stored.
    again = FrozenCache(model, {"dev": prepared.dev}, 0, torch.device("cpu"), nullcontext, "fp32",
                        tmp_path / "frozen")
    assert again.built == 0 and cache.built > 0


def test_frozen_run_with_and_without_cache_agree(tmp_path):
    base = {"freeze.layers": 1, "train.precision": "fp32", "heads.dropout": 0.0}
    cached = train(_cfg(tmp_path, **base), log=None)
    plain = train(_cfg(tmp_path, **base, **{"train.frozen_cache_mb": 0}), log=None)
    for a, b in zip(cached.epochs, plain.epochs):
        assert a["overall"] == pytest.approx(b["overall"], abs=0.02)
    assert cached.epochs[0]["train_flops"] < plain.epochs[0]["train_flops"]


def test_bf16_and_fp32_runs_agree(tmp_path):
    # bf16 rounds every matmul input to 8 bits of mantissa: scores after a short run agree to
    # within a few points, not to the digit.
    fp32 = train(_cfg(tmp_path, **{"train.precision": "fp32"}), log=None)
    bf16 = train(_cfg(tmp_path, **{"train.precision": "bf16"}), log=None)
    assert bf16.metrics["overall"] == pytest.approx(fp32.metrics["overall"], abs=0.05)


def test_tf32_on_a_cpu_is_fp32_to_the_digit_and_every_run_reports_its_throughput(tmp_path):
    """A CPU has no TF32: the setting runs plain fp32 there (the GPU half is tests/gpu). Every
    run reports real tokens per second and its MFU against this CPU's measured matmul peak."""
    fp32 = train(_cfg(tmp_path, **{"train.precision": "fp32", "train.device": "cpu"}), log=None)
    tf32 = train(_cfg(tmp_path, **{"train.precision": "tf32", "train.device": "cpu"}), log=None)
    keep = ("overall", "loss_sst", "loss_para", "loss_sts")
    assert [{k: e[k] for k in keep} for e in tf32.epochs] == [{k: e[k] for k in keep} for e in fp32.epochs]
    for e in fp32.epochs:
        assert e["tokens_per_s"] > e["seq_per_s"] > 0 and 0 < e["mfu"] < 1, e
    # Measuring the peak draws from no generator of the run's: the second run repeats the first.
    again = train(_cfg(tmp_path, **{"train.precision": "fp32", "train.device": "cpu"}), log=None)
    assert [e["overall"] for e in again.epochs] == [e["overall"] for e in fp32.epochs]
    assert fp32.metrics["mfu"] == fp32.epochs[-1]["mfu"]  # the summary's is the last epoch's


@pytest.mark.shared
@pytest.mark.skipif(not (MINILM.is_dir() and DATA.is_dir()), reason="../shared model or data absent")
def test_minilm_default_recipe_keeps_sts(tmp_path):
    """No rate given: the pretrained recipe must not destroy what MiniLM knows. 24 steps of 8
    are enough to tell: the recipe keeps STS at 0.85, where one rate of 1e-3 for everything
    (the tiny model's) takes it to 0.68 in the same steps."""
    cfg = build_config({}, {"model.name_or_path": str(MINILM), "data.source": "cs224n", "data.dir": str(DATA),
                            "data.max_dev_examples": 400, "data.max_train_examples": 2000,
                            "sampling.strategy": "tuple", "sampling.steps_per_epoch": 24, "train.batch_size": 8,
                            "train.epochs": 1, "data.cache_dir": str(tmp_path / "cache")})
    result = train(cfg, log=None)
    assert result.metrics["sts_corr"] >= 0.80, result.metrics


def test_trials_read_the_peak_their_sweep_measured_on_the_idle_device(monkeypatch):
    """A sweep's driver measures each device's matmul peak before its trials start (trials
    sharing a GPU would each measure the others' work); a trial reads that one."""
    from mtbert.train import measure

    cpu = torch.device("cpu")
    monkeypatch.delenv(measure.PEAKS_ENV, raising=False)
    monkeypatch.setattr(measure, "_peaks", {})
    measure.share_peaks([(cpu, "fp32"), (cpu, "fp32")], threads=1)
    shared = json.loads(os.environ[measure.PEAKS_ENV])
    assert list(shared) == [measure.peak_key(cpu, "fp32", 1)] and shared[measure.peak_key(cpu, "fp32", 1)] > 1e8
    monkeypatch.setenv(measure.PEAKS_ENV, json.dumps({measure.peak_key(cpu, "fp32"): 1.5e9}))
    assert measure.matmul_peak(cpu, "fp32") == 1.5e9  # this process's thread count: read, not measured


def test_the_frozen_cache_build_says_how_far_it_is_its_rate_and_the_time_left(tmp_path, monkeypatch):
    from mtbert.train.frozen import BuildProgress

    cfg = _cfg(tmp_path, **{"freeze.layers": 1, "train.precision": "fp32"})
    prepared = prepare(cfg, log=None)
    model = MultitaskModel(cfg, vocab_size=len(prepared.tokenizer)).eval()
    lines: list[str] = []
    monkeypatch.setattr(BuildProgress, "EVERY", 0.0)  # a line at every batch
    splits = {"train": prepared.train, "dev": prepared.dev}
    FrozenCache(model, splits, 0, torch.device("cpu"), nullcontext, "fp32", tmp_path / "c", lines.append)
    total = sum(len(ds) * len(ds.packed) for d in splits.values() for ds in d.values())
    assert lines[0] == f"frozen layers: computing up to {total:,} sequences once (a line every 0 s)"
    steps = [line for line in lines if "seq/s, about" in line]
    assert len(steps) > 3 and all(line.startswith("frozen layers: ") and "m" in line.split("about ")[1]
                                  for line in steps), lines
    assert f"of {total:,} sequences" in steps[-1]
    lines.clear()  # built: a second cache reads it, in silence but for its one line
    FrozenCache(model, splits, 0, torch.device("cpu"), nullcontext, "fp32", tmp_path / "c", lines.append)
    assert len(lines) == 1 and "read from the cache" in lines[0]


def test_the_frozen_cache_line_prices_what_is_left_at_the_computed_rate():
    from mtbert.train.frozen import BuildProgress

    progress = BuildProgress(1000, lambda _m: None)
    progress.add(200, computed=False)  # read from the cache: no compute, not in the rate
    progress.add(300, computed=True)
    assert progress.line(10.0) == "frozen layers: 500 of 1,000 sequences (50%), 30 seq/s, about 0m16s left"
