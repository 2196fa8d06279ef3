"""train.precision: whether a run computes in bf16, TF32 or fp32, and the autocast context its
forwards enter.

Its own module because training (loop.py) and prediction (bundle.py) both ask, and the loop
already imports the bundle's state helpers: here neither imports the other for it.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext

import torch

from mtbert.train import measure

try:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    # Attention kernels that take any shape without planning for it (see _cuda_bf16).
    ANY_SHAPE = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
except ImportError:  # torch before 2.3 has neither the choice nor cuDNN's kernel
    ANY_SHAPE = None

    def sdpa_kernel(_backends):
        return nullcontext()


def use_bf16(precision: str, device: torch.device) -> bool:
    """train.precision: auto is bf16 on CUDA and on CPUs with native bf16 matmuls."""
    if precision != "auto":
        return precision == "bf16"
    return device.type == "cuda" or (device.type == "cpu" and measure.cpu_has_bf16())


def label(precision: str, device: torch.device) -> str:
    """What a run of `precision` on `device` computes in: bf16, tf32 or fp32. TF32 exists only
    on CUDA (Ampere and later); asked for elsewhere, the run is plain fp32 and says so here."""
    if use_bf16(precision, device):
        return "bf16"
    return "tf32" if precision == "tf32" and device.type == "cuda" else "fp32"


@contextmanager
def matmul_precision(precision: str, device: torch.device) -> Iterator[None]:
    """The span of a run whose fp32 matmuls may use TF32 tensor cores (train.precision: tf32).
    It covers the backward passes too, which run outside the forwards' autocast. A sweep worker
    runs trials one after another, so the process's setting is restored after each."""
    if label(precision, device) != "tf32":
        yield
        return
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")  # TF32 on CUDA: 10-bit mantissa products, fp32 sums
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def autocast_for(precision: str, device: torch.device) -> tuple[bool, Callable]:
    """(bf16?, a factory of the context every forward of the run enters): one answer for
    training, evaluation and anyone who re-evaluates a run's model the way the run did."""
    if not use_bf16(precision, device):
        return False, nullcontext
    if device.type == "cuda":
        return True, _cuda_bf16
    return True, lambda: torch.autocast(device.type, dtype=torch.bfloat16)


@contextmanager
def _cuda_bf16() -> Iterator[None]:
    """bf16 autocast on CUDA, with attention kept off cuDNN's kernel. For bf16 on Hopper that
    is scaled_dot_product_attention's first choice, and it plans anew for every shape it has
    not seen: here every step's batch has its own longest row, so it planned at every call,
    3-5 ms of host time each. The flash and memory-efficient kernels take any shape: with them
    the bf16 step ran 1.7-3.2x faster on an H200 on CS224N's rows, and 3-4% slower where every
    row is 128 tokens and cuDNN plans once (docs/benchmarks.md)."""
    with torch.autocast("cuda", dtype=torch.bfloat16), sdpa_kernel(ANY_SHAPE):
        yield

