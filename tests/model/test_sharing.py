"""Encoder and head sharing by identity, parameter counts by formula, freezing."""
import itertools

import pytest
import torch

from mtbert.config import ConfigError, build_config
from mtbert.model.multitask import MultitaskModel, count_params

V, H, L, I, HEADS = 120, 32, 4, 64, 2
TINY = {"model": {"pooling": "pooler", "tiny": {"layers": L, "hidden": H, "heads": HEADS, "intermediate": I}}}


def model_for(**overrides):
    cfg = build_config(TINY, overrides)
    return MultitaskModel(cfg, vocab_size=V)


def layer_params():
    return 4 * (H * H + H) + 2 * H + (H * I + I) + (I * H + H) + 2 * H


def emb_params(max_pos=128):
    return V * H + max_pos * H + 2 * H + 2 * H


def unique_numel(modules):
    params = {id(p): p for m in modules for p in m.parameters()}
    return sum(p.numel() for p in params.values())


@pytest.mark.parametrize("k", [0, L // 2, L])
def test_encoder_sharing_by_identity_and_count(k):
    m = model_for(**{"sharing.encoder_shared_layers": k})
    tasks = ["sst", "para", "sts"]
    assert len(m.shared_layers) == k
    for t in tasks:
        assert len(m.task_layers[t]) == L - k
    # Private layers are distinct objects per task; k = 0 shares no layer at all.
    for a, b in itertools.combinations(tasks, 2):
        for la, lb in zip(m.task_layers[a], m.task_layers[b]):
            assert la is not lb
            assert la.attention.self.query.weight is not lb.attention.self.query.weight
        assert (m.poolers[a] is m.poolers[b]) == (k == L)
    encoder = [m.embeddings, m.shared_layers, *m.task_layers.values(), *m.poolers.values()]
    n_pool = H * H + H
    expected = emb_params() + k * layer_params() + 3 * (L - k) * layer_params() \
        + (1 if k == L else 3) * n_pool
    assert unique_numel(encoder) == expected


def test_default_is_one_bert():
    m = model_for()
    assert len(m.shared_layers) == L and all(len(v) == 0 for v in m.task_layers.values())


@pytest.mark.parametrize("regime", ["-".join(r) for r in itertools.product("SI", repeat=3)])
def test_head_regimes_share_by_identity_and_count(regime):
    m = model_for(**{"sharing.head_regime": regime})
    letters = regime.split("-")
    for j, letter in enumerate(letters):
        mods = [m.heads.layers[j][t] for t in ("sst", "para", "sts")]
        assert (len({id(x) for x in mods}) == 1) == (letter == "S")
    lin = H * H + H
    n_s, n_i = letters.count("S"), letters.count("I")
    out = (H * 5 + 5) + (H + 1) + (H + 1)
    assert unique_numel([m.heads]) == n_s * lin + 3 * n_i * lin + out


@pytest.mark.parametrize("subset", [["para", "sts"], ["sst", "sts"], ["sst", "para"]])
def test_head_share_subset(subset):
    m = model_for(**{"sharing.head_regime": "S-S-I", "sharing.head_share_tasks": subset})
    (outside,) = {"sst", "para", "sts"} - set(subset)
    for j in (0, 1):
        assert m.heads.layers[j][subset[0]] is m.heads.layers[j][subset[1]]
        assert m.heads.layers[j][outside] is not m.heads.layers[j][subset[0]]
    lin = H * H + H
    # 2 shared layers with a private copy for the task outside the subset, 3 individual ones.
    assert unique_numel([m.heads.layers]) == 2 * 2 * lin + 3 * lin


def test_freeze_layers_bit_identical_after_step():
    torch.manual_seed(0)
    m = model_for(**{"sharing.encoder_shared_layers": 2, "freeze.layers": 3})
    frozen = [m.embeddings, *m.shared_layers[:2]] + [m.task_layers[t][0] for t in ("sst", "para", "sts")]
    moving = [m.task_layers[t][1] for t in ("sst", "para", "sts")] + [m.heads]
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-2)
    from mtbert.data.types import Batch, Encoded
    ids = torch.randint(5, V, (4, 7))
    enc = Encoded(ids, torch.ones_like(ids), torch.zeros_like(ids))
    batches = [Batch("sst", [enc], torch.tensor([0, 1, 2, 3])),
               Batch("para", [enc], torch.tensor([0, 1, 0, 1])),
               Batch("sts", [enc], torch.tensor([0.5, 1.0, 4.0, 2.0]))]
    out = m(batches)
    loss = sum(o.float().pow(2).mean() for o in out.values())
    loss.backward()
    opt.step()
    frozen_ids = {id(p) for mod in frozen for p in mod.parameters()}
    for n, p in m.named_parameters():
        if id(p) in frozen_ids:
            assert torch.equal(p, before[n]), n
    changed = [not torch.equal(p, before[n]) for n, p in m.named_parameters()
               if any(p is q for mod in moving for q in mod.parameters())]
    assert changed and all(changed)
    total, trainable = count_params(m)
    assert trainable == total - unique_numel(frozen)


def test_depth_errors_name_the_key():
    with pytest.raises(ConfigError, match="sharing.encoder_shared_layers"):
        model_for(**{"sharing.encoder_shared_layers": L + 1})
    from mtbert.model.encoder import check_against_encoder
    with pytest.raises(ConfigError, match="freeze.layers"):
        check_against_encoder(build_config(TINY, {"freeze.layers": L + 2}))


def test_packed_trunk_matches_separate_forwards():
    """Running tasks packed together gives the same outputs as one task at a time."""
    torch.manual_seed(0)
    m = model_for(**{"sharing.encoder_shared_layers": 2}).eval()
    from mtbert.data.types import Batch, Encoded

    def enc(n, t):
        ids = torch.randint(5, V, (n, t))
        mask = torch.ones_like(ids)
        mask[0, t - 2:] = 0
        return Encoded(ids, mask, torch.zeros_like(ids))
    batches = [Batch("sst", [enc(3, 5)], torch.zeros(3)), Batch("para", [enc(2, 9)], torch.zeros(2)),
               Batch("sts", [enc(4, 6)], torch.zeros(4))]
    with torch.no_grad():
        together = m(batches)
        for b in batches:
            alone = m([b])[b.task]
            torch.testing.assert_close(together[b.task], alone, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("shared", [0, L])
def test_model_size_is_what_torch_save_writes_shared_tensors_once(shared, monkeypatch):
    import io

    from mtbert.model import multitask

    m = model_for(**{"sharing.encoder_shared_layers": shared, "sharing.head_regime": "S-S-S"})
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    monkeypatch.setattr(multitask, "_SIZES", None)  # measured here, not remembered from an earlier model
    assert multitask.model_size_mb(m) == buf.tell() / 2**20


def test_the_sharing_section_imports_nothing_of_the_config():
    """config imports sharing (SharingConfig is one of its sections), never the other way, not
    even for type checking: the checks that read the rest of the config (check_heads,
    check_depth) live in config."""
    import ast
    import inspect

    import mtbert.model.sharing as sharing

    tree = ast.parse(inspect.getsource(sharing))
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
    assert not {m for m in imported if m == "mtbert.config" or m.startswith("torch")}, imported


def test_the_regimes_own_the_references_sharing_keys_and_the_caches_safety():
    """The frozen reference turns every built-in regime off with the values it always set, in
    the order it set them; PALs (a trainable term inside frozen layers) alone spoil the cache."""
    from mtbert.config import reference_settings
    from mtbert.model.sharing import regimes

    assert [r.name for r in regimes()] == ["heads", "encoder", "cascade", "pal"]
    sharing = {k: v for k, v in reference_settings().items() if k.startswith("sharing.")}
    assert list(sharing.items()) == [("sharing.head_regime", "none"), ("sharing.encoder_shared_layers", None),
                                     ("sharing.cascade", "none"), ("sharing.pal_size", 0)]
    frozen = {"freeze.layers": 1, "sharing.head_regime": "S-S"}
    assert model_for(**frozen).cache_safe()
    assert not model_for(**frozen, **{"sharing.pal_size": 8}).cache_safe()
    assert not model_for(**{"sharing.pal_size": 8}).cache_safe()  # nothing frozen, nothing to cache
