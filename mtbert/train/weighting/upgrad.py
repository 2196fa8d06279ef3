"""UPGrad (Quinton and Rey 2024, "Jacobian descent for multi-objective optimization"), from
TorchJD: each task's gradient is projected onto the dual cone of all of them (so the step
conflicts with no task), and the projections are averaged, weighted by loss.weights when set
(TorchJD's preference vector)."""
from __future__ import annotations

from dataclasses import dataclass

from mtbert.components import require
from mtbert.train.weighting.torchjd import TorchJDWeighting, quadprog_projector


class UPGrad(TorchJDWeighting):
    name = "upgrad"
    uses_fixed_weights = True
    requires = ("torchjd", "quadprog", "qpsolvers")
    extra = "quadprog-projector"

    @dataclass
    class Settings(TorchJDWeighting.Settings):
        norm_eps: float = 1e-4  # keeps the normalised Gram matrix finite when every gradient is ~0
        reg_eps: float = 1e-4  # added to its diagonal so the QP stays positive definite

        def check(self, key):
            require(self.norm_eps >= 0, f"{key}.norm_eps: must be >= 0, got {self.norm_eps}")
            require(self.reg_eps >= 0, f"{key}.reg_eps: must be >= 0, got {self.reg_eps}")

    def make_weighting(self):
        from torchjd.aggregation import UPGradWeighting

        return UPGradWeighting(self.preference(), projector=quadprog_projector(self.settings))
