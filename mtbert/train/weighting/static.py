"""Fixed weights: the update follows sum_i w_i L_i, w = loss.weights (null = equal, summing to 1)."""
from __future__ import annotations

import torch

from mtbert.train.weighting.base import Weighting


class Static(Weighting):
    name = "static"
    uses_fixed_weights = True

    def __init__(self, cfg, device):
        super().__init__(cfg, device)
        self.weights = {t: cfg.loss_weight(t) for t in self.tasks}
        self._as_tensors = {t: torch.tensor(w, device=device) for t, w in self.weights.items()}

    def backward(self, losses, shared):
        torch.stack([self.weights[t] * loss for t, loss in losses.items()]).sum().backward()
        return {t: self._as_tensors[t] for t in losses}
