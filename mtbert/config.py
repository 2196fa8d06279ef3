"""Typed config: YAML (or a dict) -> nested dataclasses, validated before any compute is spent.

Every user error is a `ConfigError` whose message names the full key path, e.g.
`config.yaml: sharing.head_regim: unknown key (did you mean 'sharing.head_regime'?)`.
`--set key=value` overrides and `flatten()` (the MLflow params) use the same dotted paths.

build_config: import the `plugins:` modules, rewrite old spellings, build the typed config,
`resolve` the defaults that depend on other keys (RECIPES), then `validate` (read-only).
Each section's checks are its `check` method; a pluggable component (loss weighting,
sampling strategy) owns its settings and their checks (mtbert/components.py).
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import importlib
import logging
import math
import os
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml

from mtbert.components import SAMPLERS, WEIGHTINGS, Registry, Settings
from mtbert.data.samplers import SamplingConfig
from mtbert.errors import ConfigError, did_you_mean
from mtbert.model.sharing import SharingConfig, off_values


# --------------------------------------------------------------------------- schema

@dataclass
class TinyEncoder:
    """Shape of the random-init encoder used when `model.name_or_path: tiny`."""
    layers: int = 2
    hidden: int = 64
    heads: int = 2
    intermediate: int = 128


def check_size(key: str, value: int | None, most: int, least: int = 1) -> None:
    """A size the config names, within its bound: far beyond any model or run this trains, so
    a typo (an extra 0, 10**9) is one line at load instead of an allocation that never ends."""
    if value is not None and not least <= value <= most:
        raise ConfigError(f"{key}: must be in {least}..{most:,}, got {value:,}")


# Bounds of the sizes a config names (check_size); BERT-large is 24 x 1024, 16 heads, 4096 wide.
MAX_LAYERS, MAX_WIDTH, MAX_HEADS = 96, 16_384, 256
MAX_TOKENS = 8_192  # tokens per sequence
MAX_BATCH = 65_536
MAX_EXAMPLES = 10_000_000  # synthetic examples per task
MAX_EPOCHS = 100_000


@dataclass
class ModelConfig:
    # "tiny" = random-init BERT over the synthetic vocabulary; otherwise a hub name
    # (bert-base-uncased) or a local directory in Hugging Face layout.
    name_or_path: str = "tiny"
    tiny: TinyEncoder = field(default_factory=TinyEncoder)
    max_length: int = 64  # tokens per sequence (a cross-encoded pair counts as one sequence)
    # Sentence vector: mean of the token states (what sentence encoders such as MiniLM are
    # trained for), the [CLS] state, or BERT's pooler (dense + tanh over [CLS], as the papers use).
    pooling: Literal["mean", "cls", "pooler"] = "mean"

    def check(self) -> None:
        if not self.max_length > 0:
            raise ConfigError(f"model.max_length: must be > 0, got {self.max_length}")
        check_size("model.max_length", self.max_length, MAX_TOKENS)
        if self.name_or_path == "tiny":
            t = self.tiny
            for key, most in (("layers", MAX_LAYERS), ("hidden", MAX_WIDTH), ("heads", MAX_HEADS),
                              ("intermediate", 4 * MAX_WIDTH)):
                check_size(f"model.tiny.{key}", getattr(t, key), most)


@dataclass
class ColumnMap:
    # Used by csv/tsv/jsonl files; a cs224n-format file is read by the task's own CS224N names.
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
    # Tasks whose labels are mirrored (a class c becomes C-1-c, a score y becomes lo+hi-y): the
    # same inputs and signal with the opposite answer, a planted conflict for a task that has no
    # output layer of its own to absorb the sign (a cosine pair head; docs/affinity.md).
    mirrored: list[str] = field(default_factory=list)


@dataclass
class DataConfig:
    # synthetic: built-in generator (reads no files); cs224n: `dir` holds ids-sst-train.csv,
    # quora-train.csv, ..., and a task with a `files` entry reads that instead; files: one entry per task.
    source: Literal["synthetic", "cs224n", "files"] = "synthetic"
    dir: str | None = None
    files: dict[str, TaskFiles] = field(default_factory=dict)
    synthetic: SyntheticData = field(default_factory=SyntheticData)
    on_bad_row: Literal["skip", "error"] = "skip"
    max_train_examples: int | None = None  # per task; bounds real-data runs
    max_dev_examples: int | None = None
    cache_dir: str = ".mtbert_cache"  # tokenized datasets, keyed by content

    def check(self, tasks: list[str]) -> None:
        if self.source == "synthetic":
            check_size("data.synthetic.train_size", self.synthetic.train_size, MAX_EXAMPLES)
            check_size("data.synthetic.dev_size", self.synthetic.dev_size, MAX_EXAMPLES)
        if self.source == "cs224n" and not self.dir:
            raise ConfigError("data.dir: required when data.source is cs224n")
        for t in self.synthetic.mirrored:
            _check_task_key("data.synthetic.mirrored", t, tasks)
        if self.source == "synthetic" and self.files:
            t = next(iter(self.files))
            raise ConfigError(f"data.files.{t}: data.source is synthetic, which reads no files; "
                              "set data.source: files (or cs224n, whose tasks read data.dir)")
        for t in self.files:
            if t not in tasks:
                raise ConfigError(f"data.files.{t}: '{t}' is not one of tasks {tasks} (the entry "
                                  "would be read by nothing)")
        if self.source == "files":
            for t in tasks:
                if t not in self.files:
                    raise ConfigError(f"data.files.{t}: missing (data.source is files)")
                if not self.files[t].train or not self.files[t].dev:
                    raise ConfigError(f"data.files.{t}: needs both train and dev paths")


@dataclass
class SmartConfig:
    weight: float = 0.0  # 0 = off
    epsilon: float = 1e-5  # std of the initial perturbation
    step_size: float = 1e-3
    steps: int = 1

    def check(self) -> None:
        if self.weight < 0 or self.steps < 0:
            raise ConfigError("loss.smart: weight and steps must be >= 0")


@dataclass
class HeadsConfig:
    hidden: int | None = None  # width of head layers; null = encoder hidden size
    dropout: float = 0.1
    task_dropout: dict[str, float] | None = None  # per-task override (progressive paper)
    pooled_layernorm: bool = False  # LayerNorm on the pooled output (progressive paper)

    def check(self, tasks: list[str]) -> None:
        check_size("heads.hidden", self.hidden, MAX_WIDTH)
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"heads.dropout: must be in [0, 1), got {self.dropout}")
        for t, p in (self.task_dropout or {}).items():
            _check_task_key("heads.task_dropout", t, tasks)
            if not 0 <= p < 1:
                raise ConfigError(f"heads.task_dropout.{t}: must be in [0, 1), got {p}")


@dataclass
class FreezeConfig:
    layers: int = 0  # embeddings + the first n encoder layers get no updates; -1 = whole encoder

    def check(self) -> None:
        if self.layers < -1:
            raise ConfigError("freeze.layers: must be >= 0, or -1 for the whole encoder")


@dataclass
class OptimConfig:
    """The fine-tuning recipe. A null value is filled in at load from the encoder (RECIPES),
    so MLflow always records the rates a run used."""
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

    def check(self) -> None:
        for key in ("lr", "head_lr", "layer_decay"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"optim.{key}: must be > 0, got {getattr(self, key)}")
        if self.layer_decay > 1:
            raise ConfigError(f"optim.layer_decay: must be in (0, 1] (lower layers get smaller rates), "
                              f"got {self.layer_decay}")
        if self.warmup < 0 or (self.warmup >= 1 and not float(self.warmup).is_integer()):
            raise ConfigError(f"optim.warmup: a ratio in [0, 1) or a whole number of steps, got {self.warmup}")


# Defaults for the null optim keys (and sts.head), by kind of encoder. Pretrained: 5e-5, the
# top of the usual BERT range, because CPU budgets are a few thousand steps; the random-init
# heads need ~20x that. tiny: random init everywhere, so one high constant rate. STS: with a
# pretrained sentence encoder the untrained cosine scores 0.838 on CS224N STS dev, a regression
# head on the same frozen vectors at most 0.821 (docs/results/reference.md).
RECIPES = {
    "pretrained": {"lr": 5e-5, "head_lr": 1e-3, "schedule": "linear", "warmup": 0.1,
                   "sts_head": "cosine"},
    "tiny": {"lr": 1e-3, "head_lr": None, "schedule": "constant", "warmup": 0.0,  # head_lr = lr
             "sts_head": "regression"},
}


WEIGHT_SUM_TOLERANCE = 5e-3  # as a sweep's simplex: weights may be written rounded (0.333 for 1/3)


@dataclass
class LossConfig:
    # Per task, summing to 1; a task left out weighs 0. Not normalised: a sum other than 1
    # would silently scale the learning rate, so it is an error. null = equal weights.
    weights: dict[str, float] | None = None
    # How the per-task losses become one update: a method of mtbert/train/weighting/, by name
    # (`weighting: dwa`) or with its settings (`weighting: {name: cagrad, c: 0.4}`).
    # static = sum of loss.weights x loss. pcgrad, gradnorm, famo and cagrad need sampling.strategy: tuple.
    weighting: Annotated[Settings, WEIGHTINGS] = field(default_factory=lambda: Settings(WEIGHTINGS.default))
    # Older spelling of `weighting: pcgrad`, kept so existing sweeps run unchanged.
    pcgrad: bool = False
    smart: SmartConfig = field(default_factory=SmartConfig)

    def check(self, cfg: Config) -> None:
        if self.weights is not None:
            for t, w in self.weights.items():
                _check_task_key("loss.weights", t, cfg.tasks)
                if w < 0:
                    raise ConfigError(f"loss.weights.{t}: must be >= 0, got {w}")
            total = sum(self.weights.get(t, 0.0) for t in cfg.tasks)
            if total <= 0:
                raise ConfigError("loss.weights: at least one weight must be positive")
            if abs(total - 1) > WEIGHT_SUM_TOLERANCE:
                left_out = [t for t in cfg.tasks if t not in self.weights]
                note = f"; {', '.join(left_out)} weigh 0" if left_out else ""
                raise ConfigError(f"loss.weights: must sum to 1, got {total:g}{note} (not normalised: "
                                  f"a larger sum would act as a larger learning rate)")
        WEIGHTINGS.check(self.weighting, cfg, "loss.pcgrad" if self.pcgrad else None)
        self.smart.check()


@dataclass
class PairsConfig:
    # bi: each sentence encoded alone, features [u, v, |u-v|, u*v]; cross: one sequence
    # [CLS] a [SEP] b [SEP]. bi is the default because a random-init tiny encoder learns it fast.
    encoding: Literal["cross", "bi"] = "bi"


COSINE_HEADS = ("cosine", "cosine_mlp")  # the heads that score the cosine of two sentence vectors


@dataclass
class StsConfig:
    # regression: a head on the pair features; cosine: the cosine of the two sentence vectors,
    # trained towards similarity / 5 (no head layers: the encoder's own geometry is the score);
    # cosine_mlp: the cosine after the task's hidden head layers (so head-sharing regimes apply).
    # null = cosine for a pretrained encoder with bi-encoded pairs (RECIPES), else regression.
    # task_options.sts.head wins when set.
    head: Literal["regression", "cosine", "cosine_mlp"] | None = None


@dataclass
class TaskOptions:
    """Options of one task (`task_options.<task>`), for tasks whose shape differs from the rest."""
    # Tokens per sequence for this task; null = model.max_length.
    max_length: int | None = None
    # regression: the usual head (MLP on the pooled vector, or on [u, v, |u-v|, u*v] for a
    # bi-encoded pair); cosine: cos(u, v) of the two sentence vectors mapped to the label range,
    # for a similarity pair task (regression kind, pairs.encoding: bi); cosine_mlp: the same
    # cosine after the task's hidden head layers (as sts.head). null = regression, except for
    # sts, where sts.head decides.
    head: Literal["regression", "cosine", "cosine_mlp"] | None = None

    def check(self, task: str) -> None:
        if self.max_length is not None and self.max_length <= 0:
            raise ConfigError(f"task_options.{task}.max_length: must be > 0, got {self.max_length}")
        check_size(f"task_options.{task}.max_length", self.max_length, MAX_TOKENS)


@dataclass
class AffinityConfig:
    """Inter-task affinity telemetry (mtbert/train/affinity.py, docs/affinity.md): the cosine of
    the task gradients on the shared parameters and TAG's lookahead affinity, measured on a held
    batch per task; it never changes what the run trains."""
    every_steps: int = 0  # measure every this many training steps (the run's global step); 0 = off
    # eta of the lookahead step theta - eta grad L_i; null = each parameter's peak learning rate
    # (its optimizer group's scheduled rate before warmup and decay: comparable across epochs).
    lookahead_lr: float | None = None
    batch_size: int | None = None  # examples per task in the held batch; null = train.batch_size
    # Per shared part as well (the shared encoder, the shared head layers) where the model has
    # both, and each shared hidden head layer where several are shared: T more lookahead
    # forwards per part.
    per_part: bool = True

    def check(self, tasks: list[str]) -> None:
        if self.every_steps < 0:
            raise ConfigError(f"affinity.every_steps: must be >= 0 (0 = off), got {self.every_steps}")
        if self.lookahead_lr is not None and not self.lookahead_lr > 0:
            raise ConfigError(f"affinity.lookahead_lr: must be > 0 (or null for the optimizer's), "
                              f"got {self.lookahead_lr}")
        check_size("affinity.batch_size", self.batch_size, MAX_BATCH)
        if self.every_steps and len(tasks) < 2:
            raise ConfigError(f"affinity.every_steps: affinity is between tasks; tasks has one ({tasks[0]})")


SEED_LIMIT = 2**32  # seeds are numpy's too, which must be below it


@dataclass
class TrainConfig:
    epochs: int = 3
    batch_size: int = 16
    eval_batch_size: int = 64
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # auto = bf16 autocast on CUDA and on CPUs with native bf16 (AVX512-BF16 or AMX), whose
    # bf16 matmuls run several times faster than fp32; fp32 elsewhere. tf32: fp32 weights and
    # activations with TF32 matmuls on CUDA (plain fp32 on a CPU, which has no TF32).
    precision: Literal["auto", "fp32", "tf32", "bf16"] = "auto"
    save_checkpoint: bool = True
    # Frozen layers loaded from a pretrained model: slim names them in best/ (model and
    # digest), full stores them (mtbert/bundle.py).
    bundle: Literal["slim", "full"] = "slim"
    # Micro-batches whose gradients add up before one optimizer step (an effective batch of
    # batch_size x grad_accum per task); schedules count optimizer steps.
    grad_accum: int = 1
    # Stop after this many epochs without a new best overall. null = run every epoch.
    patience: int | None = None
    # Run the encoder over length-sorted buckets of rows instead of one padded batch
    # (model/multitask.py: length_buckets). null = on for CPU, off on CUDA. Speed, not results.
    length_buckets: bool | None = None
    # Outputs of the frozen layers (freeze.layers) are computed once per example and stored
    # under data.cache_dir (mtbert/train/frozen.py), unless they would exceed this many MB; 0 = off.
    frozen_cache_mb: int = 4096
    # Linear probe, then fine-tune: the heads first train on the frozen encoder for one pass
    # over the training data, so fine-tuning does not start by sending random heads'
    # gradients into the pretrained layers.
    probe: bool = False
    # The training loss, per task, averaged over every this many steps (and the epoch's last
    # ones): a sweep's trials send these points with each epoch's report, and MLflow charts
    # them as step/loss_<task> at the run's global step. 0 = off.
    log_every_steps: int = 20
    # A run that has trained this many seconds since its last checkpoint writes one between
    # two steps of the epoch (mtbert/train/state.py), so that a run stopped inside a long epoch
    # continues from there, exactly, rather than from the epoch's start. 0 = at epoch ends only.
    checkpoint_every_s: float = 300.0

    def check(self) -> None:
        if not 0 <= self.checkpoint_every_s < math.inf:
            raise ConfigError(f"train.checkpoint_every_s: must be a number of seconds >= 0 (0 = at epoch ends "
                              f"only), got {self.checkpoint_every_s}")
        if self.log_every_steps < 0:
            raise ConfigError(f"train.log_every_steps: must be >= 0 (0 = off), got {self.log_every_steps}")
        for key in ("grad_accum", "epochs", "batch_size"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"train.{key}: must be > 0, got {getattr(self, key)}")
        for key, most in (("epochs", MAX_EPOCHS), ("batch_size", MAX_BATCH), ("eval_batch_size", MAX_BATCH),
                          ("grad_accum", MAX_BATCH), ("patience", MAX_EPOCHS)):
            check_size(f"train.{key}", getattr(self, key), most)
        if not 0 <= self.seed < SEED_LIMIT:
            raise ConfigError(f"train.seed: must be in 0..{SEED_LIMIT - 1}, got {self.seed}")
        if self.patience is not None and self.patience < 1:
            raise ConfigError(f"train.patience: must be >= 1 (or null), got {self.patience}")
        if self.frozen_cache_mb < 0:
            raise ConfigError(f"train.frozen_cache_mb: must be >= 0 (0 = off), got {self.frozen_cache_mb}")
        check_size("train.frozen_cache_mb", self.frozen_cache_mb, 1 << 20, least=0)  # a terabyte


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
    affinity: AffinityConfig = field(default_factory=AffinityConfig)

    def head_regime(self) -> list[str]:
        return self.sharing.regime()

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


def _registry(tp) -> Registry | None:
    return next((m for m in typing.get_args(tp)[1:] if isinstance(m, Registry)), None)


def _build(tp, value: Any, path: str):
    """Coerce `value` to type `tp` or raise ConfigError naming `path`."""
    origin = typing.get_origin(tp)
    if origin is Annotated:
        registry = _registry(tp)
        if registry is not None:
            return _build_component(registry, value, path)
        return _build(typing.get_args(tp)[0], value, path)
    if dataclasses.is_dataclass(tp):
        return _build_dataclass(tp, value, path)
    if origin in (Union, types.UnionType):
        return _build_union(tp, value, path)
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
    return _build_scalar(tp, value, path)


def _build_dataclass(tp, value: Any, path: str):
    """A config section from a mapping (null: every default); a key it lacks names the closest."""
    value = {} if value is None else value
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: expected a mapping, got {value!r}")
    # A section that plugins add keys to (sharing: a plugin regime's) is built with those keys.
    tp = getattr(tp, "with_plugin_keys", lambda: tp)()
    hints = typing.get_type_hints(tp, include_extras=True)
    names = [f.name for f in dataclasses.fields(tp)]
    kwargs = {}
    for key, sub in value.items():
        sub_path = f"{path}.{key}" if path else str(key)
        if key not in names:
            hint = did_you_mean(key, names, f"{path}." if path else "", cutoff=0.5)
            raise ConfigError(f"{sub_path}: unknown key{hint}")
        kwargs[key] = _build(hints[key], sub, sub_path)
    return tp(**kwargs)


def _build_union(tp, value: Any, path: str):
    """The first of the union's types that takes `value`, None for null where it is allowed."""
    args = typing.get_args(tp)
    if value is None and type(None) in args:
        return None
    errors = []
    for arg in [a for a in args if a is not type(None)]:
        try:
            return _build(arg, value, path)
        except ConfigError as exc:
            errors.append(exc)
    if len(errors) == 1:  # Optional[X]: X's own message
        raise errors[0]
    raise ConfigError(f"{path}: expected {_type_name(tp)}, got {value!r}")


def _build_scalar(tp, value: Any, path: str):
    """bool, int, float, str or Any: `value` as it is where it is one already; a whole float as
    an int, an int or a numeric string as a float."""
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif tp is float:
        number = as_float(value)
        if number is not None:
            # .inf and .nan pass every `x > 0` or `x < 1` a setting is checked with, then
            # surface as a NaN loss or a verdict "within inf": no setting here means either.
            if not math.isfinite(number):
                raise ConfigError(f"{path}: expected a finite number, got {value!r}")
            return number
    elif tp is str:
        if isinstance(value, str):
            return value
    elif tp is Any:
        return value
    raise ConfigError(f"{path}: expected {_type_name(tp)}, got {value!r}")


def as_float(value: Any) -> float | None:
    """A number (not a bool) or a numeric string as a float, else None: the one reading of a
    number from YAML, for configs, sweeps and claims alike."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:  # an integer of 309 digits or more
            return math.inf
    if isinstance(value, str):  # YAML 1.1 reads "1e-5" as a string
        try:
            return float(value)
        except ValueError:
            pass
    return None


def _build_component(registry: Registry, value: Any, path: str) -> Settings:
    """`name` or `{name: ..., <setting>: ...}` -> the Settings of that registered component."""
    if isinstance(value, Settings):
        value = dataclasses.asdict(value)
    if isinstance(value, str):
        value = {"name": value}
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: expected a {registry.what} name, or a mapping of its name and its "
                          f"settings ({{name: {registry.default}}}), got {value!r}")
    if "name" not in value:
        raise ConfigError(f"{path}.name: missing; which {registry.what} the settings are for "
                          f"({', '.join(registry.load())})")
    name = value["name"]
    registry.lookup(name, path)
    settings = registry.settings_of(name)
    own = [f.name for f in dataclasses.fields(settings) if f.name != "name"]
    for key in value:
        if key != "name" and key not in own:
            hint = did_you_mean(key, own, f"{path}.", cutoff=0.5)
            has = f"its settings: {', '.join(own)}" if own else "it has none"
            raise ConfigError(f"{path}.{key}: not a setting of {registry.what} {name}{hint}; {has}")
    return _build(settings, value, path)


# Public name: the sweep spec types its own schema with the same rules and messages.
coerce = _build


def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


@functools.cache
def component_keys() -> dict[str, Registry]:
    """Dotted config key -> Registry of each component slot (loss.weighting)."""
    out: dict[str, Registry] = {}

    def walk(tp, prefix: str) -> None:
        for name, hint in typing.get_type_hints(tp, include_extras=True).items():
            if typing.get_origin(hint) is Annotated and _registry(hint) is not None:
                out[prefix + name] = _registry(hint)
            elif dataclasses.is_dataclass(hint):
                walk(hint, f"{prefix}{name}.")

    walk(Config, "")
    return out


def flatten(d: dict | Any, prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}; lists and None stay values (MLflow params). A component
    gives its name under its own key and each setting below it: loss.weighting = cagrad,
    loss.weighting.c = 0.4 (so the tables that read the method by its key still do)."""
    if dataclasses.is_dataclass(d):
        d = dataclasses.asdict(d)
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if key in component_keys() and isinstance(v, dict):
            out[key] = v.get("name")
            out.update(flatten({s: x for s, x in v.items() if s != "name"}, key + "."))
        elif isinstance(v, dict) and v:
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
    if not all(part.strip() for part in key.split(".")):
        raise ConfigError(f"--set {text}: '{key.strip()}' is not a dotted key (an empty part between dots), "
                          "e.g. --set optim.lr=1e-4")
    try:
        value = load_yaml_text(raw, f"--set {key.strip()}") if raw.strip() else ""
    except ConfigError as exc:
        if "not valid YAML" not in str(exc):
            raise  # over a bound, a key twice: not plain text that failed to parse
        value = raw
    return key.strip(), value


def set_dotted(d: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    node = d
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if isinstance(child, str) and ".".join(parts[:i + 1]) in component_keys():
            node[part] = {"name": child}  # a component named alone keeps its name under a setting
        elif not isinstance(child, dict):
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


# Bounds of what a YAML input may name, checked before anything is built from it: a config or
# sweep file is a few KB, and YAML aliases let a 1 KB file name a billion values (each alias
# repeats the node it names), which building the config would expand until memory runs out.
YAML_MAX_BYTES = 1 << 20
YAML_MAX_VALUES = 100_000  # scalars, lists and mappings, every alias counted as what it names
YAML_MAX_DEPTH = 50  # levels of nesting


class _YamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader in pure Python: its composer recurses in Python, so a file nested
    beyond the interpreter's limit is a RecursionError here, not a crash in C."""


def _node_path(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _at(where: str, path: str) -> str:
    return f"{where}: {path}" if path else where


def _check_nodes(root: yaml.Node, where: str) -> None:
    """The composed document against the bounds, before any Python object is built from it:
    its size with every alias expanded (computed once per node, so a bomb costs nothing to
    measure), its depth, aliases that contain themselves, and keys written twice."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: yaml.Node, path: str, depth: int) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        if id(node) in open_nodes:
            raise ConfigError(f"{_at(where, path)}: a YAML alias that contains itself")
        if depth > YAML_MAX_DEPTH:
            raise ConfigError(f"{_at(where, path)}: nested more than {YAML_MAX_DEPTH} levels deep (the bound)")
        open_nodes.add(id(node))
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(child, f"{path}[{i}]", depth + 1) for i, child in enumerate(node.value))
        elif isinstance(node, yaml.MappingNode):
            seen: dict[tuple[str, str], yaml.Node] = {}
            for key, value in node.value:
                name = key.value if isinstance(key, yaml.ScalarNode) else "?"
                sub = _node_path(path, name)
                if isinstance(key, yaml.ScalarNode):
                    first = seen.setdefault((key.tag, key.value), key)
                    if first is not key:
                        raise ConfigError(f"{where}: line {key.start_mark.line + 1}: {sub}: duplicate key (also at "
                                          f"line {first.start_mark.line + 1}); YAML would silently keep the last")
                total += size(key, sub, depth + 1) + size(value, sub, depth + 1)
        open_nodes.discard(id(node))
        sizes[id(node)] = total
        return total

    if size(root, "", 0) <= YAML_MAX_VALUES:
        return
    # Name the deepest key whose own expansion is over the bound; of several, the last in the
    # file, as an alias comes after its anchor: the key that uses the bomb, not its parts.
    node, path = root, ""
    while True:
        children = ([(k.value if isinstance(k, yaml.ScalarNode) else "?", v) for k, v in node.value]
                    if isinstance(node, yaml.MappingNode) else [])  # keys, not list positions
        over = next(((k, v) for k, v in reversed(children) if sizes[id(v)] > YAML_MAX_VALUES), None)
        if over is None:
            break
        node, path = over[1], _node_path(path, over[0])
    n = sizes[id(node)]
    shown = f"{n:,}" if n < 10**12 else f"about 10^{len(str(n)) - 1}"
    raise ConfigError(f"{_at(where, path)}: {shown} values once its YAML aliases are expanded, "
                      f"over the bound of {YAML_MAX_VALUES:,}")


def _unshared(value: Any) -> Any:
    """A copy in which no two places share an object: YAML builds an aliased node once and
    puts the same dict at every alias, so `--set` on one place would change the others."""
    if isinstance(value, dict):
        return {k: _unshared(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unshared(v) for v in value]
    return value


def load_yaml_text(text: str, where: str) -> Any:
    """YAML text -> plain data, within the bounds above, every key written once, no object
    shared between two places. The one YAML loader of configs, sweep files and `--set` values."""
    if len(text) > YAML_MAX_BYTES:
        raise ConfigError(f"{where}: {len(text):,} characters, over the bound of {YAML_MAX_BYTES:,} "
                          "for a config or sweep file")
    loader = _YamlLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_nodes(node, where)
        return _unshared(loader.construct_document(node))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{where}:{at} not valid YAML ({getattr(exc, 'problem', None) or exc})") from None
    except RecursionError:
        raise ConfigError(f"{where}: nested more than {YAML_MAX_DEPTH} levels deep (the bound)") from None
    finally:
        loader.dispose()


def read_yaml(path: str | Path) -> dict:
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path}: a folder, not a YAML file")
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    size = path.stat().st_size
    if size > YAML_MAX_BYTES:  # before reading it: the bound is also on what is read
        raise ConfigError(f"{path}: {size:,} bytes, over the bound of {YAML_MAX_BYTES:,} for a config or sweep file")
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    data = load_yaml_text(text, str(path))
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
        # Plugins first: a plugin's task or weighting method (and its settings) must be known
        # before the keys that name it are read.
        import_plugins(_build(list[str], raw.get("plugins", []), "plugins"))
        cfg = _build(Config, upgrade_old_spellings(raw), "")
        resolve(cfg)
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
    """Import the modules named in `plugins:`; importing is a plugin's whole interface (it
    registers a task, weighting method or sampling strategy). Every process that builds a
    config runs this first (the CLI, a sweep's driver and each Ray trial). A module is looked
    up on sys.path, then in the working directory, as `python -m` would find it."""
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
        except SystemExit as exc:  # an exit (even 0) would end the command as if it had succeeded
            raise ConfigError(f"plugins[{i}]: importing '{name}' called sys.exit({exc.code!r}); a plugin "
                              "registers tasks or components and returns") from None
        except Exception as exc:  # the plugin's own code failed: say which plugin
            raise ConfigError(f"plugins[{i}]: importing '{name}' raised {type(exc).__name__}: {exc}") from None
    return modules


def reference_settings() -> dict[str, Any]:
    """The frozen reference: the encoder as it came, every layer frozen, with linear heads on
    top. A fine-tuned row that scores below it has lost what the encoder knew. `mtbert train
    --reference` and a sweep's `reference: true` apply these over the config: every sharing
    regime registered so far off (a plugin's too, once imported), then the rest."""
    return {"freeze.layers": -1, **off_values(), "loss.smart.weight": 0.0,
            "heads.dropout": 0.0, "heads.pooled_layernorm": False, "pairs.encoding": "bi",
            "optim.schedule": "constant", "optim.warmup": 0.0, "train.epochs": 10, "train.patience": 2}


def resolve(cfg: Config) -> Config:
    """The values that follow from other keys, filled in before validate (which only reads):
    the recipe's null keys (RECIPES), and the cascade in its one spelling (`sst>para`)."""
    recipe = RECIPES["tiny" if cfg.model.name_or_path == "tiny" else "pretrained"]
    for key in ("lr", "schedule", "warmup"):
        if getattr(cfg.optim, key) is None:
            setattr(cfg.optim, key, recipe[key])
    if cfg.optim.head_lr is None:
        cfg.optim.head_lr = recipe["head_lr"] if recipe["head_lr"] is not None else cfg.optim.lr
    if cfg.sts.head is None:
        cfg.sts.head = recipe["sts_head"] if "sts" in cfg.tasks and cfg.pairs.encoding == "bi" else "regression"
    if cfg.sharing.cascade != "none":
        cfg.sharing.cascade = ">".join(cfg.sharing.chain())
    return cfg


_said: set[str] = set()


def _deprecated(message: str) -> None:
    """One line per old spelling and process (a sweep builds its configs many times)."""
    if message not in _said:
        _said.add(message)
        logging.getLogger("mtbert.config").warning("deprecated: %s", message)


def upgrade_old_spellings(raw: dict) -> dict:
    """Old spellings rewritten to today's, each with a deprecation line, so that older sweeps,
    bundles and `--set`s load unchanged: `loss.pcgrad: true` (loss.weighting: pcgrad), a
    method's settings under `loss.<method>` (`loss.cagrad.c: 0.2` is `loss.weighting: {name:
    cagrad, c: 0.2}`) and the temperature strategy's flat under `sampling` (`sampling.size_cap`
    is `sampling.strategy.size_cap`)."""
    sampling = raw["sampling"] if isinstance(raw.get("sampling"), dict) else {}
    flat = {k: sampling.pop(k) for k in ("temperature", "size_cap") if k in sampling}
    if flat:
        _move_old_settings(SAMPLERS, "temperature", flat, "sampling", sampling, "strategy",
                           f"{', '.join('sampling.' + k for k in flat)}: write the temperature strategy's "
                           f"settings as sampling.strategy: {{name: temperature, ...}}")
    loss = raw.get("loss")
    if not isinstance(loss, dict):
        return raw
    weighting = loss.get("weighting")
    chosen = weighting.get("name") if isinstance(weighting, dict) else weighting
    if loss.get("pcgrad") is True:
        if chosen not in (None, "static", "pcgrad"):
            raise ConfigError(f"loss.pcgrad: true is the old spelling of loss.weighting: pcgrad and cannot "
                              f"be combined with loss.weighting: {chosen}; drop loss.pcgrad")
        _deprecated("loss.pcgrad: true is the old spelling of loss.weighting: pcgrad")
        loss["weighting"] = {**weighting, "name": "pcgrad"} if isinstance(weighting, dict) else "pcgrad"
    own = {f.name for f in dataclasses.fields(LossConfig)}
    for method in [k for k in loss if k not in own and k in WEIGHTINGS.load()]:
        key, block = f"loss.{method}", loss.pop(method)
        block = {} if block is None else block
        if not isinstance(block, dict):
            raise ConfigError(f"{key}: expected a mapping of {method}'s settings, got {block!r}")
        _move_old_settings(WEIGHTINGS, method, block, key, loss, "weighting",
                           f"{key}: write its settings as loss.weighting: {{name: {method}, ...}}")
    return raw


def _move_old_settings(registry: Registry, name: str, block: dict, key: str, parent: dict, slot: str,
                       said: str) -> None:
    """Settings of component `name` written the old way at `key`, checked there and moved into
    `parent[slot]` if that is the component chosen (settings written the new way win)."""
    settings = _build_component(registry, {**block, "name": name}, key)
    settings.check(key)
    # Configs saved before settings moved carry them at their defaults (a resumed sweep's, a
    # bundle's): only a value someone set is worth a line.
    if settings != _build_component(registry, {"name": name}, key):
        _deprecated(said)
    current = parent.get(slot)
    if name == (current.get("name") if isinstance(current, dict) else current):
        parent[slot] = {**block, **(current if isinstance(current, dict) else {}), "name": name}


def _check_task_key(key: str, task: str, tasks: list[str]) -> None:
    """A mapping keyed by task name: a key that is not a configured task would be ignored."""
    if task not in tasks:
        raise ConfigError(f"{key}.{task}: '{task}' is not one of tasks {tasks}{did_you_mean(task, tasks, cutoff=0.5)}")


def check_heads(cfg: Config) -> None:
    """A cosine head scores two sentence vectors on a scale: only a bi-encoded regression pair has
    one. Run by validate and by MultitaskModel (which may be handed a config built by hand)."""
    from mtbert.tasks import get_task

    if cfg.sts.head in COSINE_HEADS and (cfg.pairs.encoding != "bi" or "sts" not in cfg.tasks):
        raise ConfigError("sts.head: cosine needs pairs.encoding: bi (two sentence vectors) and the sts task")
    for t in cfg.tasks:
        if cfg.task_head(t) not in COSINE_HEADS:
            continue
        key = f"task_options.{t}.head" if t in cfg.task_options and cfg.task_options[t].head else "sts.head"
        task = get_task(t)
        if not task.pair or task.kind != "regression":
            raise ConfigError(f"{key}: cosine scores a sentence pair on a scale; '{t}' is a "
                              f"{task.kind}{' pair' if task.pair else ' single-sentence'} task")
        if cfg.pairs.encoding != "bi":
            raise ConfigError(f"{key}: cosine needs pairs.encoding: bi (two sentence vectors)")


def check_depth(cfg: Config, n_layers: int) -> None:
    """The keys that count encoder layers, against the encoder's depth L: known only once the
    encoder's config is read (mtbert/model/encoder.py), so not part of validate."""
    k = cfg.sharing.encoder_shared_layers
    if k is not None and k > n_layers:
        raise ConfigError(f"sharing.encoder_shared_layers: {k} > {n_layers} layers of "
                          f"'{cfg.model.name_or_path}'")
    if cfg.freeze.layers > n_layers:
        raise ConfigError(f"freeze.layers: {cfg.freeze.layers} > {n_layers} layers of "
                          f"'{cfg.model.name_or_path}'")


def validate(cfg: Config) -> None:
    """Every check of a resolved config, each written beside the keys it checks; reads only."""
    from mtbert.tasks import TASKS

    if not cfg.tasks:
        raise ConfigError("tasks: at least one task is needed")
    for i, t in enumerate(cfg.tasks):
        if t not in TASKS:
            raise ConfigError(f"tasks[{i}]: unknown task '{t}'{did_you_mean(t, TASKS, cutoff=0.5)}; "
                              f"known: {', '.join(TASKS)}")
    if len(set(cfg.tasks)) != len(cfg.tasks):
        raise ConfigError(f"tasks: duplicate task in {cfg.tasks}")
    cfg.sharing.check(cfg)
    cfg.heads.check(cfg.tasks)
    for t, opts in cfg.task_options.items():
        _check_task_key("task_options", t, cfg.tasks)
        opts.check(t)
    check_heads(cfg)
    cfg.freeze.check()
    cfg.loss.check(cfg)
    cfg.optim.check()
    cfg.train.check()
    cfg.model.check()
    cfg.sampling.check(cfg)
    cfg.data.check(cfg.tasks)
    cfg.affinity.check(cfg.tasks)
