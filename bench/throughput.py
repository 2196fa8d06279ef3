"""Training throughput, measured side by side in one process.

    python bench/throughput.py [--steps 30] [--rounds 3] [--models tiny,minilm]

Comparisons (each prints sequences/s of both arms and their ratio):
  packed-vs-naive  the real train step (dynamic padding, all tasks' rows packed into one
                   forward, run in length buckets) vs a naive loop (pad to max_length, each
                   task's batch through its own full forward, no buckets), same model and
                   data, tuple sampling.
  bi-vs-cross      pairs.encoding: bi vs cross (real step).
  pcgrad-on-vs-off loss.weighting: pcgrad vs static (real step, tuple sampling).
  famo-vs-static   loss.weighting: famo vs static (real step, tuple sampling).
  buckets          train.length_buckets on vs off (one padded batch), real step, with the
                   padding each leaves, for 3-bert and 1-bert.
  build-vs-forward the frozen-layer cache's build (the whole encoder frozen, every training
                   sequence once) vs the real step's forward alone (eval, no gradients), in
                   encoder rows per second (a pair's two sides count two): how near the
                   sweep's shared setup runs to the encoder's forward speed.
Arms alternate in rounds so that machine noise hits both alike; only ratios are stable.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from mtbert.config import build_config
from mtbert.data.samplers import TaskBatches
from mtbert.data.tokenize import collate, prepare
from mtbert.data.types import Batch, Encoded
from mtbert.model.multitask import MultitaskModel, pack
from mtbert.train.frozen import FrozenCache
from mtbert.train.loop import _update, make_lr_schedule, make_optimizer, seed_everything, train_step
from mtbert.train.weighting import make_weighting

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT / ".." / "shared"
MINILM = SHARED / "models" / "all-MiniLM-L6-v2"
MINBERT = SHARED / "data" / "minbert"


def base_config(model: str) -> dict:
    raw = {"model": {"max_length": 128}, "sampling": {"strategy": "tuple"},
           "train": {"batch_size": 16, "device": "cpu"}, "data": {"cache_dir": str(ROOT / ".mtbert_cache")},
           "sharing": {"encoder_shared_layers": None}}
    if model == "minilm":
        raw["model"]["name_or_path"] = str(MINILM)
        raw["data"].update(source="cs224n", dir=str(MINBERT), max_train_examples=2000, max_dev_examples=50)
    return raw


def pad_to(batch: Batch, length: int) -> Batch:
    """The naive baseline pads every sequence to max_length."""
    def grow(t: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(t.shape[0], length, dtype=t.dtype)
        out[:, : t.shape[1]] = t
        return out
    return Batch(batch.task, [Encoded(grow(e.input_ids), grow(e.attention_mask), grow(e.token_type_ids))
                              for e in batch.inputs], batch.labels)


class Arm:
    def __init__(self, label: str, raw: dict, overrides: dict, naive: bool = False):
        self.label, self.naive = label, naive
        self.cfg = build_config(raw, overrides)
        self.prepared = prepare(self.cfg, log=None)
        seed_everything(0)
        tok = self.prepared.tokenizer
        self.pad = tok.pad_token_id or 0
        self.model = MultitaskModel(self.cfg, vocab_size=len(tok), pad_token_id=self.pad)
        self.weighting = make_weighting(self.cfg)
        self.opt = make_optimizer(self.model, self.cfg, self.weighting.parameters())
        self.sched = make_lr_schedule(self.opt, self.cfg, 10**6)
        self.shared = self.model.shared_parameters()
        self.weights = {t: self.cfg.loss_weight(t) for t in self.cfg.tasks}
        self.iters = {t: TaskBatches(len(ds), self.cfg.train.batch_size, seed=0)
                      for t, ds in self.prepared.train.items()}
        self.seqs, self.seconds = 0, 0.0

    def step(self) -> None:
        idx = [self.iters[t].next() for t in self.cfg.tasks]
        batches = [collate(self.prepared.train[t], i, self.pad) for t, i in zip(self.cfg.tasks, idx)]
        if self.naive:
            losses = [self.weights[b.task] * self.model.tasks[self.cfg.tasks.index(b.task)].loss(
                self.naive_forward(b), b.labels) for b in batches]
            torch.stack(losses).sum().backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.optim.grad_clip)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        else:
            train_step(self.model, batches, idx, self.weighting, self.cfg, self.shared, nullcontext,
                       None, torch.device("cpu"))
            _update(self.model, self.opt, self.sched, self.cfg)
        self.seqs += sum(len(b) for b in batches)

    def naive_forward(self, batch: Batch) -> torch.Tensor:
        """One task alone, every position of max_length computed (attention still masked)."""
        packed = pack([pad_to(batch, self.cfg.model.max_length)])
        packed.lengths = [self.cfg.model.max_length] * len(packed.lengths)  # no trimming
        return self.model.from_embeddings(packed, self.model.embed(packed))[batch.task]

    def run(self, steps: int) -> None:
        t0 = time.perf_counter()
        for _ in range(steps):
            self.step()
        self.seconds += time.perf_counter() - t0

    def padding(self, steps: int = 50) -> float:
        """Share of the encoder's layer positions that are padding, over `steps` sampled steps."""
        iters = {t: TaskBatches(len(ds), self.cfg.train.batch_size, seed=1) for t, ds in self.prepared.train.items()}
        real = done = 0
        for _ in range(steps):
            packed = pack([collate(self.prepared.train[t], iters[t].next(), self.pad) for t in self.cfg.tasks])
            r, d = self.model.layer_positions(packed, torch.device("cpu"))
            real, done = real + r, done + d
        return 1 - real / done

    @property
    def rate(self) -> float:
        return self.seqs / self.seconds


def compare(title: str, a: Arm, b: Arm, steps: int, rounds: int) -> float:
    for arm in (a, b):
        arm.run(2)  # warm-up: allocator, autograd graph caches
        arm.seqs, arm.seconds = 0, 0.0
    for _ in range(rounds):
        a.run(steps)
        b.run(steps)
    ratio = a.rate / b.rate
    print(f"{title:<34} {a.label}: {a.rate:8.1f} seq/s   {b.label}: {b.rate:8.1f} seq/s   ratio {ratio:5.2f}x")
    return ratio


class Build:
    """The frozen-layer cache's build over `examples` training rows per task, as a sweep's
    driver computes it (mtbert/train/frozen.py: length-sorted batches of 64), into a fresh folder."""

    def __init__(self, raw: dict, examples: int, cache_dir: str):
        data = {**raw["data"], "cache_dir": cache_dir}
        if raw["data"].get("source") == "cs224n":
            data["max_train_examples"] = examples
        else:
            data["synthetic"] = {"train_size": examples, "dev_size": 16}
        self.cfg = build_config({**raw, "data": data}, {"freeze.layers": -1})
        self.prepared = prepare(self.cfg, log=None)
        seed_everything(0)
        tok = self.prepared.tokenizer
        self.model = MultitaskModel(self.cfg, vocab_size=len(tok), pad_token_id=tok.pad_token_id or 0)
        self.rows = sum(len(ds) * len(ds.packed) for ds in self.prepared.train.values())

    def rate(self) -> float:
        t0 = time.perf_counter()
        FrozenCache(self.model, {"train": self.prepared.train}, self.prepared.tokenizer.pad_token_id or 0,
                    torch.device("cpu"), nullcontext, "fp32", self.cfg.data.cache_dir)
        return self.rows / (time.perf_counter() - t0)


@torch.no_grad()
def forward_rate(arm: Arm, steps: int) -> float:
    """The real step's forward alone (packed, length buckets, eval mode, no gradients)."""
    arm.model.eval()
    rows, seconds = 0, 0.0
    for step in range(steps + 2):  # two warm-up steps
        idx = [arm.iters[t].next() for t in arm.cfg.tasks]
        packed = pack([collate(arm.prepared.train[t], i, arm.pad) for t, i in zip(arm.cfg.tasks, idx)])
        t0 = time.perf_counter()
        arm.model.from_embeddings(packed, arm.model.embed(packed))
        if step >= 2:
            rows, seconds = rows + len(packed.lengths), seconds + time.perf_counter() - t0
    return rows / seconds


def build_vs_forward(raw: dict, steps: int, examples: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        build = Build(raw, examples, tmp).rate()
    forward = forward_rate(Arm("forward", raw, {}), steps)
    print(f"{'cache build vs step forward':<34} build: {build:8.1f} rows/s   forward: {forward:8.1f} rows/s   "
          f"ratio {build / forward:5.2f}x")
    return build / forward


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--models", default="tiny,minilm")
    ap.add_argument("--only", default="packed-vs-naive,bi-vs-cross,pcgrad-on-vs-off,famo-vs-static,buckets,"
                                      "build-vs-forward")
    ap.add_argument("--build-examples", type=int, default=300, help="training rows per task the cache build computes")
    # One thread by default: on a small shared machine, intra-op threads that wait on each
    # other turn load from other processes into 10x swings that no alternation can cancel.
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    only = args.only.split(",")
    for model in args.models.split(","):
        if model == "minilm" and not MINILM.is_dir():
            print("minilm: ../shared/models/all-MiniLM-L6-v2 not found, skipped")
            continue
        raw = base_config(model)
        print(f"== {model} (batch 16 per task, max_length 128, 3 tasks per step, CPU, "
              f"{torch.get_num_threads()} threads)")
        if "packed-vs-naive" in only:
            compare("packed trunk vs naive loop", Arm("packed", raw, {}),
                    Arm("naive", raw, {"train.length_buckets": False}, naive=True), args.steps, args.rounds)
        if "bi-vs-cross" in only:
            compare("bi vs cross pairs", Arm("bi", raw, {"pairs.encoding": "bi"}),
                    Arm("cross", raw, {"pairs.encoding": "cross"}), args.steps, args.rounds)
        if "pcgrad-on-vs-off" in only:
            compare("pcgrad on vs off", Arm("pcgrad", raw, {"loss.weighting": "pcgrad"}),
                    Arm("plain", raw, {}), args.steps, args.rounds)
        if "famo-vs-static" in only:  # FAMO's claim: O(1) extra work, no per-task backward
            compare("famo vs static", Arm("famo", raw, {"loss.weighting": "famo"}),
                    Arm("static", raw, {}), args.steps, args.rounds)
        if "buckets" in only:
            for k, name in ((0, "3-bert"), (None, "1-bert")):
                on = Arm("buckets", raw, {"train.length_buckets": True, "sharing.encoder_shared_layers": k})
                off = Arm("one batch", raw, {"train.length_buckets": False, "sharing.encoder_shared_layers": k})
                compare(f"{name} buckets vs one batch ({on.padding():.0%} vs {off.padding():.0%} pad)",
                        on, off, args.steps, args.rounds)
        if "build-vs-forward" in only:
            build_vs_forward(raw, args.steps * args.rounds, args.build_examples)


if __name__ == "__main__":
    main()
