"""Plug-in components chosen by name in the config, each owning its settings.

A component (a loss weighting method, a task sampling strategy) is written by name alone,
`loss.weighting: cagrad`, or as a mapping of its name and its own settings,
`loss.weighting: {name: cagrad, c: 0.4}`. Its settings are a dataclass beside its code (a
`Settings` subclass, the component's `Settings` attribute) whose `check` holds their ranges;
what the component needs of the rest of the config is its own `check_config`. A module named
in `plugins:` registers a component with settings the same way the built-in ones are, and
those settings are then config keys like any other: `--set loss.weighting.c=0.2`, a sweep
dimension, an MLflow param `loss.weighting.c`.

This module imports nothing of mtbert's but its errors: the config reaches the components
through a Registry, and the components' code (torch) never imports the config.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from mtbert.errors import ConfigError, did_you_mean


@dataclass
class Settings:
    """The settings of one component; subclasses add fields, each with a default."""
    name: str = ""

    def check(self, key: str) -> None:
        """Ranges of the settings; raise ConfigError naming `key`.<field>."""


def require(ok: bool, message: str) -> None:
    """Range checks of settings read as one line each: require(self.c >= 0, f"{key}.c: ...")."""
    if not ok:
        raise ConfigError(message)


class Registry(dict):
    """name -> component class, for the config key `key`. A component class has a `name`, a
    `Settings` dataclass and a `check_config(settings, key, cfg)` classmethod.

    The built-in components register when the module `builtins` is imported, which happens at
    the first lookup: the config names that module, it does not import it (no import cycle,
    and no torch for a process that only reads configs)."""

    def __init__(self, key: str, what: str, builtins: str, default: str):
        super().__init__()
        self.key, self.what, self.builtins, self.default = key, what, builtins, default

    def load(self) -> Registry:
        if self.builtins:
            importlib.import_module(self.builtins)
        return self

    def register(self, component: type) -> type:
        name = getattr(component, "name", "")
        if not name:
            raise ValueError(f"{component.__name__}: a {self.what} needs a `name`")
        settings = getattr(component, "Settings", Settings)
        if not (isinstance(settings, type) and issubclass(settings, Settings)):
            raise ValueError(f"{component.__name__}.Settings: must subclass mtbert.components.Settings")
        taken = self.get(name)
        same = taken is not None and (taken.__module__, taken.__qualname__) == (component.__module__,
                                                                                component.__qualname__)
        if taken is not None and not same:
            # A second class under a taken name would silently change what every config naming
            # it trains (a module imported again redefines its own class: that is the same one).
            raise ValueError(f"{component.__name__}: {self.what} '{name}' is already {taken.__module__}."
                             f"{taken.__qualname__}; register it under another name")
        self[name] = component
        return component

    def lookup(self, name: Any, key: str) -> type:
        """The component called `name`, or a ConfigError naming `key` and the close names."""
        self.load()
        if isinstance(name, str) and name in self:
            return self[name]
        raise ConfigError(f"{key}: unknown {self.what} '{name}'{did_you_mean(name, self, cutoff=0.5)}; "
                          f"known: {', '.join(self)}")

    def settings_of(self, name: str) -> type[Settings]:
        return getattr(self[name], "Settings", Settings)

    def check(self, settings: Settings, cfg: Any, key: str | None = None) -> None:
        """The settings' own ranges, then what their component needs of the rest of `cfg`
        (`key`: the key its errors name, when the config wrote the choice elsewhere)."""
        component = self.lookup(settings.name, self.key)
        if not isinstance(settings, component.Settings):
            raise ConfigError(f"{self.key}: {settings.name} takes {component.Settings.__qualname__}, "
                              f"got {type(settings).__qualname__}")
        try:
            settings.check(self.key)
            component.check_config(settings, key or self.key, cfg)
        except ConfigError:
            raise
        except Exception as exc:  # a plugin's check written as an assert: still one line, naming it
            detail = f": {exc}" if str(exc) else ""
            raise ConfigError(f"{key or self.key}: {self.what} {settings.name} refused its settings "
                              f"({type(exc).__name__}{detail}) in {component.__module__}") from None


# The component slots of the config, one line each. Weighting methods: mtbert/train/weighting/;
# sampling strategies: mtbert/data/samplers.py. Sharing regimes (mtbert/model/sharing.py) are
# not chosen by one key: every registered regime owns keys under `sharing:`.
WEIGHTINGS = Registry("loss.weighting", "method", builtins="mtbert.train.weighting", default="static")
SAMPLERS = Registry("sampling.strategy", "strategy", builtins="mtbert.data.samplers", default="round_robin")
REGIMES = Registry("sharing", "regime", builtins="mtbert.model.sharing", default="heads")
