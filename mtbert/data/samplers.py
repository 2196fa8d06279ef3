"""Task sampling: which task(s) each training step sees, and endless batches per task.

Strategies (config `sampling.strategy`):
  round_robin   tasks in turn; every task gets the same number of steps (to within one)
  proportional  one task per step, p_i = N_i / sum_j N_j
  annealed      one task per step, p_i ∝ N_i^alpha, alpha = 1 - 0.8 (e-1)/(E-1)
                (pals-annealed-sampling.txt, eq. 3-4): proportional in the first epoch,
                near uniform in the last
  uniform       one task per step, p_i = 1/T
  tuple         every task at every step (one batch of each, losses combined)
  temperature   one task per step, p_i ∝ min(N_i, cap)^(1/T) (jiant's temperature sampling;
                `sampling.temperature` T, `sampling.size_cap` cap): T = 1 is proportional,
                T -> infinity uniform
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from mtbert.errors import ConfigError

STRATEGIES = ("round_robin", "proportional", "annealed", "uniform", "tuple", "temperature")


class SamplingError(ValueError):
    """Bad sampling arguments; the message names the config key."""


@dataclass
class SamplingConfig:
    """The `sampling:` keys, checked here beside the strategies that read them."""
    strategy: Literal["round_robin", "proportional", "annealed", "uniform", "tuple", "temperature"] = "round_robin"
    steps_per_epoch: int | None = None  # null = one pass over the largest task (tuple) / all tasks
    # temperature strategy (jiant's): p_i ∝ N_i^(1/T); T = 1 is proportional, large T near uniform.
    temperature: float = 2.0
    # temperature strategy: N_i counted as min(N_i, size_cap), so one huge task (Quora) cannot
    # take nearly every step; null = no cap.
    size_cap: int | None = None

    def check(self) -> None:
        if not self.temperature > 0:
            raise ConfigError(f"sampling.temperature: must be > 0, got {self.temperature}")
        if self.size_cap is not None and self.size_cap <= 0:
            raise ConfigError("sampling.size_cap: must be > 0 (or null)")
        if self.steps_per_epoch is not None and self.steps_per_epoch <= 0:
            raise ConfigError("sampling.steps_per_epoch: must be > 0 (or null)")


def annealed_alpha(epoch: int, epochs: int) -> float:
    """pals-annealed-sampling.txt eq. 4, with e 1-based; a single epoch keeps alpha = 1."""
    if epochs == 1:
        return 1.0
    return 1.0 - 0.8 * (epoch - 1) / (epochs - 1)


def _check(strategy: str, sizes: dict[str, int], epoch: int, epochs: int) -> None:
    if strategy not in STRATEGIES:
        raise SamplingError(f"sampling.strategy: unknown '{strategy}' (expected one of {', '.join(STRATEGIES)})")
    if not sizes:
        raise SamplingError("tasks: no tasks to sample")
    if any(n <= 0 for n in sizes.values()):
        raise SamplingError(f"sampling: every task needs training examples, got sizes {sizes}")
    if not 1 <= epoch <= epochs:
        raise SamplingError(f"sampling: epoch must be in 1..{epochs} (1-based), got {epoch}")


def task_probabilities(strategy: str, sizes: dict[str, int], epoch: int, epochs: int,
                       temperature: float = 1.0, size_cap: int | None = None) -> dict[str, float]:
    """Probability that a step trains each task (tuple: 1.0 each, all tasks every step)."""
    _check(strategy, sizes, epoch, epochs)
    if strategy == "temperature":
        if not temperature > 0:
            raise SamplingError(f"sampling.temperature: must be > 0, got {temperature}")
        capped = {t: min(n, size_cap) if size_cap else n for t, n in sizes.items()}
        weights = {t: float(n) ** (1.0 / temperature) for t, n in capped.items()}
        total = sum(weights.values())
        return {t: w / total for t, w in weights.items()}
    if strategy == "tuple":
        return {t: 1.0 for t in sizes}
    if strategy in ("round_robin", "uniform"):
        return {t: 1.0 / len(sizes) for t in sizes}
    alpha = 1.0 if strategy == "proportional" else annealed_alpha(epoch, epochs)
    weights = {t: float(n) ** alpha for t, n in sizes.items()}
    total = sum(weights.values())
    return {t: w / total for t, w in weights.items()}


def task_schedule(strategy: str, sizes: dict[str, int], epoch: int, epochs: int, steps: int,
                  seed: int, temperature: float = 1.0, size_cap: int | None = None) -> list[list[str]]:
    """The tasks trained at each of `steps` steps of one epoch (1-based `epoch`)."""
    probs = task_probabilities(strategy, sizes, epoch, epochs, temperature, size_cap)
    tasks = list(sizes)
    if strategy == "tuple":
        return [list(tasks) for _ in range(steps)]
    if strategy == "round_robin":
        # Continue the cycle across epochs, so when steps % T != 0 the first tasks do not
        # get the extra turns every epoch.
        start = (epoch - 1) * steps
        return [[tasks[(start + s) % len(tasks)]] for s in range(steps)]
    rng = np.random.default_rng([seed, epoch])
    draws = rng.choice(len(tasks), size=steps, p=[probs[t] for t in tasks])
    return [[tasks[i]] for i in draws]


class TaskBatches:
    """Endless batches of one task's example indices: each pass is a fresh seeded shuffle.

    A batch never spans two passes, so every pass shows each example exactly once; the last
    batch of a pass is smaller when batch_size does not divide n.
    """

    def __init__(self, n: int, batch_size: int, seed: int):
        if n <= 0 or batch_size <= 0:
            raise SamplingError(f"TaskBatches: need n > 0 and batch_size > 0, got {n}, {batch_size}")
        self.n, self.batch_size = n, batch_size
        self.passes = 0  # completed passes over the data
        self._rng = np.random.default_rng(seed)
        self._order: list[int] = []
        self._pos = 0

    def next(self) -> list[int]:
        if self._pos >= len(self._order):
            if self._order:
                self.passes += 1
            self._order = self._rng.permutation(self.n).tolist()
            self._pos = 0
        batch = self._order[self._pos:self._pos + self.batch_size]
        self._pos += len(batch)
        return batch
