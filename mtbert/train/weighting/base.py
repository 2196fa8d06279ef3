"""The interface every loss-weighting method implements (one small class per file)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from mtbert.components import SAMPLERS, Settings
from mtbert.errors import ConfigError

if TYPE_CHECKING:  # the config reaches the methods through mtbert.components, never the reverse
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
    # The method's own settings (`loss.weighting: {name: ..., <field>: ...}`): a subclass of
    # Settings beside the method, with its ranges in Settings.check. None by default.
    Settings = Settings

    def __init__(self, cfg: Config, device: torch.device):
        self.cfg = cfg
        self.settings = cfg.loss.weighting
        self.tasks = list(cfg.tasks)
        self.device = device

    @classmethod
    def check_config(cls, settings: Settings, key: str, cfg: Config) -> None:
        """What the method needs of the rest of the config (after its settings' own check)."""
        strategy = cfg.sampling.strategy.name
        if cls.needs_every_task and not SAMPLERS.lookup(strategy, "sampling.strategy").every_task:
            what = "" if key == "loss.pcgrad" else f" {cls.name}"
            raise ConfigError(f"{key}:{what} needs a loss for several tasks in one step; "
                              f"set sampling.strategy: tuple (got '{strategy}')")
        if cfg.loss.weights is not None and not cls.uses_fixed_weights:
            raise ConfigError(f"loss.weights: fixed weights are read by loss.weighting static or pcgrad; "
                              f"{cls.name} sets its own, so leave loss.weights null")

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
