"""Loading a BERT-family encoder: a hub name, a local directory, or a tiny random-init model."""
from __future__ import annotations

from mtbert.config import Config, ConfigError
from mtbert.hub import pretrained_source


def encoder_config(cfg: Config, vocab_size: int | None = None):
    """The encoder's transformers config, read without loading weights (cheap), so that
    layer counts can be checked before any compute is spent."""
    from transformers import AutoConfig, BertConfig

    m = cfg.model
    if m.name_or_path == "tiny":
        return BertConfig(
            vocab_size=vocab_size or 1000,
            hidden_size=m.tiny.hidden,
            num_hidden_layers=m.tiny.layers,
            num_attention_heads=m.tiny.heads,
            intermediate_size=m.tiny.intermediate,
            max_position_embeddings=max(128, m.max_length),
        )
    source, kwargs = pretrained_source(m.name_or_path, ConfigError)
    try:
        return AutoConfig.from_pretrained(source, **kwargs)
    except OSError as exc:
        raise ConfigError(f"model.name_or_path: cannot load '{m.name_or_path}' "
                          f"({str(exc).splitlines()[0]})") from None


def load_encoder(cfg: Config, vocab_size: int | None = None):
    """A BertModel-like module with .embeddings, .encoder.layer and (optionally) .pooler."""
    from transformers import AutoModel, BertModel

    if cfg.model.name_or_path == "tiny":
        enc = BertModel(encoder_config(cfg, vocab_size), add_pooling_layer=True)
    else:
        encoder_config(cfg)  # readable error for a missing directory or unknown hub name
        source, kwargs = pretrained_source(cfg.model.name_or_path, ConfigError)
        enc = AutoModel.from_pretrained(source, **kwargs)
    if not (hasattr(enc, "embeddings") and hasattr(getattr(enc, "encoder", None), "layer")):
        raise ConfigError(f"model.name_or_path: '{cfg.model.name_or_path}' is not a BERT-family "
                          "encoder (needs .embeddings and .encoder.layer)")
    return enc


def check_against_encoder(cfg: Config) -> int:
    """Validate the keys that depend on the encoder depth L; returns L."""
    n_layers = encoder_config(cfg).num_hidden_layers
    k = cfg.sharing.encoder_shared_layers
    if k is not None and k > n_layers:
        raise ConfigError(f"sharing.encoder_shared_layers: {k} > {n_layers} layers of "
                          f"'{cfg.model.name_or_path}'")
    if cfg.freeze.layers > n_layers:
        raise ConfigError(f"freeze.layers: {cfg.freeze.layers} > {n_layers} layers of "
                          f"'{cfg.model.name_or_path}'")
    return n_layers
