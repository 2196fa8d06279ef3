"""Readers: task files (CS224N TSV, CSV, TSV, JSONL) and config -> train/dev Examples.

Malformed rows are skipped and counted per reason in a `BadRows` (with `on_bad_row="error"`
the first one raises). Row numbers are 1-based file lines, header included, as an editor shows.
"""
from __future__ import annotations

import csv
import hashlib
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mtbert.config import ColumnMap, Config
from mtbert.data.synthetic import make_synthetic
from mtbert.data.types import BadRows, Example
from mtbert.errors import DataError
from mtbert.tasks import TaskSpec, get_task

FORMATS = ("auto", "cs224n", "csv", "tsv", "jsonl")
BAD_JSON = "invalid JSON"  # a bad-row reason, and the key marking a JSONL line that is not an object

UNCLOSED_QUOTE = "unclosed quote"  # a bad-row reason, and the key marking a record that ran on over lines

Fields = dict[str, Any]


# --------------------------------------------------------------------------- one file

def read_examples(path: str | Path, task: TaskSpec, fmt: str = "auto",
                  columns: ColumnMap | None = None,
                  on_bad_row: str = "skip", labels_required: bool = True) -> tuple[list[Example], BadRows]:
    """Read one file of `task` examples.

    fmt: "cs224n" (tab-separated, header with an empty first field; the task's CS224N column
    names, or `columns` for a task without them), "csv" (comma, CSV quoting), "tsv" (tab, no
    quoting) or "jsonl" (one object per line); those three take their columns from `columns`,
    by default the task's CS224N names.
    "auto" picks by extension (detect_format). Each example's id is the `columns.id` column,
    else an `id` column when the file has one, else its row number. With labels_required=False
    (a test split) the label may be absent; such examples carry label None.
    """
    path = Path(path)
    if fmt not in FORMATS:
        raise DataError(f"{path}: unknown format '{fmt}' (expected one of {', '.join(FORMATS)})")
    if on_bad_row not in ("skip", "error"):
        raise DataError(f"{path}: on_bad_row must be skip or error, got '{on_bad_row}'")
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    bad = BadRows(file=str(path))
    examples: list[Example] = []
    try:
        if fmt == "auto":
            fmt = detect_format(path)
        names = _column_names(path, task, fmt, columns)
        named_id = columns.id if columns is not None else None
        id_name = named_id or "id"
        # An explicitly named id column must exist; the default `id` is used when present.
        optional = set() if named_id else {id_name}
        if not labels_required:
            optional.add(names[2])
        columns_seen = _ColumnsSeen([n for n in (*names, id_name) if n is not None and n not in optional])
        for line, fields in _records(path, fmt, (*names, id_name), optional):
            bad.rows_read += 1
            if fmt == "jsonl" and BAD_JSON not in fields:
                columns_seen.add(fields)
            example, reason, detail = _to_example(fields, names, task, labels_required)
            if example is not None:
                examples.append(_with_id(example, fields, id_name, line))
                continue
            if on_bad_row == "error":
                raise DataError(f"{path}: row {line}: {reason}{detail}")
            bad.add(line, reason)
    except UnicodeDecodeError:
        raise DataError(f"{path}: not UTF-8 text") from None
    except csv.Error as exc:
        raise DataError(f"{path}: unreadable ({exc})") from None
    columns_seen.check(path)
    return examples, bad


class _ColumnsSeen:
    """JSONL: the objects read and, of each required column, how many lacked it. A column that
    every object lacks is a wrong column map, not a few malformed rows: one error, not a file
    of bad rows."""

    def __init__(self, required: list[str]):
        self.required, self.objects, self.keys = required, 0, []
        self.absent: dict[str, int] = {}  # column -> objects without it

    def add(self, fields: Fields) -> None:
        self.objects += 1
        self.keys = self.keys or list(fields)  # the first object's, for the message
        for name in self.required:
            if name not in fields:
                self.absent[name] = self.absent.get(name, 0) + 1

    def check(self, path: Path) -> None:
        for name, n in self.absent.items():
            if self.objects and n == self.objects:
                raise DataError(f"{path}: column '{name}' missing from every row "
                                f"(keys: {', '.join(map(str, self.keys))}); set its columns map")


def detect_format(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return "jsonl"
    if suffix == ".tsv":
        return "tsv"
    if suffix == ".csv":
        with path.open(encoding="utf-8-sig", newline="") as f:
            header = f.readline()
        return "cs224n" if "\t" in header and header.split("\t")[0].strip() == "" else "csv"
    raise DataError(f"{path}: cannot tell the format from the extension "
                    "(expected .csv, .tsv or .jsonl); set its format")


def _column_names(path: Path, task: TaskSpec, fmt: str,
                  columns: ColumnMap | None) -> tuple[str, str | None, str]:
    """(text, text2, label) column names; text2 is None for single-sentence tasks."""
    if fmt == "cs224n" and task.cs224n_columns:
        text, text2, label = task.cs224n_columns
    elif columns is not None:
        text, text2, label = columns.text, columns.text2, columns.label
    elif task.cs224n_columns:
        text, text2, label = task.cs224n_columns
    else:
        text, text2, label = ColumnMap().text, None, ColumnMap().label
    if task.pair and not text2:
        raise DataError(f"{path}: task '{task.name}' has sentence pairs; set columns.text2")
    return text, (text2 if task.pair else None), label


def _unquote(field: str) -> str:
    """Undo CSV quoting on a field that is wholly and validly quoted (every inner quote doubled).

    CS224N files are tab-separated, but some fields were written CSV-quoted, some twice over.
    With CSV quoting on, one stray quote would swallow the lines after it, so the files are
    read with quoting off and such fields unwrapped here; '"Hi" he said "bye"' is left alone."""
    while len(field) >= 2 and field[0] == '"' and field[-1] == '"':
        inner = field[1:-1]
        if '"' in inner.replace('""', ""):
            break
        field = inner.replace('""', '"')
    return field


def _records(path: Path, fmt: str, names: tuple[str | None, ...],
             optional: set[str] = frozenset()) -> Iterator[tuple[int, Fields | None]]:
    """(line, fields) per data record; fields None when the record has the wrong shape."""
    if fmt == "jsonl":
        yield from _jsonl_records(path)
        return
    quoted = fmt == "csv"
    with path.open(encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f, delimiter="," if quoted else "\t",
                            quoting=csv.QUOTE_MINIMAL if quoted else csv.QUOTE_NONE)
        header = next(reader, None)
        if header is None:
            raise DataError(f"{path}: empty file (expected a header row)")
        index = _header_index(path, header, names, fmt, optional)
        start = reader.line_num + 1
        while True:
            try:
                row = next(reader, None)
            except csv.Error as exc:  # a field over csv's size limit, say: the row it is on
                raise DataError(f"{path}: row {start}: {exc}") from None
            if row is None:
                return
            line, start = start, reader.line_num + 1
            if not row:  # blank line
                continue
            if quoted and reader.line_num > line and any("\n" in field for field in row):
                # A quote opened and not closed on its line takes the lines after it into one
                # field: the row is bad, and the rows it swallowed are named with it.
                yield line, {UNCLOSED_QUOTE: reader.line_num}
                continue
            if len(row) != len(header):
                yield line, None
                continue
            yield line, {name: row[i] if quoted else _unquote(row[i]) for name, i in index.items()}


def _header_index(path: Path, header: list[str], names: tuple[str | None, ...],
                  fmt: str = "csv", optional: set[str] = frozenset()) -> dict[str, int]:
    header = [h.strip() for h in header]
    index = {}
    for name in names:
        if name is None or (name in optional and name not in header):
            continue
        if name not in header:
            shown = ", ".join(h or "(empty)" for h in header)
            hint = ""
            if len(header) == 1 and fmt != "csv" and "," in header[0]:
                hint = "; the header has commas but the file is read tab-separated: set format: csv (wrong delimiter)"
            elif len(header) == 1 and fmt == "csv" and "\t" in header[0]:
                hint = "; the header has tabs but the file is read comma-separated: set format: tsv (wrong delimiter)"
            raise DataError(f"{path}: column '{name}' not in header ({shown}){hint}")
        index[name] = header.index(name)
    return index


def _jsonl_records(path: Path) -> Iterator[tuple[int, Fields | None]]:
    with path.open(encoding="utf-8-sig") as f:
        for line, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except (json.JSONDecodeError, RecursionError):  # RecursionError: nested past Python's limit
                obj = None
            yield line, obj if isinstance(obj, dict) else {BAD_JSON: True}


def _to_example(fields: Fields | None, names: tuple[str, str | None, str],
                task: TaskSpec, labels_required: bool = True) -> tuple[Example | None, str, str]:
    """(example, "", "") or (None, reason, detail for the error message)."""
    if fields is None:
        return None, "wrong field count", ""
    if BAD_JSON in fields:
        return None, BAD_JSON, ""
    if UNCLOSED_QUOTE in fields:
        return None, UNCLOSED_QUOTE, f" (its field runs on to line {fields[UNCLOSED_QUOTE]}, taking the rows after it)"
    text_key, text2_key, label_key = names
    raw = fields.get(label_key)
    if isinstance(raw, bool):
        raw = int(raw)
    unlabelled = raw is None or str(raw).strip() == ""
    if unlabelled and labels_required:
        return None, "missing label", f" ('{label_key}')"
    label = None if unlabelled else task.parse_label(raw)
    if label is None and not unlabelled:
        return None, "bad label", f" {str(raw)!r} ({label_hint(task)})"
    text = _text(fields.get(text_key))
    if not text:
        return None, "empty text", f" ('{text_key}')"
    text2 = None
    if text2_key is not None:
        text2 = _text(fields.get(text2_key))
        if not text2:
            return None, "missing second sentence", f" ('{text2_key}')"
    return Example(text, text2, label), "", ""


def _with_id(example: Example, fields: Fields, id_name: str, line: int) -> Example:
    value = fields.get(id_name)
    value = str(value).strip() if value is not None and not isinstance(value, (dict, list)) else ""
    return Example(example.text, example.text2, example.label, value or str(line))


def _text(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""


def label_hint(task: TaskSpec) -> str:
    if task.kind == "multiclass":
        return f"{task.name} expects an integer 0..{task.num_classes - 1}"
    if task.kind == "binary":
        return f"{task.name} expects 0 or 1"
    lo, hi = task.label_range
    return f"{task.name} expects a number in [{lo:g}, {hi:g}]"


# --------------------------------------------------------------------------- config -> splits

def load_splits(cfg: Config) -> tuple[dict[str, tuple[list[Example], list[Example]]], list[BadRows]]:
    """task -> (train, dev) for every task in cfg.tasks, plus the BadRows of every file read."""
    splits: dict[str, tuple[list[Example], list[Example]]] = {}
    bad: list[BadRows] = []
    resolve_files(cfg)
    for name in cfg.tasks:
        task = get_task(name)
        if cfg.data.source == "synthetic":
            train, dev = _synthetic_splits(cfg, task)
        else:
            (train, bad_train), (dev, bad_dev) = (read_split(cfg, name, split) for split in ("train", "dev"))
            bad += [bad_train, bad_dev]
        splits[name] = (cap_examples(train, cfg.data.max_train_examples, "data.max_train_examples"),
                        cap_examples(dev, cfg.data.max_dev_examples, "data.max_dev_examples"))
    return splits, bad


def _stable_seed(*parts: object) -> int:
    """A seed from parts that is the same in every process (unlike hash() of a str)."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little")


def _synthetic_splits(cfg: Config, task: TaskSpec) -> tuple[list[Example], list[Example]]:
    syn = cfg.data.synthetic
    for key, value in (("train_size", syn.train_size), ("dev_size", syn.dev_size)):
        if value <= 0:
            raise DataError(f"data.synthetic.{key}: must be > 0, got {value}")
    # Separate seed streams per task and split: dev never replays train's draws.
    mirrored = task.name in syn.mirrored
    return (make_synthetic(task, syn.train_size, _stable_seed("train", task.name, syn.seed), mirrored),
            make_synthetic(task, syn.dev_size, _stable_seed("dev", task.name, syn.seed), mirrored))


def split_file(cfg: Config, task: TaskSpec, split: str) -> tuple[Path, str, ColumnMap | None, str]:
    """(path, format, columns, config key naming the path) of one split."""
    if cfg.data.source == "cs224n" and task.name not in cfg.data.files:
        if not cfg.data.dir or not Path(cfg.data.dir).is_dir():
            raise DataError(f"data.dir: {cfg.data.dir} not found")
        if not task.cs224n_stem:
            raise DataError(f"data.files.{task.name}: missing; task '{task.name}' has no CS224N files, "
                            "so give its train and dev files there (the other tasks still read data.dir)")
        path = Path(cfg.data.dir) / f"{task.cs224n_stem}-{split}.csv"
        if split == "test" and not path.is_file():
            # The CS224N handout names its unlabelled test files *-test-student.csv.
            path = Path(cfg.data.dir) / f"{task.cs224n_stem}-test-student.csv"
        return path, "cs224n", None, "data.dir"
    files = cfg.data.files.get(task.name)
    if files is None:
        raise DataError(f"data.files.{task.name}: missing (data.source is files)")
    if not getattr(files, split):
        raise DataError(f"data.files.{task.name}.{split}: " + (
            "not set" if split == "test" else "missing (needs both train and dev paths)"))
    return Path(getattr(files, split)), files.format, files.columns, f"data.files.{task.name}.{split}"


def input_files(cfg: Config) -> list[Path]:
    """The files load_splits reads (none for synthetic data), made absolute."""
    if cfg.data.source == "synthetic":
        return []
    return [split_file(cfg, get_task(t), split)[0].resolve() for t in cfg.tasks for split in ("train", "dev")]


def resolve_files(cfg: Config) -> Config:
    """Write into `cfg.data.files` what the readers will really use (the detected format of an
    `auto` entry; a cs224n-format file's own column names), so result.json and the MLflow
    params never show defaults the reader ignored. In place, idempotent; an entry whose file
    is missing is left as it is (reading it fails later)."""
    for name, files in cfg.data.files.items():
        if name not in cfg.tasks:
            continue
        task = get_task(name)
        fmt = files.format
        if fmt == "auto":
            try:
                fmt = detect_format(Path(files.train))
            except (DataError, OSError):
                continue
        files.format = fmt
        if fmt == "cs224n" and task.cs224n_columns:
            text, text2, label = task.cs224n_columns
            files.columns = ColumnMap(text=text, text2=text2, label=label)
        elif not task.pair:
            files.columns.text2 = None  # single-sentence tasks never read it
    return cfg


def read_split(cfg: Config, task_name: str, split: str,
               labels_required: bool | None = None) -> tuple[list[Example], BadRows]:
    """One split of one task from files (not synthetic), ids kept; `test` may lack labels, and
    so may any split read with labels_required=False (a row without one has label None)."""
    task = get_task(task_name)
    path, fmt, columns, key = split_file(cfg, task, split)
    if not path.is_file():
        raise DataError(f"{key}: {path} not found")
    examples, bad = read_examples(path, task, fmt, columns, cfg.data.on_bad_row,
                                  labels_required=split != "test" if labels_required is None else labels_required)
    if not examples:
        raise DataError(f"{key}: {path}: no usable rows ({bad.summary()})")
    return examples, bad


def cap_examples(examples: list[Example], limit: int | None, key: str) -> list[Example]:
    """The first `limit` of a fixed-seed shuffle, kept in file order. The seed is a constant,
    not train.seed: every trial of a sweep sees the same subset, and a random subset stays
    representative where the file's head may be sorted."""
    if limit is not None and limit <= 0:
        raise DataError(f"{key}: must be > 0, got {limit}")
    if limit is None or len(examples) <= limit:
        return examples
    keep = sorted(random.Random(0).sample(range(len(examples)), limit))
    return [examples[i] for i in keep]
