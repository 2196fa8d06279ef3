"""PALs: eq.-2 parameter count, masking, zero-init decoder, gradient flow."""
from __future__ import annotations

import pytest
import torch

from mtbert.model.pal import ProjectedAttention, pal_heads, pal_param_count


@pytest.mark.parametrize("d_model, d_s, layers, heads",
                         [(768, 204, 12, 12), (32, 8, 2, 2), (64, 12, 3, 4), (48, 5, 1, 5)])
def test_module_size_is_eq_2_with_biases(d_model: int, d_s: int, layers: int, heads: int) -> None:
    pal = ProjectedAttention(d_model, d_s, layers, heads)
    assert sum(p.numel() for p in pal.parameters()) == pal_param_count(d_model, d_s, layers, 1)
    weights = sum(p.numel() for name, p in pal.named_parameters() if name.endswith("weight"))
    assert weights == pal_param_count(d_model, d_s, layers, 1, bias=False)


def test_paper_configuration_count() -> None:
    # 3 * (2 * 768 * 204 + 12 * 3 * 204^2) = 3 * (313,344 + 1,498,176)
    assert pal_param_count(768, 204, 12, 3, bias=False) == 5_434_560
    assert pal_param_count(768, 204, 12, 3) == 5_434_560 + 3 * (204 + 768 + 12 * 3 * 204)
    # The paper says "approximately 1.9 million" per task; eq. 2 gives 1.81M (within 5%).
    per_task = pal_param_count(768, 204, 12, 1, bias=False)
    assert abs(per_task - 1.9e6) / 1.9e6 < 0.05


def _pal_with_live_decoder(seed: int = 0) -> ProjectedAttention:
    torch.manual_seed(seed)
    pal = ProjectedAttention(d_model=16, d_s=8, num_layers=2, num_heads=2)
    torch.nn.init.normal_(pal.decoder.weight)
    return pal


def test_padding_does_not_change_real_token_outputs() -> None:
    pal = _pal_with_live_decoder()
    real = torch.randn(1, 5, 16)
    short = pal(1, real, torch.ones(1, 5))
    padded = torch.cat([real, 100 * torch.randn(1, 3, 16)], dim=1)  # loud garbage in the pads
    mask = torch.tensor([[1, 1, 1, 1, 1, 0, 0, 0]])
    torch.testing.assert_close(pal(1, padded, mask)[:, :5], short)
    # and the mask is what makes it so: without it the garbage leaks in
    assert not torch.allclose(pal(1, padded, torch.ones(1, 8))[:, :5], short, atol=1e-3)


def test_layers_have_their_own_attention_and_all_pad_rows_stay_finite() -> None:
    pal = _pal_with_live_decoder()
    hidden = torch.randn(2, 4, 16)
    mask = torch.tensor([[1, 1, 1, 0], [0, 0, 0, 0]])
    out0, out1 = pal(0, hidden, mask), pal(1, hidden, mask)
    assert not torch.allclose(out0, out1)
    assert torch.isfinite(out0).all() and torch.isfinite(out1).all()


def test_fresh_pal_adds_exactly_zero() -> None:
    pal = ProjectedAttention(d_model=16, d_s=8, num_layers=2, num_heads=2)
    out = pal(0, torch.randn(3, 6, 16), torch.ones(3, 6))
    assert out.shape == (3, 6, 16)
    assert torch.equal(out, torch.zeros_like(out))


def test_encoder_gets_gradient_once_decoder_has_moved() -> None:
    torch.manual_seed(0)
    pal = ProjectedAttention(d_model=16, d_s=8, num_layers=2, num_heads=2)
    hidden, mask, target = torch.randn(2, 5, 16), torch.ones(2, 5), torch.randn(2, 5, 16)
    optimizer = torch.optim.SGD(pal.parameters(), lr=0.1)

    (pal(0, hidden, mask) * target).sum().backward()
    assert pal.encoder.weight.grad.abs().sum() == 0  # blocked by V^D = 0
    assert pal.decoder.weight.grad.abs().sum() > 0
    optimizer.step()
    optimizer.zero_grad()

    assert pal.decoder.weight.abs().sum() > 0
    (pal(0, hidden, mask) * target).sum().backward()
    assert pal.encoder.weight.grad.abs().sum() > 0
    assert pal.qkv[0].weight.grad.abs().sum() > 0
    assert pal.qkv[1].weight.grad is None  # layer 1 was not used


def test_head_count_must_divide_d_s() -> None:
    assert pal_heads(204, 12) == 12
    assert pal_heads(100, 12) == 10
    assert pal_heads(7, 12) == 7
    assert pal_heads(13, 12) == 1
    with pytest.raises(ValueError, match="d_s=100 is not divisible by num_heads=12.*10 heads"):
        ProjectedAttention(768, 100, 12, 12)
