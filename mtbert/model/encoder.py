"""Loading a BERT-family encoder: a hub name, a local directory, or a tiny random-init model."""
from __future__ import annotations

from pathlib import Path

from mtbert.config import Config, ConfigError, check_depth
from mtbert.errors import first_line
from mtbert.hub import pretrained_source


def encoder_config(cfg: Config, vocab_size: int | None = None):
    """The encoder's config, read without loading weights (cheap), so that layer counts can
    be checked before any compute is spent: mtbert's own BertConfig where mtbert/model/bert.py
    builds the model, else transformers'."""
    from mtbert.model.bert import BertConfig

    m = cfg.model
    if m.name_or_path == "tiny":
        return BertConfig(
            vocab_size=vocab_size or 1000,
            hidden_size=m.tiny.hidden,
            num_hidden_layers=m.tiny.layers,
            num_attention_heads=m.tiny.heads,
            intermediate_size=m.tiny.intermediate,
            max_position_embeddings=max(128, m.max_length, *(cfg.max_length(t) for t in cfg.tasks)),
        )
    source, kwargs = pretrained_source(m.name_or_path, ConfigError)
    if Path(source).is_dir():
        check_model_folder(m.name_or_path, Path(source))
    try:
        return config_of(source, kwargs)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"model.name_or_path: cannot load '{m.name_or_path}' "
                          f"({first_line(exc)})") from None


def config_of(source: str, kwargs: dict | None = None):
    """The config at `source` (a folder, or a hub name with its from_pretrained arguments):
    mtbert's BertConfig when the folder holds a BERT it builds itself, else transformers'."""
    from mtbert.model.bert import BertConfig

    folder = local_folder(source)
    native = BertConfig.from_folder(folder) if folder is not None else None
    if native is not None:
        return native
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(source, **(kwargs or {}))


def local_folder(source: str) -> Path | None:
    """The folder holding `source`'s config.json: itself, or a hub name's snapshot in the local
    Hugging Face cache. None where it is not on disk: transformers fetches it."""
    folder = Path(source)
    if not folder.is_dir():
        try:
            from huggingface_hub import try_to_load_from_cache

            found = try_to_load_from_cache(source, "config.json")
        except Exception:  # noqa: BLE001 - not a hub id the cache knows: not on disk
            return None
        if not isinstance(found, str):
            return None
        folder = Path(found).parent
    return folder if (folder / "config.json").is_file() else None


# The weight files AutoModel can load into torch (single file or sharded with an index).
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json",
                "pytorch_model.bin.index.json")


# The files a tokenizer is read from: the fast tokenizer's own, or what it is built from
# (WordPiece, BPE, SentencePiece). Without any, transformers still makes a tokenizer of its
# special tokens alone, and every word becomes [UNK].
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model",
                   "tokenizer.model")


def check_model_folder(name: str, folder: Path) -> None:
    """A local model folder needs its config and its weights: checked here, at load, and
    not after the data has been tokenized, where from_pretrained would fail with a traceback."""
    if not (folder / "config.json").is_file():
        raise ConfigError(f"model.name_or_path: folder {folder} holds no model (no config.json); "
                          "give a folder in Hugging Face layout, a hub name, or tiny")
    if not any((folder / w).is_file() for w in WEIGHT_FILES):
        raise ConfigError(f"model.name_or_path: folder {folder} has config.json but no weights "
                          f"({' or '.join(WEIGHT_FILES[:2])})")


def position_limit(enc_config) -> int | None:
    """Longest sequence the encoder's position embeddings allow (None: no absolute positions)."""
    limit = getattr(enc_config, "max_position_embeddings", None)
    if limit is None or getattr(enc_config, "position_embedding_type", "absolute") != "absolute":
        return None
    if enc_config.model_type in ("roberta", "xlm-roberta", "camembert", "longformer"):
        limit -= 2  # their positions start after the padding index
    return int(limit)


def load_encoder(cfg: Config, vocab_size: int | None = None, architecture=None):
    """A BertModel-like module with .embeddings, .encoder.layer and (optionally) .pooler.
    `architecture` (an encoder config) builds that encoder with random weights and never
    reads `model.name_or_path`: a model bundle loads its own weights, and the folder or hub
    name it was trained from need not exist where it is loaded. A BERT is mtbert's own
    (mtbert/model/bert.py: no transformers import); any other family is transformers'."""
    from mtbert.model.bert import Bert, BertConfig, read_checkpoint

    if architecture is not None:
        enc = Bert(architecture) if isinstance(architecture, BertConfig) else _auto_model().from_config(architecture)
    elif cfg.model.name_or_path == "tiny":
        enc = Bert(encoder_config(cfg, vocab_size))
    else:
        config = encoder_config(cfg)  # readable error for a missing directory or unknown hub name
        source, kwargs = pretrained_source(cfg.model.name_or_path, ConfigError)
        folder = local_folder(source) if isinstance(config, BertConfig) else None
        try:
            state = read_checkpoint(folder) if folder is not None else None
        except Exception as exc:  # noqa: BLE001 - a truncated or foreign file: one line naming it
            raise ConfigError(f"model.name_or_path: cannot read the weights in {folder} "
                              f"({type(exc).__name__}: {str(exc).strip()[:200]})") from None
        if state is not None:
            try:
                enc, new_params = Bert.pretrained(config, state)
            except ValueError as exc:
                raise ConfigError(f"model.name_or_path: '{cfg.model.name_or_path}': {exc}") from None
            enc.mtbert_new_params = new_params
        else:
            enc, info = _auto_model().from_pretrained(source, output_loading_info=True, **kwargs)
            enc.mtbert_new_params = set(info.get("missing_keys", ()))
        # Which parameters start from random init decides their learning rate (optim.head_lr).
        enc.mtbert_origin = weights_origin(source)
    if not (hasattr(enc, "embeddings") and hasattr(getattr(enc, "encoder", None), "layer")):
        raise ConfigError(f"model.name_or_path: '{cfg.model.name_or_path}' is not a BERT-family "
                          "encoder (needs .embeddings and .encoder.layer)")
    return enc


def _auto_model():
    from transformers import AutoModel

    return AutoModel


def weights_origin(source: str) -> tuple | None:
    """Where pretrained weights were read from, as the files stand now (folder_stamp): two
    loads with the same origin hold the same weights, so what a process derived from one
    (the frozen layers' digest, train/frozen.py) holds for the other. None where the folder
    is unknown."""
    from mtbert.data.cache import folder_stamp

    folder = local_folder(source)
    if folder is None:
        return None
    stamp = folder_stamp(folder)
    return (str(folder.resolve()), stamp) if stamp else None


def check_bert_family(name: str, enc_config) -> None:
    """An encoder of another family (GPT-2, T5, ...) named by its config: built without
    weights (torch's meta device, no memory), before any data is tokenized."""
    from mtbert.model.bert import BertConfig

    if isinstance(enc_config, BertConfig):
        return
    key = enc_config.to_json_string()
    if key not in _BERT_FAMILY:  # once per config: a sweep checks every trial's
        import torch

        try:
            with torch.device("meta"):
                enc = _auto_model().from_config(enc_config)
            _BERT_FAMILY[key] = hasattr(enc, "embeddings") and hasattr(getattr(enc, "encoder", None), "layer")
        except Exception as exc:  # noqa: BLE001 - no AutoModel for it: not an encoder this trains
            raise ConfigError(f"model.name_or_path: '{name}' (model_type {getattr(enc_config, 'model_type', '?')})"
                              f" cannot be built as an encoder ({type(exc).__name__})") from None
    if not _BERT_FAMILY[key]:
        raise ConfigError(f"model.name_or_path: '{name}' (model_type {enc_config.model_type}) is not a "
                          "BERT-family encoder (needs .embeddings and .encoder.layer)")


_BERT_FAMILY: dict[str, bool] = {}  # encoder config (JSON) -> has BERT's layout


def check_tokenizer_files(cfg: Config) -> None:
    """A local model folder trained from needs its tokenizer too: checked at load, not once a
    run has trained on [UNK]s (a model loaded from a bundle brings its own)."""
    name = cfg.model.name_or_path
    if name == "tiny":
        return
    source, _ = pretrained_source(name, ConfigError)
    folder = Path(source)
    if folder.is_dir() and not any((folder / t).is_file() for t in TOKENIZER_FILES):
        raise ConfigError(f"model.name_or_path: folder {folder} has no tokenizer files "
                          f"({', '.join(TOKENIZER_FILES[:3])}, ...); copy them from the model it came from")


def check_against_encoder(cfg: Config) -> int:
    """Validate the keys that depend on the encoder (depth L, family, tokenizer files); returns L."""
    enc_config = encoder_config(cfg)
    check_bert_family(cfg.model.name_or_path, enc_config)
    check_tokenizer_files(cfg)
    n_layers = enc_config.num_hidden_layers
    limit = position_limit(enc_config)
    if limit is not None:
        uses_default = any(cfg.task_options.get(t) is None or cfg.task_options[t].max_length is None
                           for t in cfg.tasks)
        keys = [("model.max_length", cfg.model.max_length)] if uses_default else []
        keys += [(f"task_options.{t}.max_length", o.max_length) for t, o in cfg.task_options.items()
                 if o.max_length is not None]
        for key, value in keys:
            if value > limit:
                raise ConfigError(f"{key}: {value} > {limit}, the position limit of "
                                  f"'{cfg.model.name_or_path}' (max_position_embeddings)")
    check_depth(cfg, n_layers)
    return n_layers
