"""Frozen layers computed once.

With `freeze.layers: n` the embeddings and the first n encoder layers never change and run
in eval mode (no dropout), so their output for an example is a fixed function of its tokens.
This module computes each example's output once, stores it under `data.cache_dir`, and
serves batches of it in place of the embeddings:

- n < L: the hidden states after layer n, one (length, hidden) block per sequence.
- n = L (the whole encoder frozen): one vector per sequence, the pooling's input (the mean of
  the token states for `mean` pooling, the first token's state for `cls` and `pooler`).

A stored block is keyed by everything that decides it: the tokenized sequences, n, the
pooling (n = L), the autocast precision and a digest of the frozen weights (so a tiny
random-init encoder gets its own entry per seed). Trials share a file memory-mapped, so the
page cache holds it once per machine. A deeper setup of the same weights and sequences
continues from the stored states of a shallower one (the bottom 4 of 6 layers frozen, then the
whole encoder): the layers they share are computed once. PALs and SMART make nothing below them fixed: with
either, the cache is off (a sharing regime says whether it keeps the cache valid, model/sharing.py).
"""
from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from mtbert.data.cache import ProcessMemo, build_once
from mtbert.config import to_dict
from mtbert.data.tokenize import TaskDataset, collate, padded_positions
from mtbert.data.types import Batch
from mtbert.model.bert import additive_mask
from mtbert.model.multitask import MultitaskModel, Packed
from mtbert.train.progress import time_left

CACHE_VERSION = 1


@dataclass
class Side:
    """One side of one dataset: every sequence's block, stacked."""
    flat: torch.Tensor  # (total rows of all blocks, hidden) float32
    offsets: torch.Tensor  # (N,) start of sequence i in flat
    lengths: torch.Tensor  # (N,) rows of sequence i's block (1 for a vector)

    def gather(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T, hidden) blocks of sequences `idx`, zero-padded to the longest, and their mask."""
        pos, mask = padded_positions(self.offsets, self.lengths, idx, self.flat.shape[0])
        return self.flat[pos] * mask[..., None], mask.long()


def _digest_params(modules: Sequence[torch.nn.Module]) -> str:
    return _prefix_digests(modules)[-1]


def _prefix_digests(modules: Sequence[torch.nn.Module]) -> list[str]:
    """_digest_params of modules[:1], modules[:2], ... in one pass: entry d names the
    embeddings and the first d layers, as a model frozen d deep digests them."""
    h, out = hashlib.blake2b(digest_size=16), []
    for m in modules:
        for name, t in m.state_dict().items():
            h.update(name.encode())
            h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        out.append(h.hexdigest())  # hashlib's digest leaves the object open to more updates
    return out


# Digests of pretrained weights as loaded, by (origin, frozen depth): a sweep worker's next
# trial loads the same encoder, and hashing it again cost a fifth of a second.
_LOADED_DIGESTS = ProcessMemo(size=8)


def frozen_digest(model: MultitaskModel) -> str:
    """Digest of the frozen weights: the embeddings and the first frozen_depth layers. It keys
    the stored blocks here and names the frozen part in a slim bundle or checkpoint. Hashing
    MiniLM takes a fifth of a second, so it is kept with the model until a load writes into
    one of those tensors (bumping its version), and in the process for models whose frozen
    tensors are still the pretrained files' (MultitaskModel.weights_origin)."""
    modules = model.digest_modules()
    version = model.frozen_versions()
    memo = getattr(model, "_frozen_digest", None)
    if memo is None or memo[0] != version:
        as_loaded = (model.weights_origin is not None and version == model.loaded_versions
                     and model.frozen_from_checkpoint())
        key = (model.weights_origin, model.frozen_depth)
        digest = _LOADED_DIGESTS.get(key) if as_loaded else None
        if digest is None:
            digest = _digest_params(modules)
            if as_loaded:
                _LOADED_DIGESTS.keep(key, digest)
        memo = (version, digest)
        model._frozen_digest = memo
    return memo[1]


def _digest_side(ds: TaskDataset, side: int) -> str:
    # Kept on the dataset, which prepare() may hand to the process's next run as it is.
    digests = ds.__dict__.setdefault("_frozen_side_digests", {})
    if side not in digests:
        p = ds.packed[side]
        h = hashlib.blake2b(digest_size=16)
        for t in (p.ids, p.types, p.lengths):
            h.update(t.numpy().tobytes())
        digests[side] = h.hexdigest()
    return digests[side]


def estimate_mb(model: MultitaskModel, datasets: Sequence[TaskDataset]) -> float:
    """Size of the float32 blocks for these datasets."""
    vector = model.frozen_depth == model.num_layers
    rows = sum(len(ds) if vector else int(p.lengths.sum()) for ds in datasets for p in ds.packed)
    return rows * model.hf_config.hidden_size * 4 / 2**20


class BuildProgress:
    """Lines while the cache is computed: how many sequences of how many, the rate and the time
    left, at most every EVERY seconds (a MiniLM setup over the whole CS224N data takes
    minutes on a CPU, which a sweep's console would otherwise pass in silence)."""

    EVERY = 10.0  # seconds between lines

    def __init__(self, total: int, log: Callable[[str], None]):
        self.total, self.log, self.every = total, log, self.EVERY
        self.done = self.computed = 0
        self.t0 = self.last = time.perf_counter()

    def add(self, n: int, computed: bool) -> None:
        self.done += n
        if not computed:
            if self.computed == 0:
                # The clock starts where computing does: sides read from the cache before it
                # take no compute, and counting their time would understate the rate.
                self.t0 = self.last = time.perf_counter()
            return
        if self.computed == 0:
            self.log(f"frozen layers: computing up to {self.total - self.done + n:,} sequences once "
                     f"(a line every {self.every:.0f} s)")
        self.computed += n
        now = time.perf_counter()
        if now - self.last >= self.every and self.done < self.total:
            self.last = now
            self.log(self.line(now - self.t0))

    def line(self, elapsed_s: float) -> str:
        """The progress line after `elapsed_s` of computing. What is left is taken at the
        computed rate, sides the cache may still hold included: an upper bound."""
        rate = self.computed / max(elapsed_s, 1e-9)
        left = time_left(self.computed, self.computed + self.total - self.done, elapsed_s)
        eta = f"about {int(left // 60)}m{int(left % 60):02d}s left" if left is not None else "time left unknown"
        return (f"frozen layers: {self.done:,} of {self.total:,} sequences ({self.done / self.total:.0%}), "
                f"{rate:,.0f} seq/s, {eta}")


@torch.no_grad()
def compute_side(model: MultitaskModel, ds: TaskDataset, side: int, pad_id: int, device,
                 autocast, batch_size: int = 64, progress: BuildProgress | None = None,
                 prefix: tuple[int, Side] | None = None) -> Side:
    """The frozen bottom's output for every sequence of one side, in the dataset's order.
    `prefix`: (d, the stored states after encoder layer d of the same sequences), which the
    layers above d continue from instead of running the embeddings and those d layers again.
    Its batches are the same as from the embeddings (same order, same padded width), and a
    padded position never reaches a real one (the attention mask), so on fp32 the blocks equal
    those computed from the start."""
    depth, vector = model.frozen_depth, model.frozen_depth == model.num_layers
    begin = prefix[0] if prefix is not None else 0
    lengths = ds.packed[side].lengths
    order = sorted(range(len(ds)), key=lambda i: int(lengths[i]))  # little padding per batch
    blocks: list[torch.Tensor | None] = [None] * len(ds)
    was_training = model.training
    model.eval()
    for at in range(0, len(order), batch_size):
        idx = order[at:at + batch_size]
        if prefix is None:
            enc = collate(ds, idx, pad_id).inputs[side].to(device)
            mask = enc.attention_mask
        else:
            states, mask = prefix[1].gather(torch.as_tensor(idx))
            states, mask = states.to(device), mask.to(device)
        with autocast():
            h = model.embeddings(input_ids=enc.input_ids, token_type_ids=enc.token_type_ids) \
                if prefix is None else states
            mask4 = additive_mask(mask, h.dtype)
            for i in range(begin, depth):
                out = model.layer(i)(h, mask4)
                h = out[0] if isinstance(out, tuple) else out
        h = h.float()
        if vector:  # the pooling's input: what _pool reduces the token states to
            if model.pooling == "mean":
                m = mask.unsqueeze(-1).to(h.dtype)
                h = ((h * m).sum(1) / m.sum(1).clamp(min=1.0))[:, None]
            else:
                h = h[:, :1]
        n_rows = mask.sum(1).tolist()
        for j, i in enumerate(idx):
            blocks[i] = h[j, : (1 if vector else n_rows[j])].cpu()
        if progress is not None:
            progress.add(len(idx), computed=True)
    model.train(was_training)
    block_lengths = torch.tensor([b.shape[0] for b in blocks], dtype=torch.long)
    offsets = torch.cumsum(block_lengths, 0) - block_lengths
    return Side(torch.cat(blocks).contiguous(), offsets, block_lengths)


# The stored blocks this process has memory-mapped, by file: a sweep worker's next trial
# reads the same ones (read-only, shared with every process through the page cache).
_OPENED = ProcessMemo(size=64)


class FrozenCache:
    """Stored frozen-layer outputs for every task, split and side of a run's data."""

    def __init__(self, model: MultitaskModel, splits: dict[str, dict[str, TaskDataset]], pad_id: int,
                 device, autocast, precision: str, cache_dir: str | Path,
                 log: Callable[[str], None] = lambda _m: None):
        self.start = model.frozen_depth
        self.model, self.precision, self.cache_dir = model, precision, Path(cache_dir)
        weights = frozen_digest(model)
        self.sides: dict[tuple[str, str], list[Side]] = {}
        self.built = 0
        self.continued: set[int] = set()  # the depths of stored states a computed side continued from
        self._prefixes: list[str] | None = None  # prefix digests, taken at the first side computed
        progress = BuildProgress(sum(len(ds) * len(ds.packed) for d in splits.values() for ds in d.values()), log)
        for split, datasets in splits.items():
            for task, ds in datasets.items():
                sides = []
                for s in range(len(ds.packed)):
                    path = self._path(task, split, ds, s, weights, self.start)
                    # A file's name is its content's key: the one this process opened is current.
                    side, built = _OPENED.get(path.resolve()), False
                    if side is None:
                        side, built = build_once(
                            path, _load, lambda ds=ds, s=s, task=task, split=split: compute_side(
                                model, ds, s, pad_id, device, autocast, progress=progress,
                                prefix=self._stored_prefix(task, split, ds, s)),
                            lambda side, tmp: torch.save({"flat": side.flat, "lengths": side.lengths}, tmp))
                        _OPENED.keep(path.resolve(), side)
                    if not built:
                        progress.add(len(ds), computed=False)
                    self.built += built
                    sides.append(side)
                self.sides[(split, task)] = sides
        shared = f", from the stored states of layer {max(self.continued)}" if self.continued else ""
        log(f"frozen layers: embeddings + {self.start} of {model.num_layers} encoder layers "
            f"{'computed once' if self.built else 'read from the cache'}{shared} "
            f"({sum(s.flat.numel() for v in self.sides.values() for s in v) * 4 / 2**20:.0f} MB)")

    def _path(self, task: str, split: str, ds: TaskDataset, side: int, weights: str, depth: int) -> Path:
        """Where the blocks of `depth` frozen layers of these weights are stored for one side."""
        pooling = self.model.pooling if depth == self.model.num_layers else "-"
        key = hashlib.blake2b(f"v{CACHE_VERSION}|{weights}|{depth}|{pooling}|{self.precision}|"
                              f"{_digest_side(ds, side)}".encode(), digest_size=12).hexdigest()
        return self.cache_dir / f"frozen-{task}-{split}-{side}-{key}.pt"

    def _stored_prefix(self, task: str, split: str, ds: TaskDataset, side: int) -> tuple[int, Side] | None:
        """The deepest stored states below this cache's depth of the same weights and sequences
        (a shallower setup of the same sweep, say the bottom 4 of 6 layers frozen under a
        whole-encoder one): the layers they cover are not computed again. A stored vector
        (the whole encoder frozen) holds no token states to continue from."""
        if self._prefixes is None:
            self._prefixes = _prefix_digests(self.model.digest_modules())
        for depth in range(self.start - 1, 0, -1):
            path = self._path(task, split, ds, side, self._prefixes[depth], depth)
            stored = _OPENED.get(path.resolve()) or _load(path)
            if stored is not None and len(stored.lengths) == len(ds):
                self.continued.add(depth)
                return depth, stored
        return None

    def pack(self, split: str, batches: Sequence[tuple[Batch, torch.Tensor]]) -> tuple[Packed, torch.Tensor]:
        """The Packed layout of `batches` (each with its example indices) and the stored
        frozen output of its rows, (rows, width, hidden), ready for encode(start=self.start)."""
        blocks = [(b.task, s, *side.gather(idx))
                  for b, idx in batches for s, side in enumerate(self.sides[(split, b.task)])]
        width = max(h.shape[1] for _, _, h, _ in blocks)
        rows = sum(h.shape[0] for _, _, h, _ in blocks)
        hidden = blocks[0][2].shape[2]
        h_all = torch.zeros(rows, width, hidden)
        mask = torch.zeros(rows, width, dtype=torch.long)
        segments, lengths, at = [], [], 0
        for task, s, h, m in blocks:
            n, t = m.shape
            h_all[at:at + n, :t] = h
            mask[at:at + n, :t] = m
            segments.append((task, s, at, at + n))
            lengths += m.sum(1).tolist()
            at += n
        ids = torch.zeros_like(mask)  # the embeddings are not run: ids are never read
        return Packed(ids, mask, ids, segments, lengths), h_all


def _load(path: Path) -> Side | None:
    if not path.is_file():
        return None
    try:
        state = torch.load(path, weights_only=True, mmap=True)
        lengths = state["lengths"]
        return Side(state["flat"], torch.cumsum(lengths, 0) - lengths, lengths)
    except Exception:  # a truncated or foreign file is a miss, not an error
        return None


def usable(model: MultitaskModel, cfg) -> bool:
    """Whether this run can use the cache at all (see the module docstring)."""
    return (cfg.train.frozen_cache_mb > 0 and model.cache_safe() and cfg.loss.smart.weight == 0)


def setup_signature(cfg) -> str:
    """What decides whether a run reads the frozen-layer cache and which blocks it reads, as
    config: runs with the same signature share their blocks (a signature that splits runs too
    finely only costs a lookup). A sweep's driver builds the blocks once per signature."""
    raw = to_dict(cfg)
    keep = {k: raw[k] for k in ("tasks", "model", "data", "pairs", "task_options", "freeze")}
    # Of the sharing regimes, whether they leave the cache valid (PALs do not; a plugin's says).
    keep.update(sharing={"encoder_shared_layers": cfg.sharing.encoder_shared_layers,
                         "cache_safe": cfg.sharing.cache_safe()},
                smart=cfg.loss.smart.weight,
                train={k: raw["train"][k] for k in ("precision", "device", "frozen_cache_mb", "probe")},
                # A tiny encoder's weights follow the seed; a pretrained one's are its files.
                seed=cfg.train.seed if cfg.model.name_or_path == "tiny" else None)
    return json.dumps(keep, sort_keys=True, default=str)
