"""One short training per regime family on synthetic data: each learns above chance.
Plus the cascade's promise: a downstream loss never moves an upstream head."""
import pytest
import torch

from mtbert.config import ConfigError, build_config
from mtbert.data.types import Batch, Encoded
from mtbert.model.multitask import MultitaskModel
from mtbert.train.loop import train

SHORT = {"sampling.strategy": "tuple", "sampling.steps_per_epoch": 60, "train.epochs": 2,
         "optim.lr": 2e-3}


# Cross-encoded pairs learn slowly on a random-init encoder (token matching across the two
# sentences must be learned first), so the cascade family, which needs cross, is held to
# beating chance on the sentence task and overall, after 400 steps: at 200, 2 and 3 of 8 seeds
# fell under the bar (overall 0.25-0.27) with two dropout implementations; at 400 every seed
# cleared it, in bf16 (0.33-0.42) and in fp32 (0.33-0.39).
CROSS_BAR = {"overall": 0.28, "sst_acc": 0.3}


@pytest.mark.parametrize("family", [
    {"sharing.head_regime": "S-S-S"},
    {"sharing.head_regime": "I-S-S", "sharing.head_share_tasks": ["para", "sts"]},
    {"sharing.encoder_shared_layers": 0},
    {"sharing.cascade": "sst>para>sts", "pairs.encoding": "cross", "heads.pooled_layernorm": True,
     "heads.task_dropout": {"para": 0.3}, "sampling.steps_per_epoch": 200, "optim.lr": 1e-3},
    {"sharing.pal_size": 16},
    {"loss.pcgrad": True},
    {"loss.smart": {"weight": 0.3, "steps": 1}},
    {"sts.head": "cosine"},
    {"sts.head": "cosine_mlp"},
    {"sampling.strategy": "annealed", "sampling.steps_per_epoch": 180},  # one task per step
], ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()))
def test_family_learns(family, tmp_path):
    cfg = build_config({}, {**SHORT, **family, "data.cache_dir": str(tmp_path / "cache")})
    m = train(cfg, log=None).metrics
    # Chance is 0.2 / 0.5 / 0.0 (overall 0.23); a learning model clears these margins in 120
    # steps (SST, the slowest task, is held to its own bar in tests/e2e/test_train.py).
    # One task per step (annealed) gives each task a third of the updates of tuple sampling.
    bar = (CROSS_BAR if cfg.pairs.encoding == "cross"
           else {"overall": 0.45} if cfg.sampling.strategy.name == "tuple" else {"overall": 0.35})
    assert all(m[k] > v for k, v in bar.items()), m


def test_downstream_loss_leaves_upstream_heads_unchanged():
    torch.manual_seed(0)
    cfg = build_config({}, {"sharing.cascade": "sst>para>sts", "pairs.encoding": "cross"})
    model = MultitaskModel(cfg, vocab_size=100)
    ids = torch.randint(5, 100, (4, 9))
    batch = Batch("sts", [Encoded(ids, torch.ones_like(ids), torch.zeros_like(ids))], torch.rand(4) * 5)
    out = model([batch])["sts"]
    assert model.heads.layers[0]["sts"].in_features == 64 + 5 + 1  # pooled + sst logits + para logit
    model.tasks[2].loss(out, batch.labels).backward()
    for up in ("sst", "para"):
        for p in [*model.heads.out[up].parameters(), *(l[up].weight for l in model.heads.layers)]:
            assert p.grad is None or not p.grad.any()
    assert model.heads.out["sts"].weight.grad.abs().sum() > 0
    assert model.embeddings.word_embeddings.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("overrides, key", [
    ({"sharing.cascade": "sst>para"}, "sharing.cascade"),  # default pairs.encoding is bi
    ({"sharing.cascade": "sst>para", "pairs.encoding": "cross", "sharing.head_regime": "S-I-I"}, "sharing.cascade"),
    ({"sts.head": "cosine", "pairs.encoding": "cross"}, "sts.head"),
    ({"loss.pcgrad": True, "sampling.strategy": "annealed"}, "loss.pcgrad"),
    ({"sharing.head_share_tasks": ["para", "nli"]}, "sharing.head_share_tasks"),
])
def test_nonsense_combinations_fail_at_load(overrides, key):
    with pytest.raises(ConfigError, match=key):
        build_config({}, overrides)


def test_pal_parameters_match_equation_2():
    from mtbert.model.pal import pal_param_count
    cfg = build_config({}, {"sharing.pal_size": 16})
    model = MultitaskModel(cfg, vocab_size=100)
    n = sum(p.numel() for p in model.pals.parameters())
    assert n == pal_param_count(64, 16, 2, 3, bias=True)
