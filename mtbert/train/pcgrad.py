"""PCGrad gradient surgery (Yu et al. 2020, "Gradient surgery for multi-task learning").

hybrid-bert-layer-sharing.txt (section 4.2) and freeze-your-layers.txt (section 3.2) use it on
the shared encoder. For every task i and every other task j, taken in a random order, a
conflicting component is projected out:

    if g_i . g_j < 0:   g_i <- g_i - (g_i . g_j) / ||g_j||^2 * g_j

with g_j the ORIGINAL gradient of task j (as in the PCGrad paper), and the shared parameters
then step along sum_i g_i.

The surgery runs on a T x T Gram matrix instead of on P-long vectors: each projected gradient
is a combination sum_k A_ik g_k of the original ones, so its dot with g_j is (A G)_ij. The
only P-sized work is the Gram matrix and one (T x T) @ (T x P) product, all on the gradients'
device with no host sync per pair.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch


def random_orders(num_tasks: int, generator: torch.Generator | None = None) -> list[list[int]]:
    """For each task, the other tasks in a random order (PCGrad shuffles them per task)."""
    device = generator.device if generator is not None else "cpu"
    orders = []
    for i in range(num_tasks):
        perm = torch.randperm(num_tasks, generator=generator, device=device).tolist()
        orders.append([j for j in perm if j != i])
    return orders


def project_in_order(grads: torch.Tensor, orders: Sequence[Sequence[int]]) -> torch.Tensor:
    """PCGrad with a given order of the other tasks for each task i (orders[i])."""
    if grads.dim() != 2:
        raise ValueError(f"PCGrad: expected grads of shape (tasks, params), got {tuple(grads.shape)}")
    work = grads.to(torch.promote_types(grads.dtype, torch.float32))
    num_tasks = work.shape[0]
    gram = work @ work.T
    # A zero g_j never conflicts (its dot is 0), so clamping only avoids 0/0 in the unused branch.
    sq_norms = gram.diagonal().clamp_min(torch.finfo(work.dtype).tiny)
    eye = torch.eye(num_tasks, dtype=work.dtype, device=work.device)
    rows = []
    for i in range(num_tasks):
        row = eye[i]
        for j in orders[i]:
            dot = row @ gram[:, j]
            # eye[j] is the ORIGINAL g_j in coefficient space, not task j's projected gradient.
            row = row - torch.where(dot < 0, dot / sq_norms[j], 0.0) * eye[j]
        rows.append(row)
    return (torch.stack(rows) @ work).to(grads.dtype)


def project_conflicts(grads: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Project out pairwise conflicts from one flattened gradient per task: (T, P) -> (T, P)."""
    return project_in_order(grads, random_orders(grads.shape[0], generator))


def _graph_leaves(losses: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Every leaf tensor that .backward() on these losses would write a .grad to."""
    leaves: dict[int, torch.Tensor] = {}
    seen: set[torch.autograd.graph.Node] = set()
    stack = [loss.grad_fn for loss in losses if loss.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        leaf = getattr(node, "variable", None)  # only AccumulateGrad nodes carry one
        if leaf is not None:
            leaves.setdefault(id(leaf), leaf)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return list(leaves.values())


def _accumulate(param: torch.Tensor, grad: torch.Tensor) -> None:
    if param.grad is None:
        param.grad = grad
    else:
        param.grad.add_(grad)


def pcgrad_backward(losses: list[torch.Tensor], shared: list[torch.nn.Parameter],
                    generator: torch.Generator | None = None) -> None:
    """Backward with PCGrad on `shared`; plain backward of sum(losses) everywhere else.

    `losses` are the (already weighted) per-task scalar losses of one forward graph. The graph
    is freed afterwards, as .backward() would do.
    """
    if not losses:
        raise ValueError("pcgrad_backward: got no losses")
    for t, loss in enumerate(losses):
        if loss.dim() != 0 or not loss.requires_grad:
            raise ValueError(f"pcgrad_backward: loss {t} must be a scalar that requires grad")
    leaves = _graph_leaves(losses)
    # Like .backward(): frozen or unreached shared parameters get no .grad at all.
    reached = {id(p) for p in leaves}
    shared = list({id(p): p for p in shared if id(p) in reached}.values())
    shared_ids = {id(p) for p in shared}
    others = [p for p in leaves if id(p) not in shared_ids]
    params = shared + others
    sizes = [p.numel() for p in shared]
    flat = torch.zeros((len(losses), sum(sizes)), dtype=shared[0].dtype,
                       device=shared[0].device) if shared else None
    other_sum: list[torch.Tensor | None] = [None] * len(others)
    for t, loss in enumerate(losses):
        # T passes instead of T + 1: the plain gradient of sum(losses) for the non-shared
        # parameters is the sum of the per-task gradients we compute here anyway.
        grads = torch.autograd.grad(loss, params, retain_graph=t < len(losses) - 1,
                                    allow_unused=True)
        if flat is not None:
            for p_grad, chunk in zip(grads[:len(shared)], flat[t].split(sizes)):
                if p_grad is not None:  # unused by this task: a zero gradient for it
                    chunk.copy_(p_grad.reshape(-1))
        for k, p_grad in enumerate(grads[len(shared):]):
            if p_grad is not None:
                other_sum[k] = p_grad if other_sum[k] is None else other_sum[k] + p_grad
    if flat is not None:
        # Sum, not mean, over tasks: the papers step along g_1' + g_2' + g_3'
        # (freeze-your-layers.txt, 3.2), and the non-shared parameters get the gradient of
        # sum(losses); summing keeps both on one scale, so with no conflict this is exactly
        # sum(losses).backward(). (Pytorch-PCGrad silently ignores reduction='sum', DESIGN.md.)
        merged = project_conflicts(flat, generator).sum(dim=0)
        for p, chunk in zip(shared, merged.split(sizes)):
            _accumulate(p, chunk.view_as(p))
    for p, p_grad in zip(others, other_sum):
        if p_grad is not None:
            _accumulate(p, p_grad)
