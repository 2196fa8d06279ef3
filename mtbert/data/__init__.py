"""Data: readers, synthetic data, tokenization cache, samplers.

Names are re-exported lazily: `from mtbert.data.types import Example` must not pay for
importing transformers.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "DataError": "readers", "read_examples": "readers", "load_splits": "readers",
    "make_synthetic": "synthetic",
    "get_tokenizer": "tokenize", "TaskDataset": "tokenize", "encode_examples": "tokenize",
    "collate": "tokenize", "Prepared": "tokenize", "prepare": "tokenize",
    "task_probabilities": "samplers", "task_schedule": "samplers", "TaskBatches": "samplers",
    "Example": "types", "BadRows": "types", "Encoded": "types", "Batch": "types",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'mtbert.data' has no attribute '{name}'")
    return getattr(importlib.import_module(f"mtbert.data.{_EXPORTS[name]}"), name)
