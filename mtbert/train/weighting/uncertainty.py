"""Uncertainty weighting (Kendall, Gal and Cipolla 2018, "Multi-task learning using
uncertainty to weigh losses").

One learned log-variance s_i per task, trained with the model:

    L = sum_i exp(-s_i) L_i + s_i

(the form LibMTL and most reimplementations use for classification and regression alike).
The weight of task i is exp(-s_i); the + s_i term stops every s_i from running to infinity,
and at its optimum exp(-s_i) = 1 / L_i: tasks with a larger loss get a smaller weight.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from mtbert.train.weighting.base import Weighting


class Uncertainty(Weighting):
    name = "uncertainty"

    @dataclass
    class Settings(Weighting.Settings):
        init: float = 0.0  # s_i at the start; 0 = every weight 1

    def __init__(self, cfg, device):
        super().__init__(cfg, device)
        self.log_vars = nn.Parameter(torch.full((len(self.tasks),), float(self.settings.init),
                                                device=device))

    def backward(self, losses, shared):
        index = [self.tasks.index(t) for t in losses]
        s = self.log_vars[index]
        # Only the tasks trained this step: with one task per step, each s_i sees its own batches.
        (torch.exp(-s) * torch.stack(list(losses.values())) + s).sum().backward()
        weights = torch.exp(-s.detach())
        return dict(zip(losses, weights))

    def parameters(self):
        return [self.log_vars]

    def state_dict(self):
        return {"log_vars": self.log_vars.detach().clone()}

    def load_state_dict(self, state):
        with torch.no_grad():
            self.log_vars.copy_(state["log_vars"])
