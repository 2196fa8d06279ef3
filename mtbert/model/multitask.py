"""The multitask model: one encoder whose bottom is shared by reference, task heads on top.

Encoder sharing (hybrid-bert-layer-sharing.txt): the embeddings and the first k encoder
layers are single modules used by every task; layers k..L (and the pooler, unless k = L)
are deep-copied per task. k = L is 1-bert, k = 0 is 3-bert, k = L/2 is hybrid-bert.

When several tasks train in one step, their sequences are packed into one batch so the
shared trunk runs once; the batch is split by task where the private layers begin.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from mtbert.config import Config, ConfigError
from mtbert.data.types import Batch, Encoded
from mtbert.model.encoder import load_encoder
from mtbert.model.heads import Heads
from mtbert.tasks import TaskSpec, get_task


@dataclass
class Packed:
    """Sequences of several batches padded to one length and stacked along the batch."""
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor
    segments: list[tuple[str, int, int, int]]  # (task, side, start, end) rows

    def to(self, device) -> "Packed":
        return Packed(self.input_ids.to(device, non_blocking=True),
                      self.attention_mask.to(device, non_blocking=True),
                      self.token_type_ids.to(device, non_blocking=True), self.segments)


def pack(batches: list[Batch]) -> Packed:
    seqs: list[tuple[str, int, Encoded]] = [(b.task, s, e) for b in batches for s, e in enumerate(b.inputs)]
    width = max(e.input_ids.shape[1] for _, _, e in seqs)
    rows = sum(e.input_ids.shape[0] for _, _, e in seqs)
    dev = seqs[0][2].input_ids.device
    # Padded positions are masked out of attention and never pooled, so the filler id is moot.
    ids = torch.zeros(rows, width, dtype=torch.long, device=dev)
    mask = torch.zeros_like(ids)
    types = torch.zeros_like(ids)
    segments, at = [], 0
    for task, side, e in seqs:
        n, t = e.input_ids.shape
        ids[at:at + n, :t] = e.input_ids
        mask[at:at + n, :t] = e.attention_mask
        types[at:at + n, :t] = e.token_type_ids
        segments.append((task, side, at, at + n))
        at += n
    return Packed(ids, mask, types, segments)


def _additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # (B, 1, 1, T): 0 where attended, a large negative where padded; both eager and SDPA
    # attention in transformers add it to the scores.
    return (1.0 - mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min


class MultitaskModel(nn.Module):
    def __init__(self, cfg: Config, vocab_size: int | None = None, pad_token_id: int = 0):
        super().__init__()
        self.tasks: list[TaskSpec] = [get_task(t) for t in cfg.tasks]
        self.encoding = cfg.pairs.encoding
        self.sts_cosine = cfg.sts.head == "cosine"
        if self.sts_cosine and (self.encoding != "bi" or "sts" not in cfg.tasks):
            raise ConfigError("sts.head: cosine needs pairs.encoding: bi (two sentence vectors)")
        if cfg.sharing.cascade != "none" and self.encoding == "bi":
            raise ConfigError("sharing.cascade: not supported with pairs.encoding: bi "
                              "(upstream heads read one pooled vector per example)")
        self.pad_token_id = pad_token_id

        enc = load_encoder(cfg, vocab_size)
        self.hf_config = enc.config
        layers = list(enc.encoder.layer)
        self.num_layers = n = len(layers)
        k = n if cfg.sharing.encoder_shared_layers is None else cfg.sharing.encoder_shared_layers
        if k > n:
            raise ConfigError(f"sharing.encoder_shared_layers: {k} > {n} encoder layers")
        self.k = k
        names = [t.name for t in self.tasks]
        self.embeddings = enc.embeddings
        self.shared_layers = nn.ModuleList(layers[:k])
        # Deep copies start from the same (pretrained) weights and then diverge per task.
        self.task_layers = nn.ModuleDict({t: nn.ModuleList(copy.deepcopy(layers[k:])) for t in names})
        self.pooling = cfg.model.pooling
        self.poolers = nn.ModuleDict()
        if self.pooling == "pooler":
            pooler = enc.pooler
            if pooler is None:
                from transformers.models.bert.modeling_bert import BertPooler
                pooler = BertPooler(enc.config)
            # The pooler sits above layer L: shared only when every layer is (1-bert).
            self.poolers.update({t: pooler if k == n else copy.deepcopy(pooler) for t in names})
        hidden = enc.config.hidden_size
        self.pooled_norm = nn.LayerNorm(hidden, eps=1e-12) if cfg.heads.pooled_layernorm else nn.Identity()
        self.pals = None
        if cfg.sharing.pal_size > 0:
            from mtbert.model.pal import ProjectedAttention, pal_heads
            # As many heads as the encoder has, or the largest count that divides d_s.
            heads = pal_heads(cfg.sharing.pal_size, enc.config.num_attention_heads)
            self.pals = nn.ModuleDict({t: ProjectedAttention(hidden, cfg.sharing.pal_size, n, heads)
                                       for t in names})

        # Bi-encoded pairs: [u, v, |u-v|, u*v] (hybrid-bert-layer-sharing.txt) projected back
        # to the hidden width so that S head layers can be shared with single-sentence tasks.
        self.pair_proj = nn.ModuleDict({
            t.name: nn.Linear(4 * hidden, hidden) for t in self.tasks
            if t.pair and self.encoding == "bi" and not (t.name == "sts" and self.sts_cosine)})

        self.cascade = cfg.sharing.cascade.split(">") if cfg.sharing.cascade != "none" else []
        in_dims = {}
        for t in self.tasks:
            extra = 0
            if t.name in self.cascade:
                extra = sum(get_task(u).out_dim for u in self.cascade[: self.cascade.index(t.name)])
            in_dims[t.name] = hidden + extra
        dropout = {t: (cfg.heads.task_dropout or {}).get(t, cfg.heads.dropout) for t in names}
        width = cfg.heads.hidden or hidden
        try:
            self.heads = Heads(self.tasks, in_dims, cfg.head_regime(), width, dropout,
                               cfg.sharing.head_share_tasks)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self._freeze(cfg.freeze.layers)

    # ------------------------------------------------------------------ structure
    def _freeze(self, n: int) -> None:
        """freeze-your-layers.txt: embeddings and the first n encoder layers get no updates."""
        if n == 0:
            return
        n = self.num_layers if n < 0 else n
        frozen = [self.embeddings] + list(self.shared_layers[: min(n, self.k)])
        for layers in self.task_layers.values():
            frozen += list(layers[: max(0, n - self.k)])
        for module in frozen:
            module.requires_grad_(False)

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

    def _layer(self, layer: nn.Module, h: torch.Tensor, mask4: torch.Tensor, mask2: torch.Tensor,
               idx: int, segments) -> torch.Tensor:
        out = layer(h, mask4)
        out = out[0] if isinstance(out, tuple) else out
        if self.pals is not None:
            # PALs run in parallel to the layer, one stack per task (pals-annealed-sampling.txt).
            delta = torch.cat([self.pals[task](idx, h[s:e], mask2[s:e]) for task, _, s, e in segments])
            out = out + delta
        return out

    def encode(self, packed: Packed, emb: torch.Tensor) -> dict[tuple[str, int], torch.Tensor]:
        """Embeddings -> pooled vector per (task, side)."""
        mask2 = packed.attention_mask
        mask4 = _additive_mask(mask2, emb.dtype)
        h = emb
        for i, layer in enumerate(self.shared_layers):
            h = self._layer(layer, h, mask4, mask2, i, packed.segments)
        pooled = {}
        # Private layers run once per task over all of that task's rows (both sides of a bi pair).
        by_task: dict[str, list[tuple[int, int, int]]] = {}
        for task, side, s, e in packed.segments:
            by_task.setdefault(task, []).append((side, s, e))
        for task, parts in by_task.items():
            s0, e0 = parts[0][1], parts[-1][2]
            ht, m4, m2 = h[s0:e0], mask4[s0:e0], mask2[s0:e0]
            segs = [(task, side, s - s0, e - s0) for side, s, e in parts]
            for j, layer in enumerate(self.task_layers[task]):
                ht = self._layer(layer, ht, m4, m2, self.k + j, segs)
            out = self.pooled_norm(self._pool(task, ht, m2))
            for side, s, e in parts:
                pooled[(task, side)] = out[s - s0:e - s0]
        return pooled

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
        if task == "sts" and self.sts_cosine:
            # Cosine of the two sentence vectors mapped from [-1, 1] to [0, 1], the units the
            # regression loss works in (TaskSpec.predict scales it to 0..5).
            cos = torch.cosine_similarity(self.heads.hidden(task, u), self.heads.hidden(task, v), dim=-1)
            return (0.5 * (cos + 1.0)).unsqueeze(-1)
        return self._head(task, self.pair_proj[task](torch.cat([u, v, (u - v).abs(), u * v], dim=-1)))

    def from_embeddings(self, packed: Packed, emb: torch.Tensor) -> dict[str, torch.Tensor]:
        pooled = self.encode(packed, emb)
        sides: dict[str, list[torch.Tensor]] = {}
        for task, side, _, _ in packed.segments:  # segments list sides in order
            sides.setdefault(task, []).append(pooled[(task, side)])
        return {t: self.predict_from_pooled(t, vecs) for t, vecs in sides.items()}

    def forward(self, batches: list[Batch]) -> dict[str, torch.Tensor]:
        """Logits (or predictions for cosine STS) per task of the given batches."""
        packed = pack(batches)
        return self.from_embeddings(packed, self.embed(packed))


def count_params(model: nn.Module) -> tuple[int, int]:
    """(total, trainable), shared tensors counted once."""
    params = {id(p): p for p in model.parameters()}.values()
    return sum(p.numel() for p in params), sum(p.numel() for p in params if p.requires_grad)


def model_size_mb(model: nn.Module) -> float:
    """Size of the serialized state dict (torch.save stores a shared tensor once)."""
    import io

    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    return buf.tell() / 2**20
