"""DualProj (Quinton and Rey 2024, after Lopez-Paz and Ranzato's GEM), from TorchJD: the
weighted mean gradient (loss.weights when set) projected onto the dual cone of the per-task
gradients, so the step conflicts with no task."""
from __future__ import annotations

from mtbert.train.weighting.torchjd import quadprog_projector
from mtbert.train.weighting.upgrad import UPGrad


class DualProj(UPGrad):
    name = "dualproj"

    def make_weighting(self):
        from torchjd.aggregation import DualProjWeighting

        return DualProjWeighting(self.preference(), projector=quadprog_projector(self.settings))
