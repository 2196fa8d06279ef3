"""SMART on a tiny random-init BERT: the term is positive, trains the encoder, and really ascends."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import BertConfig, BertModel
from transformers.masking_utils import create_bidirectional_mask

from mtbert.train.smart import adversarial_noise, divergence, smart_loss

OUT_DIM = {"multiclass": 5, "binary": 1, "regression": 1}


class TinyBert(nn.Module):
    """Real BERT pieces: embeddings, then encoder + a linear head on [CLS] of each side."""

    def __init__(self, sides: int, out_dim: int) -> None:
        super().__init__()
        # No dropout: perturbed and clean passes must differ only by the perturbation here.
        config = BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2,
                            num_attention_heads=2, intermediate_size=64,
                            max_position_embeddings=32, hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.head = nn.Linear(32 * sides, out_dim)
        self.masks: list[torch.Tensor] = []

    def embed(self, ids: list[torch.Tensor]) -> list[torch.Tensor]:
        self.masks = [(i != 0).long() for i in ids]
        return [self.bert.embeddings(input_ids=i) for i in ids]

    def forward(self, embeds: list[torch.Tensor]) -> torch.Tensor:
        cls = []
        for e, m in zip(embeds, self.masks):
            mask = create_bidirectional_mask(config=self.bert.config, inputs_embeds=e,
                                             attention_mask=m)
            cls.append(self.bert.encoder(e, attention_mask=mask).last_hidden_state[:, 0])
        return self.head(torch.cat(cls, dim=-1))


def _ids(batch: int, length: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 60, (batch, length), generator=g)
    ids[0, length - 2:] = 0  # some padding
    return ids


def _setup(kind: str, sides: int) -> tuple[TinyBert, list[torch.Tensor], torch.Tensor]:
    torch.manual_seed(0)
    model = TinyBert(sides, OUT_DIM[kind])
    embeds = model.embed([_ids(4, 7 + s, seed=s) for s in range(sides)])
    logits = model(embeds)
    if kind != "multiclass":
        logits = logits.squeeze(-1)
    return model, embeds, logits


def _fwd(model: TinyBert, kind: str):
    return model if kind == "multiclass" else (lambda e: model(e).squeeze(-1))


@pytest.mark.parametrize("kind", ["multiclass", "binary", "regression"])
@pytest.mark.parametrize("sides", [1, 2])
def test_term_is_positive_and_reaches_encoder_and_embeddings(kind: str, sides: int) -> None:
    model, embeds, logits = _setup(kind, sides)
    loss = smart_loss(_fwd(model, kind), embeds, logits, kind)
    assert loss.dim() == 0 and torch.isfinite(loss) and loss > 0
    assert all(p.grad is None for p in model.parameters()), "the search must not leave grads"
    loss.backward()
    assert model.bert.encoder.layer[0].attention.self.query.weight.grad.abs().sum() > 0
    assert model.bert.embeddings.word_embeddings.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("kind", ["multiclass", "binary", "regression"])
def test_ascent_beats_a_random_perturbation_of_equal_size(kind: str) -> None:
    model, embeds, logits = _setup(kind, 1)
    fwd = _fwd(model, kind)

    def reached(steps: int) -> tuple[torch.Tensor, torch.Tensor]:
        torch.manual_seed(1)
        noise = adversarial_noise(fwd, embeds, 0, logits.detach(), kind, 1e-5, 1e-3, steps)
        with torch.no_grad():
            return noise, divergence(kind, fwd([embeds[0] + noise]), logits)

    adv, d_adv = reached(2)
    rand = torch.randn_like(adv)
    rand = rand * (adv.flatten(1).norm(dim=1) / rand.flatten(1).norm(dim=1))[:, None, None]
    with torch.no_grad():
        d_rand = divergence(kind, fwd([embeds[0] + rand]), logits)
    assert (d_adv > 10 * d_rand).all(), (d_adv, d_rand)
    # l_s is ~quadratic near the clean point: climbing twice as far gives ~4x; a descent
    # step would walk back towards the clean point instead.
    assert (d_adv > 3 * reached(1)[1]).all()


def test_bi_pair_sides_are_searched_one_at_a_time_then_both_perturbed() -> None:
    model, embeds, logits = _setup("multiclass", 2)
    calls: list[list[torch.Tensor]] = []

    def recording(inputs: list[torch.Tensor]) -> torch.Tensor:
        calls.append([x.detach().clone() for x in inputs])
        return model(inputs)

    steps, step_size, epsilon = 2, 1e-3, 1e-5
    smart_loss(recording, embeds, logits, "multiclass", epsilon, step_size, steps)
    assert len(calls) == 2 * steps + 1  # each side's steps, then the final evaluation
    clean = [e.detach() for e in embeds]
    for k, call in enumerate(calls[:-1]):
        searched = k // steps
        assert torch.equal(call[1 - searched], clean[1 - searched])  # other side stays clean
        assert not torch.equal(call[searched], clean[searched])
    for side in (0, 1):
        delta = (calls[-1][side] - clean[side]).flatten(1).abs().amax(dim=1)
        # every normalised step moves the largest coordinate by exactly step_size
        assert (delta > steps * step_size * 0.9).all()
        assert (delta <= steps * step_size + 10 * epsilon).all()


def _sym_kl_reference(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    log_p, log_q = F.log_softmax(p_logits, -1), F.log_softmax(q_logits, -1)
    forward = F.kl_div(log_q, log_p, log_target=True, reduction="none").sum(-1)
    backward = F.kl_div(log_p, log_q, log_target=True, reduction="none").sum(-1)
    return forward + backward


def test_divergences_match_their_textbook_forms() -> None:
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(6, 4, generator=g), torch.randn(6, 4, generator=g)
    torch.testing.assert_close(divergence("multiclass", a, b), _sym_kl_reference(a, b))
    x, y = a[:, 0], b[:, 0]
    # Bernoulli(sigmoid(x)) is the softmax of the logits [0, x]
    two_class = _sym_kl_reference(torch.stack([torch.zeros(6), x], -1),
                                  torch.stack([torch.zeros(6), y], -1))
    torch.testing.assert_close(divergence("binary", x, y), two_class)
    torch.testing.assert_close(divergence("regression", x, y), (x - y) ** 2)


def test_bad_kind_and_mismatched_logits_are_refused() -> None:
    model, embeds, logits = _setup("binary", 1)
    with pytest.raises(ValueError, match="unknown kind 'ordinal'"):
        smart_loss(model, embeds, logits, "ordinal")
    with pytest.raises(ValueError, match=r"logits \(4, 1\), expected \(4,\)"):
        smart_loss(model, embeds, logits, "binary")  # head output not squeezed
