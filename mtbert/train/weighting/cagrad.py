"""CAGrad (Liu, Liu, Jin, Stone and Liu 2021, "Conflict-averse gradient descent for
multi-task learning", eq. 2 and its dual, with the authors' rescaling).

On the shared parameters, with per-task gradients g_i and their mean g0, CAGrad steps along
the d within ||d - g0|| <= c ||g0|| that maximises the worst task's improvement min_i g_i.d.
Its dual is a T-dimensional problem over the simplex:

    w* = argmin_w  g_w . g0 + c ||g0|| ||g_w||,      g_w = sum_i w_i g_i
    d  = (g0 + c ||g0|| / ||g_w*|| g_w*) / (1 + c^2)

so d is a combination of the g_i, found from their T x T Gram matrix alone. c = 0 gives the
mean gradient. Every other parameter gets the gradient of the mean loss, so at c = 0 the
whole step is static equal weighting's.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mtbert.components import require
from mtbert.train.pcgrad import _accumulate, _graph_leaves
from mtbert.train.weighting.base import Weighting, WeightingError


def cagrad_coefficients(gram: np.ndarray, c: float) -> np.ndarray:
    """Coefficients a with d = sum_i a_i g_i (before the 1 / (1 + c^2) rescaling), from the
    Gram matrix of the g_i. The simplex problem is solved as in the authors' code (SLSQP)."""
    from scipy.optimize import minimize

    num = gram.shape[0]
    mean = np.full(num, 1.0 / num)
    g0_norm = float(np.sqrt(max(mean @ gram @ mean, 0.0)))
    if c == 0 or g0_norm == 0:
        return mean
    radius = c * g0_norm
    gram_mean = gram @ mean

    def objective(w: np.ndarray) -> float:
        return float(w @ gram_mean + radius * np.sqrt(max(w @ gram @ w, 0.0) + 1e-12))

    res = minimize(objective, mean, bounds=[(0.0, 1.0)] * num,
                   constraints=({"type": "eq", "fun": lambda w: 1.0 - w.sum()},))
    w = np.clip(res.x, 0.0, None)
    gw_norm = float(np.sqrt(max(w @ gram @ w, 0.0)))
    return mean + (radius / gw_norm) * w if gw_norm > 0 else mean


class CAGrad(Weighting):
    name = "cagrad"
    needs_every_task = True

    @dataclass
    class Settings(Weighting.Settings):
        c: float = 0.4  # radius of the ball around the mean gradient; 0 = the mean gradient

        def check(self, key):
            require(self.c >= 0, f"{key}.c: must be >= 0, got {self.c}")

    def __init__(self, cfg, device):
        super().__init__(cfg, device)
        self.c = self.settings.c

    def backward(self, losses, shared):
        values = list(losses.values())
        num = len(values)
        leaves = _graph_leaves(values)
        reached = {id(p) for p in leaves}
        shared = list({id(p): p for p in shared if id(p) in reached}.values())
        if not shared:
            raise WeightingError("loss.weighting: cagrad needs trainable shared parameters (the encoder is "
                                 "frozen or not shared); choose another method")
        shared_ids = {id(p) for p in shared}
        others = [p for p in leaves if id(p) not in shared_ids]
        sizes = [p.numel() for p in shared]
        flat = torch.zeros((num, sum(sizes)), dtype=torch.float32, device=shared[0].device)
        other_sum: list[torch.Tensor | None] = [None] * len(others)
        for t, loss in enumerate(values):
            grads = torch.autograd.grad(loss, shared + others, retain_graph=t < num - 1, allow_unused=True)
            for p_grad, chunk in zip(grads[:len(shared)], flat[t].split(sizes)):
                if p_grad is not None:
                    chunk.copy_(p_grad.reshape(-1))
            for k, p_grad in enumerate(grads[len(shared):]):
                if p_grad is not None:
                    other_sum[k] = p_grad / num if other_sum[k] is None else other_sum[k] + p_grad / num
        gram = (flat @ flat.T).double().cpu().numpy()  # T x T: the one host sync of the step
        coeffs = torch.tensor(cagrad_coefficients(gram, self.c) / (1 + self.c ** 2),
                              dtype=flat.dtype, device=flat.device)
        for p, chunk in zip(shared, (coeffs @ flat).split(sizes)):
            _accumulate(p, chunk.view_as(p).to(p.dtype))
        for p, p_grad in zip(others, other_sum):
            if p_grad is not None:
                _accumulate(p, p_grad)
        # The weight each task's gradient gets on the shared parameters (1/T each at c = 0).
        return dict(zip(losses, coeffs))
