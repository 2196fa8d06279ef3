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
    # Used by csv/tsv/jsonl files; a cs224n-format file is read by the task's own CS224N
    # names. The resolved config (result.json, MLflow params) shows what the reader used.
    text: str = "sentence"
    text2: str | None = None  # second sentence for pair tasks
    label: str = "label"
    # Column naming each example in prediction files; null = the CS224N `id` column when the
    # file has one, else the row number.
    id: str | None = None


@dataclass
class TaskFiles:
    train: str = ""
    dev: str = ""
    test: str = ""  # optional; labels may be absent (`mtbert predict --split test`)
    format: Literal["auto", "cs224n", "csv", "tsv", "jsonl"] = "auto"
    columns: ColumnMap = field(default_factory=ColumnMap)


@dataclass
class SyntheticData:
    train_size: int = 1200  # examples per task
    dev_size: int = 300
    seed: int = 0


@dataclass
class DataConfig:
    # synthetic: built-in generator (reads no files: a `files` entry is an error, not ignored);
    # cs224n: `dir` holds ids-sst-train.csv, quora-train.csv, ...; a task with a `files` entry
    # reads that instead (so a fourth task can join the CS224N three); files: one entry per task.
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
    head_regime: str = "I-I-I"  # S/I per hidden head layer; its length is the head depth; none = 0
    head_share_tasks: list[str] | None = None  # null = all tasks share the S layers
    # "none" or a chain of configured tasks, upstream first, e.g. sst>para>sts: each head also
    # reads the (detached) outputs of the heads before it (progressive-layer-sharing.txt).
    cascade: str = "none"
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
    """The fine-tuning recipe. A null value is filled in at load from the encoder (see
    RECIPES): a pretrained encoder is fine-tuned the BERT way (small encoder rate, higher rate
    for the freshly initialised heads, warmup, linear decay); the random-init `tiny` model
    learns everything from scratch at one high constant rate. The resolved values are what
    MLflow records, so a run always shows the rates it used."""
    # Learning rate of the encoder's pretrained parameters (embeddings, layers, pooler).
    lr: float | None = None
    # Learning rate of the parameters that start from random init: heads, pair projections,
    # PALs, the pooled LayerNorm (and a loss weighting's own parameters).
    head_lr: float | None = None
    # Layer-wise decay down the encoder: layer i of L gets lr x layer_decay^(L - i), the
    # embeddings lr x layer_decay^L. 1.0 = one rate for the whole encoder.
    layer_decay: float = 1.0
    # LR multiplier over the optimizer steps (transformers' schedulers): constant, or linear /
    # cosine decay to 0 at the last step; all after `warmup`.
    schedule: Literal["constant", "linear", "cosine"] | None = None
    # Linear warmup from 0: a ratio of all optimizer steps when < 1, a step count when >= 1.
    warmup: float | None = None
    weight_decay: float = 0.01
    grad_clip: float = 1.0  # max grad norm; 0 = off


# Defaults for the null optim keys, by kind of encoder. Pretrained: 5e-5 for the encoder, the
# upper end of the usual BERT fine-tuning range (2e-5..5e-5), because CPU budgets are a few
# thousand steps; the heads start from random init and need ~20x that, with 10% warmup and a
# linear decay. tiny: random init everywhere, so one high constant rate (what its smoke
# sweeps learn fast with). The STS head: with a pretrained sentence encoder, the cosine of
# the two sentence vectors scores 0.838 on the CS224N STS dev set before any training, while
# a regression head trained on the same frozen vectors peaks at 0.821
# (docs/results/reference.md), so cosine keeps what the encoder knows.
RECIPES = {
    "pretrained": {"lr": 5e-5, "head_lr": 1e-3, "schedule": "linear", "warmup": 0.1,
                   "sts_head": "cosine"},
    "tiny": {"lr": 1e-3, "head_lr": None, "schedule": "constant", "warmup": 0.0,  # head_lr = lr
             "sts_head": "regression"},
}


@dataclass
class UncertaintyConfig:
    # Kendall et al. 2018: one learned log-variance s_i per task, loss sum_i exp(-s_i) L_i + s_i.
    init: float = 0.0  # s_i at the start; 0 = every weight 1


@dataclass
class GradNormConfig:
    # Chen et al. 2018: weights pulled toward equal gradient norms on the last shared layer,
    # faster for tasks whose loss falls slower; alpha sets that pull (paper: 0.12 to 3).
    alpha: float = 1.5
    lr: float = 0.025  # Adam rate of the weights themselves (they have their own optimizer)


@dataclass
class DwaConfig:
    temperature: float = 2.0  # Liu et al. 2019: softness of the softmax over loss ratios (paper: 2)


@dataclass
class CagradConfig:
    c: float = 0.4  # Liu et al. 2021: radius of the ball around the mean gradient; 0 = the mean gradient


@dataclass
class LossConfig:
    # Per task, summing to 1 (as a sweep's simplex does); a task left out weighs 0, so
    # {sst: 0.7, sts: 0.3} trains para on nothing. Not normalised: a sum other than 1 would
    # silently scale the learning rate, so it is an error. null = equal weights.
    weights: dict[str, float] | None = None
    # How the per-task losses become one update: a name from mtbert.train.weighting.WEIGHTINGS.
    # static = sum of loss.weights x loss; the others are the papers' methods, each with its
    # own settings below. pcgrad, gradnorm and cagrad need sampling.strategy: tuple.
    weighting: str = "static"
    # Older spelling of `weighting: pcgrad`, kept so existing sweeps run unchanged.
    pcgrad: bool = False
    uncertainty: UncertaintyConfig = field(default_factory=UncertaintyConfig)
    gradnorm: GradNormConfig = field(default_factory=GradNormConfig)
    dwa: DwaConfig = field(default_factory=DwaConfig)
    cagrad: CagradConfig = field(default_factory=CagradConfig)
    smart: SmartConfig = field(default_factory=SmartConfig)


@dataclass
class SamplingConfig:
    strategy: Literal["round_robin", "proportional", "annealed", "uniform", "tuple", "temperature"] = "round_robin"
    steps_per_epoch: int | None = None  # null = one pass over the largest task (tuple) / all tasks
    # temperature strategy (jiant's): p_i ∝ N_i^(1/T); T = 1 is proportional, large T near uniform.
    temperature: float = 2.0
    # temperature strategy: N_i counted as min(N_i, size_cap), so one huge task (Quora) cannot
    # take nearly every step; null = no cap.
    size_cap: int | None = None


@dataclass
class PairsConfig:
    # bi: each sentence encoded alone, features [u, v, |u-v|, u*v]; cross: one sequence
    # [CLS] a [SEP] b [SEP]. bi is the default because a random-init tiny encoder learns
    # it in seconds; the papers' cross-encoder setting is one key away.
    encoding: Literal["cross", "bi"] = "bi"


@dataclass
class StsConfig:
    # regression: a head on the pair features; cosine: the cosine of the two sentence vectors,
    # trained towards similarity / 5 (no head layers: the encoder's own geometry is the score);
    # cosine_mlp: the cosine after the task's hidden head layers (the papers' cosine heads, so
    # head-sharing regimes apply to STS too).
    # null = cosine for a pretrained encoder with bi-encoded pairs (see RECIPES), regression
    # for tiny.
    # The sts task's head; task_options.sts.head wins when set.
    head: Literal["regression", "cosine", "cosine_mlp"] | None = None


@dataclass
class TaskOptions:
    """Options of one task (`task_options.<task>`), for tasks whose shape differs from the rest."""
    # Tokens per sequence for this task; null = model.max_length. Long texts (reviews) need
    # more than short sentences, and one global length either cuts them or pads the rest.
    max_length: int | None = None
    # regression: the usual head (MLP on the pooled vector, or on [u, v, |u-v|, u*v] for a
    # bi-encoded pair); cosine: cos(u, v) of the two sentence vectors mapped to the label range,
    # for a similarity pair task (regression kind, pairs.encoding: bi). null = regression,
    # except for sts, where sts.head decides.
    head: Literal["regression", "cosine", "cosine_mlp"] | None = None


@dataclass
class TrainConfig:
    epochs: int = 3
    batch_size: int = 16
    eval_batch_size: int = 64
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # auto = bf16 autocast on CUDA and on CPUs with native bf16 (AVX512-BF16 or AMX), whose
    # bf16 matmuls run several times faster than fp32; fp32 elsewhere.
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    save_checkpoint: bool = True
    # What best/ stores of frozen layers loaded from a pretrained model: slim names them (the
    # model and a digest) and load_model reads them from there; full stores them, so the
    # bundle loads where that model is absent (mtbert/bundle.py).
    bundle: Literal["slim", "full"] = "slim"
    # Micro-batches whose gradients add up before one optimizer step (an effective batch of
    # batch_size x grad_accum per task); schedules count optimizer steps.
    grad_accum: int = 1
    # Stop after this many evaluations (epochs) without a new best overall; the best epoch is
    # kept and reported. null = run every epoch.
    patience: int | None = None
    # Run the encoder over length-sorted buckets of rows instead of one padded batch
    # (model/multitask.py: length_buckets). null = on for CPU, off on CUDA. Speed, not results.
    length_buckets: bool | None = None
    # Frozen layers computed once: with the embeddings and the first n encoder layers frozen
    # (freeze.layers), their outputs never change, so they are computed once per example and
    # stored under data.cache_dir for every epoch and every trial with the same model, data,
    # max_length and n. Frozen layers then run in eval mode (no dropout) whether cached or
    # not. The cache is skipped when it would exceed this size (MB on disk); 0 = off.
    frozen_cache_mb: int = 4096
    # Linear probe, then fine-tune: the heads first train on the frozen encoder for one pass
    # over the training data (the frozen reference's recipe, read from the frozen-layer cache),
    # and fine-tuning starts from them. Random heads at step 1 send random gradients into the
    # pretrained layers; from probed heads the run starts at the frozen reference's level.
    probe: bool = False


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
    # task -> TaskOptions, e.g. {reviews: {max_length: 256}, sick: {head: cosine}}
    task_options: dict[str, TaskOptions] = field(default_factory=dict)
    train: TrainConfig = field(default_factory=TrainConfig)

    # Derived helpers -------------------------------------------------------------
    def head_regime(self) -> list[str]:
        # "none": no hidden head layer, each task's output layer reads the pooled vector
        # (a linear probe: logistic regression for the classification tasks).
        return [] if self.sharing.head_regime == "none" else self.sharing.head_regime.split("-")

    def max_length(self, task: str) -> int:
        opts = self.task_options.get(task)
        return opts.max_length if opts is not None and opts.max_length is not None else self.model.max_length

    def task_head(self, task: str) -> str:
        opts = self.task_options.get(task)
        if opts is not None and opts.head is not None:
            return opts.head
        return self.sts.head if task == "sts" else "regression"

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
        resolve_recipe(cfg)
        validate(cfg)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return cfg


SWEEP_FILE_KEYS = ("space", "base", "base_config", "search", "scheduler", "baseline")


def load_config(path: str | Path | None = None, overrides: list[str] | dict | None = None) -> Config:
    raw = read_yaml(path) if path else {}
    sweep_keys = [k for k in SWEEP_FILE_KEYS if k in raw]
    if sweep_keys:
        raise ConfigError(f"{path}: a sweep file (it has {', '.join(k + ':' for k in sweep_keys)}), "
                          f"not a training config; run it with `mtbert sweep run {path}`")
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


# The frozen reference: the encoder exactly as it came (every layer frozen, so its outputs are
# computed once by the frozen-layer cache) with linear heads trained on top: a logistic
# regression per classification task (on [u, v, |u-v|, u*v] for bi-encoded pairs) and, for a
# sentence encoder, the cosine of the two sentence vectors for STS. Any fine-tuned row that
# scores below it has lost what the encoder knew. `mtbert train --reference` and a sweep's
# `reference: true` apply these over the config.
REFERENCE = {"freeze.layers": -1, "sharing.head_regime": "none", "sharing.encoder_shared_layers": None,
             "sharing.cascade": "none", "sharing.pal_size": 0, "loss.smart.weight": 0.0,
             "heads.dropout": 0.0, "heads.pooled_layernorm": False, "pairs.encoding": "bi",
             "optim.schedule": "constant", "optim.warmup": 0.0, "train.epochs": 10, "train.patience": 2}


def resolve_recipe(cfg: Config) -> Config:
    """Fill the null recipe keys (optim.*, sts.head) from RECIPES for this kind of encoder."""
    recipe = RECIPES["tiny" if cfg.model.name_or_path == "tiny" else "pretrained"]
    for key in ("lr", "schedule", "warmup"):
        if getattr(cfg.optim, key) is None:
            setattr(cfg.optim, key, recipe[key])
    if cfg.optim.head_lr is None:
        cfg.optim.head_lr = recipe["head_lr"] if recipe["head_lr"] is not None else cfg.optim.lr
    if cfg.sts.head is None:
        cfg.sts.head = recipe["sts_head"] if "sts" in cfg.tasks and cfg.pairs.encoding == "bi" else "regression"
    return cfg


WEIGHT_SUM_TOLERANCE = 5e-3  # as a sweep's simplex: weights may be written rounded (0.333 for 1/3)


def _check_per_task(cfg: Config) -> None:
    """Mappings keyed by task name: a key that is not a configured task would be ignored."""
    from mtbert.tasks import get_task

    for key, mapping in (("heads.task_dropout", cfg.heads.task_dropout or {}),
                         ("task_options", cfg.task_options)):
        for t in mapping:
            if t not in cfg.tasks:
                close = difflib.get_close_matches(t, cfg.tasks, n=1, cutoff=0.5)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                raise ConfigError(f"{key}.{t}: '{t}' is not one of tasks {cfg.tasks}{hint}")
    for t, p in (cfg.heads.task_dropout or {}).items():
        if not 0 <= p < 1:
            raise ConfigError(f"heads.task_dropout.{t}: must be in [0, 1), got {p}")
    for t, opts in cfg.task_options.items():
        if opts.max_length is not None and opts.max_length <= 0:
            raise ConfigError(f"task_options.{t}.max_length: must be > 0, got {opts.max_length}")
    for t in cfg.tasks:
        if cfg.task_head(t) not in ("cosine", "cosine_mlp"):
            continue
        key = f"task_options.{t}.head" if t in cfg.task_options and cfg.task_options[t].head else "sts.head"
        task = get_task(t)
        if not task.pair or task.kind != "regression":
            raise ConfigError(f"{key}: cosine scores a sentence pair on a scale; '{t}' is a "
                              f"{task.kind}{' pair' if task.pair else ' single-sentence'} task")
        if cfg.pairs.encoding != "bi":
            raise ConfigError(f"{key}: cosine needs pairs.encoding: bi (two sentence vectors)")


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
    if any(r not in ("S", "I") for r in regime):
        raise ConfigError(f"sharing.head_regime: expected S/I letters joined by '-' (e.g. S-I-S) or none, "
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
        chain = [t.strip() for t in cfg.sharing.cascade.split(">")]
        if len(chain) < 2 or not all(chain):
            raise ConfigError(f"sharing.cascade: expected none or tasks joined by '>' upstream first "
                              f"(e.g. {'>'.join(cfg.tasks[:3])}), got {cfg.sharing.cascade!r}")
        missing = [t for t in chain if t not in cfg.tasks]
        if missing:
            raise ConfigError(f"sharing.cascade: '{cfg.sharing.cascade}' needs tasks {missing} "
                              f"which are not in tasks {cfg.tasks}")
        if len(set(chain)) != len(chain):
            raise ConfigError(f"sharing.cascade: '{cfg.sharing.cascade}' names a task twice")
        cfg.sharing.cascade = ">".join(chain)
    if cfg.sharing.cascade != "none" and cfg.pairs.encoding == "bi":
        raise ConfigError("sharing.cascade: not supported with pairs.encoding: bi (upstream heads "
                          "read one pooled vector per example); set pairs.encoding: cross")
    if cfg.sharing.cascade != "none" and regime and regime[0] == "S":
        raise ConfigError(f"sharing.cascade: downstream heads read [pooled, upstream outputs], wider "
                          f"than their upstream's input, so sharing.head_regime must start with I "
                          f"(got {cfg.sharing.head_regime})")
    if cfg.sts.head in ("cosine", "cosine_mlp") and (cfg.pairs.encoding != "bi" or "sts" not in cfg.tasks):
        raise ConfigError("sts.head: cosine needs pairs.encoding: bi (two sentence vectors) and the sts task")
    _check_per_task(cfg)
    if cfg.freeze.layers < -1:
        raise ConfigError("freeze.layers: must be >= 0, or -1 for the whole encoder")

    if cfg.loss.weights is not None:
        for t, w in cfg.loss.weights.items():
            if t not in cfg.tasks:
                raise ConfigError(f"loss.weights.{t}: '{t}' is not one of tasks {cfg.tasks}")
            if w < 0:
                raise ConfigError(f"loss.weights.{t}: must be >= 0, got {w}")
        total = sum(cfg.loss.weights.get(t, 0.0) for t in cfg.tasks)
        if total <= 0:
            raise ConfigError("loss.weights: at least one weight must be positive")
        if abs(total - 1) > WEIGHT_SUM_TOLERANCE:
            left_out = [t for t in cfg.tasks if t not in cfg.loss.weights]
            note = f"; {', '.join(left_out)} weigh 0" if left_out else ""
            raise ConfigError(f"loss.weights: must sum to 1, got {total:g}{note} (not normalised: "
                              f"a larger sum would act as a larger learning rate)")
    _validate_weighting(cfg)
    if cfg.loss.smart.weight < 0 or cfg.loss.smart.steps < 0:
        raise ConfigError("loss.smart: weight and steps must be >= 0")

    for key, val in (("optim.lr", cfg.optim.lr), ("optim.head_lr", cfg.optim.head_lr),
                     ("optim.layer_decay", cfg.optim.layer_decay), ("train.grad_accum", cfg.train.grad_accum),
                     ("train.epochs", cfg.train.epochs),
                     ("train.batch_size", cfg.train.batch_size), ("model.max_length", cfg.model.max_length)):
        if not val > 0:
            raise ConfigError(f"{key}: must be > 0, got {val}")
    if cfg.optim.layer_decay > 1:
        raise ConfigError(f"optim.layer_decay: must be in (0, 1] (lower layers get smaller rates), "
                          f"got {cfg.optim.layer_decay}")
    if cfg.optim.warmup < 0 or (cfg.optim.warmup >= 1 and not float(cfg.optim.warmup).is_integer()):
        raise ConfigError(f"optim.warmup: a ratio in [0, 1) or a whole number of steps, got {cfg.optim.warmup}")
    if cfg.train.patience is not None and cfg.train.patience < 1:
        raise ConfigError(f"train.patience: must be >= 1 (or null), got {cfg.train.patience}")
    if cfg.train.frozen_cache_mb < 0:
        raise ConfigError(f"train.frozen_cache_mb: must be >= 0 (0 = off), got {cfg.train.frozen_cache_mb}")
    if not cfg.sampling.temperature > 0:
        raise ConfigError(f"sampling.temperature: must be > 0, got {cfg.sampling.temperature}")
    if cfg.sampling.size_cap is not None and cfg.sampling.size_cap <= 0:
        raise ConfigError("sampling.size_cap: must be > 0 (or null)")
    if cfg.sampling.steps_per_epoch is not None and cfg.sampling.steps_per_epoch <= 0:
        raise ConfigError("sampling.steps_per_epoch: must be > 0 (or null)")
    if not 0 <= cfg.heads.dropout < 1:
        raise ConfigError(f"heads.dropout: must be in [0, 1), got {cfg.heads.dropout}")

    if cfg.data.source == "cs224n" and not cfg.data.dir:
        raise ConfigError("data.dir: required when data.source is cs224n")
    if cfg.data.source == "synthetic" and cfg.data.files:
        t = next(iter(cfg.data.files))
        raise ConfigError(f"data.files.{t}: data.source is synthetic, which reads no files; "
                          "set data.source: files (or cs224n, whose tasks read data.dir)")
    for t in cfg.data.files:
        if t not in cfg.tasks:
            raise ConfigError(f"data.files.{t}: '{t}' is not one of tasks {cfg.tasks} (the entry "
                              "would be read by nothing)")
    if cfg.data.source == "files":
        for t in cfg.tasks:
            if t not in cfg.data.files:
                raise ConfigError(f"data.files.{t}: missing (data.source is files)")
            if not cfg.data.files[t].train or not cfg.data.files[t].dev:
                raise ConfigError(f"data.files.{t}: needs both train and dev paths")


def _validate_weighting(cfg: Config) -> None:
    """loss.weighting names a registered method whose needs the rest of the config meets."""
    from mtbert.train.weighting import WEIGHTINGS

    loss = cfg.loss
    key = "loss.pcgrad" if loss.pcgrad else "loss.weighting"
    if loss.pcgrad:
        # The old key is an alias: it picks the method, unless another one is already named.
        if loss.weighting not in ("static", "pcgrad"):
            raise ConfigError(f"loss.pcgrad: true is the old spelling of loss.weighting: pcgrad and cannot "
                              f"be combined with loss.weighting: {loss.weighting}; drop loss.pcgrad")
        loss.weighting = "pcgrad"
    method = WEIGHTINGS.get(loss.weighting)
    if method is None:
        close = difflib.get_close_matches(loss.weighting, WEIGHTINGS, n=1, cutoff=0.5)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(f"loss.weighting: unknown method '{loss.weighting}'{hint}; "
                          f"known: {', '.join(WEIGHTINGS)}")
    if method.needs_every_task and cfg.sampling.strategy != "tuple":
        what = "" if loss.pcgrad else f" {loss.weighting}"
        raise ConfigError(f"{key}:{what} needs a loss for several tasks in one step; "
                          f"set sampling.strategy: tuple (got '{cfg.sampling.strategy}')")
    if loss.weights is not None and not method.uses_fixed_weights:
        raise ConfigError(f"loss.weights: fixed weights are read by loss.weighting static or pcgrad; "
                          f"{loss.weighting} sets its own, so leave loss.weights null")
    for key, value in (("loss.gradnorm.alpha", loss.gradnorm.alpha), ("loss.cagrad.c", loss.cagrad.c)):
        if value < 0:
            raise ConfigError(f"{key}: must be >= 0, got {value}")
    for key, value in (("loss.gradnorm.lr", loss.gradnorm.lr), ("loss.dwa.temperature", loss.dwa.temperature)):
        if not value > 0:
            raise ConfigError(f"{key}: must be > 0, got {value}")
