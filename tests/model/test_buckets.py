"""Length buckets change the work, not the result: outputs and gradients of a bucketed
forward match one padded batch for every sharing layout, pooling, pair encoding and PALs."""
import copy
import itertools
import math
import random

import pytest
import torch

from mtbert.config import build_config
from mtbert.data.types import Batch, Encoded
from mtbert.model.multitask import MultitaskModel, length_buckets, pack
from mtbert.tasks import get_task

V, L = 120, 3
TINY = {"model": {"tiny": {"layers": L, "hidden": 32, "heads": 2, "intermediate": 64}}, "heads": {"dropout": 0.0}}


def encoded(gen, n, width):
    ids = torch.randint(5, V, (n, width), generator=gen)
    lengths = torch.randint(2, width + 1, (n,), generator=gen)
    lengths[0] = width  # collate pads a batch to its own longest row
    mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    return Encoded(ids * mask, mask, torch.zeros_like(ids))


def batches(encoding, gen):
    out = []
    for task, n, width in (("sst", 7, 21), ("para", 6, 9), ("sts", 5, 14)):
        spec = get_task(task)
        sides = 2 if spec.pair and encoding == "bi" else 1
        labels = torch.rand(n, generator=gen) * 5 if spec.kind == "regression" else torch.randint(0, 2, (n,))
        out.append(Batch(task, [encoded(gen, n, width) for _ in range(sides)], labels))
    return out


def losses(model, bs):
    out = model(bs)
    return torch.stack([get_task(b.task).loss(out[b.task], b.labels) for b in bs]).sum(), out


@pytest.mark.parametrize("k", [0, 1, None])
@pytest.mark.parametrize("pooling,encoding,pal", [("mean", "bi", 0), ("cls", "cross", 0), ("pooler", "bi", 8),
                                                  ("mean", "cross", 8)])
def test_bucketed_forward_and_gradients_match_one_padded_batch(k, pooling, encoding, pal):
    torch.manual_seed(0)
    cfg = build_config(TINY, {"sharing.encoder_shared_layers": k, "model.pooling": pooling,
                              "pairs.encoding": encoding, "sharing.pal_size": pal, "train.length_buckets": False})
    whole = MultitaskModel(cfg, vocab_size=V).eval()  # no dropout; gradients still flow
    if pal:  # a fresh PAL adds exactly zero; move its decoders so the test sees them
        with torch.no_grad():
            for p in whole.pals.parameters():
                p.add_(0.05 * torch.randn_like(p))
    bucketed = copy.deepcopy(whole)
    bucketed.call_cost = 0.0  # a bucket per distinct length: many per task, some mixing tasks
    bs = batches(encoding, torch.Generator().manual_seed(1))
    loss_a, out_a = losses(whole, bs)
    loss_b, out_b = losses(bucketed, bs)
    for task in out_a:
        torch.testing.assert_close(out_b[task], out_a[task], atol=2e-5, rtol=1e-4)
    loss_a.backward()
    loss_b.backward()
    for (name, pa), pb in zip(whole.named_parameters(), bucketed.parameters()):
        if pa.grad is None:
            assert pb.grad is None, name
            continue
        torch.testing.assert_close(pb.grad, pa.grad, atol=2e-5, rtol=1e-3, msg=name)


def split_cost(groups, cost):
    return sum(len(rows) * width for rows, width in groups) + cost * len(groups)


def test_buckets_sort_longest_first_and_cover_every_row_once():
    lengths = [5, 1, 9, 3, 9, 2, 7]
    assert length_buckets(lengths, range(7), math.inf) == [([2, 4, 6, 0, 3, 5, 1], 9)]
    assert length_buckets(lengths, range(1, 7), 0.0) == [([2, 4], 9), ([6], 7), ([3], 3), ([5], 2), ([1], 1)]
    groups = length_buckets(lengths, range(7), 3.0)
    assert sorted(r for rows, _ in groups for r in rows) == list(range(7))
    assert all(width == max(lengths[r] for r in rows) for rows, width in groups)


@pytest.mark.parametrize("cost", [0.0, 2.0, 10.0, 50.0])
def test_buckets_are_the_cheapest_split(cost):
    rng = random.Random(int(cost))
    for _ in range(20):
        lengths = [rng.randint(1, 30) for _ in range(rng.randint(1, 9))]
        got = split_cost(length_buckets(lengths, range(len(lengths)), cost), cost)
        ordered = sorted(lengths, reverse=True)
        brute = min(  # every way to cut the sorted rows into runs
            sum((b - a) * ordered[a] for a, b in zip(bounds, bounds[1:])) + cost * (len(bounds) - 1)
            for n_cuts in range(len(lengths))
            for inner in itertools.combinations(range(1, len(lengths)), n_cuts)
            for bounds in [(0, *inner, len(lengths))])
        assert got == pytest.approx(brute), lengths


def test_layer_positions_count_the_padding_bucketing_leaves():
    cfg = build_config(TINY, {"sharing.encoder_shared_layers": 1, "train.length_buckets": False})
    model = MultitaskModel(cfg, vocab_size=V)
    packed = pack(batches("bi", torch.Generator().manual_seed(2)))
    real, done = model.layer_positions(packed, torch.device("cpu"))
    assert real == sum(packed.lengths) * L
    # No buckets: the shared layer pays the packed width, each private layer its task's longest row.
    n, width = packed.input_ids.shape
    spans = {"sst": (7, 21), "para": (12, 9), "sts": (10, 14)}
    assert done == n * width * 1 + sum(rows * w for rows, w in spans.values()) * (L - 1)
    model.call_cost = 0.0  # calls are free: a bucket per length, no padding at all
    assert model.layer_positions(packed, torch.device("cpu")) == (real, real)
