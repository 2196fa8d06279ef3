"""What a checkpoint must hold beyond weights for a resumed run to equal an uninterrupted one,
and the I/O of it: the resumable state written after every epoch, read back on resume, and
handed with the epoch's figures to a reporter.

A run restarted from an epoch's checkpoint rebuilds its model from the seed (which consumes
the generators differently from the original run) and then loads the weights. Dropout
masks, PCGrad's random task order and anything else drawn after that come from the Python,
numpy and torch (CPU and CUDA) generators, so those are saved at the checkpoint and put
back on resume. The samplers need no state of their own at an epoch boundary: each epoch's
task schedule and batch orders are drawn from (train.seed, epoch) alone, so the positions
saved are the next epoch and nothing else.

Mid-epoch: a run that has trained train.checkpoint_every_s since its last checkpoint writes
one between two optimizer steps (MID). Beside the above it holds where in the epoch the run
is (the step: the samplers replay the epoch's draws up to it, drawing nothing from the
generators), the epoch's running sums and step-loss points so far, and the epoch's starting
time and FLOP count. A run with a reporter (a sweep trial, whose epoch checkpoints are
Tune's) keeps it in its output folder's mid/, and a restart continues from it where it
continues the same epochs as the checkpoint it was handed; `mtbert train --output` keeps it
as its last/ state, which `--resume` reads.
"""
from __future__ import annotations

import os
import random
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from mtbert.bundle import load_stored, save_atomic, stored_state
from mtbert.outputs import remove_path

CHECKPOINT_STATE = "state.pt"  # the resumable state in a checkpoint folder (and in `mtbert train --output`)
MID = "mid"  # in a state: where inside an epoch it was written (absent at an epoch's end)
MID_DIR = "mid"  # a reporting run's mid-epoch state, in its output folder


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


# --------------------------------------------------------------------------- the state's I/O

def training_state(model, reference: dict | None, optimizer, scheduler, weighting, history: list[dict],
                   train_time: float, epoch: int, final: bool = False) -> dict:
    """Everything a resume needs to continue as if never stopped. The model's frozen tensors
    are named by `reference` when a pretrained model holds them (mtbert/bundle.py). `final`: a
    sweep trial's last checkpoint, from which a resume trains no epoch: history and counters
    only, without the model and optimizer (about three times the model's size on the disk of
    every finished trial; best/ travels beside it)."""
    state = {"history": history, "train_time_s": train_time, "epoch": epoch, "rng": capture_rng(),
             "sampler": sampler_position(epoch)}
    if final:
        state["final"] = True
    else:
        state.update({"model": stored_state(model, reference), "frozen": reference,
                      "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                      "weighting": weighting.state_dict()})
    return state


def save_last(state: dict, out_dir: Path) -> None:
    """`mtbert train --output`'s resumable state, out_dir/last/CHECKPOINT_STATE, replaced by a rename:
    a run killed while writing it keeps the previous epoch's."""
    (out_dir / "last").mkdir(parents=True, exist_ok=True)
    save_atomic(state, out_dir / "last" / CHECKPOINT_STATE)


def read_state(path: Path, device) -> dict:
    """The resumable state at `path`, or CheckpointUnreadable naming it: a file a kill cut
    short fails inside torch's reader (a zip without its directory, a pickle ending early)
    with a message that names neither the file nor what to do."""
    from mtbert.errors import CheckpointUnreadable, first_line

    try:
        state = torch.load(path, map_location=device, weights_only=False)
    except Exception as exc:  # noqa: BLE001 - whatever the reader raises, the file is unreadable
        # torch's own message goes on for lines about other causes: its first sentence.
        first = first_line(exc, 200, sentence=True)
        raise CheckpointUnreadable(f"{path}: unreadable ({type(exc).__name__}: {first})") from exc
    if not isinstance(state, dict) or "epoch" not in state:
        raise CheckpointUnreadable(f"{path}: unreadable (not a training state)")
    return state


def load_training_state(folder: Path, device, model, optimizer, scheduler, weighting, source: str) -> dict:
    """The state in `folder` (a checkpoint, or `--output`'s last/) read, and what it holds of the
    model, optimizer, LR scheduler and loss weighting loaded into them; `source` is the
    model.name_or_path whose weights the frozen tensors must be. Returns the state, whose
    history, counters and RNG states the caller continues from."""
    path = folder / CHECKPOINT_STATE
    state = read_state(path, device)
    load_state_into(state, path, model, optimizer, scheduler, weighting, source)
    return state


def load_state_into(state: dict, path: Path, model, optimizer, scheduler, weighting, source: str) -> None:
    """What `state` (read from `path`) holds of the model, optimizer, LR scheduler and loss
    weighting, loaded into them."""
    if not state.get("final"):  # a finished run's state has no weights: no epoch is left to train
        load_stored(model, state["model"], state.get("frozen"), path, source,
                    "give model.name_or_path the weights the run started from, or train afresh")
        optimizer.load_state_dict(state["optimizer"])
        if "scheduler" in state:  # the resumed run continues on the same LR curve
            scheduler.load_state_dict(state["scheduler"])
        weighting.load_state_dict(state.get("weighting", {}))


def config_digest(config: dict) -> str:
    """Names a run's config in its mid-epoch state: a state of another config is not continued."""
    import hashlib
    import json

    return hashlib.blake2b(json.dumps(config, sort_keys=True, default=str).encode(), digest_size=16).hexdigest()


def read_mid(folder: Path, epochs_done: int, digest: str, device) -> dict | None:
    """The mid-epoch state in `folder` where it continues a run of this config from
    `epochs_done` finished epochs (the checkpoint a restart was handed, 0 for none); else None:
    one of an earlier epoch, another config, or a file a kill cut short."""
    from mtbert.errors import CheckpointUnreadable

    path = folder / CHECKPOINT_STATE
    if not path.is_file():
        return None
    try:
        state = read_state(path, device)
    except CheckpointUnreadable:
        return None
    mid = state.get(MID)
    return state if mid and state["epoch"] == epochs_done and mid.get("config") == digest else None


def save_mid(state: dict, folder: Path) -> None:
    """A mid-epoch state, replacing the one before by a rename."""
    folder.mkdir(parents=True, exist_ok=True)
    save_atomic(state, folder / CHECKPOINT_STATE)


def take_best(kept: Path, best: Path) -> None:
    """A resumed run continues from its checkpoint's best/, not from whatever its folder holds:
    another node's trial folder has none, and after a stop the trainable left there a link into
    the checkpoint, which a save must not write through (orchestration/run/trainable.py)."""
    remove_path(best)
    shutil.copytree(kept, best)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem, or one without hard links
        shutil.copy2(src, dst)


def report_epoch(reporter: Callable[[dict, str | None], None], metrics: dict, state: dict | None, config_text: str,
           out_dir: Path | None, phase, train_s: float) -> None:
    """Hand `reporter` an epoch's metrics (with the phase timings so far) and, when there is a
    `state`, a checkpoint folder holding it. `config_text`: the run's config as YAML, kept in
    the checkpoint. `phase` (measure.Phases): checkpoint for the folder written here, report
    for the reporter's own time (in a sweep: Tune persisting the folder and handing the report
    to the driver)."""
    if state is None:
        with phase("report"):
            reporter({**metrics, "timings": phase.snapshot(train_s)}, None)
        return
    # In the run's folder, not the machine's temp: a sweep trial stopped inside the reporter
    # may never delete it, and there the driver does (orchestration/run/trainable.py).
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".checkpoint-" if out_dir is not None else "mtbert-checkpoint-", dir=out_dir))
    try:
        with phase("checkpoint"):
            torch.save(state, tmp / CHECKPOINT_STATE)
            (tmp / "config.yaml").write_text(config_text)
            # The best epoch's bundle travels with the checkpoint into the sweep's storage, where
            # the driver logs it to MLflow. Linked, not copied, where the folder allows: the
            # reporter copies what it keeps, and save_bundle replaces files by a rename, never
            # writing through a link.
            if out_dir is not None and (out_dir / "best").is_dir():
                shutil.copytree(out_dir / "best", tmp / "best", copy_function=_link_or_copy)
        with phase("report"):  # the reporter persists the folder if it wants it
            reporter({**metrics, "timings": phase.snapshot(train_s)}, str(tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
