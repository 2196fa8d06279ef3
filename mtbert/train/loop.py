"""The core training function: one configuration, trained and measured, top to bottom.

It knows nothing of Ray or MLflow. After each epoch it evaluates on dev and calls
`reporter(metrics, checkpoint_dir)`; the orchestrator turns that into Tune reports and
MLflow metrics, `mtbert train` into log lines.
"""
from __future__ import annotations

import copy
import functools
import json
import math
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
import torch
import yaml

from mtbert import figures
from mtbert.bundle import frozen_reference, load_stored, save_atomic, save_bundle, stored_state
from mtbert.config import Config, to_dict
from mtbert.data.samplers import TaskBatches, strategy_of, task_schedule
from mtbert.data.tokenize import Prepared, collate, pad_token_id, prepare
from mtbert.data.types import Batch
from mtbert.errors import TrainingError
from mtbert.model.multitask import MultitaskModel, Packed, count_params, model_size_mb, pack
from mtbert.tasks import get_task
from mtbert.train import measure
from mtbert.train.frozen import FrozenCache, estimate_mb
from mtbert.train.frozen import usable as frozen_usable
from mtbert.train.metrics import overall
from mtbert.train import precision
from mtbert.train.precision import autocast_for
from mtbert.train.state import STATE_FILE, capture_rng, read_state, restore_rng, sampler_position
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
    return torch.optim.AdamW([{"params": ps, "lr": lr, "weight_decay": wd}
                              for (lr, wd), ps in groups.items()], lr=cfg.optim.lr, fused=True)


def make_scheduler(optimizer: torch.optim.Optimizer, cfg: Config, total_steps: int):
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
    device = measure.pick_device(cfg.train.device)
    _, autocast = autocast_for(cfg.train.precision, device)
    # Where the run computes and in what: every report names them (a sweep tags its trials so).
    where = {"device": measure.device_name(device), "precision": precision.label(cfg.train.precision, device)}
    phase = measure.Phases(device)

    with phase("data"):
        prepared = prepared or prepare(cfg, log=log)
    tok = prepared.tokenizer
    pad_id = pad_token_id(tok)
    with phase("model"):
        model = MultitaskModel(cfg, vocab_size=len(tok), pad_token_id=pad_id).to(device)
    # A resumed run's state already holds the probed heads (and the probe's time and FLOPs).
    probed = None
    if cfg.train.probe and resume_from is None:
        with phase("probe"):
            probed = _probe(model, cfg, prepared, log)
    with phase("cache"):
        cache, cache_s = _frozen_cache(model, prepared, cfg, pad_id, device, autocast, log)
    start = cache.start if cache is not None else 0
    with phase("model"):
        weighting = make_weighting(cfg, device)
        optimizer = make_optimizer(model, cfg, weighting.parameters())
        shared = model.shared_parameters()
        params_total, params_trainable = count_params(model)
        size_mb = model_size_mb(model)

    sizes = {t: len(ds) for t, ds in prepared.train.items()}
    n_steps = steps_per_epoch(cfg, sizes)
    accum = cfg.train.grad_accum
    scheduler = make_scheduler(optimizer, cfg, math.ceil(n_steps / accum) * cfg.train.epochs)

    history: list[dict] = []
    timer = measure.StepTimer(device)
    # The cached frozen layers ran forward once over the training data, whether this run built
    # the blocks or read what another run of the same weights stored: counted once, here.
    setup_flops = model.frozen_flops(prepared.train.values(), start) if cache is not None else 0
    start_epoch, flops = 1, setup_flops
    # The fine-tuned row pays for its probe's steps, and says where the probe left it.
    start_from = {}
    if probed is not None:
        timer.elapsed = probed["train_time_s"]
        flops, setup_flops = flops + probed["train_flops"], setup_flops + probed["train_flops"]
        start_from = {"probe_overall": probed["overall"]}
    saves_state = cfg.train.save_checkpoint and (output_dir is not None or reporter is not None)
    # The frozen tensors, when a pretrained model holds them, are named in the resumable state
    # rather than stored (mtbert/bundle.py): the run that resumes builds them from that model.
    with phase("checkpoint"):
        reference = frozen_reference(model, cfg) if saves_state else None
    rng_state = None
    if resume_from is not None:
        state = read_state(Path(resume_from) / STATE_FILE, device)
        if not state.get("final"):  # a finished run's state has no weights: no epoch is left to train
            load_stored(model, state["model"], state.get("frozen"), Path(resume_from) / STATE_FILE,
                        cfg.model.name_or_path, "give model.name_or_path the weights the run started from, "
                        "or train afresh")
            optimizer.load_state_dict(state["optimizer"])
            if "scheduler" in state:  # the resumed run continues on the same LR curve
                scheduler.load_state_dict(state["scheduler"])
            weighting.load_state_dict(state.get("weighting", {}))
        history, timer.elapsed, start_epoch = state["history"], state["train_time_s"], state["epoch"] + 1
        if history and "probe_overall" in history[0]:
            start_from = {"probe_overall": history[0]["probe_overall"]}
        flops = history[-1].get("train_flops", 0) if history else 0
        setup_flops = history[-1].get("setup_flops", 0) if history else 0
        rng_state = state.get("rng")
        if output_dir is not None and (Path(resume_from) / "best").is_dir():
            _take_best(Path(resume_from) / "best", Path(output_dir) / "best")
        log(f"resumed from {resume_from} at epoch {start_epoch}")

    # Shares of each task's training rows and tokens that max_length cut: reported every
    # epoch, so a sweep's MLflow runs carry them like any figure.
    trunc = {}
    for t in prepared.truncation():
        if t.split == "train":
            trunc.update({f"trunc_rows_{t.task}": t.rows_cut / max(t.rows, 1),
                          f"trunc_tokens_{t.task}": t.lost_share})
    # Last before the first step: whatever ran since the seed (model init, data, the frozen
    # cache) drew from the generators differently on a resume; the steps now draw what they
    # would have. (PCGrad's own generator is in the weighting method's state.)
    restore_rng(rng_state)
    with phase("model"):  # it collects what earlier runs of the process left
        measure.reset_peak_memory(device)
    # Checking finiteness needs a host sync; on CPU it is free, on GPU we batch the check.
    check_every = 1 if device.type == "cpu" else 25
    out_dir = Path(output_dir) if output_dir else None
    bundle_saved = False  # by this call: a resumed run's best/ is a copy, rewritten whole once
    # Every checkpoint carries the config; the same text each epoch.
    config_text = yaml.safe_dump(to_dict(cfg), sort_keys=False) if reporter is not None and saves_state else ""
    since_best = len(history) - 1 - figures.best_epoch_index(history) if history else 0

    for epoch in range(start_epoch, cfg.train.epochs + 1):
        if cfg.train.patience is not None and since_best >= cfg.train.patience:
            break  # a resumed run that had already run out of patience
        schedule = task_schedule(cfg.sampling.strategy, sizes, epoch, cfg.train.epochs, n_steps, cfg.train.seed)
        iters = {t: TaskBatches(sizes[t], cfg.train.batch_size, seed=cfg.train.seed * 1000 + epoch)
                 for t in cfg.tasks}
        loss_sum = torch.zeros(len(cfg.tasks), device=device)
        loss_cnt = torch.zeros(len(cfg.tasks), device=device)
        weight_sum = torch.zeros(len(cfg.tasks), device=device)
        recent: list[tuple[int, torch.Tensor, list[str]]] = []
        points = StepLosses(cfg.tasks, cfg.train.log_every_steps, len(schedule), (epoch - 1) * n_steps)
        seqs, pad_tokens, all_tokens, real_tokens = 0, 0, 0, 0
        epoch_t0, epoch_flops0 = timer.elapsed, flops
        if progress is not None:
            progress.start_epoch()
        with timer:
            for step, step_tasks in enumerate(schedule, 1):
                idx_of = [iters[t].next() for t in step_tasks]
                batches = [_batch(prepared.train[t], idx, pad_id, cache) for t, idx in zip(step_tasks, idx_of)]
                # Gradients of `accum` micro-batches add up to one optimizer step; each loss is
                # scaled by its group's size, so the step sees their mean.
                group = (step - 1) // accum
                group_size = min(accum, len(schedule) - group * accum)
                losses, raws, step_weights, packed = train_step(
                    model, batches, idx_of, weighting, cfg, shared, autocast, cache, device,
                    scale=1.0 / group_size)
                if step == len(schedule) or step % accum == 0:
                    _update(model, optimizer, scheduler, cfg)
                real, done = model.layer_positions(packed, device, start)
                pad_tokens += done - real
                all_tokens += done
                real_tokens += sum(packed.lengths)
                # A gradient method's extra backward passes and solve count too (weighting/base.py).
                flops += model.step_flops(packed, device, start) + weighting.extra_flops(model, packed, device, start)
                for b, raw in zip(batches, raws):
                    i = cfg.tasks.index(b.task)
                    loss_sum[i] += raw
                    loss_cnt[i] += 1
                    weight_sum[i] += step_weights[b.task]
                    seqs += len(b)
                recent.append((step, losses, step_tasks))
                points.step(step, loss_sum, loss_cnt)
                if step % check_every == 0 or step == len(schedule):
                    _check_finite(recent, epoch)
                    recent.clear()
                if progress is not None:
                    progress.step(epoch, step, len(schedule), seqs, losses)
        epoch_time = timer.elapsed - epoch_t0

        with phase("eval"):
            scores = evaluate(model, prepared.dev, cfg, device, pad_id, autocast, cache)
        mean_loss = (loss_sum / loss_cnt.clamp(min=1)).tolist()
        mean_weight, trained = (weight_sum / loss_cnt.clamp(min=1)).tolist(), loss_cnt.tolist()
        weighting.end_epoch({t: mean_loss[i] for i, t in enumerate(cfg.tasks)})
        m = {"epoch": epoch, **epoch_metrics(scores)}
        m.update({f"loss_{t}": mean_loss[i] for i, t in enumerate(cfg.tasks)})
        # The weighting method's effective weight of each task, averaged over its steps.
        m.update({f"weight_{t}": mean_weight[i] for i, t in enumerate(cfg.tasks) if trained[i]})
        # MFU counts the useful work only: the epoch's counted FLOPs less their padding share.
        useful_flops = (flops - epoch_flops0) * (1 - pad_tokens / max(all_tokens, 1))
        peak = measure.matmul_peak(device, precision.label(cfg.train.precision, device))
        m.update(seq_per_s=seqs / max(epoch_time, 1e-9), pad_fraction=pad_tokens / max(all_tokens, 1),
                 tokens_per_s=real_tokens / max(epoch_time, 1e-9), mfu=useful_flops / max(epoch_time, 1e-9) / peak,
                 epoch_time_s=epoch_time, train_time_s=timer.elapsed, train_flops=flops, setup_flops=setup_flops,
                 lr=scheduler.get_last_lr()[0], frozen_cache_s=cache_s,
                 peak_memory_mb=measure.peak_memory_mb(device), model_size_mb=size_mb,
                 params_total=params_total, params_trainable=params_trainable, **trunc, **start_from)
        history.append(m)
        # The best epoch is the summary's (figures.py), so the bundle saved is the one it names.
        summary = figures.summary(history)
        if summary["best_epoch"] == epoch:
            since_best = 0
            if out_dir is not None and cfg.train.save_checkpoint:
                with phase("checkpoint"):
                    # After this run's first save only the weights change.
                    save_bundle(out_dir / "best", model, cfg, tok, weights_only=bundle_saved)
                bundle_saved = True
        else:
            since_best += 1
        m.update(best_overall=summary["overall"], best_epoch=summary["best_epoch"])
        if progress is not None:
            progress.end_epoch()
        log(_epoch_line(m, cfg))
        state = None
        out_of_patience = cfg.train.patience is not None and since_best >= cfg.train.patience
        last = epoch == cfg.train.epochs or out_of_patience
        with phase("checkpoint"):
            if saves_state:
                state = _state(model, reference, optimizer, scheduler, weighting, history, timer.elapsed,
                               epoch, final=last and reporter is not None)
            if out_dir is not None and state is not None and reporter is None:
                (out_dir / "last").mkdir(parents=True, exist_ok=True)
                save_atomic(state, out_dir / "last" / STATE_FILE)
        if reporter is not None:
            # The summary rides every report: a trial its scheduler stops never returns.
            # The step points ride the report, not the history: results and checkpoints stay as they were.
            _report(reporter, {**m, figures.SUMMARY_KEY: summary, figures.STEP_LOSSES: points.points,
                               figures.WHERE_KEY: where}, state, config_text, out_dir, phase, timer.elapsed)
        if out_of_patience:
            log(f"no new best overall for {since_best} evaluations (train.patience): stopping; "
                f"best epoch {summary['best_epoch']}")
            break

    result = Result(figures.summary(history), history, to_dict(cfg), prepared.data_report(),
                    [t.to_dict() for t in prepared.truncation()], model, phase.snapshot(timer.elapsed))
    if out_dir is not None:
        result.save(out_dir / "result.json")
    return result


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


def _check_finite(recent, epoch: int) -> None:
    if not recent or bool(torch.isfinite(torch.cat([l for _, l, _ in recent])).all()):
        return
    for step, losses, step_tasks in recent:
        for value, task in zip(losses.tolist(), step_tasks):
            if not math.isfinite(value):
                raise TrainingError(f"loss of task '{task}' is {value} at epoch {epoch}, step {step}; "
                                    "try a lower optim.lr or check the data")


def _epoch_line(m: dict, cfg: Config) -> str:
    scores = " ".join(f"{get_task(t).metric_name}={m[get_task(t).metric_name]:.3f}" for t in cfg.tasks)
    return (f"epoch {m['epoch']}/{cfg.train.epochs}: {scores} overall={m['overall']:.3f} "
            f"| {m['seq_per_s']:.0f} seq/s, pad {m['pad_fraction']:.0%}, train {m['train_time_s']:.1f}s")


def _take_best(kept: Path, best: Path) -> None:
    """A resumed run continues from its checkpoint's best/, not from whatever its folder holds:
    another node's trial folder has none, and after a stop the trainable left there a link into
    the checkpoint, which a save must not write through (orchestration/run/trainable.py)."""
    if best.is_symlink() or best.is_file():
        best.unlink()
    elif best.is_dir():
        shutil.rmtree(best)
    shutil.copytree(kept, best)


def _state(model, reference: dict | None, optimizer, scheduler, weighting: Weighting, history, train_time,
           epoch: int, final: bool = False) -> dict:
    """Everything a resume needs to continue as if never stopped (mtbert/train/state.py). The
    model's frozen tensors are named by `reference` when a pretrained model holds them
    (mtbert/bundle.py). `final`: a sweep trial's last checkpoint, from which a resume trains no
    epoch: history and counters only, without the model and optimizer (about three times the
    model's size on the disk of every finished trial; best/ travels beside it)."""
    state = {"history": history, "train_time_s": train_time, "epoch": epoch, "rng": capture_rng(),
             "sampler": sampler_position(epoch)}
    if final:
        state["final"] = True
    else:
        state.update({"model": stored_state(model, reference), "frozen": reference,
                      "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                      "weighting": weighting.state_dict()})
    return state


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem, or one without hard links
        shutil.copy2(src, dst)


def _report(reporter: Reporter, m: dict, state: dict | None, config_text: str, out_dir: Path | None,
            phase: measure.Phases, train_s: float) -> None:
    """`config_text`: the run's config as YAML, kept in the checkpoint. `phase`: checkpoint for
    the folder written here, report for the reporter's own time (in a sweep: Tune persisting
    the folder and handing the report to the driver)."""
    if state is None:
        with phase("report"):
            reporter({**m, "timings": phase.snapshot(train_s)}, None)
        return
    # In the run's folder, not the machine's temp: a sweep trial stopped inside the reporter
    # may never delete it, and there the driver does (orchestration/run/trainable.py).
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".checkpoint-" if out_dir is not None else "mtbert-checkpoint-", dir=out_dir))
    try:
        with phase("checkpoint"):
            torch.save(state, tmp / STATE_FILE)
            (tmp / "config.yaml").write_text(config_text)
            # The best epoch's bundle travels with the checkpoint into the sweep's storage, where
            # the driver logs it to MLflow. Linked, not copied, where the folder allows: the
            # reporter copies what it keeps, and save_bundle replaces files by a rename, never
            # writing through a link.
            if out_dir is not None and (out_dir / "best").is_dir():
                shutil.copytree(out_dir / "best", tmp / "best", copy_function=_link_or_copy)
        with phase("report"):  # the reporter persists the folder if it wants it
            reporter({**m, "timings": phase.snapshot(train_s)}, str(tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
