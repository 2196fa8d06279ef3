"""MGDA (Désidéri 2012; Sener and Koltun 2018, "Multi-task learning as multi-objective
optimization"), from TorchJD: the minimum-norm point of the convex hull of the per-task
gradients, found by Frank-Wolfe on their Gram matrix; its weights sum to 1."""
from __future__ import annotations

from dataclasses import dataclass

from mtbert.components import require
from mtbert.train.weighting.torchjd import TorchJDWeighting


class MGDA(TorchJDWeighting):
    name = "mgda"

    @dataclass
    class Settings(TorchJDWeighting.Settings):
        epsilon: float = 1e-3  # Frank-Wolfe stops once a step moves the weights less than this
        max_iters: int = 100  # and after this many steps at most

        def check(self, key):
            require(self.epsilon > 0, f"{key}.epsilon: must be > 0, got {self.epsilon}")
            require(self.max_iters >= 1, f"{key}.max_iters: must be >= 1, got {self.max_iters}")

    def make_weighting(self):
        from torchjd.aggregation import MGDAWeighting

        return MGDAWeighting(epsilon=self.settings.epsilon, max_iters=self.settings.max_iters)
