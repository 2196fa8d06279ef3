"""Plain data records shared by readers, tokenization and the training loop."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Example:
    text: str
    text2: str | None  # second sentence of a pair task, else None
    label: float | int | None  # None only in an unlabelled split (a test file)
    # The file's id column (CS224N `id`), else the row number: what a prediction file names.
    # Not part of equality: two rows with the same content are the same training example.
    id: str | None = field(default=None, compare=False)


@dataclass
class BadRows:
    """Malformed rows of one file: counted per reason, with the first few row numbers."""
    file: str
    rows_read: int = 0
    counts: dict[str, int] = field(default_factory=dict)  # reason -> count
    examples: list[tuple[int, str]] = field(default_factory=list)  # (row number, reason), first 5

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def add(self, row: int, reason: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1
        if len(self.examples) < 5:
            self.examples.append((row, reason))

    def summary(self) -> str:
        """One line, e.g. 'quora-dev.csv: 3 of 4043 rows skipped (missing label: 2, empty text: 1; first at row 17)'."""
        if not self.total:
            return f"{self.file}: {self.rows_read} rows, none malformed"
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(self.counts.items()))
        first = f"; first at row {self.examples[0][0]}" if self.examples else ""
        return f"{self.file}: {self.total} of {self.rows_read} rows malformed ({reasons}{first})"


@dataclass
class Encoded:
    """One padded batch of token sequences."""
    input_ids: torch.Tensor  # (B, T) long
    attention_mask: torch.Tensor  # (B, T) long
    token_type_ids: torch.Tensor  # (B, T) long

    def to(self, device) -> "Encoded":
        return Encoded(self.input_ids.to(device, non_blocking=True),
                       self.attention_mask.to(device, non_blocking=True),
                       self.token_type_ids.to(device, non_blocking=True))


@dataclass
class Batch:
    """A batch of one task. `inputs` holds one Encoded (single sentence or cross-encoded pair)
    or two (bi-encoded pair: sentence a, sentence b)."""
    task: str
    inputs: list[Encoded]
    labels: torch.Tensor

    def to(self, device) -> "Batch":
        return Batch(self.task, [e.to(device) for e in self.inputs], self.labels.to(device))

    def __len__(self) -> int:
        return int(self.labels.shape[0])
