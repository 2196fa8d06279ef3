"""The real training step against a competent hand-written loop, and its MFU, on MiniLM and
the CS224N data.

    python bench/recipe.py [--steps 10] [--rounds 3] [--threads 1] [--device cpu|cuda]
                           [--encoder minilm|bert-base] [--batch-size 16] [--repeat K]

The hand-written loop is what a careful user writes with transformers alone: AutoModel, one
shared encoder, each task's batch through its own forward (both sides of a pair stacked into
that forward), padded to the batch's longest row, mean pooling, a linear head per task
(pairs on [u, v, |u-v|, u*v]), AdamW. It runs in fp32 and under bf16 autocast. The real step
is mtbert's train step (rows of every task packed into one forward, length buckets) under
the same two precisions. Arms alternate in rounds; only ratios are stable on a shared machine.

MFU, as nanoGPT prints it: achieved FLOP/s of the step (6 x non-embedding parameters x real
tokens per second: the useful work; padding computed is waste, not credit) over this core's
measured bf16 matmul peak (a large square matmul on the same threads, or on the GPU).

`--encoder bert-base` is a random-init encoder of BERT-base's shape (12 layers, 768 wide, 12
heads) over a WordPiece vocabulary trained on the same data: the size MFU is usually quoted
at, with nothing to download; `--encoder minilm-shape` is MiniLM's shape (6 layers, 384 wide)
the same way, its step's speed without its weights. `--device cuda` runs every arm on the GPU. CS224N sentences are
10-30 tokens; `--repeat K` writes each sentence K times over (rows cut at 128 tokens), for the
128-token rows MFU is usually quoted at.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F

from _real import MINBERT, MINILM, ROOT, parse_or_skip
from mtbert.config import build_config
from mtbert.data.samplers import TaskBatches
from mtbert.data.tokenize import collate, prepare
from mtbert.model.encoder import encoder_config
from mtbert.model.multitask import MultitaskModel
from mtbert.tasks import get_task
from mtbert.train.loop import _update, make_lr_schedule, make_optimizer, seed_everything, train_step
from mtbert.train.measure import cpu_has_bf16, matmul_peak, sync
from mtbert.train.precision import autocast_for, matmul_precision
from mtbert.train.weighting import make_weighting

# Random-init encoders of known shapes, over a WordPiece vocabulary trained on the data.
SHAPES = {"bert-base": {"layers": 12, "hidden": 768, "heads": 12, "intermediate": 3072},
          "minilm-shape": {"layers": 6, "hidden": 384, "heads": 12, "intermediate": 1536}}


def raw_config(device: str, encoder: str, batch_size: int) -> dict:
    model = ({"name_or_path": str(MINILM)} if encoder == "minilm" else {"name_or_path": "tiny", "tiny": SHAPES[encoder]})
    return {"model": {**model, "max_length": 128}, "sampling": {"strategy": "tuple"},
            "train": {"batch_size": batch_size, "device": device},
            "data": {"source": "cs224n", "dir": str(MINBERT), "max_train_examples": 2000, "max_dev_examples": 50,
                     "cache_dir": str(ROOT / ".mtbert_cache")}}


def transformers_encoder(cfg, vocab_size: int):
    """The encoder as a user of transformers alone loads it: its own BertModel (mtbert's runs on
    mtbert/model/bert.py), the same weights."""
    from transformers import AutoModel, BertConfig, BertModel

    if cfg.model.name_or_path == "tiny":
        return BertModel(BertConfig(**encoder_config(cfg, vocab_size).to_dict()))
    return AutoModel.from_pretrained(cfg.model.name_or_path)


def repeated_data(k: int, source: Path, into: Path) -> Path:
    """The CS224N files of `source` with every sentence written k times over (same rows, same labels)."""
    for src in source.glob("*.csv"):
        lines = src.read_text(encoding="utf-8").splitlines()
        header = lines[0].split("\t")
        text = [i for i, name in enumerate(header) if name.strip().startswith("sentence")]
        out = [lines[0]]
        for line in lines[1:]:
            cells = line.split("\t")
            for i in text:
                if i < len(cells):
                    cells[i] = " ".join([cells[i].strip()] * k)
            out.append("\t".join(cells))
        (into / src.name).write_text("\n".join(out) + "\n", encoding="utf-8")
    return into


class Arm:
    def __init__(self, label: str, precision: str, prepared, hand: bool, raw: dict, plain: bool = False):
        self.label, self.hand = label, hand
        self.cfg = build_config(raw, {"train.precision": precision})
        self.device = torch.device(self.cfg.train.device)
        bf16 = precision == "bf16"
        # TF32 applies to the whole step, backward included, as in a training run.
        self.matmuls = lambda: matmul_precision(precision, self.device)
        # The hand loop enters plain autocast, as its user would; the mtbert arm the context a
        # training run enters (on CUDA it also keeps attention off cuDNN's kernel), or, with
        # `plain`, plain autocast too: the two measure that choice side by side.
        if not bf16:
            self.autocast = nullcontext
        elif hand or plain:
            self.autocast = lambda: torch.autocast(self.device.type, dtype=torch.bfloat16)
        else:
            self.autocast = autocast_for(self.cfg.train.precision, self.device)[1]
        self.prepared = prepared
        seed_everything(0)
        bs = self.cfg.train.batch_size
        self.iters = {t: TaskBatches(len(ds), bs, seed=0) for t, ds in prepared.train.items()}
        self.tokens = self.seqs = 0
        self.seconds = 0.0
        if hand:
            self.encoder = transformers_encoder(self.cfg, len(prepared.tokenizer)).to(self.device)
            h = self.encoder.config.hidden_size
            self.heads = torch.nn.ModuleDict({t: torch.nn.Linear(4 * h if get_task(t).pair else h,
                                                                 get_task(t).out_dim) for t in self.cfg.tasks})
            self.heads.to(self.device)
            self.opt = torch.optim.AdamW(list(self.encoder.parameters()) + list(self.heads.parameters()), lr=5e-5)
            self.encoder.train()
        else:
            self.model = MultitaskModel(self.cfg, vocab_size=len(prepared.tokenizer), pad_token_id=0).to(self.device)
            self.weighting = make_weighting(self.cfg)
            self.opt = make_optimizer(self.model, self.cfg)
            self.sched = make_lr_schedule(self.opt, self.cfg, 10 ** 6)
            self.shared = self.model.shared_parameters()

    def step(self) -> None:
        idx = [self.iters[t].next() for t in self.cfg.tasks]
        batches = [collate(self.prepared.train[t], i, 0) for t, i in zip(self.cfg.tasks, idx)]
        for b in batches:
            self.tokens += sum(int(e.attention_mask.sum()) for e in b.inputs)
            self.seqs += len(b)
        if not self.hand:
            train_step(self.model, batches, idx, self.weighting, self.cfg, self.shared, self.autocast,
                       None, self.device)
            _update(self.model, self.opt, self.sched, self.cfg)
            return
        losses = []
        for b in batches:
            width = max(e.input_ids.shape[1] for e in b.inputs)
            ids = torch.cat([F.pad(e.input_ids, (0, width - e.input_ids.shape[1])) for e in b.inputs]).to(self.device)
            mask = torch.cat([F.pad(e.attention_mask, (0, width - e.attention_mask.shape[1])) for e in b.inputs]).to(self.device)
            with self.autocast():
                h = self.encoder(input_ids=ids, attention_mask=mask).last_hidden_state
            m = mask.unsqueeze(-1).float()
            pooled = (h.float() * m).sum(1) / m.sum(1)
            if len(b.inputs) == 2:
                u, v = pooled.chunk(2)
                pooled = torch.cat([u, v, (u - v).abs(), u * v], -1)
            losses.append(get_task(b.task).loss(self.heads[b.task](pooled), b.labels.to(self.device)))
        torch.stack(losses).sum().backward()
        torch.nn.utils.clip_grad_norm_(self.encoder.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def run(self, steps: int) -> None:
        with self.matmuls():
            sync(self.device)
            t0 = time.perf_counter()
            for _ in range(steps):
                self.step()
            sync(self.device)
            self.seconds += time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--encoder", choices=["minilm", *SHAPES], default="minilm")
    ap.add_argument("--batch-size", type=int, default=16, help="rows per task per step")
    ap.add_argument("--repeat", type=int, default=1, metavar="K",
                    help="each sentence written K times over (rows cut at 128 tokens)")
    ap.add_argument("--profile", type=int, default=0, metavar="STEPS",
                    help="after the timing, profile this many steps of each arm and print its costliest operators")
    args = parse_or_skip(ap)
    if args is None:
        return
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench/recipe.py: --device cuda, but no CUDA device is visible")
    raw = raw_config(args.device, args.encoder, args.batch_size)
    device = torch.device(args.device)
    with tempfile.TemporaryDirectory(prefix="mtbert-recipe-") as tmp:  # read once, by prepare
        if args.repeat > 1:
            raw["data"]["dir"] = str(repeated_data(args.repeat, MINBERT, Path(tmp)))
        prepared = prepare(build_config(raw), log=None)
    # Without native bf16 (AVX2-only CPUs) autocast emulates bf16 matmuls, many times slower
    # than fp32: those arms would only time the emulation, and train.precision: auto is fp32.
    bf16 = device.type == "cuda" or cpu_has_bf16()
    arms = [Arm("hand fp32", "fp32", prepared, True, raw), Arm("mtbert fp32", "fp32", prepared, False, raw)]
    if bf16:
        arms += [Arm("hand bf16", "bf16", prepared, True, raw), Arm("mtbert bf16", "bf16", prepared, False, raw)]
    if device.type == "cuda":  # the product's attention-kernel choice against autocast's own; TF32
        arms.append(Arm("mtbert bf16, plain autocast", "bf16", prepared, False, raw, plain=True))
        arms.append(Arm("mtbert tf32", "tf32", prepared, False, raw))
    for arm in arms:
        arm.run(2)  # warm-up
        arm.tokens = arm.seqs = 0
        arm.seconds = 0.0
    for _ in range(args.rounds):
        for arm in arms:
            arm.run(args.steps)
    fp32_peak = matmul_peak(device, "fp32")
    peak = matmul_peak(device) if bf16 else fp32_peak
    enc = arms[1].model
    params = enc.layer_params() * enc.num_layers  # non-embedding parameters of the encoder
    kind = (f"bf16 matmul peak {peak / 1e9:.0f} GFLOP/s (fp32 {fp32_peak / 1e9:.0f} GFLOP/s: "
            f"bf16 runs {peak / fp32_peak:.1f}x faster here)" if bf16 else
            f"no native bf16 on this CPU: fp32 arms only, MFU against the fp32 matmul peak "
            f"{peak / 1e9:.0f} GFLOP/s")
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {args.threads} thread(s)"
    name = {"minilm": "MiniLM", "bert-base": "BERT-base shape (random init)",
            "minilm-shape": "MiniLM's shape (random init)"}[args.encoder]
    rows = f", each sentence {args.repeat}x over" if args.repeat > 1 else ""
    print(f"{name}, CS224N data{rows}, batch {args.batch_size} per task, tuple sampling, {where}; {kind}")
    print(f"  {arms[1].tokens / arms[1].seqs:.0f} real tokens per example (a pair has two rows)")
    rate = {a.label: a.seqs / a.seconds for a in arms}
    for a in arms:
        mfu = 6 * params * a.tokens / a.seconds / peak
        print(f"  {a.label:<12} {rate[a.label]:7.1f} seq/s   MFU {mfu:5.1%}")
    if device.type == "cuda":
        print(f"  attention kept off cuDNN's kernel: "
              f"{rate['mtbert bf16'] / rate['mtbert bf16, plain autocast']:.2f}x the step under plain autocast")
        print(f"  mtbert tf32 vs fp32: {rate['mtbert tf32'] / rate['mtbert fp32']:.2f}x   "
              f"bf16 vs tf32: {rate['mtbert bf16'] / rate['mtbert tf32']:.2f}x   "
              f"(TF32 matmul peak {matmul_peak(device, 'tf32') / 1e12:.0f} TFLOP/s)")
    line = f"  mtbert fp32 vs hand fp32: {rate['mtbert fp32'] / rate['hand fp32']:.2f}x"
    if bf16:
        line += (f"   mtbert bf16 vs hand fp32: {rate['mtbert bf16'] / rate['hand fp32']:.2f}x   "
                 f"vs hand bf16: {rate['mtbert bf16'] / rate['hand bf16']:.2f}x")
    print(line)
    if args.profile:
        for arm in arms:
            profile(arm, args.profile, device)


def profile(arm: Arm, steps: int, device: torch.device) -> None:
    """The operators that take an arm's time, by their own time on the device (or the CPU)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch_profile(activities=acts) as prof:
        arm.run(steps)
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = prof.key_averages()
    launches = sum(e.count for e in events if e.key.startswith("cudaLaunchKernel"))
    print(f"\n{arm.label}: {steps} steps profiled; {launches / steps:.0f} kernel launches a step")
    print(events.table(sort_by=key, row_limit=12, max_name_column_width=48))

if __name__ == "__main__":
    main()
