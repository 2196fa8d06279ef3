"""SMART smoothness-inducing adversarial regulariser (Jiang et al. 2020), freeze-your-layers.txt 3.3.

    R_s(theta) = 1/n sum_i max_{||x~_i - x_i||_inf <= eps} l_s(f(x~_i; theta), f(x_i; theta))

x are the embedding-layer outputs. l_s is the symmetric KL divergence for classification and
the squared error for regression, as in freeze-your-layers.txt. The inner max is approximated
as SMART's reference code does: start from x + N(0, epsilon^2) noise, take `steps` ascent steps
of size step_size along the gradient normalised by its per-example inf-norm, so each step
moves every coordinate by at most step_size (this normalisation is the projection: the
perturbation stays in an inf-ball of radius steps * step_size around the noise).

Pairs encoded separately, f(x, y) (freeze-your-layers.txt 3.3): x~ is found with y clean and
y~ with x clean, then R_s is evaluated at f(x~, y~).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

KINDS = ("multiclass", "binary", "regression")


def divergence(kind: str, perturbed: torch.Tensor, clean: torch.Tensor) -> torch.Tensor:
    """Per-example l_s between perturbed and clean logits: shape (B,)."""
    if perturbed.shape != clean.shape:  # broadcasting (B, 1) against (B,) would be silent
        raise ValueError(f"SMART: forward gave logits {tuple(perturbed.shape)}, "
                         f"expected {tuple(clean.shape)}")
    if kind == "multiclass":
        # KL(p||q) + KL(q||p) = sum (p - q)(log p - log q)
        log_p, log_q = F.log_softmax(perturbed, dim=-1), F.log_softmax(clean, dim=-1)
        per_item = (log_p.exp() - log_q.exp()) * (log_p - log_q)
    elif kind == "binary":
        # Symmetric KL of Bernoulli(sigmoid(a)) and Bernoulli(sigmoid(b)) reduces to
        # (sigmoid(a) - sigmoid(b)) (a - b), since log s(a) - log s(-a) = a: no log of 0 to guard.
        per_item = (torch.sigmoid(perturbed) - torch.sigmoid(clean)) * (perturbed - clean)
    elif kind == "regression":
        per_item = (perturbed - clean).pow(2)
    else:
        raise ValueError(f"SMART: unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
    return per_item.reshape(per_item.shape[0], -1).sum(dim=1)


def _normalise(grad: torch.Tensor) -> torch.Tensor:
    """grad / ||grad||_inf per example (SMART's p = inf); a zero or non-finite grad gives no step."""
    grad = torch.nan_to_num(grad, nan=0.0, posinf=0.0, neginf=0.0)
    dims = tuple(range(1, grad.dim()))
    scale = grad.abs().amax(dim=dims, keepdim=True).clamp_min(torch.finfo(grad.dtype).tiny)
    return grad / scale


def adversarial_noise(forward: Callable[[list[torch.Tensor]], torch.Tensor],
                       embeds: list[torch.Tensor], side: int, target: torch.Tensor, kind: str,
                       epsilon: float, step_size: float, steps: int) -> torch.Tensor:
    """Perturbation of embeds[side] that (approximately) maximises l_s, other sides clean."""
    # The search trains nothing: inputs are detached and only the noise is differentiated,
    # so no .grad lands on parameters and the embedding graph is not extended.
    base = [e.detach() for e in embeds]
    noise = torch.randn_like(base[side]) * epsilon
    for _ in range(steps):
        noise.requires_grad_(True)
        inputs = list(base)
        inputs[side] = base[side] + noise
        loss = divergence(kind, forward(inputs), target).sum()  # sum: per-example grads
        (grad,) = torch.autograd.grad(loss, noise)
        noise = (noise + step_size * _normalise(grad)).detach()
    return noise


def smart_loss(forward: Callable[[list[torch.Tensor]], torch.Tensor], embeds: list[torch.Tensor],
               logits: torch.Tensor, kind: str, epsilon: float = 1e-5, step_size: float = 1e-3,
               steps: int = 1) -> torch.Tensor:
    """R_s at the adversarial perturbation, averaged over the batch; a scalar.

    `embeds`: embedding outputs, one (B, T, H) tensor per encoder pass (one for a single
    sentence or a cross-encoded pair, two for a bi-encoded pair). `forward(embeds)` must give
    logits shaped like `logits`, the clean logits of the same batch. Gradients flow to the
    model through `forward` and through `embeds`; the clean logits are a fixed target
    (detached), as SMART treats f(x; theta) in the adversarial term.
    """
    if kind not in KINDS:
        raise ValueError(f"SMART: unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
    if not embeds:
        raise ValueError("SMART: got no embeddings to perturb")
    if steps < 0:
        raise ValueError(f"SMART: steps must be >= 0, got {steps}")
    target = logits.detach()
    # Each side is searched on its own (freeze-your-layers.txt 3.3), so the ascent costs one
    # forward per side per step. The two searches are independent, so the joint point
    # (x~, y~) is not itself a maximiser; the paper accepts that and so do we.
    noises = [adversarial_noise(forward, embeds, side, target, kind, epsilon, step_size, steps)
              for side in range(len(embeds))]
    perturbed = forward([e + n for e, n in zip(embeds, noises)])
    return divergence(kind, perturbed, target).mean()
