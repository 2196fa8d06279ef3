"""The multitask model: one encoder whose bottom is shared by reference, task heads on top.

Encoder sharing (hybrid-bert-layer-sharing.txt): the embeddings and the first k encoder
layers are single modules used by every task; layers k..L (and the pooler, unless k = L)
are deep-copied per task. k = L is 1-bert, k = 0 is 3-bert, k = L/2 is hybrid-bert.

When several tasks train in one step, their sequences are packed into one batch so the
shared layers see every task's rows together; the batch is split by task where the private
layers begin. Within each stage the rows run in length buckets (see `length_buckets`).
"""
from __future__ import annotations

import copy
import io
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mtbert.config import COSINE_HEADS, Config, ConfigError, check_depth, check_heads
from mtbert.data.types import Batch, Encoded
from mtbert.model.bert import additive_mask
from mtbert.model.dropout import cheapen
from mtbert.model.encoder import load_encoder
from mtbert.model.heads import Heads
from mtbert.model.sharing import regimes
from mtbert.tasks import TaskSpec, get_task


@dataclass
class Packed:
    """Sequences of several batches, right-padded to one length and stacked along the batch."""
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor
    segments: list[tuple[str, int, int, int]]  # (task, side, start, end) rows
    lengths: list[int]  # real tokens per row, kept on the host so bucketing needs no device sync
    buckets: dict = field(default_factory=dict, repr=False)  # (rows, call cost) -> length_buckets

    def to(self, device) -> "Packed":
        return Packed(self.input_ids.to(device, non_blocking=True),
                      self.attention_mask.to(device, non_blocking=True),
                      self.token_type_ids.to(device, non_blocking=True), self.segments, self.lengths,
                      self.buckets)

    def bucketed(self, rows: range, cost: float) -> list[tuple[list[int], int]]:
        key = (rows.start, rows.stop, cost)
        if key not in self.buckets:
            self.buckets[key] = length_buckets(self.lengths, rows, cost)
        return self.buckets[key]


def pack(batches: list[Batch]) -> Packed:
    seqs: list[tuple[str, int, Encoded]] = [(b.task, s, e) for b in batches for s, e in enumerate(b.inputs)]
    width = max(e.input_ids.shape[1] for _, _, e in seqs)
    rows = sum(e.input_ids.shape[0] for _, _, e in seqs)
    dev = seqs[0][2].input_ids.device
    # Padded positions are masked out of attention and never pooled, so the filler id is moot.
    ids = torch.zeros(rows, width, dtype=torch.long, device=dev)
    mask = torch.zeros_like(ids)
    types = torch.zeros_like(ids)
    segments, lengths, at = [], [], 0
    for task, side, e in seqs:
        n, t = e.input_ids.shape
        ids[at:at + n, :t] = e.input_ids
        mask[at:at + n, :t] = e.attention_mask
        types[at:at + n, :t] = e.token_type_ids
        segments.append((task, side, at, at + n))
        lengths += e.attention_mask.sum(1).tolist()
        at += n
    return Packed(ids, mask, types, segments, lengths)


def _by_task(packed: Packed) -> dict[str, list[tuple[int, int, int]]]:
    """task -> its (side, start, end) row ranges; pack() keeps a task's rows contiguous."""
    out: dict[str, list[tuple[int, int, int]]] = {}
    for task, side, s, e in packed.segments:
        out.setdefault(task, []).append((side, s, e))
    return out


def length_buckets(lengths: Sequence[int], rows: Sequence[int], call_cost: float) -> list[tuple[list[int], int]]:
    """`rows` sorted longest first and cut into the runs (groups) that minimise

        sum over groups of (rows in the group x its longest row) + call_cost x groups,

    the positions an encoder layer computes plus a price, in positions, for each extra call.
    Returns each group with its width. call_cost 0 gives a group per distinct length,
    infinity one group (a single padded batch).

    Why: one padded batch costs rows x its longest row. On the CS224N data with tuple
    sampling 65% of those positions are padding, most of it length spread inside each task's
    own batch (SST sentences average 25 tokens, Quora and STS 15; a batch's longest is 2-3x
    that). Padded positions are masked out of attention and never pooled, so trimming them
    changes no real token's output, up to float rounding (tests/model/test_buckets.py).
    """
    order = sorted(rows, key=lambda r: -lengths[r])
    widths = [max(1, lengths[r]) for r in order]
    if not order:
        return []
    if sum(widths[0] - w for w in widths) <= call_cost:  # all the padding is worth less than a call
        return [(order, widths[0])]
    # best[j]: cheapest split of the j longest rows; the last group is order[cut[j]:j].
    best, cut = [0.0] + [math.inf] * len(order), [0] * (len(order) + 1)
    for j in range(1, len(order) + 1):
        for i in range(j):
            cost = best[i] + (j - i) * widths[i] + call_cost
            if cost < best[j]:
                best[j], cut[j] = cost, i
    groups, j = [], len(order)
    while j:
        groups.append((order[cut[j]:j], widths[cut[j]]))
        j = cut[j]
    return groups[::-1]


# The price of an extra layer call, in positions, for a 384-wide encoder on a CPU core. With
# tuple sampling, batch 16 (bench/throughput.py --only buckets, one thread): MiniLM trained
# fastest at 16-64 (2.1x 1-bert, 1.6x 3-bert over one padded batch per stage); the 64-wide
# tiny encoder only above 256, where its calls cost more than the padding they save. The
# price scales as (384 / hidden)^2: 1152 for the tiny encoder, 8 for bert-base.
CALL_COST_AT_384 = 32.0


def call_cost(setting: bool | None, hidden: int, device: torch.device) -> float:
    """train.length_buckets as a price per extra layer call, in positions (inf = off).
    Null turns buckets on for CPU only: on GPUs, where small calls leave the device idle,
    they are unmeasured."""
    if setting is False or (setting is None and device.type != "cpu"):
        return math.inf
    return CALL_COST_AT_384 * (384 / hidden) ** 2


def _checked_encoder(cfg: Config, vocab_size: int | None, architecture) -> nn.Module:
    """The encoder (model/encoder.py), refused when the tokenizer's ids run past its embedding
    table, and made cheaper to train (model/dropout.py)."""
    enc = load_encoder(cfg, vocab_size, architecture=architecture)
    table = getattr(enc.config, "vocab_size", None)
    if vocab_size is not None and isinstance(table, int) and vocab_size > table:
        # Ids past the embedding table would fail deep in the first batch: the tokenizer is
        # another model's (copied from elsewhere, or the wrong folder).
        raise ConfigError(f"model.name_or_path: '{cfg.model.name_or_path}': its tokenizer has {vocab_size:,} "
                          f"tokens but the encoder embeds {table:,}; the tokenizer files "
                          "are another model's")
    cheapen(enc)
    return enc


class MultitaskModel(nn.Module):
    def __init__(self, cfg: Config, vocab_size: int | None = None, pad_token_id: int = 0,
                 encoder_architecture=None):
        super().__init__()
        self.tasks: list[TaskSpec] = [get_task(t) for t in cfg.tasks]
        self.encoding = cfg.pairs.encoding
        # The config's own checks (a config built by hand has not been through them).
        cfg.sharing.check(cfg)
        check_heads(cfg)
        # Tasks whose head is the cosine of the two sentence vectors (task_options.<t>.head,
        # or sts.head for sts): bi-encoded regression pairs, as check_heads made sure.
        self.cosine_tasks = {t for t in cfg.tasks if cfg.task_head(t) in COSINE_HEADS}
        self.cosine_mlp_tasks = {t for t in cfg.tasks if cfg.task_head(t) == "cosine_mlp"}
        self.sts_cosine = "sts" in self.cosine_tasks
        self.pad_token_id = pad_token_id
        self.length_buckets = cfg.train.length_buckets
        self.call_cost: float | None = None  # overrides the setting (tests, bench)

        # encoder_architecture: build from this transformers config, weights random (a bundle).
        enc = _checked_encoder(cfg, vocab_size, encoder_architecture)
        # The submodules in this order, which is their order in the state dict (and the order
        # their random initialisation draws in): the encoder's parts, the pooled LayerNorm,
        # PALs, pair projections, heads.
        self._share_encoder(enc, cfg)
        hidden = enc.config.hidden_size
        self.pooled_norm = nn.LayerNorm(hidden, eps=1e-12) if cfg.heads.pooled_layernorm else nn.Identity()
        self.pals = None  # per-task projected attention beside each layer (the pal regime's)
        self.sharing = cfg.sharing
        for regime in regimes():  # what each sharing regime adds to or ties in the split encoder
            regime.build(self, cfg.sharing)
        self._add_heads(cfg, hidden)
        self._freeze(cfg.freeze.layers)
        self.train()  # frozen modules start in eval mode too
        # Where the pretrained weights came from, and the frozen tensors as loaded: while none
        # of them is written, a digest this process took of the same origin holds (frozen_digest).
        self.weights_origin = getattr(enc, "mtbert_origin", None)
        self.loaded_versions = self.frozen_versions()

    def _share_encoder(self, enc: nn.Module, cfg: Config) -> None:
        """The encoder's embeddings and first k layers, one module for every task; its other
        layers (and its pooler, unless k = L) deep-copied per task."""
        self.hf_config = enc.config
        layers = list(enc.encoder.layer)
        self.num_layers = n = len(layers)
        check_depth(cfg, n)
        self.k = k = n if cfg.sharing.encoder_shared_layers is None else cfg.sharing.encoder_shared_layers
        names = [t.name for t in self.tasks]
        self.embeddings = enc.embeddings
        self.shared_layers = nn.ModuleList(layers[:k])
        # Deep copies start from the same (pretrained) weights and then diverge per task.
        self.task_layers = nn.ModuleDict({t: nn.ModuleList(copy.deepcopy(layers[k:])) for t in names})
        self.pooling = cfg.model.pooling
        self.poolers = nn.ModuleDict()
        new_params = getattr(enc, "mtbert_new_params", None)
        # What the pretrained checkpoint lacked (random init), by the encoder's own key names;
        # None when nothing came from a checkpoint (tiny, or built from an architecture).
        self.random_init = None if new_params is None else frozenset(new_params)
        self.pretrained_pooler = (new_params is not None and enc.pooler is not None
                                  and not any(k.startswith("pooler.") for k in new_params))
        if self.pooling == "pooler":
            pooler = enc.pooler
            if pooler is None:
                from mtbert.model.bert import Pooler
                pooler = Pooler(enc.config)
            # The pooler sits above layer L: shared only when every layer is (1-bert).
            self.poolers.update({t: pooler if k == n else copy.deepcopy(pooler) for t in names})

    def _add_heads(self, cfg: Config, hidden: int) -> None:
        """The pair projections and the task heads (model/heads.py), with their input widths."""
        # Bi-encoded pairs: [u, v, |u-v|, u*v] (hybrid-bert-layer-sharing.txt) projected back
        # to the hidden width so that S head layers can be shared with single-sentence tasks.
        self.pair_proj = nn.ModuleDict({
            t.name: nn.Linear(4 * hidden, hidden) for t in self.tasks
            if t.pair and self.encoding == "bi" and t.name not in self.cosine_tasks})

        self.cascade = cfg.sharing.chain()
        in_dims = {}
        for t in self.tasks:
            extra = 0
            if t.name in self.cascade:
                extra = sum(get_task(u).out_dim for u in self.cascade[: self.cascade.index(t.name)])
            in_dims[t.name] = hidden + extra
        names = [t.name for t in self.tasks]
        dropout = {t: (cfg.heads.task_dropout or {}).get(t, cfg.heads.dropout) for t in names}
        width = cfg.heads.hidden or hidden
        try:
            # A plain cosine pair score has no head at all (predict_from_pooled).
            headed = [t for t in self.tasks if t.name not in self.cosine_tasks - self.cosine_mlp_tasks]
            self.heads = Heads(headed, in_dims, cfg.head_regime(), width, dropout,
                               cfg.sharing.head_share_tasks)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    # ------------------------------------------------------------------ structure
    def _freeze(self, n: int) -> None:
        """freeze-your-layers.txt: embeddings and the first n encoder layers get no updates.

        Frozen modules also stay in eval mode (no dropout) while the model trains: their outputs
        are then a fixed function of the input, the same whether computed each step or once
        (the frozen-layer cache, train/frozen.py)."""
        self.frozen_depth = 0 if n == 0 else (self.num_layers if n < 0 else n)
        self._frozen: list[nn.Module] = []
        if n == 0:
            return
        n = self.frozen_depth
        frozen = [self.embeddings] + list(self.shared_layers[: min(n, self.k)])
        for layers in self.task_layers.values():
            frozen += list(layers[: max(0, n - self.k)])
        for module in frozen:
            module.requires_grad_(False)
        self._frozen = frozen

    def frozen_keys(self) -> set[str]:
        """State-dict keys of the frozen tensors, every task's private copy included."""
        ids = {id(t) for m in self._frozen for t in m.state_dict(keep_vars=True).values()}
        return {k for k, t in self.state_dict(keep_vars=True).items() if id(t) in ids}

    def digest_modules(self) -> list[nn.Module]:
        """The embeddings and the first frozen_depth layers as a task sees them: the weights
        that decide the frozen bottom's output (a frozen private copy equals the others)."""
        return [self.embeddings] + [self.layer(i) for i in range(self.frozen_depth)]

    def frozen_versions(self) -> tuple:
        """Identity and write count of every tensor of digest_modules: any write changes it."""
        return tuple((id(t), t._version) for m in self.digest_modules()
                     for t in m.state_dict(keep_vars=True).values())

    def frozen_from_checkpoint(self) -> bool:
        """Whether every frozen tensor is the pretrained checkpoint's own (none random-init),
        so that the checkpoint can stand for them (a slim bundle, mtbert/bundle.py)."""
        if self.random_init is None or not self._frozen:
            return False
        prefixes = ("embeddings.", *(f"encoder.layer.{i}." for i in range(self.frozen_depth)))
        return not any(k.startswith(prefixes) for k in self.random_init)

    def train(self, mode: bool = True) -> "MultitaskModel":
        super().train(mode)
        for module in self._frozen:
            module.eval()
        return self

    def layer(self, i: int) -> nn.Module:
        """Encoder layer i as a task sees it before the copies diverge (a frozen private copy
        keeps the pretrained weights, so any task's copy computes the same)."""
        return self.shared_layers[i] if i < self.k else next(iter(self.task_layers.values()))[i - self.k]

    def cache_safe(self) -> bool:
        """Whether the frozen layers' outputs depend on the input alone: each sharing regime
        says (PALs add a trainable term inside every layer, frozen or not)."""
        return self.frozen_depth > 0 and self.sharing.cache_safe()

    def shared_parameters(self) -> list[nn.Parameter]:
        """Trainable parameters used by more than one task (what PCGrad projects)."""
        mods: list[nn.Module] = [self.embeddings, self.shared_layers, self.pooled_norm]
        if self.k == self.num_layers and len(self.poolers) > 1:
            mods.append(next(iter(self.poolers.values())))
        mods += self.heads.shared_modules()
        seen, out = set(), []
        for m in mods:
            for p in m.parameters():
                if p.requires_grad and id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        return out

    # ------------------------------------------------------------------ forward
    def embed(self, packed: Packed) -> torch.Tensor:
        return self.embeddings(input_ids=packed.input_ids, token_type_ids=packed.token_type_ids)

    def _stack(self, layers: Sequence[nn.Module], first: int, h: torch.Tensor, mask2: torch.Tensor,
               row_tasks: list[str]) -> torch.Tensor:
        """Encoder layers `first`, `first`+1, ... over rows whose tasks are `row_tasks`."""
        mask4 = additive_mask(mask2, h.dtype)
        groups = None
        if self.pals is not None:
            at: dict[str, list[int]] = {}
            for i, task in enumerate(row_tasks):
                at.setdefault(task, []).append(i)
            groups = [(task, torch.tensor(rows, device=h.device)) for task, rows in at.items()]
        for j, layer in enumerate(layers):
            out = layer(h, mask4)
            out = out[0] if isinstance(out, tuple) else out
            if groups:
                # PALs run in parallel to the layer, one stack per task (pals-annealed-sampling.txt).
                if len(groups) == 1:
                    out = out + self.pals[groups[0][0]](first + j, h, mask2)
                else:
                    delta = torch.zeros_like(out)
                    for task, rows in groups:
                        delta = delta.index_add(0, rows, self.pals[task](first + j, h[rows], mask2[rows]).to(out.dtype))
                    out = out + delta
            h = out
        return h

    def _call_cost(self, device: torch.device) -> float:
        if self.call_cost is not None:
            return self.call_cost
        return call_cost(self.length_buckets, self.hf_config.hidden_size, device)

    def _bucketed(self, packed: Packed, h: torch.Tensor, rows: range,
                  fn: Callable[[torch.Tensor, torch.Tensor, list[int]], torch.Tensor]) -> torch.Tensor:
        """fn(h, mask, rows) on each length bucket of `rows`, trimmed to the bucket's width;
        the outputs back in `rows` order (hidden states padded back to h's width)."""
        mask2, full = packed.attention_mask, h.shape[1]

        def pad(out: torch.Tensor, width: int) -> torch.Tensor:
            return F.pad(out, (0, 0, 0, full - width)) if out.dim() == 3 and width < full else out

        buckets = packed.bucketed(rows, self._call_cost(h.device))
        if len(buckets) == 1:  # one group: the rows as they lie, only trimmed (no gather, no reorder)
            width = buckets[0][1]
            return pad(fn(h[rows.start:rows.stop, :width], mask2[rows.start:rows.stop, :width], list(rows)), width)
        # One gather into bucket order, then contiguous pieces: gathering each bucket on its
        # own made its backward scatter into a zero tensor the size of all of h, per bucket.
        order = torch.tensor([r for bucket, _ in buckets for r in bucket], device=h.device)
        sizes = [len(bucket) for bucket, _ in buckets]
        outs = [pad(fn(x[:, :width], m[:, :width], bucket), width)
                for x, m, (bucket, width) in zip(h[order].split(sizes), mask2[order].split(sizes), buckets)]
        # Back to `rows` order: the inverse of the permutation `order` (rows are contiguous).
        back = torch.empty_like(order)
        back[order - rows.start] = torch.arange(len(order), device=h.device)
        return torch.cat(outs)[back]

    def encode(self, packed: Packed, h: torch.Tensor, start: int = 0) -> dict[tuple[str, int], torch.Tensor]:
        """Hidden states after `start` encoder layers (0: the embeddings) -> pooled vector per
        (task, side). start = L takes one vector per row (the pooling input, see
        FrozenCache) and runs no layer."""
        row_tasks = [task for task, _, s, e in packed.segments for _ in range(s, e)]
        if start < self.k:
            h = self._bucketed(packed, h, range(len(row_tasks)), lambda x, m, rows: self._stack(
                self.shared_layers[start:], start, x, m, [row_tasks[r] for r in rows]))
        first = max(start, self.k)
        pooled = {}
        # Private layers run per task over all of that task's rows (both sides of a bi pair).
        for task, parts in _by_task(packed).items():
            s0, e0 = parts[0][1], parts[-1][2]

            def private(x: torch.Tensor, m: torch.Tensor, rows: list[int], task: str = task) -> torch.Tensor:
                x = self._stack(self.task_layers[task][first - self.k:], first, x, m, [task] * len(rows))
                return self.pooled_norm(self._pool(task, x, m))

            out = self._bucketed(packed, h, range(s0, e0), private)
            for side, s, e in parts:
                pooled[(task, side)] = out[s - s0:e - s0]
        return pooled

    def layer_positions(self, packed: Packed, device: torch.device, start: int = 0) -> tuple[int, int]:
        """(real tokens, positions computed) summed over the encoder layers that one forward
        from layer `start` runs: what the padding costs after bucketing."""
        cost = self._call_cost(device)

        def positions(rows: range) -> int:
            return sum(len(bucket) * width for bucket, width in packed.bucketed(rows, cost))
        real = sum(packed.lengths) * (self.num_layers - start)
        done = positions(range(len(packed.lengths))) * max(0, self.k - start)
        for parts in _by_task(packed).values():
            done += positions(range(parts[0][1], parts[-1][2])) * (self.num_layers - max(start, self.k))
        return real, done

    def layer_params(self) -> int:
        """Parameters of one encoder layer (all layers of a BERT encoder have the same shape)."""
        return sum(p.numel() for p in self.layer(0).parameters())

    def step_flops(self, packed: Packed, device: torch.device, start: int) -> int:
        """Training FLOPs of one forward + backward from layer `start` (docs/guide.md, "What a
        trial's compute counts"): 2 x params per position forward in every encoder layer run,
        4 x more backward in the layers at or above the lowest trainable one (frozen layers
        need no backward), plus the heads' 6 x params per example (head_flops). Attention's
        T^2 term, the embeddings' lookup and the element-wise norms are left out, as in the
        usual 6N-per-token count."""
        _, done = self.layer_positions(packed, device, start)
        per_layer = done / max(1, self.num_layers - start)  # mean positions per layer run
        trainable_layers = self.num_layers - max(start, self.frozen_depth)
        return int(self.layer_params() * (2 * done + 4 * per_layer * trainable_layers)) + self.head_flops(packed)

    def shared_positions(self, packed: Packed, device: torch.device) -> int:
        """Positions one shared encoder layer computes for this step (every packed row, bucketed)."""
        return sum(len(bucket) * width for bucket, width in packed.bucketed(range(len(packed.lengths)),
                                                                             self._call_cost(device)))

    def shared_backward_flops(self, packed: Packed, device: torch.device, start: int) -> int:
        """Backward FLOPs of the trainable shared encoder layers for this step (4 x params per
        position, over every packed row): what each extra backward pass of a method that takes
        one gradient per task costs (mtbert/train/weighting/base.py). A task's loss reaches
        every row there, since the rows run packed; its own layers and head only its rows."""
        layers = max(0, self.k - max(start, self.frozen_depth))
        return 4 * self.layer_params() * self.shared_positions(packed, device) * layers if layers else 0

    def private_backward_flops(self, packed: Packed, device: torch.device, start: int) -> int:
        """Backward FLOPs of the tasks' own trainable encoder layers for this step, each over its
        task's rows (4 x params per position)."""
        first = max(start, self.k, self.frozen_depth)
        layers = max(0, self.num_layers - first)
        if not layers:
            return 0
        cost = self._call_cost(device)
        positions = sum(len(bucket) * width for parts in _by_task(packed).values()
                        for bucket, width in packed.bucketed(range(parts[0][1], parts[-1][2]), cost))
        return 4 * self.layer_params() * positions * layers

    def head_flops(self, packed: Packed) -> int:
        """FLOPs of everything above the encoder for one step's examples, all of it trainable:
        6 x params per example for a task's pair projection and head layers, per side for its
        pooler (and the hidden head layers of a cosine_mlp pair), and 2 x params forward for
        the upstream heads a cascade runs without gradient."""
        total = 0
        for task, parts in _by_task(packed).items():
            sides = [e - s for _, s, e in parts]
            total += 6 * sum(sides) * _numel(self.poolers[task] if task in self.poolers else None)
            if task in self.cosine_tasks:
                if task in self.cosine_mlp_tasks:
                    total += 6 * sum(sides) * sum(_numel(layer[task]) for layer in self.heads.layers)
                continue
            own, upstream = self._head_params(task)
            total += sides[0] * (6 * own + 2 * upstream)
        return total

    def _head_params(self, task: str) -> tuple[int, int]:
        """(the task's own pair projection and head layers, the upstream heads a cascade runs for
        it, each with its own upstream)."""
        own = _numel(self.pair_proj[task] if task in self.pair_proj else None)
        own += sum(_numel(layer[task]) for layer in self.heads.layers) + _numel(self.heads.out[task])
        upstream = 0
        if task in self.cascade:
            for u in self.cascade[: self.cascade.index(task)]:
                u_own, u_up = self._head_params(u)
                upstream += u_own + u_up - _numel(self.pair_proj[u] if u in self.pair_proj else None)
        return own, upstream

    def frozen_flops(self, datasets: Iterable[Any], start: int) -> int:
        """Forward FLOPs of the first `start` encoder layers over every sequence of `datasets`
        (TaskDataset, each side), real tokens only: the frozen-layer cache's work, done once
        per sequence rather than once per epoch (train/frozen.py)."""
        tokens = sum(int(p.lengths.sum()) for ds in datasets for p in ds.packed)
        return 2 * self.layer_params() * start * tokens

    def _pool(self, task: str, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.pooling == "pooler":
            return self.poolers[task](h)
        if self.pooling == "cls":
            return h[:, 0]
        m = mask.unsqueeze(-1).to(h.dtype)
        return (h * m).sum(1) / m.sum(1).clamp(min=1.0)

    def _head(self, task: str, x: torch.Tensor) -> torch.Tensor:
        if task in self.cascade and self.cascade.index(task) > 0:
            with torch.no_grad():  # upstream heads learn only from their own loss
                ups = [self._head(u, x) for u in self.cascade[: self.cascade.index(task)]]
            x = torch.cat([x, *ups], dim=-1)
        return self.heads(task, x)

    def predict_from_pooled(self, task: str, sides: list[torch.Tensor]) -> torch.Tensor:
        if len(sides) == 1:
            return self._head(task, sides[0])
        u, v = sides
        if task in self.cosine_tasks:
            # The cosine of the two sentence vectors is the prediction, in the [0, 1] units the
            # regression loss works in (TaskSpec.predict scales it to 0..5): MSE towards
            # similarity / 5, as sentence encoders are trained. No head layers: a random
            # projection would throw away the pretrained geometry the score starts from.
            if task in self.cosine_mlp_tasks:  # the papers' variant: after the hidden head layers
                u, v = self.heads.hidden(task, u), self.heads.hidden(task, v)
            return torch.cosine_similarity(u, v, dim=-1).unsqueeze(-1)
        return self._head(task, self.pair_proj[task](torch.cat([u, v, (u - v).abs(), u * v], dim=-1)))

    def from_embeddings(self, packed: Packed, emb: torch.Tensor, start: int = 0) -> dict[str, torch.Tensor]:
        pooled = self.encode(packed, emb, start)
        sides: dict[str, list[torch.Tensor]] = {}
        for task, side, _, _ in packed.segments:  # segments list sides in order
            sides.setdefault(task, []).append(pooled[(task, side)])
        return {t: self.predict_from_pooled(t, vecs) for t, vecs in sides.items()}

    def forward(self, batches: list[Batch]) -> dict[str, torch.Tensor]:
        """Logits (or predictions for cosine STS) per task of the given batches."""
        packed = pack(batches)
        return self.from_embeddings(packed, self.embed(packed))


def _numel(module: nn.Module | None) -> int:
    return 0 if module is None else sum(p.numel() for p in module.parameters())


def count_params(model: nn.Module) -> tuple[int, int]:
    """(total, trainable), shared tensors counted once."""
    params = {id(p): p for p in model.parameters()}.values()
    return sum(p.numel() for p in params), sum(p.numel() for p in params if p.requires_grad)


# Serialized sizes by state-dict layout: a sweep worker builds the same architecture trial
# after trial, and serializing MiniLM to measure it took a fifth of a second each time.
_SIZES = None


def model_size_mb(model: nn.Module) -> float:
    """Size of the serialized state dict (torch.save stores a shared tensor once). It depends
    on the layout alone (names, shapes, dtypes, which tensors share storage), never on the
    values, so the process keeps it by that layout."""
    from mtbert.data.cache import ProcessMemo

    global _SIZES
    _SIZES = _SIZES or ProcessMemo(size=32)
    state = model.state_dict()
    first: dict[int, int] = {}
    layout = tuple((k, tuple(t.shape), str(t.dtype), t.storage_offset(), tuple(t.stride()),
                    first.setdefault(t.untyped_storage().data_ptr(), i), t.untyped_storage().nbytes())
                   for i, (k, t) in enumerate(state.items()))
    size = _SIZES.get(layout)
    if size is None:
        sink = _ByteCount()
        torch.save(state, sink)
        size = _SIZES.keep(layout, sink.tell() / 2**20)
    return size


class _ByteCount(io.RawIOBase):
    """A file that counts what is written to it and keeps none of it: torch.save's size without
    the copy (MiniLM in 17 ms, against 60 ms into memory, on a 2-core AVX512-BF16 EPYC)."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        n = memoryview(data).nbytes
        self.n += n
        return n

    def tell(self) -> int:
        return self.n
