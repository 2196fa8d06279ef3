"""Errors the command line turns into one line. Here, not in train/loop.py, so that catching
them does not import torch and transformers (seconds on every `mtbert` command)."""


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. a non-finite loss); the message is one readable line."""


class DataError(ValueError):
    """A user error in data or data config: one readable line naming the file, row or key."""


class ConfigError(ValueError):
    """A user error in a config: one readable line, naming the file and key path. Here so that
    the components checking their own settings (mtbert/components.py) need not import the config."""
