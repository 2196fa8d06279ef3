"""CAGrad (Liu, Liu, Jin, Stone and Liu 2021, "Conflict-averse gradient descent for
multi-task learning", eq. 2 and its dual, with the authors' rescaling).

On the shared parameters, with per-task gradients g_i and their mean g0, CAGrad steps along
the d within ||d - g0|| <= c ||g0|| that maximises the worst task's improvement min_i g_i.d.
Its dual is a T-dimensional problem over the simplex:

    w* = argmin_w  g_w . g0 + c ||g0|| ||g_w||,      g_w = sum_i w_i g_i
    d  = (g0 + c ||g0|| / ||g_w*|| g_w*) / (1 + c^2)

so d is a combination of the g_i, found from their T x T Gram matrix alone. c = 0 gives the
mean gradient. Every other parameter gets the gradient of the mean loss, so at c = 0 the
whole step is static equal weighting's. mtbert's own rather than TorchJD's CAGrad: its SLSQP
solve measured faster than TorchJD's cvxpy one, and needs no cvxpy (docs/weighting.md).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mtbert.components import require
from mtbert.train.weighting.base import GradientWeighting, TaskGradients


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


class CAGrad(GradientWeighting):
    name = "cagrad"

    @dataclass
    class Settings(GradientWeighting.Settings):
        c: float = 0.4  # radius of the ball around the mean gradient; 0 = the mean gradient

        def check(self, key):
            require(self.c >= 0, f"{key}.c: must be >= 0, got {self.c}")

    def __init__(self, cfg, device):
        super().__init__(cfg, device)
        self.c = self.settings.c

    def coefficients(self, grads: TaskGradients, tasks: list[str]) -> torch.Tensor:
        # The weight each task's gradient gets on the shared parameters (1/T each at c = 0).
        gram = grads.gram().double().cpu().numpy()  # T x T: the one host sync of the step
        return torch.tensor(cagrad_coefficients(gram, self.c) / (1 + self.c ** 2),
                            dtype=grads.flat.dtype, device=grads.flat.device)
