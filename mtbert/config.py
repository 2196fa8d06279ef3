"""Typed config: YAML (or a dict) -> nested dataclasses, validated before any compute is spent.

Every user error is a `ConfigError` whose message names the full key path, e.g.
`config.yaml: sharing.head_regim: unknown key (did you mean 'sharing.head_regime'?)`.
Dotted `--set key=value` overrides use the same paths, and `flatten()` gives the same
names as MLflow params, so YAML, CLI and the tracking UI all read alike.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

import yaml


class ConfigError(ValueError):
    """A user error in a config: one readable line, naming the file and key path."""


# --------------------------------------------------------------------------- schema

@dataclass
class TinyEncoder:
    """Shape of the random-init encoder used when `model.name_or_path: tiny`."""
    layers: int = 2
    hidden: int = 64
    heads: int = 2
    intermediate: int = 128


@dataclass
class ModelConfig:
    # "tiny" = random-init BERT over the synthetic vocabulary; otherwise a hub name
    # (bert-base-uncased) or a local directory in Hugging Face layout.
    name_or_path: str = "tiny"
    tiny: TinyEncoder = field(default_factory=TinyEncoder)
    max_length: int = 64  # tokens per sequence (a cross-encoded pair counts as one sequence)
    # Sentence vector: mean of the token states (what sentence encoders such as MiniLM are
    # trained for, and what a random-init tiny model learns fastest), the [CLS] state, or
    # BERT's pooler (dense + tanh over [CLS], as the papers use).
    pooling: Literal["mean", "cls", "pooler"] = "mean"


@dataclass
class ColumnMap:
    text: str = "sentence"
    text2: str | None = None  # second sentence for pair tasks
    label: str = "label"


@dataclass
class TaskFiles:
    train: str = ""
    dev: str = ""
    format: Literal["auto", "cs224n", "csv", "tsv", "jsonl"] = "auto"
    columns: ColumnMap = field(default_factory=ColumnMap)


@dataclass
class SyntheticData:
    train_size: int = 1200  # examples per task
    dev_size: int = 300
    seed: int = 0


@dataclass
class DataConfig:
    # synthetic: built-in generator; cs224n: `dir` holds ids-sst-train.csv, quora-train.csv, ...;
    # files: one entry per task under `files`.
    source: Literal["synthetic", "cs224n", "files"] = "synthetic"
    dir: str | None = None
    files: dict[str, TaskFiles] = field(default_factory=dict)
    synthetic: SyntheticData = field(default_factory=SyntheticData)
    on_bad_row: Literal["skip", "error"] = "skip"
    max_train_examples: int | None = None  # per task; bounds real-data runs
    max_dev_examples: int | None = None
    cache_dir: str = ".mtbert_cache"  # tokenized datasets, keyed by content


@dataclass
class SmartConfig:
    weight: float = 0.0  # 0 = off
    epsilon: float = 1e-5  # std of the initial perturbation
    step_size: float = 1e-3
    steps: int = 1


@dataclass
class SharingConfig:
    # k of L encoder layers shared (with the embeddings); the rest are copied per task.
    # null = all L (1-bert); 0 = 3-bert; L/2 = hybrid-bert.
    encoder_shared_layers: int | None = None
    head_regime: str = "I-I-I"  # S/I per hidden head layer; its length is the head depth
    head_share_tasks: list[str] | None = None  # null = all tasks share the S layers
    cascade: Literal["none", "sst>para", "sst>para>sts"] = "none"
    pal_size: int = 0  # PAL projection size d_s; 0 = off


@dataclass
class HeadsConfig:
    hidden: int | None = None  # width of head layers; null = encoder hidden size
    dropout: float = 0.1
    task_dropout: dict[str, float] | None = None  # per-task override (progressive paper)
    pooled_layernorm: bool = False  # LayerNorm on the pooled output (progressive paper)


@dataclass
class FreezeConfig:
    layers: int = 0  # embeddings + the first n encoder layers get no updates; -1 = whole encoder


@dataclass
class OptimConfig:
    lr: float = 1e-3
    weight_decay: float = 0.01
    grad_clip: float = 1.0  # max grad norm; 0 = off


@dataclass
class LossConfig:
    weights: dict[str, float] | None = None  # per task; null = equal weights summing to 1
    pcgrad: bool = False
    smart: SmartConfig = field(default_factory=SmartConfig)


@dataclass
class SamplingConfig:
    strategy: Literal["round_robin", "proportional", "annealed", "uniform", "tuple"] = "round_robin"
    steps_per_epoch: int | None = None  # null = one pass over the largest task (tuple) / all tasks


@dataclass
class PairsConfig:
    # bi: each sentence encoded alone, features [u, v, |u-v|, u*v]; cross: one sequence
    # [CLS] a [SEP] b [SEP]. bi is the default because a random-init tiny encoder learns
    # it in seconds; the papers' cross-encoder setting is one key away.
    encoding: Literal["cross", "bi"] = "bi"


@dataclass
class StsConfig:
    head: Literal["regression", "cosine"] = "regression"


@dataclass
class TrainConfig:
    epochs: int = 3
    batch_size: int = 16
    eval_batch_size: int = 64
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    precision: Literal["auto", "fp32", "bf16"] = "auto"  # auto = bf16 autocast on CUDA
    save_checkpoint: bool = True
    # Run the encoder over length-sorted buckets of rows instead of one padded batch
    # (model/multitask.py: length_buckets). null = on for CPU, off on CUDA. Speed, not results.
    length_buckets: bool | None = None


@dataclass
class Config:
    tasks: list[str] = field(default_factory=lambda: ["sst", "para", "sts"])
    # Python modules imported before the rest is checked, e.g. one that registers a task
    # (see import_plugins). Names, not paths: `mytasks` for ./mytasks.py.
    plugins: list[str] = field(default_factory=list)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    sharing: SharingConfig = field(default_factory=SharingConfig)
    heads: HeadsConfig = field(default_factory=HeadsConfig)
    freeze: FreezeConfig = field(default_factory=FreezeConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    pairs: PairsConfig = field(default_factory=PairsConfig)
    sts: StsConfig = field(default_factory=StsConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    # Derived helpers -------------------------------------------------------------
    def head_regime(self) -> list[str]:
        return self.sharing.head_regime.split("-")

    def loss_weight(self, task: str) -> float:
        if self.loss.weights is None:
            return 1.0 / len(self.tasks)
        return float(self.loss.weights.get(task, 0.0))


# --------------------------------------------------------------------------- building

def _type_name(tp) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    if origin is dict:
        return f"mapping of {_type_name(typing.get_args(tp)[1])}"
    if dataclasses.is_dataclass(tp):
        return "mapping"
    return "null" if tp is type(None) else getattr(tp, "__name__", str(tp))


def _build(tp, value: Any, path: str):
    """Coerce `value` to type `tp` or raise ConfigError naming `path`."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {value!r}")
        hints = typing.get_type_hints(tp)
        names = [f.name for f in dataclasses.fields(tp)]
        kwargs = {}
        for key, sub in value.items():
            sub_path = f"{path}.{key}" if path else str(key)
            if key not in names:
                close = difflib.get_close_matches(str(key), names, n=1, cutoff=0.5)
                hint = f" (did you mean '{path + '.' if path else ''}{close[0]}'?)" if close else ""
                raise ConfigError(f"{sub_path}: unknown key{hint}")
            kwargs[key] = _build(hints[key], sub, sub_path)
        return tp(**kwargs)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _build(arg, value, path)
            except ConfigError as exc:
                errors.append(exc)
        if len(errors) == 1:
            raise errors[0]
        raise ConfigError(f"{path}: expected {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{path}: expected one of {', '.join(map(str, allowed))}; got {value!r}")
        return value
    if origin is list:
        (item,) = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}: expected {_type_name(tp)}, got {value!r}")
        return [_build(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        _, item = typing.get_args(tp)
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected {_type_name(tp)}, got {value!r}")
        return {str(k): _build(item, v, f"{path}.{k}") for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "1e-5" as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, str):
            return value
    elif tp is Any:
        return value
    raise ConfigError(f"{path}: expected {_type_name(tp)}, got {value!r}")


# Public name: the sweep spec types its own schema with the same rules and messages.
coerce = _build


def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


def flatten(d: dict | Any, prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}; lists and None stay values (MLflow params)."""
    if dataclasses.is_dataclass(d):
        d = dataclasses.asdict(d)
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def parse_override(text: str) -> tuple[str, Any]:
    """'optim.lr=1e-4' -> ('optim.lr', 1e-4). The value is read as YAML, so lists,
    numbers, booleans and null work: --set tasks=[sst,sts]."""
    if "=" not in text:
        raise ConfigError(f"--set {text}: expected key=value")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def set_dotted(d: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    node = d
    for part in parts[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[parts[-1]] = value


def merge(base: dict, extra: dict) -> dict:
    """Deep merge: mappings merge key by key; anything else in `extra` replaces."""
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and v:
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out


def read_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}:{where} not valid YAML ({getattr(exc, 'problem', exc)})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at top level")
    return data


def build_config(raw: dict | None = None, overrides: list[str] | dict | None = None,
                 source: str = "config") -> Config:
    """Build and validate a Config from a plain dict plus overrides (the input is not modified)."""
    raw = copy.deepcopy(raw or {})
    items = overrides.items() if isinstance(overrides, dict) else map(parse_override, overrides or [])
    for key, value in items:
        set_dotted(raw, key, value)
    try:
        cfg = _build(Config, raw, "")
        validate(cfg)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return cfg


def load_config(path: str | Path | None = None, overrides: list[str] | dict | None = None) -> Config:
    raw = read_yaml(path) if path else {}
    return build_config(raw, overrides, source=str(path) if path else "config")


# --------------------------------------------------------------------------- validation

def import_plugins(names: list[str]) -> list[types.ModuleType]:
    """Import the modules named in `plugins:`; importing is a plugin's whole interface.

    The usual plugin registers a task (mtbert.tasks.register_task) at import. Every process
    that builds a config runs this first (the CLI, a sweep's driver and each of its Ray
    trials, to which the sweep ships the modules), so the task is known wherever the config
    is checked. A module is looked up on sys.path, then in the working directory, as
    `python -m` would find it.
    """
    import importlib
    import os
    import sys

    modules = []
    for i, name in enumerate(names):
        if name.endswith(".py") or not all(part.isidentifier() for part in name.split(".")):
            raise ConfigError(f"plugins[{i}]: {name!r} is not a module name (for ./mytasks.py write mytasks)")
        if os.getcwd() not in sys.path:
            sys.path.append(os.getcwd())
        try:
            modules.append(importlib.import_module(name))
        except ImportError as exc:
            raise ConfigError(f"plugins[{i}]: cannot import '{name}' ({exc}); it must be importable "
                              f"from the working directory or the environment") from None
        except Exception as exc:  # the plugin's own code failed: say which plugin
            raise ConfigError(f"plugins[{i}]: importing '{name}' raised {type(exc).__name__}: {exc}") from None
    return modules


def validate(cfg: Config) -> None:
    """Cross-key checks: combinations that make no sense fail here, naming the keys."""
    from mtbert.tasks import TASKS

    import_plugins(cfg.plugins)
    if not cfg.tasks:
        raise ConfigError("tasks: at least one task is needed")
    for i, t in enumerate(cfg.tasks):
        if t not in TASKS:
            close = difflib.get_close_matches(t, TASKS, n=1, cutoff=0.5)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"tasks[{i}]: unknown task '{t}'{hint}; known: {', '.join(TASKS)}")
    if len(set(cfg.tasks)) != len(cfg.tasks):
        raise ConfigError(f"tasks: duplicate task in {cfg.tasks}")

    regime = cfg.head_regime()
    if not regime or any(r not in ("S", "I") for r in regime):
        raise ConfigError(f"sharing.head_regime: expected S/I letters joined by '-' (e.g. S-I-S), "
                          f"got {cfg.sharing.head_regime!r}")
    if cfg.sharing.head_share_tasks is not None:
        for t in cfg.sharing.head_share_tasks:
            if t not in cfg.tasks:
                raise ConfigError(f"sharing.head_share_tasks: '{t}' is not one of tasks {cfg.tasks}")
    if cfg.sharing.encoder_shared_layers is not None and cfg.sharing.encoder_shared_layers < 0:
        raise ConfigError("sharing.encoder_shared_layers: must be >= 0 (or null for all layers)")
    if cfg.sharing.pal_size < 0:
        raise ConfigError("sharing.pal_size: must be >= 0")
    if cfg.sharing.cascade != "none":
        chain = cfg.sharing.cascade.split(">")
        missing = [t for t in chain if t not in cfg.tasks]
        if missing:
            raise ConfigError(f"sharing.cascade: '{cfg.sharing.cascade}' needs tasks {missing} "
                              f"which are not in tasks {cfg.tasks}")
    if cfg.sharing.cascade != "none" and cfg.pairs.encoding == "bi":
        raise ConfigError("sharing.cascade: not supported with pairs.encoding: bi (upstream heads "
                          "read one pooled vector per example); set pairs.encoding: cross")
    if cfg.sharing.cascade != "none" and regime[0] == "S":
        raise ConfigError(f"sharing.cascade: downstream heads read [pooled, upstream outputs], wider "
                          f"than their upstream's input, so sharing.head_regime must start with I "
                          f"(got {cfg.sharing.head_regime})")
    if cfg.sts.head == "cosine" and (cfg.pairs.encoding != "bi" or "sts" not in cfg.tasks):
        raise ConfigError("sts.head: cosine needs pairs.encoding: bi (two sentence vectors) and the sts task")
    if cfg.freeze.layers < -1:
        raise ConfigError("freeze.layers: must be >= 0, or -1 for the whole encoder")

    if cfg.loss.weights is not None:
        for t, w in cfg.loss.weights.items():
            if t not in cfg.tasks:
                raise ConfigError(f"loss.weights.{t}: '{t}' is not one of tasks {cfg.tasks}")
            if w < 0:
                raise ConfigError(f"loss.weights.{t}: must be >= 0, got {w}")
        if sum(cfg.loss.weights.get(t, 0.0) for t in cfg.tasks) <= 0:
            raise ConfigError("loss.weights: at least one weight must be positive")
    if cfg.loss.pcgrad and cfg.sampling.strategy != "tuple":
        raise ConfigError("loss.pcgrad: needs a loss for several tasks in one step; "
                          f"set sampling.strategy: tuple (got '{cfg.sampling.strategy}')")
    if cfg.loss.smart.weight < 0 or cfg.loss.smart.steps < 0:
        raise ConfigError("loss.smart: weight and steps must be >= 0")

    for key, val in (("optim.lr", cfg.optim.lr), ("train.epochs", cfg.train.epochs),
                     ("train.batch_size", cfg.train.batch_size), ("model.max_length", cfg.model.max_length)):
        if not val > 0:
            raise ConfigError(f"{key}: must be > 0, got {val}")
    if cfg.sampling.steps_per_epoch is not None and cfg.sampling.steps_per_epoch <= 0:
        raise ConfigError("sampling.steps_per_epoch: must be > 0 (or null)")
    if not 0 <= cfg.heads.dropout < 1:
        raise ConfigError(f"heads.dropout: must be in [0, 1), got {cfg.heads.dropout}")

    if cfg.data.source == "cs224n" and not cfg.data.dir:
        raise ConfigError("data.dir: required when data.source is cs224n")
    if cfg.data.source == "files":
        for t in cfg.tasks:
            if t not in cfg.data.files:
                raise ConfigError(f"data.files.{t}: missing (data.source is files)")
            if not cfg.data.files[t].train or not cfg.data.files[t].dev:
                raise ConfigError(f"data.files.{t}: needs both train and dev paths")
