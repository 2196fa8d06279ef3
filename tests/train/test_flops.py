"""What a trial's compute counts (docs/guide.md), pinned against a hand count on the tiny
encoder: 6 x params per token in a trainable layer, 2 x in a frozen one that runs, the cached
frozen layers' forward once per training sequence, and 6 x params per example in the heads,
so that a head-only configuration costs something and its TM-relative (compute) is defined."""
from __future__ import annotations

import contextlib

import pytest
import torch

from mtbert.config import build_config
from mtbert.model.multitask import MultitaskModel, Packed
from mtbert.tasks import get_task
from mtbert.train.loop import train
from orchestration.track.tm import time_basis, trial_tm

V, H, L, I = 120, 32, 2, 64
TINY = {"model": {"name_or_path": "tiny", "pooling": "mean",
                  "tiny": {"layers": L, "hidden": H, "heads": 2, "intermediate": I}},
        "sharing": {"head_regime": "I"}, "sts": {"head": "regression"}, "pairs": {"encoding": "bi"}}
LAYER = 4 * (H * H + H) + 2 * H + (H * I + I) + (I * H + H) + 2 * H  # attention, its norm, the MLP, its norm


def head(task: str, pair: bool) -> int:
    """A task's parameters above the pooled vector: [u, v, |u-v|, u*v] -> H, the I layer, the output."""
    out = get_task(task).out_dim
    return (4 * H * H + H if pair else 0) + (H * H + H) + (H * out + out)


# sst: 4 sequences; para: 2 pairs; sts: 1 pair (both sides of a pair are rows).
SEGMENTS = [("sst", 0, 0, 4), ("para", 0, 4, 6), ("para", 1, 6, 8), ("sts", 0, 8, 9), ("sts", 1, 9, 10)]
LENGTHS = [5, 3, 7, 2, 6, 4, 6, 8, 9, 3]
TOKENS = sum(LENGTHS)
HEADS = 6 * (4 * head("sst", False) + 2 * head("para", True) + 1 * head("sts", True))


def packed() -> Packed:
    width = max(LENGTHS)
    mask = torch.tensor([[1] * n + [0] * (width - n) for n in LENGTHS])
    return Packed(torch.zeros_like(mask), mask, torch.zeros_like(mask), SEGMENTS, LENGTHS)


def model(freeze: int) -> MultitaskModel:
    m = MultitaskModel(build_config(TINY, {"freeze.layers": freeze}), vocab_size=V)
    m.call_cost = 0.0  # every length its own bucket: the positions computed are the real tokens
    return m


def test_one_step_against_a_hand_count():
    cpu = torch.device("cpu")
    assert model(0).layer_params() == LAYER
    assert model(0).head_flops(packed()) == HEADS
    # Nothing frozen: forward and backward in both layers, 6 x params per token each.
    assert model(0).step_flops(packed(), cpu, 0) == 2 * 6 * LAYER * TOKENS + HEADS
    # Layer 1 frozen, computed every step (no cache): its forward only, 2 x.
    assert model(1).step_flops(packed(), cpu, 0) == (2 + 6) * LAYER * TOKENS + HEADS
    # Layer 1 frozen and cached: the step runs layer 2 only; the cache's forward is counted once.
    assert model(1).step_flops(packed(), cpu, 1) == 6 * LAYER * TOKENS + HEADS
    # The whole encoder frozen and cached: the heads alone train, and they are not free.
    assert model(-1).step_flops(packed(), cpu, L) == HEADS > 0


def test_a_cosine_pair_has_no_head_and_a_cascade_runs_its_upstream_heads_forward():
    m = MultitaskModel(build_config(TINY, {"sts.head": "cosine"}), vocab_size=V)
    assert m.head_flops(packed()) == 6 * (4 * head("sst", False) + 2 * head("para", True))
    # A cascade needs cross-encoded pairs: a pair is one row, and no projection.
    chained = MultitaskModel(build_config(TINY, {"sharing.cascade": "para>sts", "pairs.encoding": "cross"}),
                             vocab_size=V)
    sts_own = ((H + 1) * H + H) + (H * 1 + 1)  # its first layer takes para's output too
    para_head = head("para", False)  # run forward on sts's pooled pair
    segments = [("sst", 0, 0, 4), ("para", 0, 4, 6), ("sts", 0, 6, 7)]
    mask = torch.ones(7, 3, dtype=torch.long)
    cross = Packed(mask, mask, mask, segments, [3] * 7)
    assert chained.head_flops(cross) == 6 * (4 * head("sst", False) + 2 * head("para", False) + sts_own) \
        + 2 * para_head


def _train(tmp_path, **over):
    quick = {"sampling.strategy": "tuple", "sampling.steps_per_epoch": 4, "train.epochs": 2,
             "data.synthetic.train_size": 40, "data.synthetic.dev_size": 20, "train.precision": "fp32",
             "data.cache_dir": str(tmp_path / "cache")}
    return train(build_config(TINY, {**quick, **over}), log=None)


def test_a_head_only_run_counts_the_frozen_forward_once_and_its_heads(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    from mtbert.data.tokenize import prepare

    cfg = build_config(TINY, {"data.synthetic.train_size": 40, "data.synthetic.dev_size": 20,
                              "data.cache_dir": str(tmp_path / "cache")})
    prepared = prepare(cfg)
    train_tokens = sum(int(p.lengths.sum()) for ds in prepared.train.values() for p in ds.packed)
    frozen = _train(tmp_path, **{"freeze.layers": -1})
    first, last = frozen.epochs[0], frozen.epochs[-1]
    # The cache's forward over every training sequence, once: by hand, 2 x params x layers x tokens.
    assert last["setup_flops"] == first["setup_flops"] == 2 * LAYER * L * train_tokens
    # Each epoch adds only the heads' work, the same amount (4 steps of one batch per task).
    per_epoch = first["train_flops"] - first["setup_flops"]
    assert per_epoch > 0 and last["train_flops"] == first["setup_flops"] + 2 * per_epoch
    # The full-budget basis projects the epochs, not the one-time forward.
    assert time_basis(first["train_flops"], 1, 2, first["setup_flops"])[0] == last["train_flops"]
    # A frozen-vs-unfrozen comparison on compute: both scores defined, the head-only one cheaper.
    unfrozen = _train(tmp_path)
    assert unfrozen.metrics["train_flops"] > frozen.metrics["train_flops"] > 0

    def figures(r):
        return {"overall": r.metrics["overall"], "model_size_mb": r.metrics["model_size_mb"],
                "tm_flops": r.metrics["train_flops"]}
    assert trial_tm(figures(frozen), figures(frozen), time_key="tm_flops") == 1.0
    score = trial_tm(figures(unfrozen), figures(frozen), time_key="tm_flops")
    assert score is not None and 0 < score < 1  # the same data, several times the work


def test_one_more_backward_through_the_shared_layers_against_a_hand_count():
    cpu = torch.device("cpu")
    # Both layers shared and trainable: 4 x params per token in each (the backward part of 6 x).
    assert model(0).shared_backward_flops(packed(), cpu, 0) == 2 * 4 * LAYER * TOKENS
    assert model(1).shared_backward_flops(packed(), cpu, 1) == 4 * LAYER * TOKENS
    assert model(-1).shared_backward_flops(packed(), cpu, L) == 0  # nothing shared trains
    assert model(0).private_backward_flops(packed(), cpu, 0) == 0  # every layer is shared


@pytest.mark.parametrize("method", ["static", "pcgrad", "upgrad"])
def test_pcgrad_and_upgrad_pay_t_minus_1_extra_passes_and_the_count_says_so(method):
    """Three tasks: PCGrad and UPGrad run one backward per task through the shared encoder
    (counted by a hook on a shared weight), two more than static weighting's one, and the
    trial's FLOPs add exactly those two passes and the Gram matrix and combination."""
    from mtbert.data.samplers import TaskBatches
    from mtbert.data.tokenize import collate, prepare
    from mtbert.train.loop import train_step
    from mtbert.train.weighting import TaskGradients, make_weighting

    cfg = build_config(TINY, {"loss.weighting": method, "sampling.strategy": "tuple",
                              "data.synthetic.train_size": 40, "data.synthetic.dev_size": 8})
    prepared = prepare(cfg, log=None)
    pad = prepared.tokenizer.pad_token_id or 0
    net = MultitaskModel(cfg, vocab_size=len(prepared.tokenizer), pad_token_id=pad)
    idx = [TaskBatches(len(prepared.train[t]), 4, seed=0).next() for t in cfg.tasks]
    batches = [collate(prepared.train[t], i, pad) for t, i in zip(cfg.tasks, idx)]
    weighting, cpu = make_weighting(cfg), torch.device("cpu")
    passes = []
    next(p for p in net.layer(0).parameters() if p.ndim == 2).register_hook(lambda grad: passes.append(1))
    _, _, _, step = train_step(net, batches, idx, weighting, cfg, net.shared_parameters(),
                              contextlib.nullcontext, None, cpu)
    extra = weighting.extra_flops(net, step, cpu, 0)
    if method == "static":
        assert len(passes) == 1 and extra == 0
        return
    assert len(passes) == 3
    shared = sum(p.numel() for p in net.shared_parameters() if p.requires_grad)
    assert extra == 2 * net.shared_backward_flops(step, cpu, 0) + TaskGradients.combine_flops(3, shared)
    assert extra > 0.5 * net.step_flops(step, cpu, 0)  # two more passes: not a rounding error
    assert weighting.extra_flops(net, step, cpu, 0) == 0  # counted once per step
