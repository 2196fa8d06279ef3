"""Loss weighting methods, chosen by `loss.weighting`: one small file per method behind the
interface in base.py, one line per method in the registry below.

A new method is a Weighting subclass in its own module, with its settings beside it (a
`Settings` dataclass, see cagrad.py), plus one registry line; from outside the package (a
module named in the config's `plugins:`), that line is `register_weighting(MyMethod)`, and
its settings are config keys at once: `loss.weighting: {name: mymethod, strength: 0.3}`.

A method that works on per-task gradients subclasses GradientWeighting (base.py), which
gathers them (task_gradients) and counts their cost, and gives only its `coefficients`; one
whose solver is a TorchJD weighting subclasses TorchJDWeighting (torchjd.py) and names it.
docs/weighting.md lists every method, its settings, where it comes from and what it costs.
"""
from __future__ import annotations

import torch

from mtbert.components import WEIGHTINGS
from mtbert.train.weighting.aligned_mtl import AlignedMTL
from mtbert.train.weighting.base import (GradientWeighting, StepCost, TaskGradients, Weighting, WeightingError,
                                         task_gradients)
from mtbert.train.weighting.cagrad import CAGrad
from mtbert.train.weighting.dualproj import DualProj
from mtbert.train.weighting.dwa import DWA
from mtbert.train.weighting.famo import FAMO
from mtbert.train.weighting.gradnorm import GradNorm
from mtbert.train.weighting.imtl_g import IMTLG
from mtbert.train.weighting.mgda import MGDA
from mtbert.train.weighting.nash_mtl import NashMTL
from mtbert.train.weighting.pcgrad import PCGrad
from mtbert.train.weighting.static import Static
from mtbert.train.weighting.torchjd import TorchJDWeighting
from mtbert.train.weighting.uncertainty import Uncertainty
from mtbert.train.weighting.upgrad import UPGrad


def register_weighting(cls: type[Weighting]) -> type[Weighting]:
    return WEIGHTINGS.register(cls)


for _method in (Static, Uncertainty, GradNorm, DWA, FAMO, CAGrad, PCGrad,
                UPGrad, NashMTL, AlignedMTL, IMTLG, MGDA, DualProj):
    register_weighting(_method)


def make_weighting(cfg, device: torch.device | str = "cpu") -> Weighting:
    """The method of `loss.weighting`, for one run (the config is validated: the name is known)."""
    return WEIGHTINGS[cfg.loss.weighting.name](cfg, torch.device(device))


__all__ = ["WEIGHTINGS", "GradientWeighting", "StepCost", "TaskGradients", "TorchJDWeighting", "Weighting",
           "WeightingError", "make_weighting", "register_weighting", "task_gradients"]
