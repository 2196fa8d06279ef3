"""The task registry: everything the code needs to know about a task lives in one TaskSpec.

Adding a task is one `register_task(TaskSpec(...))` call plus its data in the config
(`data.files.<name>`); the model, loop, metrics and leaderboard read the spec.
"""
from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

from mtbert.errors import did_you_mean
from mtbert.train.metrics import accuracy, pearson

Kind = Literal["multiclass", "binary", "regression"]


@dataclass(frozen=True)
class TaskSpec:
    name: str  # config name, e.g. "sst"
    kind: Kind
    metric_name: str  # MLflow metric name, e.g. "sst_acc"
    pair: bool  # two sentences per example
    num_classes: int = 2  # multiclass only
    label_range: tuple[float, float] = (0.0, 1.0)  # regression only: valid labels
    # CS224N layout: file stem and (text, text2, label) column names.
    cs224n_stem: str | None = None
    cs224n_columns: tuple[str, str | None, str] | None = None
    description: str = ""

    @property
    def out_dim(self) -> int:
        return self.num_classes if self.kind == "multiclass" else 1

    def parse_label(self, raw) -> float | int | None:
        """The label as a number, or None when it is missing or out of range."""
        if raw is None:
            return None
        try:
            value = float(str(raw).strip())
        except ValueError:
            return None
        if value != value:  # NaN
            return None
        if self.kind == "multiclass":
            if not value.is_integer() or not 0 <= value < self.num_classes:
                return None
            return int(value)
        if self.kind == "binary":
            return int(value) if value in (0.0, 1.0) else None
        lo, hi = self.label_range
        return value if lo <= value <= hi else None

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        # torch imported here, not at the top: the leaderboard and findings read the registry
        # (names, metrics) and should not pay seconds of torch import for it.
        import torch.nn.functional as F

        if self.kind == "multiclass":
            return F.cross_entropy(logits, labels.long())
        if self.kind == "binary":
            return F.binary_cross_entropy_with_logits(logits.squeeze(-1), labels.float())
        return F.mse_loss(logits.squeeze(-1), self.normalize(labels.float()))

    # Regression heads predict in [0, 1] units of the label range: an STS loss on the raw
    # 0..5 scale starts ~25x larger than the classification losses and its gradients swamp
    # the shared encoder. The MSE differs from the raw one by the constant (hi - lo)^2, and
    # Pearson r does not change under the affine map back.
    def normalize(self, labels: torch.Tensor) -> torch.Tensor:
        lo, hi = self.label_range
        return (labels - lo) / (hi - lo)

    def predict(self, logits: torch.Tensor) -> torch.Tensor:
        if self.kind == "multiclass":
            return logits.argmax(-1)
        if self.kind == "binary":
            return (logits.squeeze(-1) > 0).long()
        lo, hi = self.label_range
        return lo + (hi - lo) * logits.squeeze(-1)

    def score(self, preds, labels) -> float:
        return pearson(preds, labels) if self.kind == "regression" else accuracy(preds, labels)

    def cs224n_score(self, score: float) -> float:
        """The CS224N leaderboard maps correlations from [-1, 1] to [0, 1]."""
        return (score + 1) / 2 if self.kind == "regression" else score


TASKS: dict[str, TaskSpec] = {}


KINDS = typing.get_args(Kind)


def register_task(spec: TaskSpec) -> TaskSpec:
    """Add a task; a spec the code could not train on fails here, at the plugin's import,
    not as a run where every row is a bad label."""
    where = f"register_task({spec.name!r})"
    if not isinstance(spec.name, str) or not spec.name.isidentifier():
        raise ValueError(f"{where}: name must be an identifier (it is a config key and an MLflow name)")
    if spec.kind not in KINDS:
        raise ValueError(f"{where}: unknown kind {spec.kind!r}{did_you_mean(spec.kind, KINDS)}; "
                         f"expected one of {', '.join(KINDS)}")
    if spec.kind == "multiclass" and (not isinstance(spec.num_classes, int) or spec.num_classes < 2):
        raise ValueError(f"{where}: multiclass needs num_classes >= 2, got {spec.num_classes!r}")
    if spec.kind == "regression":
        lo, hi = spec.label_range
        if not lo < hi:
            raise ValueError(f"{where}: label_range must be (low, high) with low < high, got {spec.label_range}")
    if not spec.metric_name or not isinstance(spec.metric_name, str):
        raise ValueError(f"{where}: metric_name is required (e.g. '{spec.name}_acc')")
    taken = TASKS.get(spec.name)
    if taken is not None and taken != spec:
        # Silently replacing it would change what every config naming it trains and scores.
        raise ValueError(f"{where}: task '{spec.name}' is already registered ({taken.description or taken.kind}); "
                         "register it under another name")
    clash = [t.name for t in TASKS.values() if t.metric_name == spec.metric_name and t.name != spec.name]
    if clash:
        raise ValueError(f"{where}: metric_name '{spec.metric_name}' is already task '{clash[0]}'s")
    TASKS[spec.name] = spec
    return spec


def get_task(name: str) -> TaskSpec:
    try:
        return TASKS[name]
    except KeyError:
        raise KeyError(f"unknown task '{name}'{did_you_mean(name, TASKS)}; known tasks: {', '.join(TASKS)}") from None


register_task(TaskSpec(
    name="sst", kind="multiclass", num_classes=5, metric_name="sst_acc", pair=False,
    cs224n_stem="ids-sst", cs224n_columns=("sentence", None, "sentiment"),
    description="SST-5 sentiment, 5 classes, accuracy",
))
register_task(TaskSpec(
    name="para", kind="binary", metric_name="para_acc", pair=True,
    cs224n_stem="quora", cs224n_columns=("sentence1", "sentence2", "is_duplicate"),
    description="Quora paraphrase detection, binary, accuracy",
))
register_task(TaskSpec(
    name="sts", kind="regression", label_range=(0.0, 5.0), metric_name="sts_corr", pair=True,
    cs224n_stem="sts", cs224n_columns=("sentence1", "sentence2", "similarity"),
    description="STS similarity, 0..5, Pearson correlation",
))
