"""A frozen prefix that several setups share is computed once: a deeper setup of the same
encoder and data continues from the stored states of a shallower one, and its blocks (and so
everything trained on them) equal those computed from the embeddings."""
from __future__ import annotations

import weakref
from collections import Counter

import torch

from mtbert.config import build_config
from mtbert.model.multitask import MultitaskModel
from mtbert.train.loop import build_frozen_cache, train

TINY = {"train.epochs": 1, "sampling.steps_per_epoch": 3, "data.synthetic.train_size": 40,
        "data.synthetic.dev_size": 20, "train.device": "cpu", "model.max_length": 32, "train.batch_size": 8,
        "model.tiny.layers": 3, "train.frozen_cache_mb": 64,
        # Bit-identical continuation is the fp32 promise; under bf16 autocast (auto on an
        # AVX512-BF16 or AMX CPU) the last bits may differ (docs/configuration.md).
        "train.precision": "fp32"}


def count_layer_rows(monkeypatch) -> Counter:
    """Rows that went through each encoder layer, by its index."""
    rows: Counter = Counter()
    real = MultitaskModel.layer

    hooked = weakref.WeakSet()  # a freed model's id may come back for a new one

    def layer(self, i):
        module = real(self, i)
        if module not in hooked:
            hooked.add(module)
            module.register_forward_pre_hook(lambda _m, args, i=i: rows.update({i: args[0].shape[0]}))
        return module

    monkeypatch.setattr(MultitaskModel, "layer", layer)
    return rows


def cfg(cache, freeze: int, **more):
    return build_config({}, {**TINY, "freeze.layers": freeze, "data.cache_dir": str(cache), **more})


def blocks(cache) -> dict[str, torch.Tensor]:
    """Each stored side by its file name, which is its content's key."""
    return {p.name: torch.load(p)["flat"] for p in sorted(cache.glob("frozen-*.pt"))}


def test_a_deeper_setup_continues_from_a_shallower_ones_states(tmp_path, monkeypatch):
    alone = tmp_path / "alone"
    build_frozen_cache(cfg(alone, -1))  # the whole encoder frozen, from the embeddings
    whole = blocks(alone)

    rows = count_layer_rows(monkeypatch)
    shared = tmp_path / "shared"
    lines = []
    assert build_frozen_cache(cfg(shared, 2))[0] > 0
    after_two = dict(rows)
    assert build_frozen_cache(cfg(shared, -1), lines.append)[0] > 0
    # Layers 0 and 1 ran once, for the shallower setup; the deeper one ran layer 2 alone.
    assert after_two[0] == after_two[1] > 0 and 2 not in after_two
    assert rows[0] == after_two[0] and rows[1] == after_two[1] and rows[2] == after_two[1]
    assert any("from the stored states of layer 2" in line for line in lines), lines
    # The same vectors, under the same keys, as from the embeddings, bit for bit (fp32 on a CPU).
    deep = blocks(shared)
    assert whole and set(whole) < set(deep) and all(torch.equal(deep[k], whole[k]) for k in whole)


def test_a_run_on_continued_blocks_trains_the_same_numbers(tmp_path):
    shared = tmp_path / "shared"
    build_frozen_cache(cfg(shared, 1))
    build_frozen_cache(cfg(shared, -1))
    continued = train(cfg(shared, -1), log=None)
    fresh = train(cfg(tmp_path / "fresh", -1), log=None)
    assert continued.epochs[0]["frozen_cache_s"] == 0.0 < fresh.epochs[0]["frozen_cache_s"]
    assert continued.metrics["overall"] == fresh.metrics["overall"]
    assert [e["loss_sst"] for e in continued.epochs] == [e["loss_sst"] for e in fresh.epochs]


def test_another_encoders_states_are_never_continued_from(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    build_frozen_cache(cfg(shared, 2, **{"train.seed": 1}))  # a tiny encoder's weights follow its seed
    rows = count_layer_rows(monkeypatch)
    build_frozen_cache(cfg(shared, -1, **{"train.seed": 2}))
    assert rows[0] == rows[1] == rows[2] > 0
