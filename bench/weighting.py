"""Each loss-weighting method's training step against static weights, on the same batch.

    python bench/weighting.py [--model tiny|minilm] [--steps 5] [--rounds 3] [--methods a,b,...]

One model and one tuple-sampled batch (every task's rows); every method steps on that batch
from the same weights, the methods taking turns in rounds so that machine noise hits them
alike. Printed side by side: milliseconds per step, the ratio to static's, the extra backward
passes through the shared layers and the extra FLOPs each step adds to the trial's count
(train_flops; Weighting.extra_flops), as a share of the plain step's.

Then the T x T solves alone, on one Gram matrix: mtbert's own PCGrad and CAGrad against
TorchJD's, which decides which of the two a `loss.weighting` name runs (docs/weighting.md).
"""
from __future__ import annotations

import argparse
import copy
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from mtbert.config import build_config
from mtbert.data.samplers import TaskBatches
from mtbert.data.tokenize import collate, prepare
from mtbert.model.multitask import MultitaskModel
from mtbert.train.loop import _update, make_lr_schedule, make_optimizer, seed_everything, train_step
from mtbert.train.weighting import WEIGHTINGS, make_weighting

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT / ".." / "shared"


def base_config(model: str, device: str) -> dict:
    raw = {"model": {"max_length": 128}, "sampling": {"strategy": "tuple"},
           "train": {"batch_size": 16, "device": device}, "data": {"cache_dir": str(ROOT / ".mtbert_cache")}}
    if model == "minilm":
        raw["model"]["name_or_path"] = str(SHARED / "models" / "all-MiniLM-L6-v2")
        raw["data"].update(source="cs224n", dir=str(SHARED / "data" / "minbert"), max_train_examples=200,
                           max_dev_examples=20)
    return raw


class Method:
    """One method's optimizer and state over a copy of the common starting model."""

    def __init__(self, name: str, raw: dict, model: MultitaskModel, device: torch.device):
        self.name = name
        self.cfg = build_config(raw, {"loss.weighting": name})
        self.model = copy.deepcopy(model)
        self.weighting = make_weighting(self.cfg, device)
        self.opt = make_optimizer(self.model, self.cfg, self.weighting.parameters())
        self.sched = make_lr_schedule(self.opt, self.cfg, 10**6)
        self.shared = self.model.shared_parameters()
        self.seconds, self.steps, self.extra, self.plain, self.passes, self.device = 0.0, 0, 0, 0, 0, device

    def run(self, batches, idx, steps: int) -> None:
        sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            _, _, _, packed = train_step(self.model, batches, idx, self.weighting, self.cfg, self.shared,
                                         nullcontext, None, self.device)
            _update(self.model, self.opt, self.sched, self.cfg)
            cost = getattr(self.weighting, "last_cost", None)  # read before extra_flops takes it
            self.passes = cost.extra_backward if cost is not None else 0
            self.extra = self.weighting.extra_flops(self.model, packed, self.device, 0)
            self.plain = self.model.step_flops(packed, self.device, 0)
        sync()
        self.seconds += time.perf_counter() - t0
        self.steps += steps


def solve_times(tasks: int, size: int, repeats: int) -> list[tuple[str, float]]:
    """Milliseconds per T x T solve, from one Gram matrix, mtbert's against TorchJD's."""
    from torchjd.aggregation import CAGradWeighting, PCGradWeighting

    from mtbert.train.weighting.cagrad import cagrad_coefficients
    from mtbert.train.weighting.pcgrad import pcgrad_coefficients

    torch.manual_seed(0)
    grads = torch.randn(tasks, size)
    gram = grads @ grads.T
    gen = torch.Generator().manual_seed(0)
    arms = [("pcgrad: mtbert", lambda: pcgrad_coefficients(gram, gen)),
            ("pcgrad: TorchJD", lambda: PCGradWeighting()(gram)),
            ("cagrad: mtbert (SLSQP)", lambda: cagrad_coefficients(gram.double().numpy(), 0.4)),
            ("cagrad: TorchJD (cvxpy)", lambda: CAGradWeighting(c=0.4)(gram))]
    out = []
    for label, fn in arms:
        fn()
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn()
        out.append((label, (time.perf_counter() - t0) / repeats * 1e3))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny", choices=["tiny", "minilm"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--methods", default="", help="comma-separated names (default: every registered one)")
    ap.add_argument("--solve-repeats", type=int, default=200)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    raw = base_config(args.model, args.device)
    names = [m for m in (args.methods.split(",") if args.methods else WEIGHTINGS.load()) if m]
    names = ["static"] + [m for m in names if m != "static"]
    cfg = build_config(raw, {})
    prepared = prepare(cfg, log=None)
    seed_everything(0)
    pad = prepared.tokenizer.pad_token_id or 0
    model = MultitaskModel(cfg, vocab_size=len(prepared.tokenizer), pad_token_id=pad).to(device)
    idx = [TaskBatches(len(prepared.train[t]), cfg.train.batch_size, seed=0).next() for t in cfg.tasks]
    batches = [collate(prepared.train[t], i, pad) for t, i in zip(cfg.tasks, idx)]
    methods = [Method(name, raw, model, device) for name in names]
    for m in methods:
        m.run(batches, idx, 1)  # warm-up: allocator, autograd caches, a solver's first build
        m.seconds, m.steps = 0.0, 0
    for _ in range(args.rounds):
        for m in methods:
            m.run(batches, idx, args.steps)
    base = methods[0].seconds / methods[0].steps
    tasks = len(cfg.tasks)
    print(f"{args.model}, {tasks} tasks, batch {cfg.train.batch_size} per task, {args.device}, "
          f"{args.rounds} rounds x {args.steps} steps")
    print(f"{'method':<14} {'ms/step':>9} {'vs static':>10} {'extra passes':>13} {'extra FLOPs':>12}")
    for m in methods:
        ms = m.seconds / m.steps * 1e3
        print(f"{m.name:<14} {ms:9.1f} {m.seconds / m.steps / base:9.2f}x {m.passes:>13} "
              f"{m.extra / max(m.plain, 1):11.1%}")
    size = sum(p.numel() for p in model.shared_parameters() if p.requires_grad)
    print(f"\nT x T solve alone ({tasks} tasks, Gram of {size:,}-long gradients), ms per step:")
    for label, ms in solve_times(tasks, min(size, 1_000_000), args.solve_repeats):
        print(f"  {label:<26} {ms:8.3f}")


if __name__ == "__main__":
    main()
