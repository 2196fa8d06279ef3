"""Short human labels for trial configurations, shared by the progress lines and the
leaderboard: `I-S-S k=2 freeze=1` for the regime, `3.2e-04` for a learning rate
(`5.0e-05 / 1.0e-03` for an encoder's and its heads' rates),
`[.40 .20 .40]` for loss weights (in the order of `tasks`), or the weighting method's name
(`gradnorm`) where the method sets the weights itself."""
from __future__ import annotations

import ast
import json
from typing import Any

from mtbert.model.sharing import short_names

# Columns of their own in the leaderboard; every other swept key joins the regime label.
OWN_COLUMNS = ("sharing.head_regime", "sharing.encoder_shared_layers", "optim.lr", "loss.weights",
               "loss.weighting", "loss.pcgrad", "train.seed")  # the last two: in the weights column
# A baseline run's tag (and its planned trial's key, plan.py): the searched variants whose
# config at that seed is the baseline's own, comma-joined; trained once, as the baseline.
STANDS_FOR = "stands_for"
REFERENCE = "reference"  # variant and role of the frozen reference (a sweep's `reference:`), a yardstick
# Role of the runs that train one task alone (a sweep's `single_task: true`), variant
# single-<task>: the yardstick of Delta_m%, never a contender.
SINGLE_TASK = "single_task"
YARDSTICKS = (REFERENCE, SINGLE_TASK)


def single_task_variant(task: str) -> str:
    return f"single-{task}"
# The sharing regimes' keys take the short names their regimes give them (mtbert/model/sharing.py).
SHORT_NAMES = {"freeze.layers": "freeze", "loss.pcgrad": "pcgrad", "sampling.strategy": "sampling",
               "pairs.encoding": "pairs", "model.name_or_path": "model", "train.epochs": "epochs",
               "train.batch_size": "bs", "heads.dropout": "dropout", "loss.smart.weight": "smart",
               "loss.gradnorm.alpha": "alpha", "loss.dwa.temperature": "dwa_T", "loss.cagrad.c": "c",
               # the same settings as logged since each method owns its settings (loss.weighting.<setting>)
               "loss.weighting.alpha": "alpha", "loss.weighting.temperature": "dwa_T", "loss.weighting.c": "c",
               "sampling.temperature": "T", "sampling.strategy.temperature": "T", "sampling.steps_per_epoch": "steps"}


def parse_param(text: Any) -> Any:
    """MLflow params are strings; read back numbers, lists, dicts, None and booleans."""
    if not isinstance(text, str):
        return text
    for parse in (json.loads, ast.literal_eval):
        try:
            return parse(text)
        except (ValueError, SyntaxError, TypeError):
            continue
    return text


def fmt_lr(value: Any) -> str:
    value = parse_param(value)
    return f"{value:.1e}" if isinstance(value, (int, float)) else str(value)


def fmt_rates(config: dict[str, Any]) -> str:
    """The learning rates that trained a run (`config` flat, typed or as MLflow strings):
    `5.0e-05 / 1.0e-03` (the encoder's optim.lr / the heads' optim.head_lr) where they differ,
    one rate where they are the same, `– / 1.0e-03` where only the heads train (freeze.layers
    -1, unless a pooler above the frozen encoder trains at the encoder's rate). A run logged
    before optim.head_lr existed trained everything at optim.lr."""
    lr, head = parse_param(config.get("optim.lr")), parse_param(config.get("optim.head_lr"))
    if not isinstance(head, (int, float)):
        return fmt_lr(lr)
    if parse_param(config.get("freeze.layers")) == -1 and config.get("model.pooling") != "pooler":
        return f"– / {fmt_lr(head)}"
    return fmt_lr(lr) if lr == head else f"{fmt_lr(lr)} / {fmt_lr(head)}"


# The params fmt_rates reads.
RATE_KEYS = ("optim.lr", "optim.head_lr", "freeze.layers", "model.pooling")


def fmt_weights(weights: Any, tasks: list[str]) -> str:
    weights = parse_param(weights)
    if not isinstance(weights, dict) or not weights:
        return "equal"
    return "[" + " ".join(f"{float(weights.get(t, 0.0)):.2f}".lstrip("0") or "0" for t in tasks) + "]"


# The weighting methods that read loss.weights (their Weighting.uses_fixed_weights; named here so
# that reading a sweep's labels imports no torch): PCGrad's fixed weights, TorchJD's preference.
FIXED_WEIGHT_READERS = ("pcgrad", "upgrad", "dualproj", "aligned_mtl")


def fmt_weighting(method: Any, weights: Any, tasks: list[str], pcgrad: Any = None) -> str:
    """The weights column: fixed weights as fmt_weights, `pcgrad` or another method that reads
    them (with its fixed weights when not equal), or the name of a method that sets its own weights. Runs from before
    `loss.weighting` existed read it from `loss.pcgrad`."""
    method = parse_param(method)
    if not isinstance(method, str) or not method:
        method = "pcgrad" if parse_param(pcgrad) is True else "static"
    fixed = fmt_weights(weights, tasks)
    if method == "static":
        return fixed
    if method in FIXED_WEIGHT_READERS:
        return method if fixed == "equal" else f"{method} {fixed}"
    return method


def fmt_value(value: Any) -> str:
    value = parse_param(value)
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, list):
        return "{" + ",".join(map(str, value)) + "}"
    return str(value)


def regime_label(config: dict[str, Any], swept: list[str], defaults: dict[str, Any]) -> str:
    """Head regime + encoder sharing k + every other swept key whose value is not the default.
    `config` is flat (dotted keys), typed or as MLflow strings."""
    short = {**SHORT_NAMES, **short_names()}
    parts = [str(config.get("sharing.head_regime", "?"))]
    k = parse_param(config.get("sharing.encoder_shared_layers"))
    parts.append("k=all" if k is None else f"k={k}")
    for key in swept:
        if key in OWN_COLUMNS or key not in config:
            continue
        value = parse_param(config[key])
        if value == defaults.get(key):
            continue
        text = "all" if key == "freeze.layers" and value == -1 else fmt_value(value)  # -1: the whole encoder
        parts.append(f"{short.get(key, key)}={text}")
    return " ".join(parts)
