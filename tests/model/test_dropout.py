"""The encoder's cheaper CPU dropout (mtbert/model/dropout.py) against what nn.Dropout promises."""
import torch

from mtbert.model.dropout import LEVELS, Dropout, cheapen


def test_drops_p_of_the_elements_and_keeps_the_mean():
    torch.manual_seed(0)
    drop = Dropout(0.1).train()
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.ones(1_000_001, dtype=dtype)  # odd: the last 32-bit word is half used
        y = drop(x)
        assert abs((y == 0).float().mean().item() - 0.1) < 0.002
        assert abs(y.float().mean().item() - 1.0) < 0.003
        kept = y[y != 0].float()
        assert torch.allclose(kept, torch.full_like(kept, LEVELS / (LEVELS - round(0.1 * LEVELS))), rtol=4e-3)


def test_kept_values_are_scaled_without_bias_in_bf16_too():
    # Kept values are x / (1 - p) up to each element's own rounding: over a million elements
    # the sums agree within 3e-4. A scale rounded to bf16 (1/0.9 -> 1.109) would be 1.8e-3 off.
    torch.manual_seed(0)
    drop = Dropout(0.1).train()
    scale = LEVELS / (LEVELS - round(0.1 * LEVELS))
    for dtype in (torch.float32, torch.bfloat16):
        x = (torch.rand(1_000_000) + 1).to(dtype)
        y = drop(x)
        kept = y != 0
        ratio = (y[kept].double().sum() / x[kept].double().sum()).item()
        assert abs(ratio - scale) < 3e-4, (dtype, ratio, scale)


def test_same_seed_same_mask_and_gradient_through_the_mask():
    drop = Dropout(0.3).train()
    x = torch.randn(7, 5, 3, requires_grad=True)
    torch.manual_seed(1)
    a = drop(x)
    torch.manual_seed(1)
    b = drop(x)
    assert torch.equal(a, b)
    a.sum().backward()
    assert torch.equal(x.grad == 0, a == 0)


def test_eval_and_p0_are_identity_and_cheapen_swaps_every_dropout():
    x = torch.randn(4, 3)
    assert torch.equal(Dropout(0.5).eval()(x), x)
    assert torch.equal(Dropout(0.0).train()(x), x)
    net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Dropout(0.2),
                              torch.nn.Sequential(torch.nn.Dropout(0.4)))
    cheapen(net)
    swapped = [m for m in net.modules() if isinstance(m, torch.nn.Dropout)]
    assert [type(m) for m in swapped] == [Dropout, Dropout] and [m.p for m in swapped] == [0.2, 0.4]
