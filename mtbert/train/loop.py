"""The core training function: one configuration, trained and measured, top to bottom.

It knows nothing of Ray or MLflow. After each epoch it evaluates on dev and calls
`reporter(metrics, checkpoint_dir)`; the orchestrator turns that into Tune reports and
MLflow metrics, `mtbert train` into log lines.
"""
from __future__ import annotations

import json
import math
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import yaml

from mtbert.config import Config, to_dict
from mtbert.data.samplers import TaskBatches, task_schedule
from mtbert.data.tokenize import Prepared, collate, prepare
from mtbert.model.multitask import MultitaskModel, count_params, model_size_mb, pack
from mtbert.tasks import get_task
from mtbert.train import measure
from mtbert.train.metrics import overall

Reporter = Callable[[dict, "str | None"], None]


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. a non-finite loss); the message is one readable line."""


@dataclass
class Result:
    metrics: dict  # final figures: best-epoch scores + measurements
    epochs: list[dict] = field(default_factory=list)  # per-epoch metrics
    config: dict = field(default_factory=dict)
    data_report: list[str] = field(default_factory=list)  # bad-row summaries

    def to_dict(self) -> dict:
        return {"metrics": self.metrics, "epochs": self.epochs, "config": self.config,
                "data_report": self.data_report}

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2))
        return path


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def make_optimizer(model: torch.nn.Module, cfg: Config) -> torch.optim.Optimizer:
    params = [p for p in {id(p): p for p in model.parameters()}.values() if p.requires_grad]
    # No decay on biases and LayerNorm gains (the usual BERT fine-tuning recipe).
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.optim.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=cfg.optim.lr)


def steps_per_epoch(cfg: Config, sizes: dict[str, int]) -> int:
    if cfg.sampling.steps_per_epoch:
        return cfg.sampling.steps_per_epoch
    bs = cfg.train.batch_size
    # tuple: one pass over the largest task; one-task-per-step samplers: one pass over all data.
    n = max(sizes.values()) if cfg.sampling.strategy == "tuple" else sum(sizes.values())
    return max(1, math.ceil(n / bs))


@torch.no_grad()
def evaluate(model: MultitaskModel, dev: dict, cfg: Config, device, pad_id: int, autocast) -> dict[str, float]:
    model.eval()
    scores = {}
    for name, ds in dev.items():
        task = get_task(name)
        # Length-sorted batches waste less padding; scores do not depend on order.
        order = sorted(range(len(ds)), key=lambda i: len(ds.sides[0][i]))
        preds, labels = [], []
        for at in range(0, len(order), cfg.train.eval_batch_size):
            batch = collate(ds, order[at:at + cfg.train.eval_batch_size], pad_id)
            packed = pack([batch]).to(device)  # packed on the host: row lengths need no device sync
            with autocast():
                out = model.from_embeddings(packed, model.embed(packed))[name]
            preds.append(task.predict(out.float()))
            labels.append(batch.labels.to(device))
        scores[name] = task.score(torch.cat(preds), torch.cat(labels))
    model.train()
    return scores


def epoch_metrics(scores: dict[str, float]) -> dict[str, float]:
    out = {get_task(t).metric_name: s for t, s in scores.items()}
    out["overall"] = overall(list(scores.values()))
    out["overall_cs224n"] = overall([get_task(t).cs224n_score(s) for t, s in scores.items()])
    return out


def train(cfg: Config, reporter: Reporter | None = None, output_dir: str | Path | None = None,
          resume_from: str | Path | None = None, prepared: Prepared | None = None,
          log: Callable[[str], None] | None = print) -> Result:
    log = log or (lambda _msg: None)
    seed_everything(cfg.train.seed)
    device = measure.pick_device(cfg.train.device)
    use_bf16 = cfg.train.precision == "bf16" or (cfg.train.precision == "auto" and device.type == "cuda")
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if use_bf16 else nullcontext

    prepared = prepared or prepare(cfg, log=log)
    tok = prepared.tokenizer
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    model = MultitaskModel(cfg, vocab_size=len(tok), pad_token_id=pad_id).to(device)
    optimizer = make_optimizer(model, cfg)
    shared = model.shared_parameters() if cfg.loss.pcgrad else []
    params_total, params_trainable = count_params(model)
    size_mb = model_size_mb(model)

    history: list[dict] = []
    timer = measure.StepTimer(device)
    start_epoch = 1
    if resume_from is not None:
        state = torch.load(Path(resume_from) / "state.pt", map_location=device, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        history, timer.elapsed, start_epoch = state["history"], state["train_time_s"], state["epoch"] + 1
        log(f"resumed from {resume_from} at epoch {start_epoch}")

    sizes = {t: len(ds) for t, ds in prepared.train.items()}
    n_steps = steps_per_epoch(cfg, sizes)
    weights = {t: cfg.loss_weight(t) for t in cfg.tasks}
    gen = torch.Generator(device=device).manual_seed(cfg.train.seed) if cfg.loss.pcgrad else None
    measure.reset_peak_memory(device)
    # Checking finiteness needs a host sync; on CPU it is free, on GPU we batch the check.
    check_every = 1 if device.type == "cpu" else 25
    out_dir = Path(output_dir) if output_dir else None
    best = max(history, key=lambda m: m["overall"]) if history else None

    for epoch in range(start_epoch, cfg.train.epochs + 1):
        schedule = task_schedule(cfg.sampling.strategy, sizes, epoch, cfg.train.epochs, n_steps,
                                 cfg.train.seed)
        iters = {t: TaskBatches(sizes[t], cfg.train.batch_size, seed=cfg.train.seed * 1000 + epoch)
                 for t in cfg.tasks}
        loss_sum = torch.zeros(len(cfg.tasks), device=device)
        loss_cnt = torch.zeros(len(cfg.tasks), device=device)
        recent: list[tuple[int, torch.Tensor, list[str]]] = []
        seqs, pad_tokens, all_tokens = 0, 0, 0
        epoch_t0 = timer.elapsed
        with timer:
            for step, step_tasks in enumerate(schedule, 1):
                # Collate and pack on the host (padding counts cost no device sync), move once.
                batches = [collate(prepared.train[t], iters[t].next(), pad_id) for t in step_tasks]
                packed = pack(batches)
                real, done = model.layer_positions(packed, device)
                pad_tokens += done - real
                all_tokens += done
                packed = packed.to(device)
                batches = [b.to(device) for b in batches]
                losses, raws = train_step(model, optimizer, packed, batches, weights, cfg, shared, gen, autocast)
                for b, raw in zip(batches, raws):
                    i = cfg.tasks.index(b.task)
                    loss_sum[i] += raw
                    loss_cnt[i] += 1
                    seqs += len(b)
                recent.append((step, losses, step_tasks))
                if step % check_every == 0 or step == len(schedule):
                    _check_finite(recent, epoch)
                    recent.clear()
        epoch_time = timer.elapsed - epoch_t0

        scores = evaluate(model, prepared.dev, cfg, device, pad_id, autocast)
        mean_loss = (loss_sum / loss_cnt.clamp(min=1)).tolist()
        m = {"epoch": epoch, **epoch_metrics(scores)}
        m.update({f"loss_{t}": mean_loss[i] for i, t in enumerate(cfg.tasks)})
        m.update(seq_per_s=seqs / max(epoch_time, 1e-9), pad_fraction=pad_tokens / max(all_tokens, 1),
                 epoch_time_s=epoch_time, train_time_s=timer.elapsed,
                 peak_memory_mb=measure.peak_memory_mb(device), model_size_mb=size_mb,
                 params_total=params_total, params_trainable=params_trainable)
        if best is None or m["overall"] > best["overall"]:
            best = m
            if out_dir is not None and cfg.train.save_checkpoint:
                _save_model(model, cfg, out_dir / "best")
        m.update(best_overall=best["overall"], best_epoch=best["epoch"])
        history.append(m)
        log(_epoch_line(m, cfg))
        if reporter is not None:
            _report(reporter, m, model, optimizer, history, timer.elapsed, epoch, cfg)

    keep = {get_task(t).metric_name for t in cfg.tasks} | {"overall", "overall_cs224n"}
    final = {k: best[k] for k in best if k in keep}
    final.update(best_epoch=best["epoch"], train_time_s=timer.elapsed,
                 peak_memory_mb=max(h["peak_memory_mb"] for h in history), model_size_mb=size_mb,
                 params_total=params_total, params_trainable=params_trainable, epochs_run=len(history))
    result = Result(final, history, to_dict(cfg), [b.summary() for b in prepared.bad_rows if b.total])
    if out_dir is not None:
        result.save(out_dir / "result.json")
    return result


def train_step(model: MultitaskModel, optimizer, packed, batches, weights: dict[str, float], cfg: Config,
               shared: list, gen, autocast) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One optimizer step on the packed batches of this step's tasks. Returns the weighted
    losses (stacked, detached) and the raw per-task losses, all still on the device."""
    with autocast():
        out = model.from_embeddings(packed, model.embed(packed))
    losses, raws = [], []
    for b in batches:
        task = get_task(b.task)
        raw = task.loss(out[b.task].float(), b.labels)
        loss = weights[b.task] * raw
        if cfg.loss.smart.weight > 0:
            loss = loss + weights[b.task] * cfg.loss.smart.weight * smart_term(
                model, b, task, out[b.task].float(), cfg, autocast)
        losses.append(loss)
        raws.append(raw.detach())
    if shared:
        from mtbert.train.pcgrad import pcgrad_backward
        pcgrad_backward(losses, shared, generator=gen)
    else:
        torch.stack(losses).sum().backward()
    if cfg.optim.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]],
                                       cfg.optim.grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return torch.stack([l.detach() for l in losses]), raws


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


def _check_finite(recent, epoch: int) -> None:
    if not recent:
        return
    if bool(torch.isfinite(torch.cat([l for _, l, _ in recent])).all()):
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


def _save_model(model, cfg: Config, path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), path / "model.pt")
    (path / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))


def _report(reporter: Reporter, m: dict, model, optimizer, history, train_time, epoch, cfg: Config) -> None:
    if not cfg.train.save_checkpoint:
        reporter(dict(m), None)
        return
    tmp = Path(tempfile.mkdtemp(prefix="mtbert-ckpt-"))
    try:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "history": history, "train_time_s": train_time, "epoch": epoch}, tmp / "state.pt")
        (tmp / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
        reporter(dict(m), str(tmp))  # the reporter persists the directory if it wants it
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
