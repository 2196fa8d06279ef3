"""Projected Attention Layers (Stickland & Murray 2019), pals-annealed-sampling.txt eq. 1-2.

Eq. 1, one task's function beside every encoder layer:   TS(h) = V^D g(V^E h)
V^E (d_m -> d_s) and V^D (d_s -> d_m) are shared by the L layers of a task (not across tasks);
g is a per-layer multi-head self-attention in the small d_s space with Q, K, V projections
and no output projection. Eq. 2 counts the added weights (biases excluded):

    T * (2 d_m d_s + L * 3 d_s^2)

The paper's d_m = 768, d_s = 204, L = 12 give 1,811,520 per task; the text rounds this to
"approximately 1.9 million".
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def pal_heads(d_s: int, max_heads: int) -> int:
    """Largest head count <= max_heads (the encoder's) that divides d_s, e.g. 12 for 204."""
    return max(h for h in range(1, max(1, min(max_heads, d_s)) + 1) if d_s % h == 0)


def task_pals(tasks: list[str], d_model: int, d_s: int, num_layers: int, encoder_heads: int) -> nn.ModuleDict:
    """One PAL stack per task, with as many heads as the encoder has, or the largest count
    that divides d_s (the pal sharing regime's modules, model/sharing.py)."""
    heads = pal_heads(d_s, encoder_heads)
    return nn.ModuleDict({t: ProjectedAttention(d_model, d_s, num_layers, heads) for t in tasks})


class ProjectedAttention(nn.Module):
    """One task's PAL stack for an encoder of `num_layers` layers of width `d_model`.

    This is the parallel adapter form: `forward(l, h)` takes the hidden state h that enters
    encoder layer l and returns TS(h), which the caller ADDS to that layer's output (the
    paper adds it inside the layer before its LayerNorm; adding it after keeps the pretrained
    layer untouched and the PAL a separable module).

    V^D starts at zero, so a fresh PAL adds exactly nothing and the model starts as the
    pretrained encoder: random V^D would inject noise into every layer at once, and the L
    layers compound it. The cost is that V^E gets no gradient on the very first step (it only
    flows through V^D), which V^D's own first update then opens.
    """

    def __init__(self, d_model: int, d_s: int, num_layers: int, num_heads: int) -> None:
        super().__init__()
        for name, value in (("d_model", d_model), ("d_s", d_s), ("num_layers", num_layers),
                            ("num_heads", num_heads)):
            if value < 1:
                raise ValueError(f"PAL: {name} must be >= 1, got {value}")
        if d_s % num_heads:
            raise ValueError(f"PAL: d_s={d_s} is not divisible by num_heads={num_heads} "
                             f"(use pal_heads: {pal_heads(d_s, num_heads)} heads would fit)")
        self.num_heads = num_heads
        self.encoder = nn.Linear(d_model, d_s)  # V^E, shared by all layers of this task
        self.decoder = nn.Linear(d_s, d_model)  # V^D, shared by all layers of this task
        self.qkv = nn.ModuleList(nn.Linear(d_s, 3 * d_s) for _ in range(num_layers))
        # BERT's own initialiser scale (std 0.02), so the PAL matches the encoder it sits in.
        for linear in (self.encoder, *self.qkv):
            nn.init.normal_(linear.weight, std=0.02)
            nn.init.zeros_(linear.bias)
        nn.init.zeros_(self.decoder.weight)
        nn.init.zeros_(self.decoder.bias)

    def forward(self, layer: int, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """hidden (B, T, d_m), attention_mask (B, T) with 1 = token, 0 = pad -> (B, T, d_m)."""
        small = self.encoder(hidden)
        batch, length, d_s = small.shape
        q, k, v = (t.view(batch, length, self.num_heads, d_s // self.num_heads).transpose(1, 2)
                   for t in self.qkv[layer](small).chunk(3, dim=-1))
        keys = attention_mask.bool()
        # A row with every key masked gives NaN on some attention backends and torch versions
        # (softmax of all -inf); let an all-pad sequence attend anywhere, nobody reads it.
        keys = keys | ~keys.any(dim=-1, keepdim=True)
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=keys[:, None, None, :])
        return self.decoder(attended.transpose(1, 2).reshape(batch, length, d_s))


def pal_param_count(d_model: int, d_s: int, num_layers: int, num_tasks: int,
                    bias: bool = True) -> int:
    """Eq. 2 of pals-annealed-sampling.txt, plus the biases when `bias` is set."""
    per_task = 2 * d_model * d_s + num_layers * 3 * d_s ** 2
    if bias:
        per_task += (d_s + d_model) + num_layers * 3 * d_s  # V^E, V^D; then Q, K, V per layer
    return num_tasks * per_task
