"""FAMO (Liu, Liu, Jin, Stone and Liu 2023, "FAMO: Fast adaptive multitask optimization",
Algorithm 1).

Task logits w (start 0) give the weights z = softmax(w). The network steps along the
z-weighted gradient of the log losses, rescaled:

    d = c sum_i z_i grad log L_i = sum_i (c z_i / L_i) grad L_i,     c = (sum_i z_i / L_i)^-1

so each task's effective weight is c z_i / L_i (they sum to 1), and one backward of the
weighted sum serves: no per-task gradient, O(1) extra memory. After the step, the logits move
so that the tasks whose log loss fell least gain weight:

    delta = J_softmax(w)^T [log L_i(before) - log L_i(after)]_i,    w <- w - beta (delta + gamma w)

(the authors' code steps w with Adam at rate beta and weight decay gamma, as here).

The loss "after" is this run's next step's loss, on the next batch, where the authors run a
second forward on the same batch after the step: that forward would cost a third of a step,
and on shuffled batches the two differences agree in expectation. With train.grad_accum > 1,
the micro-batches of one optimizer step compare at the same parameters (the change then is
batch noise with mean zero, which only slows w).
"""
from __future__ import annotations

from dataclasses import dataclass

import copy

import torch
from torch import nn

from mtbert.components import require
from mtbert.train.weighting.base import Weighting, WeightingError

# Keeps log L and 1 / L finite for a loss at exactly 0 (the authors add the same).
EPS = 1e-8


class FAMO(Weighting):
    name = "famo"
    needs_every_task = True

    @dataclass
    class Settings(Weighting.Settings):
        lr: float = 0.025  # beta: Adam rate of the task logits (paper: 0.025)
        gamma: float = 0.01  # weight decay of the logits, pulling the weights back toward equal (paper: 0.01)

        def check(self, key):
            require(self.lr > 0, f"{key}.lr: must be > 0, got {self.lr}")
            require(self.gamma >= 0, f"{key}.gamma: must be >= 0, got {self.gamma}")

    def __init__(self, cfg, device):
        super().__init__(cfg, device)
        self.logits = nn.Parameter(torch.zeros(len(self.tasks), device=device))
        # The logits have their own optimizer and are not trained by the loss: parameters() is empty.
        self.optimizer = torch.optim.Adam([self.logits], lr=self.settings.lr, weight_decay=self.settings.gamma)
        self.last_log_losses: torch.Tensor | None = None

    def backward(self, losses, shared):
        if list(losses) != self.tasks:
            raise WeightingError(f"famo: expected a loss for each of {self.tasks} in this step, got {list(losses)}")
        stacked = torch.stack(list(losses.values()))
        log_losses = (stacked.detach().float() + EPS).log()
        if self.last_log_losses is not None:
            self.update_logits(self.last_log_losses - log_losses)
        self.last_log_losses = log_losses
        with torch.no_grad():
            z = torch.softmax(self.logits, dim=0)
            scaled = z / (stacked.detach().float() + EPS)
            weights = scaled / scaled.sum()
        (weights.to(stacked.dtype) * stacked).sum().backward()
        return dict(zip(losses, weights))

    def update_logits(self, decrease: torch.Tensor) -> None:
        """One step of the logits on delta = J_softmax(w)^T decrease."""
        with torch.enable_grad():
            delta = torch.autograd.grad(torch.softmax(self.logits, dim=0), self.logits, grad_outputs=decrease)[0]
        self.optimizer.zero_grad(set_to_none=True)
        self.logits.grad = delta
        self.optimizer.step()

    def state_dict(self):
        return {"logits": self.logits.detach().clone(), "optimizer": copy.deepcopy(self.optimizer.state_dict()),
                "last_log_losses": self.last_log_losses}

    def load_state_dict(self, state):
        with torch.no_grad():
            self.logits.copy_(state["logits"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.last_log_losses = state["last_log_losses"]
