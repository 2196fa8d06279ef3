"""The interface every loss-weighting method implements (one small class per file)."""
from __future__ import annotations

import torch
from torch import nn

from mtbert.config import Config


class WeightingError(ValueError):
    """A weighting method cannot run on this model; the message is one readable line."""


class Weighting:
    """Turns one step's per-task losses into the update, accumulated into the parameters'
    .grad (so several micro-batches can accumulate before the optimizer steps).

    Created once per run. `losses` maps each task trained this step to its scalar loss (raw,
    unweighted; SMART's term included). `shared` are the trainable parameters several tasks
    use, for the methods that work on per-task gradients.
    """

    name = ""
    # True: the method needs a loss for several tasks in one step (sampling.strategy: tuple).
    needs_every_task = False
    # True: the method reads loss.weights; the others set their own weights.
    uses_fixed_weights = False

    def __init__(self, cfg: Config, device: torch.device):
        self.cfg = cfg
        self.tasks = list(cfg.tasks)
        self.device = device

    def backward(self, losses: dict[str, torch.Tensor], shared: list[nn.Parameter]) -> dict[str, torch.Tensor]:
        """Backward pass of this step; returns the effective weight of each task in `losses`
        (0-dim tensors, left on the device so that no step waits for a host sync)."""
        raise NotImplementedError

    def parameters(self) -> list[nn.Parameter]:
        """Learned parameters the run's optimizer should train with the model."""
        return []

    def end_epoch(self, mean_losses: dict[str, float]) -> None:
        """Called after each epoch with each task's mean training loss over it."""

    def state_dict(self) -> dict:
        """What a checkpoint must carry to resume the method where it was."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
