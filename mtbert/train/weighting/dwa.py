"""Dynamic weight average (Liu, Johns and Davison 2019, "End-to-end multi-task learning with
attention", eq. 7).

    w_i(t-1) = L_i(t-1) / L_i(t-2)                         (ratio of epoch-mean losses)
    lambda_i(t) = K exp(w_i(t-1) / T) / sum_k exp(w_k(t-1) / T)

with K tasks and temperature T (loss.weighting.temperature): a task whose loss fell least in the
last epoch weighs most. The first two epochs have no ratio yet: every weight is 1. Weights
are constant within an epoch and sum to K, as in the paper.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from mtbert.components import require
from mtbert.train.weighting.base import Weighting


class DWA(Weighting):
    name = "dwa"

    @dataclass
    class Settings(Weighting.Settings):
        temperature: float = 2.0  # softness of the softmax over loss ratios (paper: 2)

        def check(self, key):
            require(self.temperature > 0, f"{key}.temperature: must be > 0, got {self.temperature}")

    def __init__(self, cfg, device):
        super().__init__(cfg, device)
        self.temperature = self.settings.temperature
        self.history: list[list[float]] = []  # epoch-mean loss per task, last two epochs
        self.weights = torch.ones(len(self.tasks), device=device)

    def backward(self, losses, shared):
        index = [self.tasks.index(t) for t in losses]
        w = self.weights[index]
        (w * torch.stack(list(losses.values()))).sum().backward()
        return dict(zip(losses, w))

    def end_epoch(self, mean_losses):
        self.history = (self.history + [[float(mean_losses[t]) for t in self.tasks]])[-2:]
        self.weights = torch.tensor(self.epoch_weights(self.history, self.temperature), device=self.device)

    @staticmethod
    def epoch_weights(history: list[list[float]], temperature: float) -> list[float]:
        """Weights for the next epoch from the last two epochs' mean losses."""
        if len(history) < 2:
            return [1.0] * len(history[-1]) if history else []
        # A task not trained in an epoch (loss 0 there) keeps ratio 1 rather than dividing by 0.
        ratios = torch.tensor([cur / prev if prev > 0 and cur > 0 else 1.0
                               for prev, cur in zip(*history)], dtype=torch.float64)
        return (len(ratios) * torch.softmax(ratios / temperature, dim=0)).tolist()

    def state_dict(self):
        return {"history": self.history}

    def load_state_dict(self, state):
        self.history = [list(h) for h in state.get("history", [])]
        if self.history:
            self.weights = torch.tensor(self.epoch_weights(self.history, self.temperature), device=self.device)
