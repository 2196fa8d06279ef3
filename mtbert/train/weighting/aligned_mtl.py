"""Aligned-MTL (Senushkin, Patakin, Kuznetsov and Konushin 2023, "Independent component
alignment for multi-task learning", Algorithm 1), from TorchJD: the per-task gradients are
made orthogonal and equally scaled (the Gram matrix's eigen-decomposition) before the
weighted mean (loss.weights when set)."""
from __future__ import annotations

from dataclasses import dataclass

from mtbert.components import require
from mtbert.train.weighting.torchjd import TorchJDWeighting

SCALE_MODES = ("min", "median", "rmse")


class AlignedMTL(TorchJDWeighting):
    name = "aligned_mtl"
    uses_fixed_weights = True

    @dataclass
    class Settings(TorchJDWeighting.Settings):
        # The eigenvalue the aligned gradients are scaled to: the smallest (the paper's), the
        # median, or the mean ("rmse", the authors' code).
        scale_mode: str = "min"

        def check(self, key):
            require(self.scale_mode in SCALE_MODES,
                    f"{key}.scale_mode: must be one of {', '.join(SCALE_MODES)}, got '{self.scale_mode}'")

    def make_weighting(self):
        from torchjd.aggregation import AlignedMTLWeighting

        return AlignedMTLWeighting(self.preference(), scale_mode=self.settings.scale_mode)
