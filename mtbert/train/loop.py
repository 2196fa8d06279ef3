"""The core training function: one configuration, trained and measured, top to bottom.

It knows nothing of Ray or MLflow. After each epoch it evaluates on dev and calls
`reporter(metrics, checkpoint_dir)`; the orchestrator turns that into Tune reports and
MLflow metrics, `mtbert train` into log lines.

train() reads as the run goes: the setup phases (_setup: data, model, probe, frozen-layer
cache, optimizer), the ledger of the epochs so far (fresh, or read back from a checkpoint by
mtbert/train/state.py), then per epoch _epoch (its steps and its figures) and what the epoch
leaves (_Outputs: best/, the resumable state, the report).
"""
from __future__ import annotations

import copy
import functools
import json
import math
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
import torch
import yaml

from mtbert import figures
from mtbert.bundle import frozen_reference, save_bundle
from mtbert.config import Config, to_dict
from mtbert.data.samplers import TaskBatches, strategy_of, task_schedule
from mtbert.data.tokenize import Prepared, collate, pad_token_id, prepare
from mtbert.data.types import Batch
from mtbert.errors import Diverged
from mtbert.model.multitask import MultitaskModel, Packed, count_params, model_size_mb, pack
from mtbert.tasks import get_task
from mtbert.train import measure
from mtbert.train.frozen import FrozenCache, estimate_mb
from mtbert.train.frozen import usable as frozen_usable
from mtbert.train.metrics import overall
from mtbert.train import precision
from mtbert.train.affinity import FOLDER as AFFINITY_FOLDER
from mtbert.train.affinity import AffinityMeter
from mtbert.train.precision import autocast_for
from mtbert.train.state import (MID, MID_DIR, CHECKPOINT_STATE, config_digest, load_state_into, read_mid, read_state,
                                report_epoch, restore_rng, save_last, save_mid, take_best, training_state)
from mtbert.train.weighting import Weighting, make_weighting

Reporter = Callable[[dict, "str | None"], None]


@dataclass
class Result:
    metrics: dict  # final figures: best-epoch scores + measurements
    epochs: list[dict] = field(default_factory=list)  # per-epoch metrics
    config: dict = field(default_factory=dict)
    data_report: list[str] = field(default_factory=list)  # bad-row and truncation summaries
    truncation: list[dict] = field(default_factory=list)  # per task and split: what max_length cut
    # The model as the last epoch left it, in memory only (the best epoch's is output_dir/best).
    model: MultitaskModel | None = field(default=None, repr=False, compare=False)
    timings: dict = field(default_factory=dict)  # seconds per phase (measure.Phases.snapshot)

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "model"}

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2))
        return path


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def param_rates(model: MultitaskModel, cfg: Config) -> dict[int, float]:
    """id(parameter) -> learning rate. The encoder's own (pretrained) parameters get optim.lr,
    scaled by layer_decay^(layers above them); everything the model adds on top (heads, pair
    projections, PALs, the pooled LayerNorm, a pooler the checkpoint lacks) optim.head_lr."""
    o, n = cfg.optim, model.num_layers
    rates: dict[int, float] = {}

    def put(module: torch.nn.Module, rate: float) -> None:
        for p in module.parameters():
            rates.setdefault(id(p), rate)

    put(model.embeddings, o.lr * o.layer_decay ** n)
    for i, layer in enumerate(model.shared_layers):
        put(layer, o.lr * o.layer_decay ** (n - 1 - i))
    for layers in model.task_layers.values():
        for j, layer in enumerate(layers):
            put(layer, o.lr * o.layer_decay ** (n - 1 - model.k - j))
    if model.pretrained_pooler:
        for pooler in model.poolers.values():
            put(pooler, o.lr)
    for p in model.parameters():
        rates.setdefault(id(p), o.head_lr)
    return rates


def make_optimizer(model: MultitaskModel, cfg: Config, extra: list[torch.nn.Parameter] = ()) -> torch.optim.Optimizer:
    """AdamW with one group per (rate, decay) pair. `extra` parameters (e.g. a loss
    weighting's own) train at the head rate."""
    rates = param_rates(model, cfg)
    groups: dict[tuple[float, float], list[torch.nn.Parameter]] = {}
    params = {id(p): p for p in model.parameters()}
    extra_ids = {id(p) for p in extra}
    for p in list(params.values()) + list(extra):
        if not p.requires_grad:
            continue
        # No decay on biases and LayerNorm gains (the usual BERT fine-tuning recipe), nor on a
        # weighting method's own parameters (decay would pull its log-variances to 0).
        decay = cfg.optim.weight_decay if p.ndim >= 2 and id(p) not in extra_ids else 0.0
        groups.setdefault((rates.get(id(p), cfg.optim.head_lr), decay), []).append(p)
    # fused: one kernel per parameter for the whole AdamW update, where the for-loop version
    # makes a fresh temporary (sqrt, div) the size of each parameter at every step. On MiniLM
    # that is the 30522 x 384 word-embedding matrix, whose update took a quarter of a CPU step.
    fused = all(fused_adamw(kind) for kind in {p.device.type for ps in groups.values() for p in ps})
    return torch.optim.AdamW([{"params": ps, "lr": lr, "weight_decay": wd}
                              for (lr, wd), ps in groups.items()], lr=cfg.optim.lr, fused=True if fused else None)


@functools.cache
def fused_adamw(device_type: str) -> bool:
    """Whether the installed torch runs AdamW's fused kernel on this kind of device. pyproject
    admits torch >= 2.1, whose fused AdamW is CUDA-only (CPU came in 2.4; which devices have
    it is torch's to say and has changed from release to release), and `fused=True` elsewhere
    raises at construction: so it is tried once per process and device type on a one-element
    parameter (a step included, in case a kernel is missing only there), and where it fails
    the optimizer keeps torch's default implementation. Nothing here draws from a generator."""
    try:
        p = torch.zeros(1, device=device_type, requires_grad=True)
        optimizer = torch.optim.AdamW([p], fused=True)
        p.grad = torch.zeros_like(p)
        optimizer.step()
    except (RuntimeError, NotImplementedError, ValueError):
        return False
    return True


def make_lr_schedule(optimizer: torch.optim.Optimizer, cfg: Config, total_steps: int):
    """optim.schedule over `total_steps` optimizer steps, after optim.warmup."""
    w = cfg.optim.warmup
    warmup = int(w) if w >= 1 else int(round(w * total_steps))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, functools.partial(
        lr_factor, schedule=cfg.optim.schedule, warmup=warmup, total=total_steps))


def lr_factor(step: int, schedule: str, warmup: int, total: int) -> float:
    """The learning rate's multiplier at optimizer step `step`: a linear ramp from 0 over
    `warmup` steps, then constant, a straight line to 0 at `total`, or half a cosine to 0 (the
    schedules BERT fine-tuning uses, as transformers defines them)."""
    if step < warmup:
        return step / max(1, warmup)
    if schedule == "constant":
        return 1.0
    if schedule == "linear":
        return max(0.0, (total - step) / max(1, total - warmup))
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * ((step - warmup) / max(1, total - warmup)))))


def steps_per_epoch(cfg: Config, sizes: dict[str, int]) -> int:
    if cfg.sampling.steps_per_epoch:
        return cfg.sampling.steps_per_epoch
    bs = cfg.train.batch_size
    # tuple: one pass over the largest task; one-task-per-step samplers: one pass over all data.
    n = max(sizes.values()) if strategy_of(cfg.sampling.strategy).every_task else sum(sizes.values())
    return max(1, math.ceil(n / bs))


@torch.no_grad()
def evaluate(model: MultitaskModel, dev: dict, cfg: Config, device, pad_id: int, autocast,
             cache: FrozenCache | None = None) -> dict[str, float]:
    model.eval()
    scores = {}
    for name, ds in dev.items():
        task = get_task(name)
        # Length-sorted batches waste less padding; scores do not depend on order.
        order = sorted(range(len(ds)), key=lambda i: len(ds.sides[0][i]))
        preds, labels = [], []
        for at in range(0, len(order), cfg.train.eval_batch_size):
            idx = order[at:at + cfg.train.eval_batch_size]
            with autocast():
                out = _forward(model, [_batch(ds, idx, pad_id, cache)], idx_of=[idx], cache=cache,
                               split="dev", device=device)[0][name]
            preds.append(task.predict(out.float()))
            labels.append(ds.labels[idx].to(device))
        scores[name] = task.score(torch.cat(preds), torch.cat(labels))
    model.train()
    return scores


def _batch(ds, idx, pad_id: int, cache: FrozenCache | None) -> Batch:
    # With the frozen-layer cache the token ids are never read: labels only.
    return Batch(ds.task, [], ds.labels[idx]) if cache is not None else collate(ds, idx, pad_id)


def _forward(model: MultitaskModel, batches: list[Batch], idx_of, cache: FrozenCache | None,
             split: str, device) -> tuple[dict[str, torch.Tensor], Packed]:
    """One packed forward of these batches: from the embeddings, or from the stored output
    of the frozen layers. Packing happens on the host (row lengths need no device sync)."""
    if cache is None:
        packed = pack(batches).to(device)
        return model.from_embeddings(packed, model.embed(packed)), packed
    packed, h = cache.pack(split, [(b, torch.as_tensor(i)) for b, i in zip(batches, idx_of)])
    packed, h = packed.to(device), h.to(device, non_blocking=True)
    return model.from_embeddings(packed, h, cache.start), packed


def epoch_metrics(scores: dict[str, float]) -> dict[str, float]:
    out = {get_task(t).metric_name: s for t, s in scores.items()}
    out["overall"] = overall(list(scores.values()))
    out["overall_cs224n"] = overall([get_task(t).cs224n_score(s) for t, s in scores.items()])
    return out


def train(cfg: Config, reporter: Reporter | None = None, output_dir: str | Path | None = None,
          resume_from: str | Path | None = None, prepared: Prepared | None = None,
          log: Callable[[str], None] | None = print, progress=None) -> Result:
    """`output_dir` gets result.json, the best epoch's model bundle (best/) and, after every
    epoch, the resumable state (last/state.pt) that `resume_from=output_dir / "last"` continues.
    With a `reporter` the state goes to it instead (a sweep trial: Tune's checkpoint is what
    its retries and resumes start from). `progress`, when given, is told about every step
    (mtbert/train/progress.py). Every report's metrics carry `timings` (measure.Phases)."""
    with precision.matmul_precision(cfg.train.precision, measure.pick_device(cfg.train.device)):
        return _train(cfg, reporter, output_dir, resume_from, prepared, log, progress)


def _train(cfg: Config, reporter: Reporter | None, output_dir: str | Path | None,
           resume_from: str | Path | None, prepared: Prepared | None,
           log: Callable[[str], None] | None, progress) -> Result:
    log = log or (lambda _msg: None)
    seed_everything(cfg.train.seed)
    state, path = _start_from(cfg, reporter, output_dir, resume_from)
    # A resumed run's state already holds the probed heads (and the probe's time and FLOPs).
    run, probed = _setup(cfg, prepared, log, probe=cfg.train.probe and state is None)
    out = _Outputs(run, reporter, output_dir)
    mid = state.get(MID) if state is not None else None  # where inside its first epoch the run continues
    if state is None:
        ledger, rng_state = _Ledger.fresh(run, probed), None
    else:
        ledger, rng_state = _resume(run, state, path, resume_from, output_dir)
        log(f"resumed from {path.parent} at epoch {ledger.next_epoch}" + (f", step {mid['step']}" if mid else ""))
    # Last before the first step: whatever ran since the seed (model init, data, the frozen
    # cache) drew from the generators differently on a resume; the steps now draw what they
    # would have. (PCGrad's own generator is in the weighting method's state.)
    restore_rng(rng_state)
    with run.phase("model"):  # it collects what earlier runs of the process left
        measure.reset_peak_memory(run.device)
    history, patience = ledger.history, cfg.train.patience
    since_best = len(history) - 1 - figures.best_epoch_index(history) if history else 0

    for epoch in range(ledger.next_epoch, cfg.train.epochs + 1):
        if patience is not None and since_best >= patience:
            break  # a resumed run that had already run out of patience
        m, points = _epoch(run, ledger, epoch, progress, out, mid)
        mid = None
        history.append(m)
        # The best epoch is the summary's (figures.py), so the bundle saved is the one it names.
        summary = figures.summary(history)
        if summary["best_epoch"] == epoch:
            since_best = 0
            out.save_best(run)
        else:
            since_best += 1
        m.update(best_overall=summary["overall"], best_epoch=summary["best_epoch"])
        if progress is not None:
            progress.end_epoch()
        log(_epoch_line(m, cfg))
        out_of_patience = patience is not None and since_best >= patience
        out.end_epoch(run, ledger, epoch, epoch == cfg.train.epochs or out_of_patience, m, summary, points)
        if out_of_patience:
            log(f"no new best overall for {since_best} evaluations (train.patience): stopping; "
                f"best epoch {summary['best_epoch']}")
            break

    result = Result(figures.summary(history), history, to_dict(cfg), run.prepared.data_report(),
                    [t.to_dict() for t in run.prepared.truncation()], run.model,
                    run.phase.snapshot(ledger.timer.elapsed))
    if out.dir is not None:
        result.save(out.dir / "result.json")
    return result


# --------------------------------------------------------------------------- a run's parts

@dataclass
class _Run:
    """What the setup phases build (_setup) and every epoch reads."""
    cfg: Config
    device: torch.device
    autocast: Callable  # the context every forward enters (precision.autocast_for)
    phase: measure.Phases  # wall seconds per phase, reported with every epoch
    prepared: Prepared
    pad_id: int
    model: MultitaskModel
    cache: FrozenCache | None  # the frozen layers' outputs, computed once (train/frozen.py)
    cache_s: float  # seconds this run spent computing them (0 when read from disk)
    weighting: Weighting
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    shared: list[torch.nn.Parameter]  # what the tasks share, for the weighting methods that need it
    sizes: dict[str, int]  # training rows per task
    n_steps: int  # steps per epoch
    size: dict  # model_size_mb, params_total, params_trainable: the same every epoch
    truncated: dict  # trunc_rows_<task>, trunc_tokens_<task>: the same every epoch
    affinity: AffinityMeter  # affinity.every_steps: the inter-task affinity telemetry (train/affinity.py)

    @property
    def start(self) -> int:
        """The encoder layer the training forwards start from: above the cached frozen ones."""
        return self.cache.start if self.cache is not None else 0


@dataclass
class _Ledger:
    """What the epochs so far add up to: what a resume reads back from the state."""
    timer: measure.StepTimer  # the training steps' time, evaluation and checkpoints excluded
    history: list[dict] = field(default_factory=list)  # one row of figures per epoch
    flops: int = 0  # training FLOPs so far, setup_flops included
    setup_flops: int = 0  # the frozen layers' one forward and the probe's steps
    start_from: dict = field(default_factory=dict)  # where the probe left a fine-tuned run
    next_epoch: int = 1

    @classmethod
    def fresh(cls, run: _Run, probed: dict | None) -> _Ledger:
        # The cached frozen layers ran forward once over the training data, whether this run built
        # the blocks or read what another run of the same weights stored: counted once, here.
        setup = run.model.frozen_flops(run.prepared.train.values(), run.start) if run.cache is not None else 0
        if probed is None:
            return cls(measure.StepTimer(run.device), flops=setup, setup_flops=setup)
        # The fine-tuned row pays for its probe's steps, and says where the probe left it.
        setup += probed["train_flops"]
        return cls(measure.StepTimer(run.device, probed["train_time_s"]), flops=setup, setup_flops=setup,
                   start_from={"probe_overall": probed["overall"]})

    @classmethod
    def from_state(cls, state: dict, device: torch.device) -> _Ledger:
        history = state["history"]
        last = history[-1] if history else {}
        probe = {"probe_overall": history[0]["probe_overall"]} if history and "probe_overall" in history[0] else {}
        ledger = cls(measure.StepTimer(device, state["train_time_s"]), history, last.get("train_flops", 0),
                     last.get("setup_flops", 0), probe, state["epoch"] + 1)
        if state.get(MID):  # inside an epoch: the counts as they stood there
            mid = state[MID]
            ledger.flops, ledger.setup_flops, ledger.start_from = mid["flops"], mid["setup_flops"], mid["start_from"]
        return ledger


def _setup(cfg: Config, prepared: Prepared | None, log, probe: bool) -> tuple[_Run, dict | None]:
    """The setup phases, each timed under its name: data, model (then the probe and the
    frozen-layer cache, which start from it), optimizer. Returns the run and, with `probe`,
    the probe's final figures."""
    device = measure.pick_device(cfg.train.device)
    _, autocast = autocast_for(cfg.train.precision, device)
    phase = measure.Phases(device)
    with phase("data"):
        prepared = prepared or prepare(cfg, log=log)
    pad_id = pad_token_id(prepared.tokenizer)
    with phase("model"):
        model = MultitaskModel(cfg, vocab_size=len(prepared.tokenizer), pad_token_id=pad_id).to(device)
    probed = None
    if probe:
        with phase("probe"):
            probed = _probe(model, cfg, prepared, log)
    with phase("cache"):
        cache, cache_s = _frozen_cache(model, prepared, cfg, pad_id, device, autocast, log)
    with phase("model"):
        weighting = make_weighting(cfg, device)
        optimizer = make_optimizer(model, cfg, weighting.parameters())
        shared = model.shared_parameters()
        params_total, params_trainable = count_params(model)
        size = {"model_size_mb": model_size_mb(model), "params_total": params_total,
                "params_trainable": params_trainable}
    sizes = {t: len(ds) for t, ds in prepared.train.items()}
    n_steps = steps_per_epoch(cfg, sizes)
    scheduler = make_lr_schedule(optimizer, cfg, math.ceil(n_steps / cfg.train.grad_accum) * cfg.train.epochs)
    return _Run(cfg, device, autocast, phase, prepared, pad_id, model, cache, cache_s, weighting, optimizer,
                scheduler, shared, sizes, n_steps, size, _truncated(prepared), AffinityMeter.of(cfg)), probed


def _truncated(prepared: Prepared) -> dict[str, float]:
    """Shares of each task's training rows and tokens that max_length cut: reported every
    epoch, so a sweep's MLflow runs carry them like any figure."""
    trunc = {}
    for t in prepared.truncation():
        if t.split == "train":
            trunc.update({f"trunc_rows_{t.task}": t.rows_cut / max(t.rows, 1),
                          f"trunc_tokens_{t.task}": t.lost_share})
    return trunc


def _start_from(cfg: Config, reporter: Reporter | None, output_dir: str | Path | None,
                resume_from: str | Path | None) -> tuple[dict | None, Path | None]:
    """The resumable state the run continues from and its file: `resume_from`'s, or, for a run
    with a reporter (whose epoch checkpoints the reporter keeps), the newer mid-epoch state in
    its output folder where that continues the same epochs (state.py). (None, None): afresh."""
    device = measure.pick_device(cfg.train.device)
    state, path = None, None
    if resume_from is not None:
        path = Path(resume_from) / CHECKPOINT_STATE
        state = read_state(path, device)
    if reporter is not None and output_dir is not None and cfg.train.save_checkpoint:
        folder = Path(output_dir) / MID_DIR
        mid = read_mid(folder, state["epoch"] if state is not None else 0, config_digest(to_dict(cfg)), device)
        if mid is not None:
            state, path = mid, folder / CHECKPOINT_STATE
    return state, path


def _resume(run: _Run, state: dict, path: Path, resume_from: str | Path | None,
            output_dir: str | Path | None) -> tuple[_Ledger, dict | None]:
    """Continue from the resumable `state` read from `path`: its weights, optimizer, scheduler
    and weighting states loaded into the run, its epochs as the ledger, the best/ of the
    checkpoint resumed from as output_dir's (a mid-epoch state's best is its epochs', that one).
    Returns the ledger and the generators' states to put back before the first step."""
    load_state_into(state, path, run.model, run.optimizer, run.scheduler, run.weighting, run.cfg.model.name_or_path)
    run.affinity.load_state_dict(state.get("affinity"))
    kept = Path(resume_from) / "best" if resume_from is not None else None
    if output_dir is not None and kept is not None and kept.is_dir():
        take_best(kept, Path(output_dir) / "best")
    return _Ledger.from_state(state, run.device), state.get("rng")


class _Outputs:
    """Where a run's epochs go: the output folder (best/ at every new best epoch; last/, the
    resumable state, when no reporter takes it) and the reporter (a sweep trial's Tune)."""

    def __init__(self, run: _Run, reporter: Reporter | None, output_dir: str | Path | None):
        cfg = run.cfg
        self.reporter, self.dir = reporter, Path(output_dir) if output_dir else None
        self.saves_state = cfg.train.save_checkpoint and (output_dir is not None or reporter is not None)
        # The frozen tensors, when a pretrained model holds them, are named in the resumable state
        # rather than stored (mtbert/bundle.py): the run that resumes builds them from that model.
        with run.phase("checkpoint"):
            self.reference = frozen_reference(run.model, cfg) if self.saves_state else None
        # Every checkpoint carries the config; the same text each epoch.
        reported = reporter is not None and self.saves_state
        self.config_text = yaml.safe_dump(to_dict(cfg), sort_keys=False) if reported else ""
        # Where the run computes and in what: every report names them (a sweep tags its trials so).
        self.where = {"device": measure.device_name(run.device),
                      "precision": precision.label(cfg.train.precision, run.device)}
        self.bundle_saved = False  # by this call: a resumed run's best/ is a copy, rewritten whole once
        # train.checkpoint_every_s: where a mid-epoch state goes (state.py), and when the last
        # checkpoint was; a reporter's run keeps its own beside the epochs' the reporter keeps.
        self.mid_dir = (None if not self.saves_state or self.dir is None or not cfg.train.checkpoint_every_s
                        else self.dir / (MID_DIR if reporter is not None else "last"))
        self.digest = config_digest(to_dict(cfg)) if self.mid_dir is not None else ""
        self.every, self.saved_at = cfg.train.checkpoint_every_s, time.monotonic()

    def save_best(self, run: _Run) -> None:
        if self.dir is None or not run.cfg.train.save_checkpoint:
            return
        with run.phase("checkpoint"):
            # After this run's first save only the weights change.
            save_bundle(self.dir / "best", run.model, run.cfg, run.prepared.tokenizer, weights_only=self.bundle_saved)
        self.bundle_saved = True

    def end_epoch(self, run: _Run, ledger: _Ledger, epoch: int, last: bool, m: dict, summary: dict,
                  points: StepLosses) -> None:
        """The resumable state after `epoch` (the `last` one's slim for a reporter) to last/, or
        with the epoch's figures `m` to the reporter."""
        state = None
        with run.phase("checkpoint"):
            if self.dir is not None:  # the affinity telemetry's series and the epoch's heatmap
                run.affinity.write(self.dir / AFFINITY_FOLDER, epoch)
            if self.saves_state:
                state = training_state(run.model, self.reference, run.optimizer, run.scheduler, run.weighting,
                                       ledger.history, ledger.timer.elapsed, epoch,
                                       final=last and self.reporter is not None)
                state["affinity"] = run.affinity.state_dict()
            if self.dir is not None and state is not None and self.reporter is None:
                save_last(state, self.dir)
        if self.reporter is not None:
            # The summary rides every report: a trial its scheduler stops never returns. The step
            # points ride the report, not the history: results and checkpoints stay as they were;
            # so do the affinity telemetry's epoch means and points.
            report = {**m, **run.affinity.epoch_means(epoch), figures.SUMMARY_KEY: summary,
                      figures.STEP_LOSSES: {**points.points, **run.affinity.epoch_points(epoch)},
                      figures.WHERE_KEY: self.where}
            if self.mid_dir is not None:
                # The epoch's checkpoint supersedes it; gone before the report, in which a
                # scheduler may stop the trial for good.
                shutil.rmtree(self.mid_dir, ignore_errors=True)
            report_epoch(self.reporter, report, state, self.config_text, self.dir, run.phase, ledger.timer.elapsed)
        self.saved_at = time.monotonic()

    def mid_due(self, step: int, steps: int, accum: int) -> bool:
        """Whether a mid-epoch state is due after `step`: train.checkpoint_every_s passed since
        the last checkpoint, between two optimizer steps, and not at the epoch's end (whose
        checkpoint follows anyway)."""
        return (self.mid_dir is not None and step < steps and step % accum == 0
                and time.monotonic() - self.saved_at >= self.every)

    def save_mid(self, run: _Run, ledger: _Ledger, epoch: int, step: int, tally: _Tally, points: StepLosses,
                 start: tuple[float, int]) -> None:
        """The resumable state after `step` of `epoch` (state.py: MID), replacing the last one."""
        with run.phase("checkpoint"):
            state = training_state(run.model, self.reference, run.optimizer, run.scheduler, run.weighting,
                                   ledger.history, ledger.timer.elapsed, epoch - 1)
            state[MID] = {"epoch": epoch, "step": step, "config": self.digest, "flops": ledger.flops,
                          "setup_flops": ledger.setup_flops, "start_from": ledger.start_from, "start": list(start),
                          "tally": tally.state(), "points": points.state()}
            state["affinity"] = run.affinity.state_dict()
            save_mid(state, self.mid_dir)
        self.saved_at = time.monotonic()


# --------------------------------------------------------------------------- one epoch

def _epoch(run: _Run, ledger: _Ledger, epoch: int, progress, out: _Outputs | None = None,
           mid: dict | None = None) -> tuple[dict, StepLosses]:
    """Train epoch `epoch`, then evaluate on dev: the epoch's figures (its row of the history)
    and the step-loss points of train.log_every_steps. `mid`: where inside the epoch a
    resumed run continues (state.py)."""
    time0, flops0 = mid["start"] if mid else (ledger.timer.elapsed, ledger.flops)
    tally, points = _train_epoch(run, ledger, epoch, progress, out, mid, (time0, flops0))
    seconds = ledger.timer.elapsed - time0
    run.affinity.end_epoch(epoch)
    with run.phase("eval"):
        scores = evaluate(run.model, run.prepared.dev, run.cfg, run.device, run.pad_id, run.autocast, run.cache)
    mean_loss, mean_weight, trained = tally.means()
    run.weighting.end_epoch({t: mean_loss[i] for i, t in enumerate(run.cfg.tasks)})
    m = {"epoch": epoch, **epoch_metrics(scores)}
    m.update({f"loss_{t}": mean_loss[i] for i, t in enumerate(run.cfg.tasks)})
    # The weighting method's effective weight of each task, averaged over its steps.
    m.update({f"weight_{t}": mean_weight[i] for i, t in enumerate(run.cfg.tasks) if trained[i]})
    # MFU counts the useful work only: the epoch's counted FLOPs less their padding share.
    pad_share = tally.pad_tokens / max(tally.all_tokens, 1)
    useful_flops = (ledger.flops - flops0) * (1 - pad_share)
    peak = measure.matmul_peak(run.device, precision.label(run.cfg.train.precision, run.device))
    m.update(seq_per_s=tally.seqs / max(seconds, 1e-9), pad_fraction=pad_share,
             tokens_per_s=tally.real_tokens / max(seconds, 1e-9), mfu=useful_flops / max(seconds, 1e-9) / peak,
             epoch_time_s=seconds, train_time_s=ledger.timer.elapsed, train_flops=ledger.flops,
             setup_flops=ledger.setup_flops, lr=run.scheduler.get_last_lr()[0], frozen_cache_s=run.cache_s,
             peak_memory_mb=measure.peak_memory_mb(run.device), **run.size, **run.truncated, **ledger.start_from)
    return m, points


@dataclass
class _Tally:
    """One epoch's running sums: per task (cfg.tasks' order) its training loss, steps and
    effective weight, kept on the device so that a step adds no host sync; sequences and
    token positions on the host."""
    loss_sum: torch.Tensor
    loss_cnt: torch.Tensor
    weight_sum: torch.Tensor
    seqs: int = 0
    pad_tokens: int = 0  # positions the encoder layers computed on padding (after length buckets)
    all_tokens: int = 0  # positions the encoder layers computed
    real_tokens: int = 0  # the rows' real tokens

    @classmethod
    def zeros(cls, tasks: int, device: torch.device) -> _Tally:
        return cls(*(torch.zeros(tasks, device=device) for _ in range(3)))

    def state(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_state(cls, state: dict, device: torch.device) -> _Tally:
        return cls(**{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in state.items()})

    def add(self, tasks: list[str], batches: list[Batch], raws: list[torch.Tensor], weights: dict) -> None:
        for b, raw in zip(batches, raws):
            i = tasks.index(b.task)
            self.loss_sum[i] += raw
            self.loss_cnt[i] += 1
            self.weight_sum[i] += weights[b.task]
            self.seqs += len(b)

    def means(self) -> tuple[list[float], list[float], list[float]]:
        """Mean loss and mean effective weight per task, and each task's step count."""
        return ((self.loss_sum / self.loss_cnt.clamp(min=1)).tolist(),
                (self.weight_sum / self.loss_cnt.clamp(min=1)).tolist(), self.loss_cnt.tolist())


def _train_epoch(run: _Run, ledger: _Ledger, epoch: int, progress, out: _Outputs | None = None,
                 mid: dict | None = None, start: tuple[float, int] = (0.0, 0)) -> tuple[_Tally, StepLosses]:
    """The training steps of `epoch` (after `mid`'s step, where a resumed run continues), timed
    by the ledger's timer, their FLOPs added to its count; a mid-epoch state where `out` says
    one is due (`start`: the epoch's starting time and FLOPs, which the state keeps)."""
    cfg, device, accum = run.cfg, run.device, run.cfg.train.grad_accum
    schedule = task_schedule(cfg.sampling.strategy, run.sizes, epoch, cfg.train.epochs, run.n_steps, cfg.train.seed)
    iters = {t: TaskBatches(run.sizes[t], cfg.train.batch_size, seed=cfg.train.seed * 1000 + epoch)
             for t in cfg.tasks}
    tally = _Tally.zeros(len(cfg.tasks), device)
    recent: list[tuple[int, torch.Tensor, list[str]]] = []
    points = StepLosses(cfg.tasks, cfg.train.log_every_steps, len(schedule), (epoch - 1) * run.n_steps)
    done = 0
    if mid:  # the samplers replay the epoch's draws up to its step (seeded per epoch: no generator read)
        done, tally = mid["step"], _Tally.from_state(mid["tally"], device)
        points.load(mid["points"])
        for step_tasks in schedule[:done]:
            for t in step_tasks:
                iters[t].next()
    # Checking finiteness needs a host sync; on CPU it is free, on GPU we batch the check.
    check_every = 1 if device.type == "cpu" else 25
    if progress is not None:
        progress.start_epoch()
    with ledger.timer:
        for step, step_tasks in enumerate(schedule[done:], done + 1):
            idx_of = [iters[t].next() for t in step_tasks]
            batches = [_batch(run.prepared.train[t], idx, run.pad_id, run.cache) for t, idx in zip(step_tasks, idx_of)]
            # Gradients of `accum` micro-batches add up to one optimizer step; each loss is
            # scaled by its group's size, so the step sees their mean.
            group = (step - 1) // accum
            group_size = min(accum, len(schedule) - group * accum)
            losses, raws, step_weights, packed = train_step(
                run.model, batches, idx_of, run.weighting, cfg, run.shared, run.autocast, run.cache, device,
                scale=1.0 / group_size)
            if step == len(schedule) or step % accum == 0:
                _update(run.model, run.optimizer, run.scheduler, cfg)
            _count_step(run, ledger, tally, packed)
            tally.add(cfg.tasks, batches, raws, step_weights)
            if run.affinity.due(points.before + step):  # its cost counts: its FLOPs join the run's
                ledger.flops += run.affinity.measure(run.model, run.shared, run.optimizer, run.sizes,
                                                     functools.partial(_held_losses, run), epoch,
                                                     points.before + step, device, run.start)
            recent.append((step, losses, step_tasks))
            points.step(step, tally.loss_sum, tally.loss_cnt)
            if step % check_every == 0 or step == len(schedule):
                _check_finite(recent, epoch)
                recent.clear()
            if progress is not None:
                progress.step(epoch, step, len(schedule), tally.seqs, losses)
            if out is not None and out.mid_due(step, len(schedule), accum):
                _check_finite(recent, epoch)  # a state is saved only with every loss so far finite
                recent.clear()
                ledger.timer.__exit__(None, None, None)  # the checkpoint's time is not the steps'
                out.save_mid(run, ledger, epoch, step, tally, points, start)
                ledger.timer.__enter__()
    return tally, points


def _count_step(run: _Run, ledger: _Ledger, tally: _Tally, packed) -> None:
    """A step's tokens into the epoch's tally (its real ones, and the positions the encoder's
    layers computed, padding included) and its FLOPs into the run's count."""
    device = run.device
    real, computed = run.model.layer_positions(packed, device, run.start)
    tally.pad_tokens += computed - real
    tally.all_tokens += computed
    tally.real_tokens += sum(packed.lengths)
    # A gradient method's extra backward passes and solve count too (weighting/base.py).
    ledger.flops += (run.model.step_flops(packed, device, run.start)
                     + run.weighting.extra_flops(run.model, packed, device, run.start))


# --------------------------------------------------------------------------- the probe, the frozen cache

def _probe(model: MultitaskModel, cfg: Config, prepared: Prepared, log) -> dict:
    """train.probe: train the heads on the frozen encoder for one pass over the training data
    (_probe_config) and load them into `model`, whose encoder is still the pretrained one.
    Returns the probe's final metrics."""
    # One epoch, so its last model is its best: handed over in memory, nothing written to disk.
    result = train(_probe_config(cfg), prepared=prepared, log=lambda msg: log(f"probe: {msg}"))
    missing, unexpected = model.load_state_dict(result.model.state_dict(), strict=False)
    if unexpected or any(not key.startswith("pals.") for key in missing):
        raise RuntimeError(f"probe: the probed model does not fit the model to fine-tune "
                           f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    log(f"probe: heads trained on the frozen encoder (overall {result.metrics['overall']:.4f}); fine-tuning from them")
    return result.metrics


def _probe_config(cfg: Config) -> Config:
    probe = copy.deepcopy(cfg)
    probe.freeze.layers, probe.train.probe = -1, False
    # A fresh PAL adds exactly nothing (its V^D starts at zero), so probing without PALs is
    # probing the same model, heads alone and from the frozen-layer cache; with them it would
    # give PAL arms an extra pass of adapter training.
    probe.sharing.pal_size = 0
    probe.sampling.steps_per_epoch, probe.train.epochs, probe.train.patience = None, 1, None
    probe.optim.schedule, probe.optim.warmup, probe.train.save_checkpoint = "constant", 0.0, False
    probe.loss.smart.weight = 0.0  # a linear probe: SMART's perturbed passes would also defeat the cache
    probe.affinity.every_steps = 0  # the telemetry measures the run it asks about, not its probe
    return probe


def build_frozen_cache(cfg: Config, log: Callable[[str], None] | None = None) -> tuple[int, float]:
    """The frozen-layer cache that a run of `cfg` (and its probe) reads, made ready as train()
    would make it, without training: a sweep's driver calls it once per distinct setup before
    its first trial. Returns (blocks computed, seconds spent computing them)."""
    log = log or (lambda _msg: None)
    built, seconds = 0, 0.0
    for run in ([_probe_config(cfg)] if cfg.train.probe else []) + [cfg]:
        seed_everything(run.train.seed)
        device = measure.pick_device(run.train.device)
        _, autocast = autocast_for(run.train.precision, device)
        prepared = prepare(run, log=None)
        pad_id = pad_token_id(prepared.tokenizer)
        model = MultitaskModel(run, vocab_size=len(prepared.tokenizer), pad_token_id=pad_id).to(device)
        with precision.matmul_precision(run.train.precision, device):
            cache, s = _frozen_cache(model, prepared, run, pad_id, device, autocast, log)
        if cache is not None:
            built, seconds = built + cache.built, seconds + s
    return built, seconds


def _frozen_cache(model: MultitaskModel, prepared: Prepared, cfg: Config, pad_id: int, device, autocast,
                  log) -> tuple[FrozenCache | None, float]:
    """The frozen-layer cache where it applies and fits, and the seconds spent computing it."""
    if not frozen_usable(model, cfg):
        return None, 0.0
    mb = estimate_mb(model, [*prepared.train.values(), *prepared.dev.values()])
    if mb > cfg.train.frozen_cache_mb:
        log(f"frozen layers: not cached ({mb:.0f} MB > train.frozen_cache_mb {cfg.train.frozen_cache_mb}); "
            "computed at every step")
        return None, 0.0
    t0 = time.perf_counter()
    cache = FrozenCache(model, {"train": prepared.train, "dev": prepared.dev}, pad_id, device, autocast,
                        precision.label(cfg.train.precision, device), cfg.data.cache_dir, log)
    return cache, (time.perf_counter() - t0 if cache.built else 0.0)


def train_step(model: MultitaskModel, batches: list[Batch], idx_of, weighting: Weighting, cfg: Config,
               shared: list, autocast, cache: FrozenCache | None, device, scale: float = 1.0
               ) -> tuple[torch.Tensor, list[torch.Tensor], dict[str, torch.Tensor], Packed]:
    """Forward and backward of one (micro-)step on the packed batches of this step's tasks;
    gradients accumulate until _update. Returns the per-task losses (stacked, detached), the
    raw per-task losses, the weighting method's effective weights (on the device) and the
    packed layout (for padding and FLOP counts)."""
    with autocast():
        out, packed = _forward(model, batches, idx_of, cache, "train", device)
    losses, raws = {}, []
    for b in batches:
        b = b.to(device)
        task = get_task(b.task)
        raw = task.loss(out[b.task].float(), b.labels)
        loss = raw
        if cfg.loss.smart.weight > 0:
            loss = loss + cfg.loss.smart.weight * smart_term(model, b, task, out[b.task].float(), cfg, autocast)
        losses[b.task] = loss
        raws.append(raw.detach())
    if not any(l.requires_grad for l in losses.values()) and not weighting.parameters():
        # Nothing this step reaches can learn (a cosine STS head on a wholly frozen encoder has
        # no parameters, and round robin gives it steps of its own): no backward, and the
        # optimizer step that follows changes nothing.
        step_weights = {t: torch.zeros((), device=device) for t in losses}
    else:
        # `scale` averages the micro-batches of one optimizer step (train.grad_accum).
        step_weights = weighting.backward({t: l * scale for t, l in losses.items()} if scale != 1.0 else losses,
                                          shared)
    return torch.stack([l.detach() for l in losses.values()]), raws, step_weights, packed


def _held_losses(run: _Run, held: dict[str, list[int]]) -> tuple[dict[str, torch.Tensor], Packed]:
    """Each task's loss on its training rows `held[task]`, in one packed forward: the affinity
    telemetry's held batch (mtbert/train/affinity.py)."""
    batches = [_batch(run.prepared.train[t], idx, run.pad_id, run.cache) for t, idx in held.items()]
    with run.autocast():
        out, packed = _forward(run.model, batches, list(held.values()), run.cache, "train", run.device)
    return {b.task: get_task(b.task).loss(out[b.task].float(), b.labels.to(run.device)) for b in batches}, packed


def _update(model: MultitaskModel, optimizer, scheduler, cfg: Config) -> None:
    if cfg.optim.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]],
                                       cfg.optim.grad_clip)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)


def smart_term(model: MultitaskModel, batch, task, clean: torch.Tensor, cfg: Config, autocast) -> torch.Tensor:
    """SMART on the embedding output of this task's batch, one perturbation per sentence.
    `clean` are the step's logits for the batch: SMART detaches them as its target, so the
    packed forward's output serves and no extra clean forward is run."""
    from mtbert.train.smart import smart_loss

    packed = pack([batch])
    emb = model.embed(packed)
    sides = [emb[s:e] for _, _, s, e in packed.segments]

    def forward(perturbed: list[torch.Tensor]) -> torch.Tensor:
        with autocast():
            return model.from_embeddings(packed, torch.cat(perturbed))[batch.task].float()

    s = cfg.loss.smart
    return smart_loss(forward, sides, clean, task.kind, epsilon=s.epsilon,
                      step_size=s.step_size, steps=s.steps)


# At most this many points per epoch: a long epoch widens the window, so what a trial sends
# its tracker stays bounded however many steps an epoch has.
MAX_STEP_POINTS = 200


class StepLosses:
    """train.log_every_steps: each task's mean training loss over the steps since the last
    point, every `every` steps and at the epoch's last, at the run's global step (the steps of
    the epochs before plus this one's). Read from the epoch's running sums, so it adds no work
    to a step but at a point (one device sync there) and draws nothing from any generator."""

    def __init__(self, tasks: list[str], every: int, steps: int, before: int):
        self.tasks, self.steps, self.before = tasks, steps, before
        self.every = max(every, math.ceil(steps / MAX_STEP_POINTS)) if every > 0 else 0
        self.points: dict[str, list[list[float]]] = {}
        self._sum, self._count = [0.0] * len(tasks), [0.0] * len(tasks)

    def step(self, step: int, loss_sum: torch.Tensor, loss_cnt: torch.Tensor) -> None:
        if not self.every or (step % self.every and step != self.steps):
            return
        sums, counts = loss_sum.tolist(), loss_cnt.tolist()
        for i, task in enumerate(self.tasks):
            n = counts[i] - self._count[i]
            if n > 0:
                self.points.setdefault(f"loss_{task}", []).append([self.before + step, (sums[i] - self._sum[i]) / n])
        self._sum, self._count = sums, counts

    def state(self) -> dict:
        return {"points": self.points, "sum": self._sum, "count": self._count}

    def load(self, state: dict) -> None:
        """Continue from a mid-epoch state's points and sums (state.py)."""
        self.points = {k: [list(p) for p in v] for k, v in state["points"].items()}
        self._sum, self._count = list(state["sum"]), list(state["count"])


def _check_finite(recent, epoch: int) -> None:
    if not recent or bool(torch.isfinite(torch.cat([l for _, l, _ in recent])).all()):
        return
    for step, losses, step_tasks in recent:
        for value, task in zip(losses.tolist(), step_tasks):
            if not math.isfinite(value):
                raise Diverged(f"loss of task '{task}' is {value} at epoch {epoch}, step {step}; "
                                    "try a lower optim.lr or check the data")


def _epoch_line(m: dict, cfg: Config) -> str:
    scores = " ".join(f"{get_task(t).metric_name}={m[get_task(t).metric_name]:.3f}" for t in cfg.tasks)
    return (f"epoch {m['epoch']}/{cfg.train.epochs}: {scores} overall={m['overall']:.3f} "
            f"| {m['seq_per_s']:.0f} seq/s, pad {m['pad_fraction']:.0%}, train {m['train_time_s']:.1f}s")
