"""How the tasks share the model: the `sharing:` settings, and the regimes that own them.

A regime is one way the tasks share (or stop sharing) parts of the model. It owns its keys
under `sharing:`, the values that turn it off (what the frozen reference sets), its load-time
checks (each error a line naming its key), whether the frozen-layer cache stays valid under
it, the short names its keys take in the tables' regime labels, and what it builds into the
model. Regimes register in mtbert.components.REGIMES by name, the built-in ones below, a
plugin's (`plugins: [mymodule]`) the same way; a plugin's keys are then `sharing.<key>` like
the built-in ones, in YAML, `--set`, a sweep's space and the MLflow params.

  heads    head_regime, head_share_tasks: S or I per hidden head layer, and which tasks the S
           layers serve (mops-tm-relative-score.txt, model/heads.py)
  encoder  encoder_shared_layers: k of L encoder layers shared by reference
           (hybrid-bert-layer-sharing.txt, MultitaskModel._share_encoder)
  cascade  cascade: heads that also read upstream heads' outputs (progressive-layer-sharing.txt)
  pal      pal_size: projected attention beside every encoder layer (pals-annealed-sampling.txt)

The checks are written once, here, and run twice: by the config at load (before any compute)
and by MultitaskModel, which may be handed a config built by hand. The config imports this
module (SharingConfig is one of its sections), so nothing here imports the config, nor torch
at import: the checks that read other sections (mtbert.config.check_heads, check_depth) are the
config's, and a regime that builds modules imports torch inside `build`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from mtbert.components import REGIMES, Settings, require
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

    def value(self, key: str) -> Any:
        """`sharing.<key>`; a plugin regime's key on a section built before it registered is off."""
        if hasattr(self, key):
            return getattr(self, key)
        for r in regimes():
            if key in r.off:
                return r.off[key]
        raise KeyError(f"sharing.{key}: no registered regime owns it")

    def check(self, cfg: Any) -> None:
        """Every regime's checks, against the rest of the config `cfg` (tasks, pairs.encoding)."""
        for r in regimes():
            r.check(self, cfg)

    def cache_safe(self) -> bool:
        """Whether every regime leaves the frozen layers' outputs a function of the input alone."""
        return all(r.cache_safe(self) for r in regimes())

    @classmethod
    def with_plugin_keys(cls) -> type[SharingConfig]:
        """This section with the keys plugin regimes add, each defaulting to its off value: the
        type the config builds `sharing:` with (mtbert.config._build_dataclass)."""
        own = {f.name for f in dataclasses.fields(cls)}
        added = tuple((k, tp, r.off[k]) for r in regimes() for k, tp in r.keys.items() if k not in own)
        if not added:
            return cls
        if added not in _WITH_KEYS:
            fields = [(k, tp, dataclasses.field(default=off)) for k, tp, off in added]
            _WITH_KEYS[added] = dataclasses.make_dataclass(cls.__name__, fields, bases=(cls,),
                                                           namespace={"__reduce__": _reduce})
        return _WITH_KEYS[added]


# One class per set of plugin keys, so that two configs built with the same plugins compare equal.
_WITH_KEYS: dict[tuple, type[SharingConfig]] = {}


def _reduce(self: SharingConfig) -> tuple:
    # A class made at run time has no importable name: pickle the values, and make the class
    # again from the registry where they are read (the plugin is imported there too).
    return rebuild_sharing, (dataclasses.asdict(self),)


def rebuild_sharing(values: dict) -> SharingConfig:
    return SharingConfig.with_plugin_keys()(**values)


class Regime:
    """One sharing regime. Subclasses set `name` and `off`, override what they change, and
    register with register_regime; regimes are checked and built in the order they register.
    Class methods throughout: a regime has no state of its own, only the `sharing:` values it
    reads."""
    name: ClassVar[str] = ""
    Settings: ClassVar[type] = Settings  # the registry's slot for a component's settings: none here
    # The keys a plugin regime adds under `sharing:` and their types (the built-in regimes' keys
    # are SharingConfig's fields); each defaults to its off value.
    keys: ClassVar[dict[str, type]] = {}
    # The values that turn this regime off: what the frozen reference (the encoder as it came,
    # linear heads) sets. Every key in `keys` has one.
    off: ClassVar[dict[str, Any]] = {}
    # key -> its short name in a regime label (`pal=64`); a key without one is written in full.
    short: ClassVar[dict[str, str]] = {}

    @classmethod
    def check(cls, sharing: SharingConfig, cfg: Any) -> None:
        """The regime's keys against the rest of `cfg`; raise ConfigError naming the key."""

    @classmethod
    def cache_safe(cls, sharing: SharingConfig) -> bool:
        """Whether the frozen layers' outputs still depend on the input alone (train/frozen.py)."""
        return True

    @classmethod
    def build(cls, model: Any, sharing: SharingConfig) -> None:
        """Add or tie modules of `model` (a MultitaskModel whose encoder is split by task, before
        its heads are added). The encoder and head regimes are read by the model's own
        construction (the split, model/heads.py) and add nothing here."""


def regimes() -> list[type[Regime]]:
    return list(REGIMES.load().values())


def register_regime(regime: type[Regime]) -> type[Regime]:
    missing = [k for k in regime.keys if k not in regime.off]
    if missing:
        raise ValueError(f"{regime.__name__}.off: needs the off value of {', '.join(missing)}")
    return REGIMES.register(regime)


def off_values() -> dict[str, Any]:
    """`sharing.<key>` -> its off value, for every regime registered."""
    return {f"sharing.{k}": v for r in regimes() for k, v in r.off.items()}


def short_names() -> dict[str, str]:
    """`sharing.<key>` -> its short name in regime labels, for every regime registered."""
    return {f"sharing.{k}": v for r in regimes() for k, v in r.short.items()}


@register_regime
class HeadSharing(Regime):
    name = "heads"
    off = {"head_regime": "none"}  # linear heads; which tasks share no layer is then moot
    short = {"head_share_tasks": "S"}

    @classmethod
    def check(cls, sharing: SharingConfig, cfg: Any) -> None:
        if any(r not in ("S", "I") for r in sharing.regime()):
            raise ConfigError(f"sharing.head_regime: expected S/I letters joined by '-' (e.g. S-I-S) or none, "
                              f"got {sharing.head_regime!r}")
        for t in sharing.head_share_tasks or []:
            require(t in cfg.tasks, f"sharing.head_share_tasks: '{t}' is not one of tasks {cfg.tasks}")


@register_regime
class EncoderSharing(Regime):
    name = "encoder"
    off = {"encoder_shared_layers": None}  # every layer shared: one encoder (1-bert)

    @classmethod
    def check(cls, sharing: SharingConfig, cfg: Any) -> None:
        k = sharing.encoder_shared_layers
        require(k is None or k >= 0, "sharing.encoder_shared_layers: must be >= 0 (or null for all layers)")


@register_regime
class Cascade(Regime):
    name = "cascade"
    off = {"cascade": "none"}
    short = {"cascade": "cascade"}

    @classmethod
    def check(cls, sharing: SharingConfig, cfg: Any) -> None:
        if sharing.cascade == "none":
            return
        tasks, chain = cfg.tasks, sharing.chain()
        if len(chain) < 2 or not all(chain):
            raise ConfigError(f"sharing.cascade: expected none or tasks joined by '>' upstream first "
                              f"(e.g. {'>'.join(tasks[:3])}), got {sharing.cascade!r}")
        missing = [t for t in chain if t not in tasks]
        if missing:
            raise ConfigError(f"sharing.cascade: '{sharing.cascade}' needs tasks {missing} "
                              f"which are not in tasks {tasks}")
        if len(set(chain)) != len(chain):
            raise ConfigError(f"sharing.cascade: '{sharing.cascade}' names a task twice")
        if cfg.pairs.encoding == "bi":
            raise ConfigError("sharing.cascade: not supported with pairs.encoding: bi (upstream heads "
                              "read one pooled vector per example); set pairs.encoding: cross")
        regime = sharing.regime()
        if regime and regime[0] == "S":
            raise ConfigError(f"sharing.cascade: downstream heads read [pooled, upstream outputs], wider "
                              f"than their upstream's input, so sharing.head_regime must start with I "
                              f"(got {sharing.head_regime})")


@register_regime
class Pals(Regime):
    name = "pal"
    off = {"pal_size": 0}
    short = {"pal_size": "pal"}

    @classmethod
    def check(cls, sharing: SharingConfig, cfg: Any) -> None:
        require(sharing.pal_size >= 0, "sharing.pal_size: must be >= 0")

    @classmethod
    def cache_safe(cls, sharing: SharingConfig) -> bool:
        # PALs add a trainable term inside every layer, frozen or not: nothing below them is fixed.
        return sharing.pal_size == 0

    @classmethod
    def build(cls, model: Any, sharing: SharingConfig) -> None:
        if sharing.pal_size > 0:
            from mtbert.model.pal import task_pals

            model.pals = task_pals([t.name for t in model.tasks], model.hf_config.hidden_size,
                                   sharing.pal_size, model.num_layers, model.hf_config.num_attention_heads)
