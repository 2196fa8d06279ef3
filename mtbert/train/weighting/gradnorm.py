"""GradNorm (Chen, Badrinarayanan, Lee and Rabinovich 2018, "GradNorm: gradient normalization
for adaptive loss balancing in deep multitask networks", section 3).

Weights w_i (start 1) multiply the task losses; the network steps along sum_i w_i L_i. After
each step the weights follow the gradient of

    L_grad = sum_i | G_i - mean_j(G_j) * r_i^alpha |,   G_i = || d(w_i L_i) / dW ||,
    r_i = (L_i / L_i(0)) / mean_j(L_j / L_j(0))

with the target mean_j(G_j) r_i^alpha held constant, W the last shared layer, and are then
renormalised to sum to the number of tasks. G_i = w_i ||dL_i/dW||, so dL_grad/dw_i needs no
second-order graph: the only extra work is one gradient per task on W.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from mtbert.components import require
from mtbert.train.weighting.base import StepCost, Weighting, WeightingError, graph_leaves, layer_gradients

# Adam may push a weight through zero; a floor keeps every task in the loss (and the
# weights positive, as the paper's renormalisation assumes).
MIN_WEIGHT = 1e-3


class GradNorm(Weighting):
    name = "gradnorm"
    needs_every_task = True

    @dataclass
    class Settings(Weighting.Settings):
        # How hard the weights pull toward equal gradient norms, faster for the tasks whose
        # loss falls slower (paper: 0.12 to 3).
        alpha: float = 1.5
        lr: float = 0.025  # Adam rate of the weights themselves (they have their own optimizer)

        def check(self, key):
            require(self.alpha >= 0, f"{key}.alpha: must be >= 0, got {self.alpha}")
            require(self.lr > 0, f"{key}.lr: must be > 0, got {self.lr}")

    def __init__(self, cfg, device):
        super().__init__(cfg, device)
        self.alpha = self.settings.alpha
        self.weights = nn.Parameter(torch.ones(len(self.tasks), device=device))
        # The weights have their own optimizer: the model's (a BERT fine-tuning rate, ~1e-5)
        # would barely move them.
        self.optimizer = torch.optim.Adam([self.weights], lr=self.settings.lr)
        self.initial_losses: torch.Tensor | None = None
        self._layer: int | None = None  # index into `shared` of W
        self._layer_numel = 0
        self.last_cost = StepCost()

    def last_shared_layer(self, losses: list[torch.Tensor], shared: list[nn.Parameter]) -> nn.Parameter:
        """W: the last weight matrix in `shared` (the model lists them bottom to top) that every
        task's loss reaches. Chosen once: the graph's shape does not change between steps."""
        if self._layer is None:
            reached = [{id(p) for p in graph_leaves([loss])} for loss in losses]
            candidates = [i for i, p in enumerate(shared) if p.ndim >= 2 and all(id(p) in r for r in reached)]
            if not candidates:
                raise WeightingError("loss.weighting: gradnorm needs a trainable shared weight matrix that every "
                                     "task uses (the encoder is frozen or not shared); choose another method")
            self._layer = candidates[-1]
        return shared[self._layer]

    def backward(self, losses, shared):
        if list(losses) != self.tasks:
            raise WeightingError(f"gradnorm: expected a loss for each of {self.tasks} in this step, "
                                 f"got {list(losses)}")
        stacked = torch.stack(list(losses.values()))
        layer = self.last_shared_layer(list(losses.values()), shared)
        norms = layer_gradients(list(losses.values()), layer).norm(dim=1).detach()
        # T passes from each loss down to W, on top of the step's own backward (extra_flops).
        self.last_cost = StepCost(len(losses), 2 * len(losses) * layer.numel())
        self._layer_numel = layer.numel()
        w = self.weights.detach().clone()
        (w * stacked).sum().backward()

        values = stacked.detach()
        if self.initial_losses is None:
            self.initial_losses = values.clone().clamp_min(torch.finfo(values.dtype).tiny)
        ratios = values / self.initial_losses
        target = ((self.weights.detach() * norms).mean() * (ratios / ratios.mean()) ** self.alpha).detach()
        grad_loss = (self.weights * norms - target).abs().sum()
        self.optimizer.zero_grad(set_to_none=True)
        self.weights.grad = torch.autograd.grad(grad_loss, self.weights)[0]
        self.optimizer.step()
        with torch.no_grad():
            self.weights.clamp_(min=MIN_WEIGHT)
            self.weights.mul_(len(self.tasks) / self.weights.sum())
        return dict(zip(losses, w))

    def extra_flops(self, model, packed, device, start):
        """Each of the T passes computes W's weight gradient over every packed row (2 x its
        size per position) and runs back to it through the task's own layers and head, input
        gradients only (half a backward's 4 x there, a third of the head's 6 x)."""
        cost, self.last_cost = self.last_cost, StepCost()
        if not cost.extra_backward:
            return 0
        weight_grads = cost.extra_backward * 2 * self._layer_numel * model.shared_positions(packed, device)
        return (weight_grads + model.private_backward_flops(packed, device, start) // 2
                + model.head_flops(packed) // 3 + cost.solve_flops)

    def state_dict(self):
        return {"weights": self.weights.detach().clone(), "optimizer": self.optimizer.state_dict(),
                "initial_losses": self.initial_losses}

    def load_state_dict(self, state):
        with torch.no_grad():
            self.weights.copy_(state["weights"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.initial_losses = state["initial_losses"]
