"""Fixtures for the data-layer tests: paths to ../shared (skipping when absent) and made-up tasks."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mtbert.tasks import TASKS, TaskSpec, register_task

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT / ".." / "shared"
MINBERT = SHARED / "data" / "minbert"
MINILM = SHARED / "models" / "all-MiniLM-L6-v2"


@pytest.fixture
def minbert_dir() -> Path:
    if not MINBERT.is_dir():
        pytest.skip("../shared/data/minbert is absent")
    return MINBERT


@pytest.fixture
def minilm_dir() -> Path:
    if not MINILM.is_dir():
        pytest.skip("../shared/models/all-MiniLM-L6-v2 is absent")
    return MINILM


# Tasks no shipped code knows about: one per (kind, single/pair) shape the built-ins lack.
TOY_TASKS = [
    TaskSpec(name="toy_topic3", kind="multiclass", num_classes=3, metric_name="toy_topic3_acc", pair=False),
    TaskSpec(name="toy_polar", kind="binary", metric_name="toy_polar_acc", pair=False),
    TaskSpec(name="toy_rating", kind="regression", label_range=(-1.0, 1.0), metric_name="toy_rating_corr",
             pair=False),
    TaskSpec(name="toy_overlap4", kind="multiclass", num_classes=4, metric_name="toy_overlap4_acc", pair=True),
    TaskSpec(name="toy_relate", kind="regression", label_range=(1.0, 10.0), metric_name="toy_relate_corr",
             pair=True),
]


@pytest.fixture
def toy_tasks() -> Iterator[dict[str, TaskSpec]]:
    """Registers the made-up tasks for one test and removes them afterwards."""
    for spec in TOY_TASKS:
        register_task(spec)
    try:
        yield {spec.name: spec for spec in TOY_TASKS}
    finally:
        for spec in TOY_TASKS:
            TASKS.pop(spec.name, None)
