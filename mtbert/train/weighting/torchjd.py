"""The methods whose step comes from an aggregator of TorchJD (the `torchjd` package,
Jacobian descent; https://torchjd.org): each is a small class beside this one that says which
TorchJD weighting to build from its settings. TorchJD's weightings read the Gram matrix of
the per-task gradients, which GradientWeighting gathers once, so a TorchJD method costs what
mtbert's own PCGrad and CAGrad cost: T - 1 extra backward passes through the shared layers,
the Gram matrix and the combination (base.py), plus its T x T solve.

torchjd is a dependency; a method whose solver is an optional extra of it (Nash-MTL: cvxpy)
names the missing package in one line when the config is loaded, not at the first step.
"""
from __future__ import annotations

from importlib.util import find_spec
from typing import Any

import torch

from mtbert.errors import ConfigError
from mtbert.train.weighting.base import GradientWeighting, TaskGradients


class TorchJDWeighting(GradientWeighting):
    """Shared parameters step along sum_i a_i g_i, a = the TorchJD weighting of their Gram
    matrix; the other parameters along the mean gradient (or loss.weights, for a method that
    reads them as its preference vector)."""

    # The Python packages the method's TorchJD solver needs, and the torchjd extra that brings them.
    requires: tuple[str, ...] = ("torchjd",)
    extra = ""

    @classmethod
    def check_config(cls, settings, key, cfg):
        super().check_config(settings, key, cfg)
        missing = [m for m in cls.requires if find_spec(m) is None]
        if missing:
            hint = f"torchjd[{cls.extra}]" if cls.extra else "torchjd"
            raise ConfigError(f"{key}: {cls.name} needs the package(s) {', '.join(missing)}, which are not "
                              f"installed; pip install '{hint}', or choose another method")

    def __init__(self, cfg, device):
        super().__init__(cfg, device)
        self.solver = self.make_weighting()

    def preference(self) -> torch.Tensor | None:
        """loss.weights as TorchJD's pref_vector, or None (TorchJD's default, the mean)."""
        if self.cfg.loss.weights is None:
            return None
        return torch.tensor([self.cfg.loss_weight(t) for t in self.tasks], device=self.device)

    def make_weighting(self) -> Any:
        """The TorchJD weighting (a callable from the T x T Gram matrix to T weights)."""
        raise NotImplementedError

    def coefficients(self, grads: TaskGradients, tasks: list[str]) -> torch.Tensor:
        return self.solver(grads.gram()).to(device=grads.flat.device, dtype=grads.flat.dtype)


def quadprog_projector(settings) -> Any:
    """TorchJD's dual-cone projector (UPGrad, DualProj): a small QP per task, by quadprog."""
    from torchjd.linalg import QuadprogProjector

    return QuadprogProjector(norm_eps=settings.norm_eps, reg_eps=settings.reg_eps)
