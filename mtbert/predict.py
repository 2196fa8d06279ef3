"""`mtbert predict`: a model bundle over a split's files -> one prediction file per task.

The files follow the CS224N hand-in layout (what its `multitask_classifier.py` writes): a
header `id \t Predicted_<what>`, then one `<id> , <prediction>` line per example, in file
order; the prediction is a class (sst), 0/1 (para) or a similarity on 0..5 (sts). When the
split has labels the scores are computed too, the way the training loop computes them. A split
is predicted whole; `as_trained` keeps the run's own `data.max_dev_examples` cap on dev, so the
scores reproduce the run's exactly.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

# CS224N names: file stem and header column per task (its spelling kept, "Similiarity").
CS224N_OUTPUT = {"sst": ("sst", "Predicted_Sentiment"), "para": ("para", "Predicted_Is_Paraphrase"),
                 "sts": ("sts", "Predicted_Similiarity")}


@dataclass
class TaskPredictions:
    task: str
    file: Path  # the prediction file written
    source: str  # the split file read
    rows: int
    score: float | None  # None when the split has no labels


def _examples(cfg, task: str, split: str, as_trained: bool):
    from mtbert.data.readers import cap_examples, read_split
    from mtbert.data.types import Example
    from mtbert.errors import DataError

    if cfg.data.source == "synthetic":
        if split == "test":
            raise ValueError("data.source: synthetic has no test split; predict --split dev, or point "
                             "the config at files (--set data.source=cs224n --set data.dir=...)")
        from mtbert.data.readers import load_splits

        dev = load_splits(cfg)[0][task][1]
        # Synthetic rows have no file: their position is their id.
        return [Example(e.text, e.text2, e.label, str(i)) for i, e in enumerate(dev)], "synthetic dev"
    # The whole split: a row whose label is missing is still a row to predict (and is left out
    # of the score); as trained, the rows the run read, which had every label.
    examples, bad = read_split(cfg, task, split, labels_required=split == "dev" and as_trained)
    if bad.total and not (split == "dev" and as_trained):
        # A prediction file answers every row of the split: one skipped row would leave the
        # hand-in a line short, and every line after it paired with the wrong id by position.
        raise DataError(f"{bad.summary()}; a prediction file needs every row: fix it "
                        f"(or --as-trained on dev scores the rows the run read)")
    if split == "dev" and as_trained:
        examples = cap_examples(examples, cfg.data.max_dev_examples, "data.max_dev_examples")
    return examples, bad.file


def _format(task, value: float) -> str:
    if task.kind == "regression":
        return f"{value:.4f}"
    return str(int(value))


def predict_split(bundle, split: str, output: str | Path,
                  log: Callable[[str], None] = print, as_trained: bool = False) -> list[TaskPredictions]:
    from mtbert.tasks import get_task

    output = Path(output)
    # Every split read first: a file that cannot be read leaves no folder and no task's file.
    read = {name: _examples(bundle.config, name, split, as_trained) for name in bundle.tasks}
    output.mkdir(parents=True, exist_ok=True)
    done = []
    for name in bundle.tasks:
        task = get_task(name)
        examples, source = read[name]
        ds = bundle.encode(name, examples)
        sorted_preds, order = bundle.predict_dataset(ds)
        # Scored on the rows with a label (all of a dev split but a faulty row, none of a test split).
        known = [k for k, i in enumerate(order) if examples[i].label is not None]
        score = None
        if known:
            at = torch.as_tensor(known, dtype=torch.long)
            labels = ds.labels[torch.as_tensor(order, dtype=torch.long)[at]].to(sorted_preds.device)
            score = task.score(sorted_preds[at.to(sorted_preds.device)], labels)
        preds = [None] * len(order)
        for value, i in zip(sorted_preds.cpu().tolist(), order):
            preds[i] = value
        stem, column = CS224N_OUTPUT.get(name, (name, f"Predicted_{task.metric_name}"))
        path = output / f"{stem}-{split}-output.csv"
        with path.open("w") as f:
            f.write(f"id \t {column} \n")
            for example, value in zip(examples, preds):
                f.write(f"{example.id} , {_format(task, value)} \n")
        done.append(TaskPredictions(name, path, str(source), len(examples), score))
        shown = f"{task.metric_name}={score:.4f}" if score is not None else "no labels, not scored"
        if 0 < len(known) < len(examples):
            shown += f" on the {len(known)} rows with a label"
        log(f"{name}: {len(examples)} predictions -> {path} ({shown})")
    scores = {p.task: p.score for p in done if p.score is not None}
    if scores:
        import json

        # Full precision: the printed figures are rounded, these compare exactly with a run's.
        (output / f"scores-{split}.json").write_text(json.dumps(scores, indent=2))
    return done


def read_predictions(path: str | Path) -> list[tuple[str, float]]:
    """(id, prediction) pairs of a prediction file (tests and scoring scripts read them back)."""
    rows = []
    for line in Path(path).read_text().splitlines()[1:]:
        ident, _, value = line.partition(",")
        rows.append((ident.strip(), float(value)))
    return rows
