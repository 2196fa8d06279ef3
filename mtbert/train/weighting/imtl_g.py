"""IMTL-G (Liu, Li, Kuang, Xue, Chen, Yang, Liao and Zhang 2021, "Towards impartial multi-task
learning", the gradient part), from TorchJD: the weights that give the step an equal projection
on every task's unit gradient (a pseudo-inverse of the Gram matrix), summing to 1."""
from __future__ import annotations

from mtbert.train.weighting.torchjd import TorchJDWeighting


class IMTLG(TorchJDWeighting):
    name = "imtl_g"

    def make_weighting(self):
        from torchjd.aggregation import IMTLGWeighting

        return IMTLGWeighting()
