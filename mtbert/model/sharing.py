"""How the tasks share the model: the `sharing:` settings and their own checks.

The checks are written once, here, and run twice: by the config at load (before any compute)
and by MultitaskModel, which may be handed a config built by hand. The config imports this
module (SharingConfig is one of its sections), so nothing here imports the config, nor torch:
the checks that read other sections (mtbert.config.check_heads, check_depth) are the config's.

  encoder_shared_layers  k of L encoder layers shared by reference (hybrid-bert-layer-sharing.txt)
  head_regime            S or I per hidden head layer (mops-tm-relative-score.txt, model/heads.py)
  head_share_tasks       the tasks whose S layers are one module
  cascade                heads that also read upstream heads' outputs (progressive-layer-sharing.txt)
  pal_size               projected attention beside every encoder layer (pals-annealed-sampling.txt)
"""
from __future__ import annotations

from dataclasses import dataclass

from mtbert.errors import ConfigError

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

    def check(self, tasks: list[str], pair_encoding: str) -> None:
        """These keys, against the configured `tasks` and pairs.encoding."""
        regime = self.regime()
        if any(r not in ("S", "I") for r in regime):
            raise ConfigError(f"sharing.head_regime: expected S/I letters joined by '-' (e.g. S-I-S) or none, "
                              f"got {self.head_regime!r}")
        for t in self.head_share_tasks or []:
            if t not in tasks:
                raise ConfigError(f"sharing.head_share_tasks: '{t}' is not one of tasks {tasks}")
        if self.encoder_shared_layers is not None and self.encoder_shared_layers < 0:
            raise ConfigError("sharing.encoder_shared_layers: must be >= 0 (or null for all layers)")
        if self.pal_size < 0:
            raise ConfigError("sharing.pal_size: must be >= 0")
        if self.cascade == "none":
            return
        chain = self.chain()
        if len(chain) < 2 or not all(chain):
            raise ConfigError(f"sharing.cascade: expected none or tasks joined by '>' upstream first "
                              f"(e.g. {'>'.join(tasks[:3])}), got {self.cascade!r}")
        missing = [t for t in chain if t not in tasks]
        if missing:
            raise ConfigError(f"sharing.cascade: '{self.cascade}' needs tasks {missing} "
                              f"which are not in tasks {tasks}")
        if len(set(chain)) != len(chain):
            raise ConfigError(f"sharing.cascade: '{self.cascade}' names a task twice")
        if pair_encoding == "bi":
            raise ConfigError("sharing.cascade: not supported with pairs.encoding: bi (upstream heads "
                              "read one pooled vector per example); set pairs.encoding: cross")
        if regime and regime[0] == "S":
            raise ConfigError(f"sharing.cascade: downstream heads read [pooled, upstream outputs], wider "
                              f"than their upstream's input, so sharing.head_regime must start with I "
                              f"(got {self.head_regime})")
