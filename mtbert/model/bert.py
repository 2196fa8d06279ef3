"""BERT in plain torch: the embeddings, encoder layers and pooler of a `model_type: bert`
checkpoint (MiniLM, bert-base, tiny), under the state-dict names transformers' BertModel
uses, so a checkpoint's weights load as they are and bundles and digests do not change.

Why not transformers' class: importing its BERT module (its generic model machinery with
it) cost every sweep worker about 2.4 s before its first trial could start, more than a
head-only trial trains (a 2-core AVX512-BF16 EPYC; docs/benchmarks.md). mtbert calls only
the pieces: embeddings(input_ids, token_type_ids), layer(h, additive mask) and pooler(h).
The same arithmetic, in the same order: tests/model/test_bert.py holds it to transformers'
outputs. Any other architecture (roberta, relative positions, an activation not listed
below) loads through transformers' AutoModel as before (mtbert/model/encoder.py).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

# The keys this module reads, with BERT's own values where a config.json leaves one out.
DEFAULTS: dict[str, Any] = {
    "model_type": "bert", "vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12,
    "num_attention_heads": 12, "intermediate_size": 3072, "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 512,
    "type_vocab_size": 2, "initializer_range": 0.02, "layer_norm_eps": 1e-12, "pad_token_id": 0,
    "position_embedding_type": "absolute",
}
ACTIVATIONS = {
    "gelu": F.gelu,  # the exact (erf) form, as BERT was trained
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu, "silu": F.silu, "swish": F.silu,
}


class BertConfig:
    """A BERT config.json as attributes (every key kept, so that it is written back whole)."""

    def __init__(self, **values: Any):
        self.__dict__.update({**DEFAULTS, **values})

    @classmethod
    def from_folder(cls, folder: str | Path) -> "BertConfig | None":
        """The folder's config if this module can build it, else None (transformers builds it).
        Raises ValueError for a config.json that is not a JSON object."""
        values = json.loads((Path(folder) / "config.json").read_text())
        if not isinstance(values, dict):
            raise ValueError("config.json is not a JSON object")
        config = cls(**values)
        return config if config.supported() else None

    def supported(self) -> bool:
        return (self.model_type == "bert" and self.hidden_act in ACTIVATIONS
                and self.position_embedding_type == "absolute"
                and not self.__dict__.get("is_decoder") and not self.__dict__.get("add_cross_attention")
                and self.hidden_size % self.num_attention_heads == 0)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def save_pretrained(self, folder: str | Path) -> None:
        """config.json as transformers writes it: AutoConfig and AutoModel read it too."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        values = {"architectures": ["BertModel"], **self.to_dict()}
        (folder / "config.json").write_text(json.dumps(values, indent=2, sort_keys=True) + "\n")


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, 1, 1, T) from a (B, T) 0/1 mask: 0 where attended, a large negative where padded,
    what every layer adds to its attention scores (transformers' layers take it too)."""
    return (1.0 - mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min


class Embeddings(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size, padding_idx=c.pad_token_id)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.dropout = nn.Dropout(c.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
        h = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        h = h + self.position_embeddings(positions)
        return self.dropout(self.LayerNorm(h))


class SelfAttention(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.heads = c.num_attention_heads
        self.query = nn.Linear(c.hidden_size, c.hidden_size)
        self.key = nn.Linear(c.hidden_size, c.hidden_size)
        self.value = nn.Linear(c.hidden_size, c.hidden_size)
        # Only its p is read: scaled_dot_product_attention drops the probabilities itself.
        self.dropout = nn.Dropout(c.attention_probs_dropout_prob)

    def forward(self, h: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        b, t, width = h.shape

        def split(x: torch.Tensor) -> torch.Tensor:  # (B, T, width) -> (B, heads, T, width / heads)
            return x.view(b, t, self.heads, -1).transpose(1, 2)

        q, k, v = split(self.query(h)), split(self.key(h)), split(self.value(h))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                             dropout_p=self.dropout.p if self.training else 0.0,
                                             scale=(width // self.heads) ** -0.5)
        return out.transpose(1, 2).reshape(b, t, width)


class Residual(nn.Module):
    """dense, dropout, then LayerNorm of the sum with the block's input."""

    def __init__(self, d_in: int, c: BertConfig):
        super().__init__()
        self.dense = nn.Linear(d_in, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.dropout = nn.Dropout(c.hidden_dropout_prob)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(x)) + skip)


class Attention(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.self = SelfAttention(c)
        self.output = Residual(c.hidden_size, c)

    def forward(self, h: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return self.output(self.self(h, mask), h)


class Intermediate(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.intermediate_size)
        self.act = ACTIVATIONS[c.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x))


class Layer(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.attention = Attention(c)
        self.intermediate = Intermediate(c)
        self.output = Residual(c.intermediate_size, c)

    def forward(self, h: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """`mask`: additive, broadcastable to (B, heads, T, T): 0 where attended."""
        a = self.attention(h, mask)
        return self.output(self.intermediate(a), a)


class Pooler(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.hidden_size)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(h[:, 0]))


class Stack(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(Layer(c) for _ in range(c.num_hidden_layers))


class Bert(nn.Module):
    """embeddings, encoder.layer[i], pooler: BertModel's layout and names."""

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True, init: bool = True):
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.encoder = Stack(config)
        self.pooler = Pooler(config) if add_pooling_layer else None
        if init:
            self.init_weights()

    @classmethod
    def pretrained(cls, config: BertConfig, state: dict[str, torch.Tensor]) -> tuple["Bert", set[str]]:
        """The encoder holding a checkpoint's tensors, and the names it lacked (initialised as
        BERT initialises). Built empty and filled: drawing MiniLM's 22 million random numbers
        only to overwrite them cost every trial 0.16-0.23 s (a 2-core AVX512-BF16 EPYC)."""
        with torch.device("meta"):
            enc = cls(config, init=False)
        enc.to_empty(device="cpu")
        missing = enc.load_checkpoint(state)
        enc.init_weights(missing)
        return enc, missing

    def init_weights(self, names: set[str] | None = None) -> None:
        """BERT's initialisation of the parameters `names` (all by default): normal weights of
        sd initializer_range (the padding token's embedding zero), zero biases, unit LayerNorm gains."""
        std = self.config.initializer_range
        with torch.no_grad():
            for prefix, module in self.named_modules():
                for name, p in module.named_parameters(recurse=False):
                    if names is not None and f"{prefix}.{name}".lstrip(".") not in names:
                        continue
                    if isinstance(module, nn.LayerNorm) and name == "weight":
                        p.fill_(1.0)
                    elif name == "bias":
                        p.zero_()
                    else:
                        p.normal_(0.0, std)
                        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
                            p[module.padding_idx].zero_()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The last layer's hidden states (B, T, hidden)."""
        h = self.embeddings(input_ids, token_type_ids)
        mask = additive_mask(attention_mask, h.dtype) if attention_mask is not None else None
        for layer in self.encoder.layer:
            h = layer(h, mask)
        return h

    def load_checkpoint(self, state: dict[str, torch.Tensor]) -> set[str]:
        """Take a checkpoint's tensors in (as float32); returns the names it lacked (left as
        they were). Accepts BertModel's names and those of a pretraining checkpoint ("bert."
        before each, LayerNorm's old gamma and beta); anything else in it (its pretraining
        heads) is not read."""
        own = self.state_dict()
        taken = {}
        for name, tensor in state.items():
            name = name[len("bert."):] if name.startswith("bert.") else name
            name = name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
            if name not in own:
                continue
            if own[name].shape != tensor.shape:
                shape = lambda t: " x ".join(map(str, t.shape))  # noqa: E731
                raise ValueError(f"{name} is {shape(tensor)} in the checkpoint but {shape(own[name])} "
                                 "by its config.json")
            taken[name] = tensor.to(own[name].dtype)
        # assign: the checkpoint's own tensors become the parameters, with no second copy.
        self.load_state_dict(taken, strict=False, assign=True)
        return {name for name in own if name not in taken}


def read_checkpoint(folder: Path) -> dict[str, torch.Tensor] | None:
    """A folder's single weights file, or None where it has only a sharded one."""
    if (folder / "model.safetensors").is_file():
        from safetensors.torch import load_file

        return load_file(str(folder / "model.safetensors"))
    if (folder / "pytorch_model.bin").is_file():
        return torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    return None
