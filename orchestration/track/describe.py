"""What a run says about where it came from and what it read: its source and its data.

The Source column shows the sweep file and the git commit (source_tags). The Dataset column
and the data report show every task's training and dev data, digested by the tokenization-cache
key, so two runs that read the same data show the same digest (describe_run); the bad rows
the readers skipped are counted on the run. Reading the data is memoized per data setup
(data_signature), which the launcher also uses to tokenize each setup once.
"""
from __future__ import annotations

import json
from typing import Any


def source_tags(sweep_file: str | None, commit: str | None) -> dict[str, str]:
    tags = {"mlflow.source.type": "LOCAL"}
    if sweep_file:
        tags["mlflow.source.name"] = str(sweep_file)
    if commit:
        tags["mlflow.source.git.commit"] = commit
    return tags


_DATA_MEMO: dict[str, dict] = {}
DATA_KEYS = ("tasks", "data", "pairs", "model.name_or_path", "model.max_length")


def data_signature(config: dict[str, Any]) -> str:
    """What a config's data setup is (tasks, files, tokenizer): configs alike here share it."""
    from mtbert.config import flatten

    return json.dumps({k: v for k, v in flatten(config).items() if k.startswith(DATA_KEYS)},
                      sort_keys=True, default=str)


def data_summary(config: dict[str, Any]) -> dict:
    """Per task and split: rows, source, tokenization-cache key; and the bad-row summaries.
    Memoized per data setup: the trials of a sweep share a handful. Read from what prepare()
    made (the launcher has prepared every setup before this runs, so it is the process's own
    or the prepared index's): reading the files and the tokenizer again cost a sweep's start
    seconds."""
    from mtbert.config import build_config
    from mtbert.data.tokenize import prepare
    from mtbert.tasks import get_task

    signature = data_signature(config)
    if signature in _DATA_MEMO:
        return _DATA_MEMO[signature]
    cfg = build_config(config)
    prepared = prepare(cfg, log=None)
    files = {b.file: b for b in prepared.bad_rows}
    datasets = []
    for name in cfg.tasks:
        for split in ("train", "dev"):
            source = _source(cfg, get_task(name), split)
            bad = files.get(source.get("uri", ""))
            datasets.append({"name": f"{name}-{split}", "task": name, "split": split,
                             "rows": len(getattr(prepared, split)[name]), "digest": prepared.digests[split][name],
                             "source": source, "bad_rows": bad.total if bad is not None else 0})
    summary = {"datasets": datasets, "bad_rows": [b.summary() for b in prepared.bad_rows],
               "bad_total": sum(b.total for b in prepared.bad_rows)}
    _DATA_MEMO[signature] = summary
    return summary


def _source(cfg, task, split: str) -> dict:
    if cfg.data.source == "synthetic":
        return {"generator": "mtbert.data.synthetic", "seed": cfg.data.synthetic.seed,
                "size": getattr(cfg.data.synthetic, f"{split}_size")}
    from mtbert.data.readers import split_file

    return {"uri": str(split_file(cfg, task, split)[0])}


def data_report(summary: dict) -> str:
    lines = ["dataset\trows\tbad rows\tdigest (tokenization cache key)\tsource"]
    for d in summary["datasets"]:
        lines.append(f"{d['name']}\t{d['rows']}\t{d['bad_rows']}\t{d['digest']}\t"
                     f"{d['source'].get('uri') or json.dumps(d['source'])}")
    lines += ["", "bad rows:"] + [f"  {s}" for s in summary["bad_rows"]] if summary["bad_rows"] else []
    return "\n".join(lines) + "\n"


def describe_run(client, run_id: str, config: dict[str, Any]) -> None:
    """The run's data, once per run (tracking.py's sync): dataset inputs (train: context
    training, dev: eval), the data report, a bad_rows tag. Reading the data failing costs the
    run its description only (noted on it); the store failing raises, so the sync is retried
    like any other."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    try:
        summary = data_summary(config)
    except Exception as exc:  # noqa: BLE001 - see the docstring
        client.set_tag(run_id, "data_report_error", f"{type(exc).__name__}: {exc}"[:500])
        return
    inputs = []
    for d in summary["datasets"]:
        source_type = "local" if "uri" in d["source"] else "code"
        profile = json.dumps({"num_rows": d["rows"], "bad_rows": d["bad_rows"]})
        dataset = Dataset(d["name"], d["digest"], source_type, json.dumps(d["source"]), profile=profile)
        context = "training" if d["split"] == "train" else "eval"
        inputs.append(DatasetInput(dataset, [InputTag("mlflow.data.context", context)]))
    client.log_inputs(run_id, datasets=inputs)
    client.log_text(run_id, data_report(summary), "data_report.txt")
    client.set_tag(run_id, "bad_rows", str(summary["bad_total"]))

