"""train.precision: whether a run computes in bf16, and the autocast context its forwards enter.

Its own module because training (loop.py) and prediction (bundle.py) both ask, and the loop
already imports the bundle's state helpers: here neither imports the other for it.
"""
from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

import torch

from mtbert.train import measure


def use_bf16(precision: str, device: torch.device) -> bool:
    """train.precision: auto is bf16 on CUDA and on CPUs with native bf16 matmuls."""
    if precision != "auto":
        return precision == "bf16"
    return device.type == "cuda" or (device.type == "cpu" and measure.cpu_has_bf16())


def autocast_for(precision: str, device: torch.device) -> tuple[bool, Callable]:
    """(bf16?, a factory of the context every forward of the run enters): one answer for
    training, evaluation and anyone who re-evaluates a run's model the way the run did."""
    if use_bf16(precision, device):
        return True, lambda: torch.autocast(device.type, dtype=torch.bfloat16)
    return False, nullcontext
