"""What a checkpoint must hold beyond weights for a resumed run to equal an uninterrupted one.

A run restarted from an epoch's checkpoint rebuilds its model from the seed (which consumes
the generators differently from the original run) and then loads the weights. Dropout
masks, PCGrad's random task order and anything else drawn after that come from the Python,
numpy and torch (CPU and CUDA) generators, so those are saved at the checkpoint and put
back on resume. The samplers need no state of their own at an epoch boundary: each epoch's
task schedule and batch orders are drawn from (train.seed, epoch) alone, so the positions
saved are the next epoch and nothing else.
"""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

STATE_FILE = "state.pt"  # the resumable state in a checkpoint folder (and in `mtbert train --output`)


def capture_rng(generator: torch.Generator | None = None) -> dict:
    """Every random generator a training step reads, as plain picklable values."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    if generator is not None:
        state["generator"] = generator.get_state()
    return state


def restore_rng(state: dict | None, generator: torch.Generator | None = None) -> bool:
    """Put back what capture_rng saved; False (nothing changed) for a checkpoint written
    before RNG states were saved, which then resumes as before: exact weights, new draws."""
    if not state:
        return False
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"].cpu() if hasattr(state["torch"], "cpu") else state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
    if generator is not None and "generator" in state:
        generator.set_state(state["generator"].cpu())
    return True


def sampler_position(epoch: int) -> dict:
    """Where the task schedule and batch orders continue: the epoch after the checkpoint."""
    return {"next_epoch": epoch + 1}


def read_state(path: Path, device) -> dict:
    """The resumable state at `path`, or CheckpointUnreadable naming it: a file a kill cut
    short fails inside torch's reader (a zip without its directory, a pickle ending early)
    with a message that names neither the file nor what to do."""
    from mtbert.errors import CheckpointUnreadable

    try:
        state = torch.load(path, map_location=device, weights_only=False)
    except Exception as exc:  # noqa: BLE001 - whatever the reader raises, the file is unreadable
        # torch's own message goes on for lines about other causes: its first sentence.
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0].split(". ")[0][:200]
        raise CheckpointUnreadable(f"{path}: unreadable ({type(exc).__name__}: {first})") from exc
    if not isinstance(state, dict) or "epoch" not in state:
        raise CheckpointUnreadable(f"{path}: unreadable (not a training state)")
    return state
