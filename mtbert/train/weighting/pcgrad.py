"""PCGrad gradient surgery (Yu et al. 2020, "Gradient surgery for multi-task learning") on the
shared parameters, over the fixed-weight losses (loss.weights). The reported weights are the
fixed ones: PCGrad changes directions, not weights.

hybrid-bert-layer-sharing.txt (section 4.2) and freeze-your-layers.txt (section 3.2) use it on
the shared encoder. For every task i and every other task j, taken in a random order, a
conflicting component is projected out:

    if g_i . g_j < 0:   g_i <- g_i - (g_i . g_j) / ||g_j||^2 * g_j

with g_j the ORIGINAL gradient of task j (as in the PCGrad paper), and the shared parameters
then step along sum_i g_i.

The surgery runs on the T x T Gram matrix instead of on P-long vectors: each projected
gradient is a combination sum_k A_ik g_k of the original ones, so its dot with g_j is
(A G)_ij, and the step is (1^T A) @ g. The only P-sized work is the Gram matrix and that one
combination, all on the gradients' device with no host sync per pair. mtbert's own rather than
TorchJD's PCGrad: it draws its orders from the run's own seeded generator (so a resume is exact
without the global one) and its solve measured faster (docs/weighting.md).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from mtbert.train.weighting.base import GradientWeighting, TaskGradients, task_gradients


def random_orders(num_tasks: int, generator: torch.Generator | None = None) -> list[list[int]]:
    """For each task, the other tasks in a random order (PCGrad shuffles them per task)."""
    device = generator.device if generator is not None else "cpu"
    orders = []
    for i in range(num_tasks):
        perm = torch.randperm(num_tasks, generator=generator, device=device).tolist()
        orders.append([j for j in perm if j != i])
    return orders


def surgery_rows(gram: torch.Tensor, orders: Sequence[Sequence[int]]) -> torch.Tensor:
    """A (T x T): row i holds the coefficients of task i's projected gradient over the
    original ones, from their Gram matrix."""
    num_tasks = gram.shape[0]
    # A zero g_j never conflicts (its dot is 0), so clamping only avoids 0/0 in the unused branch.
    sq_norms = gram.diagonal().clamp_min(torch.finfo(gram.dtype).tiny)
    eye = torch.eye(num_tasks, dtype=gram.dtype, device=gram.device)
    rows = []
    for i in range(num_tasks):
        row = eye[i]
        for j in orders[i]:
            dot = row @ gram[:, j]
            # eye[j] is the ORIGINAL g_j in coefficient space, not task j's projected gradient.
            row = row - torch.where(dot < 0, dot / sq_norms[j], 0.0) * eye[j]
        rows.append(row)
    return torch.stack(rows)


def project_in_order(grads: torch.Tensor, orders: Sequence[Sequence[int]]) -> torch.Tensor:
    """PCGrad with a given order of the other tasks for each task i (orders[i])."""
    if grads.dim() != 2:
        raise ValueError(f"PCGrad: expected grads of shape (tasks, params), got {tuple(grads.shape)}")
    work = grads.to(torch.promote_types(grads.dtype, torch.float32))
    return (surgery_rows(work @ work.T, orders) @ work).to(grads.dtype)


def project_conflicts(grads: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Project out pairwise conflicts from one flattened gradient per task: (T, P) -> (T, P)."""
    return project_in_order(grads, random_orders(grads.shape[0], generator))


def pcgrad_coefficients(gram: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """a with sum_i (projected g_i) = sum_k a_k g_k: the column sums of the surgery's rows."""
    return surgery_rows(gram, random_orders(gram.shape[0], generator)).sum(dim=0)


def pcgrad_backward(losses: list[torch.Tensor], shared: list[torch.nn.Parameter],
                    generator: torch.Generator | None = None) -> None:
    """Backward with PCGrad on `shared`; plain backward of sum(losses) everywhere else.

    `losses` are the (already weighted) per-task scalar losses of one forward graph. Sum, not
    mean, over tasks: the papers step along g_1' + g_2' + g_3' (freeze-your-layers.txt, 3.2),
    and the non-shared parameters get the gradient of sum(losses); summing keeps both on one
    scale, so with no conflict this is exactly sum(losses).backward(). (Pytorch-PCGrad silently
    ignores reduction='sum', DESIGN.md.)
    """
    grads = task_gradients(losses, shared)
    grads.apply(None if grads.flat is None else pcgrad_coefficients(grads.gram(), generator))


class PCGrad(GradientWeighting):
    name = "pcgrad"
    uses_fixed_weights = True

    def __init__(self, cfg, device):
        super().__init__(cfg, device)
        self.weights = {t: cfg.loss_weight(t) for t in self.tasks}
        self._as_tensors = {t: torch.tensor(w, device=device) for t, w in self.weights.items()}
        # Seeded per run: PCGrad visits the other tasks in a random order.
        self.generator = torch.Generator(device=device).manual_seed(cfg.train.seed)

    def backward(self, losses, shared):
        # The fixed weights go into the losses, so the other parameters get sum_i w_i grad L_i.
        weighted = {t: self.weights[t] * loss for t, loss in losses.items()}
        grads = task_gradients(list(weighted.values()), shared)
        grads.apply(None if grads.flat is None else self.coefficients(grads, list(losses)))
        if grads.flat is not None:
            self.last_cost = self.cost(grads)
        return {t: self._as_tensors[t] for t in losses}

    def coefficients(self, grads: TaskGradients, tasks: list[str]) -> torch.Tensor:
        return pcgrad_coefficients(grads.gram(), self.generator)

    def state_dict(self):
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state):
        if "generator" in state:
            self.generator.set_state(state["generator"].cpu())
