"""User errors of the orchestration layer: one readable line each, no traceback."""
from __future__ import annotations


class SweepError(ValueError):
    """A bad sweep file, CLI argument or sweep state; the message names the file and key."""


class TrackingUnavailable(SweepError):
    """The MLflow tracking store cannot be reached or opened (checked before any trial starts)."""
