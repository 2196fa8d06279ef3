"""PCGrad against the formula of Yu et al. 2020 on hand-made gradients and a tiny model."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from mtbert.train.weighting.pcgrad import pcgrad_backward, project_conflicts, project_in_order


def _t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def test_conflicting_pair_is_projected_onto_the_normal_plane() -> None:
    grads = _t([[1.0, 0.0], [-1.0, 1.0]])  # dot = -1
    out = project_conflicts(grads)
    # g1 - (-1 / 2) g2 = [0.5, 0.5];  g2 - (-1 / 1) g1 = [0, 1]
    torch.testing.assert_close(out, _t([[0.5, 0.5], [0.0, 1.0]]))
    assert out[0] @ grads[1] == pytest.approx(0.0)
    assert out[1] @ grads[0] == pytest.approx(0.0)


@pytest.mark.parametrize("rows", [[[1.0, 2.0], [3.0, -1.0]],   # dot = 1
                                  [[1.0, 0.0], [0.0, -5.0]]])  # dot = 0: not a conflict
def test_non_conflicting_gradients_are_unchanged(rows: list[list[float]]) -> None:
    grads = _t(rows)
    torch.testing.assert_close(project_conflicts(grads), grads)


GRADS3 = [[1.0, 0.0], [-1.0, 1.0], [1.0, -2.0]]


def test_three_tasks_in_a_fixed_order_use_the_original_other_gradients() -> None:
    out = project_in_order(_t(GRADS3), [[1, 2], [2, 0], [0, 1]])
    # task 0: g0.g1 = -1 -> [0.5, 0.5]; that now conflicts with g2 (0.5 - 1 < 0) although
    #         g0.g2 = 1 did not: [0.5, 0.5] + 0.5/5 [1, -2] = [0.6, 0.3]
    # task 1: g1.g2 = -3 -> [-1, 1] + 3/5 [1, -2] = [-0.4, -0.2]; . g0 = -0.4 -> [0, -0.2]
    # task 2: g2.g0 = 1 (kept); g2.g1 = -3 -> [1, -2] + 3/2 [-1, 1] = [-0.5, -0.5]
    torch.testing.assert_close(out, _t([[0.6, 0.3], [0.0, -0.2], [-0.5, -0.5]]))


def test_random_order_is_seeded_and_actually_varies() -> None:
    grads = _t(GRADS3)
    first_rows = set()
    for seed in range(20):
        a = project_conflicts(grads, torch.Generator().manual_seed(seed))
        b = project_conflicts(grads, torch.Generator().manual_seed(seed))
        torch.testing.assert_close(a, b)
        first_rows.add(tuple(round(v, 6) for v in a[0].tolist()))
    # task 0 after [1, 2] is [0.6, 0.3]; after [2, 1] it is [0.5, 0.5] (g0.g2 = 1 is no conflict)
    assert first_rows == {(0.6, 0.3), (0.5, 0.5)}


def test_zero_gradient_neither_conflicts_nor_produces_nan() -> None:
    grads = _t([[0.0, 0.0], [1.0, -1.0]])
    torch.testing.assert_close(project_conflicts(grads), grads)


def test_keeps_dtype_and_rejects_a_flat_vector() -> None:
    assert project_conflicts(torch.randn(3, 7)).dtype == torch.float32
    with pytest.raises(ValueError, match="tasks, params"):
        project_conflicts(torch.randn(7))


class TwoHeads(nn.Module):
    """A shared layer (plus a shared scale only task a uses) and one head per task."""

    def __init__(self, head_b: list[float]) -> None:
        super().__init__()
        self.shared = nn.Linear(3, 2)
        self.scale = nn.Parameter(torch.tensor(1.5))
        self.head_a = nn.Linear(2, 1)
        self.head_b = nn.Linear(2, 1)
        with torch.no_grad():
            self.head_a.weight.copy_(torch.tensor([[1.0, 0.5]]))
            self.head_b.weight.copy_(torch.tensor([head_b]))

    def losses(self, x: torch.Tensor) -> list[torch.Tensor]:
        h = torch.tanh(self.shared(x))
        # Linear in each head, so the sign of g_a . g_b is the sign of head_a.w . head_b.w
        # (elementwise): opposite-signed heads conflict, same-signed heads do not.
        return [self.scale * self.head_a(h).mean(), 0.5 * self.head_b(h).mean()]


def _shared_params(model: TwoHeads) -> list[nn.Parameter]:
    return [model.shared.weight, model.shared.bias, model.scale]


def _flat_task_grads(model: TwoHeads, x: torch.Tensor) -> torch.Tensor:
    rows = []
    for loss in model.losses(x):
        grads = torch.autograd.grad(loss, _shared_params(model), retain_graph=True,
                                    allow_unused=True)
        rows.append(torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1)
                               for p, g in zip(_shared_params(model), grads)]))
    return torch.stack(rows)


def _flat(model: TwoHeads) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in _shared_params(model)])


X = torch.tensor([[0.3, -1.0, 2.0], [1.0, 0.5, -0.5], [-0.7, 0.2, 0.1]])


def test_backward_sums_projected_shared_grads_and_leaves_heads_plain() -> None:
    torch.manual_seed(0)
    model = TwoHeads(head_b=[-2.0, -0.3])
    plain = copy.deepcopy(model)
    g_a, g_b = _flat_task_grads(model, X)
    dot = g_a @ g_b
    assert dot < 0, "the fixture must make the two tasks conflict"
    expected = (g_a - dot / (g_b @ g_b) * g_b) + (g_b - dot / (g_a @ g_a) * g_a)

    model.shared.weight.grad = torch.ones_like(model.shared.weight)  # must accumulate
    pcgrad_backward(model.losses(X), _shared_params(model))
    torch.testing.assert_close(_flat(model) - torch.cat([torch.ones(6), torch.zeros(3)]),
                               expected)
    sum(plain.losses(X)).backward()
    for name in ("head_a.weight", "head_a.bias", "head_b.weight", "head_b.bias"):
        torch.testing.assert_close(model.get_parameter(name).grad, plain.get_parameter(name).grad)
    assert not torch.allclose(_flat(model) - torch.cat([torch.ones(6), torch.zeros(3)]),
                              _flat(plain)), "surgery must change the conflicting shared grad"


def test_backward_without_conflict_equals_plain_backward() -> None:
    torch.manual_seed(0)
    model = TwoHeads(head_b=[2.0, 0.3])
    plain = copy.deepcopy(model)
    g_a, g_b = _flat_task_grads(model, X)
    assert g_a @ g_b >= 0
    pcgrad_backward(model.losses(X), _shared_params(model))
    sum(plain.losses(X)).backward()
    for (name, p), q in zip(model.named_parameters(), plain.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)


def test_frozen_shared_params_get_no_grad_and_bad_losses_are_refused() -> None:
    model = TwoHeads(head_b=[-2.0, -0.3])
    model.shared.weight.requires_grad_(False)
    pcgrad_backward(model.losses(X), _shared_params(model))
    assert model.shared.weight.grad is None
    assert model.shared.bias.grad is not None
    with pytest.raises(ValueError, match="no losses"):
        pcgrad_backward([], _shared_params(model))
    with pytest.raises(ValueError, match="loss 1"):
        pcgrad_backward([model.losses(X)[0], torch.tensor(1.0)], _shared_params(model))
