"""Task sampling: which task(s) each training step sees, and endless batches per task.

Strategies (config `sampling.strategy`), one small class each below, registered in SAMPLERS:
  round_robin   tasks in turn; every task gets the same number of steps (to within one)
  proportional  one task per step, p_i = N_i / sum_j N_j
  annealed      one task per step, p_i ∝ N_i^alpha, alpha = 1 - 0.8 (e-1)/(E-1)
                (pals-annealed-sampling.txt, eq. 3-4): proportional in the first epoch,
                near uniform in the last
  uniform       one task per step, p_i = 1/T
  tuple         every task at every step (one batch of each, losses combined)
  temperature   one task per step, p_i ∝ min(N_i, cap)^(1/T) (jiant's temperature sampling;
                `sampling.strategy: {name: temperature, temperature: T, size_cap: cap}`):
                T = 1 is proportional, T -> infinity uniform

A strategy is chosen as a component (mtbert/components.py): by name, or with its settings.
A new one is a Strategy subclass with a `name` (and a `Settings` dataclass if it has any),
registered with register_strategy, from a module named in `plugins:` as well.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

import numpy as np

from mtbert.components import SAMPLERS, Settings, require
from mtbert.errors import ConfigError


class SamplingError(ValueError):
    """Bad sampling arguments; the message names the config key."""


MAX_STEPS_PER_EPOCH = 10_000_000  # the schedule of an epoch is drawn whole, one entry per step


@dataclass
class SamplingConfig:
    """The `sampling:` keys, checked here beside the strategies that read them."""
    # A strategy below, by name (`strategy: annealed`) or with its settings
    # (`strategy: {name: temperature, temperature: 2.0}`).
    strategy: Annotated[Settings, SAMPLERS] = field(default_factory=lambda: Settings(SAMPLERS.default))
    steps_per_epoch: int | None = None  # null = one pass over the largest task (tuple) / all tasks

    def check(self, cfg) -> None:
        SAMPLERS.check(self.strategy, cfg)
        if self.steps_per_epoch is not None and self.steps_per_epoch <= 0:
            raise ConfigError("sampling.steps_per_epoch: must be > 0 (or null)")
        if self.steps_per_epoch is not None and self.steps_per_epoch > MAX_STEPS_PER_EPOCH:
            raise ConfigError(f"sampling.steps_per_epoch: must be in 1..{MAX_STEPS_PER_EPOCH:,}, "
                              f"got {self.steps_per_epoch:,}")


def annealed_alpha(epoch: int, epochs: int) -> float:
    """pals-annealed-sampling.txt eq. 4, with e 1-based; a single epoch keeps alpha = 1."""
    return 1.0 if epochs == 1 else 1.0 - 0.8 * (epoch - 1) / (epochs - 1)


class Strategy:
    """Which tasks each step of an epoch trains. Created from the strategy's settings."""

    name = ""
    # True: every task at every step, which the weighting methods that combine several tasks'
    # losses in one step need (Weighting.needs_every_task).
    every_task = False
    Settings = Settings

    def __init__(self, settings: Settings):
        self.settings = settings

    @classmethod
    def check_config(cls, settings: Settings, key: str, cfg) -> None:
        """What the strategy needs of the rest of the config (after its settings' own check)."""

    def probabilities(self, sizes: dict[str, int], epoch: int, epochs: int) -> dict[str, float]:
        """Probability that a step trains each task."""
        raise NotImplementedError

    def schedule(self, sizes: dict[str, int], epoch: int, epochs: int, steps: int, seed: int) -> list[list[str]]:
        """One task per step, drawn from `probabilities`; seeded by seed and epoch, so a resumed
        run draws the same epoch again."""
        probs, tasks = self.probabilities(sizes, epoch, epochs), list(sizes)
        draws = np.random.default_rng([seed, epoch]).choice(len(tasks), size=steps, p=[probs[t] for t in tasks])
        return [[tasks[i]] for i in draws]


class Uniform(Strategy):
    name = "uniform"

    def probabilities(self, sizes, epoch, epochs):
        return {t: 1.0 / len(sizes) for t in sizes}


class RoundRobin(Uniform):
    name = "round_robin"

    def schedule(self, sizes, epoch, epochs, steps, seed):
        # Continue the cycle across epochs, so when steps % T != 0 the first tasks do not
        # get the extra turns every epoch.
        tasks, start = list(sizes), (epoch - 1) * steps
        return [[tasks[(start + s) % len(tasks)]] for s in range(steps)]


class Tuple(Strategy):
    name = "tuple"
    every_task = True

    def probabilities(self, sizes, epoch, epochs):
        return {t: 1.0 for t in sizes}

    def schedule(self, sizes, epoch, epochs, steps, seed):
        return [list(sizes) for _ in range(steps)]


class Proportional(Strategy):
    """p_i ∝ N_i^alpha, alpha = `exponent` (1 here; annealed and temperature set their own)."""
    name = "proportional"

    def exponent(self, epoch: int, epochs: int) -> float:
        return 1.0

    def probabilities(self, sizes, epoch, epochs):
        alpha = self.exponent(epoch, epochs)
        weights = {t: float(n) ** alpha for t, n in sizes.items()}
        total = sum(weights.values())
        return {t: w / total for t, w in weights.items()}


class Annealed(Proportional):
    name = "annealed"

    def exponent(self, epoch, epochs):
        return annealed_alpha(epoch, epochs)


class Temperature(Proportional):
    name = "temperature"

    @dataclass
    class Settings(Strategy.Settings):
        # jiant's: p_i ∝ N_i^(1/T); T = 1 is proportional, large T near uniform.
        temperature: float = 2.0
        # N_i counted as min(N_i, size_cap), so one huge task (Quora) cannot take nearly every
        # step; null = no cap.
        size_cap: int | None = None

        def check(self, key):
            require(self.temperature > 0, f"{key}.temperature: must be > 0, got {self.temperature}")
            require(self.size_cap is None or self.size_cap > 0, f"{key}.size_cap: must be > 0 (or null)")

    def exponent(self, epoch, epochs):
        return 1.0 / self.settings.temperature

    def probabilities(self, sizes, epoch, epochs):
        cap = self.settings.size_cap
        return super().probabilities({t: min(n, cap) if cap else n for t, n in sizes.items()}, epoch, epochs)


def register_strategy(cls: type[Strategy]) -> type[Strategy]:
    return SAMPLERS.register(cls)


for _strategy in (RoundRobin, Proportional, Annealed, Uniform, Tuple, Temperature):
    register_strategy(_strategy)


def strategy_of(settings: Settings | str, **values) -> Strategy:
    """The strategy of `sampling.strategy` settings (a validated config's), or of a name and
    its settings as keywords, checked here."""
    if isinstance(settings, str):
        settings = SAMPLERS.lookup(settings, "sampling.strategy").Settings(name=settings, **values)
        settings.check("sampling.strategy")
    return SAMPLERS.lookup(settings.name, "sampling.strategy")(settings)


def _check(sizes: dict[str, int], epoch: int, epochs: int) -> None:
    if not sizes:
        raise SamplingError("tasks: no tasks to sample")
    if any(n <= 0 for n in sizes.values()):
        raise SamplingError(f"sampling: every task needs training examples, got sizes {sizes}")
    if not 1 <= epoch <= epochs:
        raise SamplingError(f"sampling: epoch must be in 1..{epochs} (1-based), got {epoch}")


def task_probabilities(strategy: Settings | str, sizes: dict[str, int], epoch: int, epochs: int,
                       **settings) -> dict[str, float]:
    """Probability that a step trains each task (tuple: 1.0 each, all tasks every step)."""
    sampler = strategy_of(strategy, **settings)
    _check(sizes, epoch, epochs)
    return sampler.probabilities(sizes, epoch, epochs)


def task_schedule(strategy: Settings | str, sizes: dict[str, int], epoch: int, epochs: int, steps: int,
                  seed: int, **settings) -> list[list[str]]:
    """The tasks trained at each of `steps` steps of one epoch (1-based `epoch`)."""
    sampler = strategy_of(strategy, **settings)
    _check(sizes, epoch, epochs)
    return sampler.schedule(sizes, epoch, epochs, steps, seed)


class TaskBatches:
    """Endless batches of one task's example indices: each pass is a fresh seeded shuffle.
    A batch never spans two passes, so every pass shows each example exactly once."""

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
