"""How the tasks share the model: the `sharing:` settings and every check of them.

The checks are written once, here, and run twice: by the config at load (before any compute)
and by MultitaskModel, which may be handed a config built by hand. No torch here: the config
imports this module.

  encoder_shared_layers  k of L encoder layers shared by reference (hybrid-bert-layer-sharing.txt)
  head_regime            S or I per hidden head layer (mops-tm-relative-score.txt, model/heads.py)
  head_share_tasks       the tasks whose S layers are one module
  cascade                heads that also read upstream heads' outputs (progressive-layer-sharing.txt)
  pal_size               projected attention beside every encoder layer (pals-annealed-sampling.txt)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from mtbert.errors import ConfigError

if TYPE_CHECKING:
    from mtbert.config import Config

COSINE_HEADS = ("cosine", "cosine_mlp")


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

    def regime(self) -> list[str]:
        # "none": no hidden head layer, each task's output layer reads the pooled vector
        # (a linear probe: logistic regression for the classification tasks).
        return [] if self.head_regime == "none" else self.head_regime.split("-")

    def chain(self) -> list[str]:
        """The cascade's tasks, upstream first ([] for none)."""
        return [] if self.cascade == "none" else [t.strip() for t in self.cascade.split(">")]

    def check(self, cfg: Config) -> None:
        regime = self.regime()
        if any(r not in ("S", "I") for r in regime):
            raise ConfigError(f"sharing.head_regime: expected S/I letters joined by '-' (e.g. S-I-S) or none, "
                              f"got {self.head_regime!r}")
        for t in self.head_share_tasks or []:
            if t not in cfg.tasks:
                raise ConfigError(f"sharing.head_share_tasks: '{t}' is not one of tasks {cfg.tasks}")
        if self.encoder_shared_layers is not None and self.encoder_shared_layers < 0:
            raise ConfigError("sharing.encoder_shared_layers: must be >= 0 (or null for all layers)")
        if self.pal_size < 0:
            raise ConfigError("sharing.pal_size: must be >= 0")
        if self.cascade == "none":
            return
        chain = self.chain()
        if len(chain) < 2 or not all(chain):
            raise ConfigError(f"sharing.cascade: expected none or tasks joined by '>' upstream first "
                              f"(e.g. {'>'.join(cfg.tasks[:3])}), got {self.cascade!r}")
        missing = [t for t in chain if t not in cfg.tasks]
        if missing:
            raise ConfigError(f"sharing.cascade: '{self.cascade}' needs tasks {missing} "
                              f"which are not in tasks {cfg.tasks}")
        if len(set(chain)) != len(chain):
            raise ConfigError(f"sharing.cascade: '{self.cascade}' names a task twice")
        if cfg.pairs.encoding == "bi":
            raise ConfigError("sharing.cascade: not supported with pairs.encoding: bi (upstream heads "
                              "read one pooled vector per example); set pairs.encoding: cross")
        if regime and regime[0] == "S":
            raise ConfigError(f"sharing.cascade: downstream heads read [pooled, upstream outputs], wider "
                              f"than their upstream's input, so sharing.head_regime must start with I "
                              f"(got {self.head_regime})")


def check_heads(cfg: Config) -> None:
    """A cosine head scores two sentence vectors on a scale: only a bi-encoded regression pair has one."""
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
    """The keys that count encoder layers, against the encoder's depth L (known once it is read)."""
    k = cfg.sharing.encoder_shared_layers
    if k is not None and k > n_layers:
        raise ConfigError(f"sharing.encoder_shared_layers: {k} > {n_layers} layers of "
                          f"'{cfg.model.name_or_path}'")
    if cfg.freeze.layers > n_layers:
        raise ConfigError(f"freeze.layers: {cfg.freeze.layers} > {n_layers} layers of "
                          f"'{cfg.model.name_or_path}'")
