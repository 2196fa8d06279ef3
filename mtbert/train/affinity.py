"""Inter-task affinity telemetry: how the tasks' gradients on the shared parameters agree, and
how a step on one task's loss alone would change each other task's loss (TAG, Fifty et al.,
NeurIPS 2021), measured every `affinity.every_steps` training steps (docs/affinity.md).

At a measured step, on a held batch of every task (drawn for the measurement from its own
generator, so every task has one whatever the sampler) and with dropout off:

    cosine(i, j) = g_i . g_j / (|g_i| |g_j|)          g_i = grad of L_i on the shared parameters
    Z(i -> j)    = 1 - L_j(theta - eta g_i) / L_j(theta)

on the same batch for the gradient and the lookahead, as TAG does. Z > 0: a step on task i
lowers task j's loss (i helps j); Z < 0: it raises it. Both for the whole shared set and, where
the model shares both encoder parameters and head layers, for each of those parts alone.

The measurement leaves the run as it found it: the parameters are copied back after every
lookahead (not stepped back, which would round), nothing is written to .grad, the forwards
run in eval mode (no dropout mask drawn) and the generators' states are put back. Its FLOPs
are added to the run's train_flops (AffinityMeter.measure returns them) and its time falls in
the training time, so a run with the telemetry on shows what it cost.

What a run keeps: each measurement as a point at the run's global step, and each epoch's mean;
the epoch's points ride its report beside the step losses (step/affinity/...), its means the
report's figures (epoch/affinity/...), and `write` puts all of it in affinity.json with a
heatmap per epoch. The state (every epoch's means and the epoch in progress) rides the
checkpoint, so a resumed run's series equals an uninterrupted one's.
"""
from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from mtbert.train.grouping import (AFFINITY, COSINE, ENCODER, FOLDER, HEADS, JSON_FILE, WHOLE, draw_heatmap,
                                   encoder_layer, head_layer, matrices, mean_over_epochs, series_name)
from mtbert.train.state import capture_rng, restore_rng
from mtbert.train.weighting.base import TaskGradients, task_gradients


# One held batch's per-task losses (unreduced over tasks) and the packed layout, from the loop.
LossesOf = Callable[[dict[str, list[int]]], tuple[dict[str, torch.Tensor], object]]


def shared_parts(model, shared: Sequence[torch.nn.Parameter]) -> dict[str, set[int]]:
    """Part name -> ids of its parameters: the whole shared set; the shared encoder (embeddings,
    shared layers, pooler) and the shared head layers apart where both train; and each shared
    hidden head layer (head-layer-1 nearest the encoder) and each trained shared encoder layer
    (encoder-layer-1 nearest the embeddings) alone where several are, which is what ranks the
    head regimes and the encoder depths from one run (grouping.regime_scores, depth_scores)."""
    every = {id(p) for p in shared}
    by_depth = {depth: every & {id(p) for m in mods for p in m.parameters()}
                for depth, mods in model.heads.shared_by_depth().items()}
    heads = set().union(*by_depth.values())
    parts = {WHOLE: every}
    if heads and every - heads:
        parts.update({ENCODER: every - heads, HEADS: heads})
    layers = {depth: every & {id(p) for p in layer.parameters()}
              for depth, layer in enumerate(getattr(model, "shared_layers", []), start=1)}
    for name, per in ((head_layer, by_depth), (encoder_layer, layers)):
        if len([ids for ids in per.values() if ids]) > 1:
            parts.update({name(depth): ids for depth, ids in per.items() if ids})
    return parts


def held_batch(sizes: dict[str, int], batch_size: int, seed: int, step: int) -> dict[str, list[int]]:
    """A batch of every task's training rows for the measurement at `step`, from a generator of
    its own (seeded by the run's seed and the step): the run's generators are not drawn from."""
    rng = np.random.default_rng([seed, step])
    return {t: sorted(rng.choice(n, size=min(batch_size, n), replace=False).tolist()) for t, n in sizes.items()}


def lookahead_rates(optimizer: torch.optim.Optimizer, lookahead_lr: float | None) -> dict[int, float]:
    """id(parameter) -> eta: `lookahead_lr`, else the parameter's group's peak rate (the rate
    before the schedule's warmup and decay, which LambdaLR keeps as initial_lr)."""
    return {id(p): lookahead_lr if lookahead_lr is not None else g.get("initial_lr", g["lr"])
            for g in optimizer.param_groups for p in g["params"]}


def cosines(flat: torch.Tensor) -> torch.Tensor:
    """T x T cosine of the rows of `flat` (0 where a row is zero)."""
    norms = flat.norm(dim=1).clamp_min(torch.finfo(flat.dtype).tiny)
    return (flat @ flat.T) / norms[:, None] / norms[None, :]


class AffinityMeter:
    """The telemetry of one run: when to measure, the measurement, its points and epoch means,
    their state for a checkpoint and their files (affinity.json, a heatmap per epoch)."""

    def __init__(self, tasks: Sequence[str], every: int, lookahead_lr: float | None, batch_size: int,
                 per_part: bool, seed: int):
        self.tasks, self.every, self.lookahead_lr = list(tasks), every, lookahead_lr
        self.batch_size, self.per_part, self.seed = batch_size, per_part, seed
        self.points: dict[int, dict[str, list[list[float]]]] = {}  # epoch -> name -> [[global step, value], ...]
        self.epochs: dict[int, dict[str, float]] = {}  # epoch -> name -> the epoch's mean
        self.measured, self.flops = 0, 0  # measurements and their FLOPs so far, over the whole run

    @classmethod
    def of(cls, cfg) -> AffinityMeter:
        a = cfg.affinity
        return cls(cfg.tasks, a.every_steps, a.lookahead_lr, a.batch_size or cfg.train.batch_size, a.per_part,
                   cfg.train.seed)

    def due(self, global_step: int) -> bool:
        return self.every > 0 and global_step % self.every == 0

    # ------------------------------------------------------------------ the measurement

    def measure(self, model, shared: Sequence[torch.nn.Parameter], optimizer, sizes: dict[str, int],
                losses_of: LossesOf, epoch: int, global_step: int, device: torch.device, start: int) -> int:
        """Measure at `global_step` of `epoch` and keep the values as points; returns the FLOPs it spent.
        `losses_of(held)`: each task's loss on its rows `held[task]` and the packed layout."""
        rng, was_training = capture_rng(), model.training
        model.eval()  # no dropout: the lookahead compares losses of one function of the batch
        try:
            held = held_batch(sizes, self.batch_size, self.seed, global_step)
            losses, packed = losses_of(held)
            # A task that reaches nothing trainable (a cosine head on a frozen encoder) has no gradient.
            names = [t for t, loss in losses.items() if loss.requires_grad]
            grads = task_gradients([losses[t] for t in names], shared) if len(names) > 1 else None
            if grads is None or grads.flat is None:  # nothing trainable is shared: no affinity to measure
                return 0
            base = torch.stack([losses[t].detach().float() for t in names])
            rates = lookahead_rates(optimizer, self.lookahead_lr)
            parts = shared_parts(model, grads.shared) if self.per_part else {WHOLE: {id(p) for p in grads.shared}}
            values = {}
            for part, ids in parts.items():
                values.update(self._part(part, ids, grads, names, base, rates, lambda: losses_of(held)[0]))
        finally:
            model.train(was_training)
            restore_rng(rng)
        for name, value in values.items():
            self.points.setdefault(epoch, {}).setdefault(name, []).append([global_step, value])
        flops = measure_flops(model, packed, device, start, len(names), len(names) * len(parts))
        self.measured, self.flops = self.measured + 1, self.flops + flops
        return flops

    def _part(self, part: str, ids: set[int], grads: TaskGradients, names: list[str], base: torch.Tensor,
              rates: dict[int, float], losses: Callable[[], dict[str, torch.Tensor]]) -> dict[str, float]:
        """The cosines and lookahead affinities of one part of the shared parameters."""
        sizes = [p.numel() for p in grads.shared]
        columns = torch.cat([torch.full((n,), id(p) in ids, dtype=torch.bool) for p, n in zip(grads.shared, sizes)])
        cos = cosines(grads.flat[:, columns.to(grads.flat.device)]).tolist()
        out = {series_name(COSINE, names[i], names[j], part): cos[i][j]
               for i, j in itertools.combinations(range(len(names)), 2)}
        params = [(p, k) for k, p in enumerate(grads.shared) if id(p) in ids]
        saved = [p.detach().clone() for p, _ in params]
        for i, source in enumerate(names):
            rows = grads.flat[i].split(sizes)
            with torch.no_grad():
                for p, k in params:
                    p.sub_(rates.get(id(p), 0.0) * rows[k].view_as(p).to(p.dtype))
                after = losses()
                for (p, _), keep in zip(params, saved):
                    p.copy_(keep)  # exactly theta again: copied back, not stepped back
            for j, target in enumerate(names):
                if j != i:
                    ratio = float(after[target].float() / base[j]) if float(base[j]) > 0 else 1.0
                    out[series_name(AFFINITY, source, target, part)] = 1.0 - ratio
        return out

    # ------------------------------------------------------------------ the epoch's figures

    def end_epoch(self, epoch: int) -> None:
        """The epoch's means of its points (an epoch without a measurement has none)."""
        if self.points.get(epoch):
            self.epochs[epoch] = {name: float(np.mean([v for _, v in pts]))
                                  for name, pts in self.points[epoch].items()}

    def epoch_points(self, epoch: int) -> dict[str, list[list[float]]]:
        """The epoch's points, for its report (step/<name> at the run's global step)."""
        return {name: [list(p) for p in pts] for name, pts in self.points.get(epoch, {}).items()}

    def epoch_means(self, epoch: int) -> dict[str, float]:
        """The epoch's means, for its report (epoch/<name> at step = epoch)."""
        return dict(self.epochs.get(epoch, {}))

    def run_means(self) -> dict[str, float]:
        """Each series' mean over the epochs' means: what a suggestion reads (TAG averages the
        affinities over training)."""
        return mean_over_epochs(self.epochs)

    # ------------------------------------------------------------------ state and files

    def series(self) -> dict[str, list[list[float]]]:
        """Every point so far, per name, in step order."""
        out: dict[str, list[list[float]]] = {}
        for epoch in sorted(self.points):
            for name, pts in self.points[epoch].items():
                out.setdefault(name, []).extend(list(p) for p in pts)
        return out

    def state_dict(self) -> dict:
        return {"points": {e: self.epoch_points(e) for e in self.points},
                "epochs": {e: dict(m) for e, m in self.epochs.items()},
                "measured": self.measured, "flops": self.flops}

    def load_state_dict(self, state: dict | None) -> None:
        if not state:
            return
        self.points = {int(e): {n: [list(p) for p in pts] for n, pts in by_name.items()}
                       for e, by_name in state.get("points", {}).items()}
        self.epochs = {int(e): dict(m) for e, m in state.get("epochs", {}).items()}
        self.measured, self.flops = int(state.get("measured", 0)), int(state.get("flops", 0))

    def write(self, folder: Path, epoch: int) -> None:
        """affinity.json (the tasks, every epoch's means, every point so far, the count and
        FLOPs of the measurements) and the epoch's heatmap, into `folder`."""
        if epoch not in self.epochs:
            return
        folder.mkdir(parents=True, exist_ok=True)
        doc = {"tasks": self.tasks, "every_steps": self.every, "measured": self.measured, "flops": self.flops,
               "epochs": {str(e): m for e, m in sorted(self.epochs.items())}, "points": self.series()}
        (folder / JSON_FILE).write_text(json.dumps(doc, indent=1))
        draw_heatmap(matrices(self.epochs[epoch], self.tasks), folder / f"epoch-{epoch}.png",
                     f"inter-task affinity, epoch {epoch}", self.tasks)


def measure_flops(model, packed, device: torch.device, start: int, tasks: int, lookaheads: int) -> int:
    """What one measurement costs: 1 + `lookaheads` forwards of the held batch (the losses at
    theta, then one per task and part at theta - eta g_i) and one backward per task through the
    shared layers (task_gradients), each task's own layers and head once. Counted as step_flops
    counts (2 x params per position forward, 4 x backward; docs/guide.md)."""
    _, done = model.layer_positions(packed, device, start)
    head = model.head_flops(packed)  # 6 x params per example: forward 2, backward 4
    forward = 2 * model.layer_params() * done + head // 3
    backward = (tasks * model.shared_backward_flops(packed, device, start)
                + model.private_backward_flops(packed, device, start) + tasks * (head - head // 3))
    return int((1 + lookaheads) * forward + backward)
