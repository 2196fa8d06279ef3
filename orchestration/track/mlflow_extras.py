"""What makes a sweep's MLflow readable by a person, beyond params and metrics.

- The experiment's kind, so that MLflow 3's UI opens the runs table, not its GenAI overview.
- A saved runs-table view, "mtbert: scores", that the printed link opens (runs_view).
- The run's source (the sweep file, the git commit) for the Source column.
- Every trial's training and dev data as MLflow dataset inputs, digested by the
  tokenization-cache key (the Dataset column), the data report and a `bad_rows` tag.
- System metrics (CPU, memory, GPU) of the trial process under MLflow's own `system/` names.
- The model: the best trial's bundle (or every trial's, opt-in) logged to its child run as a
  pyfunc model taking text, registered when `tracking.register_model` names it.

Nothing here decides a figure or imports tracking.py; each piece is called from one marked
line in tracking.py, trainable.py or launch.py. Run writes happen in the tracking's sync,
except the model upload, which MLflow's own client makes at the sweep's end.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd

from mtbert.figures import in_view
from orchestration.paths import fluent_tracking_uri

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"  # the UI's "model training" kind
SYSTEM_PREFIX = "system/"  # MLflow's prefix for system metrics (its System metrics tab)
MODEL_NAME = "model"  # the logged model's name in its run


# --------------------------------------------------------------------------- experiment, source

def mark_experiment(client, experiment_id: str) -> None:
    """Tag the experiment as model training unless someone already chose its kind: MLflow 3's
    UI opens an experiment on its GenAI overview unless `mlflow.experimentKind` (the UI's
    ExperimentKind enum) says otherwise."""
    experiment = client.get_experiment(experiment_id)
    if EXPERIMENT_KIND_TAG not in (experiment.tags or {}):
        client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)


# MLflow 3.17 keeps a saved view ("Save as new view") as an experiment tag
# `mlflow.sharedViewState.<key>` and opens it from the URL parameter `viewStateShareKey=<key>`.
VIEW_KEY = "mtbert"
VIEW_TAG_PREFIX = "mlflow.sharedViewState."
VIEW_NAME = "mtbert: scores"
VIEW_FIGURES = in_view()  # the figures declared `view` (mtbert/figures.py); each sweep adds its task scores
# Which sweep and which seed a row is: tags of every run (the sweep run's name, tracking.py).
SWEEP_RUN_TAG = "sweep_run"
VIEW_TAGS = [SWEEP_RUN_TAG, "seed"]
VIEW_CHART = "mtbert-swept"  # the parallel-coordinates chart of the view's chart tab, and its section


def swept_params(key: str, values: list[Any]) -> list[str]:
    """The MLflow params a swept key's values are logged as: the key itself, or for a mapping
    (loss weights) one param per entry, as mtbert.config.flatten spreads it (loss.weights.sst)."""
    from mtbert.config import flatten

    return list(dict.fromkeys(name for v in values for name in flatten({key: v}))) or [key]


def runs_view(objective: str, task_metrics: list[str], swept: list[str], ascending: bool = False,
              created_ms: int | None = None) -> str:
    """The tag value of the saved view: MLflow's envelope (name, createdAt, updatedAt, state),
    `state` the JSON of the runs table's UI state (the keys its JS reads). Columns, keyed as the
    UI keys them (tags.`name`, metrics.`name`, ...): the sweep and seed of each row, the scores,
    the swept params as logged (`swept_params`), best first. Its chart tab opens on a
    parallel-coordinates chart of the swept params against the objective."""
    metrics = list(dict.fromkeys([objective, "overall", *task_metrics, *VIEW_FIGURES]))
    columns = ([f"tags.`{t}`" for t in VIEW_TAGS] + [f"metrics.`{m}`" for m in metrics]
               + [f"params.`{k}`" for k in swept]
               + ["attributes.`Dataset`", "attributes.`Source`", "attributes.`Models`"])
    chart = {"uuid": VIEW_CHART, "type": "PARALLEL", "metricSectionId": VIEW_CHART, "deleted": False,
             "isGenerated": False, "displayName": f"swept dimensions and {objective}", "runsCountToCompare": 100,
             "selectedParams": list(swept), "selectedMetrics": [objective], "showAllRuns": True}
    # columns 1: the chart the section's whole width, room for an axis per swept param.
    section = {"uuid": VIEW_CHART, "name": "Swept dimensions", "display": True, "isReordered": False,
               "deleted": False, "isGenerated": False, "columns": 1, "cardHeight": 420}
    # columnOrder: the UI lists selected columns alphabetically within their group, else.
    # columnWidths: about as wide as a column's name (a score a few digits more), not the UI's
    # default, so that the swept params fit beside the scores.
    widths = {c: max(84 if c.startswith("metrics.") else 60, min(180, round(6.2 * len(c.split("`")[1])) + 20))
              for c in columns if not c.startswith("attributes.")}
    widths[f"tags.`{SWEEP_RUN_TAG}`"] = 170  # its values: <sweep>-<date>-<time>
    # isAccordionReordered: the chart tab keeps this section first (else it sorts sections by
    # name, the epoch/ and system/ charts' first); SHOW_ALL: every run in the charts, not 10.
    state = {"orderByKey": f"metrics.`{objective}`", "orderByAsc": ascending, "selectedColumns": columns,
             "columnOrder": columns, "columnWidths": widths, "compareRunCharts": [chart],
             "compareRunSections": [section], "isAccordionReordered": True, "runsHiddenMode": "SHOW_ALL"}
    now = int(time.time() * 1000)
    return json.dumps({"name": VIEW_NAME, "createdAt": created_ms or now, "updatedAt": now,
                       "state": json.dumps(state)})


def save_runs_view(client, experiment_id: str, objective: str, task_metrics: list[str], swept: list[str],
                   ascending: bool = False) -> None:
    """Write (or refresh, for this sweep's tasks and keys) the view the sweep's link opens.
    `swept`: the params of the swept keys (swept_params)."""
    tag = VIEW_TAG_PREFIX + VIEW_KEY
    created = None
    old = (client.get_experiment(experiment_id).tags or {}).get(tag)
    if old:
        try:
            created = int(json.loads(old)["createdAt"])
        except (ValueError, KeyError, TypeError):
            pass
    client.set_experiment_tag(experiment_id, tag, runs_view(objective, task_metrics, swept, ascending, created))


def source_tags(sweep_file: str | None, commit: str | None) -> dict[str, str]:
    tags = {"mlflow.source.type": "LOCAL"}
    if sweep_file:
        tags["mlflow.source.name"] = str(sweep_file)
    if commit:
        tags["mlflow.source.git.commit"] = commit
    return tags


# --------------------------------------------------------------------------- data

_DATA_MEMO: dict[str, dict] = {}
DATA_KEYS = ("tasks", "data", "pairs", "model.name_or_path", "model.max_length")


def data_signature(config: dict[str, Any]) -> str:
    """What a config's data setup is (tasks, files, tokenizer): configs alike here share it."""
    from mtbert.config import flatten

    return json.dumps({k: v for k, v in flatten(config).items() if k.startswith(DATA_KEYS)},
                      sort_keys=True, default=str)


def data_summary(config: dict[str, Any]) -> dict:
    """Per task and split: rows, source, tokenization-cache key; and the bad-row summaries.
    Memoized per data setup: the trials of a sweep share a handful."""
    from mtbert.config import build_config
    from mtbert.data.readers import load_splits
    from mtbert.data.tokenize import cache_key, get_tokenizer, tokenizer_fingerprint
    from mtbert.tasks import get_task

    signature = data_signature(config)
    if signature in _DATA_MEMO:
        return _DATA_MEMO[signature]
    cfg = build_config(config)
    splits, bad_rows = load_splits(cfg)
    texts = [t for train, _ in splits.values() for e in train for t in (e.text, e.text2) if t]
    fingerprint = tokenizer_fingerprint(get_tokenizer(cfg, texts))
    files = {b.file: b for b in bad_rows}
    datasets = []
    for name, (train, dev) in splits.items():
        task = get_task(name)
        for split, examples in (("train", train), ("dev", dev)):
            key = cache_key(fingerprint, examples, task, cfg.pairs.encoding, cfg.model.max_length)
            source = _source(cfg, task, split)
            bad = files.get(source.get("uri", ""))
            datasets.append({"name": f"{name}-{split}", "task": name, "split": split, "rows": len(examples),
                             "digest": key[:24], "source": source,
                             "bad_rows": bad.total if bad is not None else 0})
    summary = {"datasets": datasets, "bad_rows": [b.summary() for b in bad_rows],
               "bad_total": sum(b.total for b in bad_rows)}
    _DATA_MEMO[signature] = summary
    return summary


def _source(cfg, task, split: str) -> dict:
    if cfg.data.source == "synthetic":
        return {"generator": "mtbert.data.synthetic", "seed": cfg.data.synthetic.seed,
                "size": getattr(cfg.data.synthetic, f"{split}_size")}
    from mtbert.data.readers import _split_file

    return {"uri": str(_split_file(cfg, task, split)[0])}


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


# --------------------------------------------------------------------------- system metrics

class SystemSampler:
    """CPU, memory and GPU figures of the trial process and its machine, read from /proc and
    torch (no psutil needed), named as MLflow's own system metrics."""

    def __init__(self):
        self._last = self._clocks()

    @staticmethod
    def _clocks() -> tuple[float, float, tuple[int, int] | None]:
        """(wall clock, this process's CPU seconds, the machine's (all, idle) CPU ticks)."""
        t = os.times()
        try:
            fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
            ticks = (sum(fields), fields[3] + (fields[4] if len(fields) > 4 else 0))
        except (OSError, ValueError, IndexError):
            ticks = None
        return time.monotonic(), t.user + t.system, ticks

    def sample(self) -> dict[str, float]:
        out: dict[str, float] = {}
        (wall0, cpu0, ticks0), (wall, cpu, ticks) = self._last, self._clocks()
        if wall > wall0:
            out["process_cpu_utilization_percentage"] = 100.0 * (cpu - cpu0) / (wall - wall0)
        if ticks and ticks0 and ticks[0] > ticks0[0]:
            busy = (ticks[0] - ticks0[0]) - (ticks[1] - ticks0[1])
            out["cpu_utilization_percentage"] = 100.0 * busy / (ticks[0] - ticks0[0])
        self._last = (wall, cpu, ticks)
        try:
            info = {line.split(":")[0]: int(line.split()[1]) for line in
                    Path("/proc/meminfo").read_text().splitlines() if line.split()[1:2]}
            used = info["MemTotal"] - info["MemAvailable"]
            out["system_memory_usage_megabytes"] = used / 1024
            out["system_memory_usage_percentage"] = 100.0 * used / info["MemTotal"]
        except (OSError, KeyError, ValueError, IndexError):
            pass
        try:
            pages = int(Path("/proc/self/statm").read_text().split()[1])
            out["process_memory_rss_megabytes"] = pages * os.sysconf("SC_PAGE_SIZE") / 2**20
        except (OSError, ValueError, IndexError):
            pass
        out.update(self._gpu())
        return {SYSTEM_PREFIX + k: float(v) for k, v in out.items()}

    @staticmethod
    def _gpu() -> dict[str, float]:
        import torch

        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return {}
        out = {}
        for i in range(torch.cuda.device_count()):
            free, total = torch.cuda.mem_get_info(i)
            out[f"gpu_{i}_memory_usage_megabytes"] = (total - free) / 2**20
            out[f"gpu_{i}_memory_usage_percentage"] = 100.0 * (total - free) / total
            try:
                out[f"gpu_{i}_utilization_percentage"] = float(torch.cuda.utilization(i))
            except Exception:  # noqa: BLE001 - needs NVML; memory alone is still worth logging
                pass
        return out


# --------------------------------------------------------------------------- models

def _pyfunc_class():
    """Defined on first use: mlflow.pyfunc is imported only where a model is logged."""
    import mlflow.pyfunc

    class MtbertModel(mlflow.pyfunc.PythonModel):
        """Input: a DataFrame with `text` (and `text2` for the pair tasks). Output: one column
        per task: the sst class, the para 0/1, the sts similarity 0..5 (NaN where a pair
        task has no text2)."""

        def load_context(self, context):
            from mtbert.bundle import load_model

            self.bundle = load_model(context.artifacts["bundle"])

        # Annotated as a DataFrame, which MLflow takes as "no schema from the hint": without
        # a hint it prints a warning on every sweep's console asking for one.
        def predict(self, context, model_input: pd.DataFrame, params=None):
            from mtbert.tasks import get_task

            texts = [str(t) for t in model_input["text"]]
            second = model_input["text2"] if "text2" in model_input else [None] * len(texts)
            pairs = [i for i, t in enumerate(second) if isinstance(t, str) and t]
            out = {}
            for task in self.bundle.tasks:
                if not get_task(task).pair:
                    out[task] = self.bundle.predict(task, texts)
                    continue
                column = [float("nan")] * len(texts)
                got = self.bundle.predict(task, [texts[i] for i in pairs], [second[i] for i in pairs])
                for i, value in zip(pairs, got):
                    column[i] = value
                out[task] = column
            return pd.DataFrame(out)

    return MtbertModel


def log_bundle(uri: str, run_id: str, bundle_dir: str | Path, register_as: str | None = None) -> str:
    """Log a bundle folder to a finished run as a pyfunc model (optionally registered);
    returns the model URI. The run keeps its status and end time. A slim bundle is logged
    self-contained (mtbert/bundle.py): a logged model is what leaves the machine, to places
    where the pretrained model it names may not be."""
    import logging
    import shutil
    import warnings

    import mlflow
    from mlflow.tracking import MlflowClient

    import mtbert
    from mtbert.bundle import is_slim, make_self_contained

    client = MlflowClient(uri)
    before = client.get_run(run_id).info
    quiet = logging.getLogger("mlflow")
    level = quiet.level
    try:
        example = pd.DataFrame({"text": ["a wonderful film"], "text2": ["a great movie"]})
        with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
            # MLflow's advice on type hints, cloudpickle and integer columns, and its
            # download bars, would fill the sweep's console; the model is checked by loading it.
            warnings.simplefilter("ignore")
            quiet.setLevel(logging.ERROR)
            os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
            # The code that defines the model travels with it, so it loads where mtbert is not
            # installed; compiled caches stay behind.
            code = Path(tmp) / "mtbert"
            shutil.copytree(Path(mtbert.__file__).parent, code, ignore=shutil.ignore_patterns("__pycache__"))
            if is_slim(bundle_dir):
                bundle_dir = make_self_contained(bundle_dir, Path(tmp) / "bundle")
            with fluent_tracking_uri(uri), mlflow.start_run(run_id=run_id):
                info = mlflow.pyfunc.log_model(
                    name=MODEL_NAME, python_model=_pyfunc_class()(), artifacts={"bundle": str(bundle_dir)},
                    code_paths=[str(code)], pip_requirements=_requirements(), input_example=example,
                    registered_model_name=register_as)
    finally:
        quiet.setLevel(level)
        if before.status != "RUNNING":
            client.set_terminated(run_id, status=before.status, end_time=before.end_time)
    return info.model_uri


def _requirements() -> list[str]:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for name in ("torch", "transformers", "tokenizers", "numpy", "pandas", "pyyaml"):
        try:
            out.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            out.append(name)
    return out


def best_configuration(runs: list) -> list:
    """The finished runs of the configuration (tag `variant`: one configuration's seeds) with
    the best mean `overall` over its seeds, its best seed first; [] when none finished.
    Judged by the mean, not by one lucky seed; with one seed per configuration that is the
    best run. Ties go to the configuration with more seeds."""
    groups: dict[str, list] = {}
    for run in runs:
        if run.info.status == "FINISHED" and "overall" in run.data.metrics:
            groups.setdefault(run.data.tags.get("variant") or run.info.run_id, []).append(run)
    if not groups:
        return []
    best = max(groups.values(), key=lambda g: (sum(r.data.metrics["overall"] for r in g) / len(g), len(g)))
    return sorted(best, key=lambda r: -r.data.metrics["overall"])


def best_summary(runs: list) -> dict[str, Any]:
    """The best configuration as the sweep reports it (its summary line, its parent run): its
    variant, its mean overall with the 95% half-width and n seeds, and its best seed (the model);
    {} when no trial finished."""
    from orchestration.stats import mean_ci

    best = best_configuration(runs)
    if not best:
        return {}
    mean, half, n = mean_ci(r.data.metrics["overall"] for r in best)
    top = best[0].data
    return {"variant": top.tags.get("variant", ""), "trial_key": top.tags.get("trial_key"), "overall": mean,
            "half": half, "n": n, "seed_overall": top.metrics["overall"],
            "tm": {name: sum(v) / len(v) for name in ("tm_relative_score_compute", "tm_relative_score")
                   if (v := [r.data.metrics[name] for r in best if name in r.data.metrics])}}


def log_models(tracking, results, which: str, register_as: str | None,
               log=print, runs: list | None = None) -> list[tuple[str, str]]:
    """After a sweep: the best seed of the best configuration (which='best', see
    best_configuration) or every trial (which='all') logs its bundle to its child run;
    (trial_key, model URI) for each one logged.
    `runs`: the sweep's child runs as the driver last read them (else read here)."""
    if which == "none" or results is None:
        return []
    by_key = {r.config["key"]: r.checkpoint for r in results
              if (r.config or {}).get("key") and r.checkpoint is not None}
    runs = tracking.children() if runs is None else runs
    best = best_configuration(runs)[:1]  # first: the registry gets it, and only it
    if which == "all":
        best += [r for r in runs if r.info.status == "FINISHED" and "overall" in r.data.metrics and r not in best]
    runs = best
    done = []
    for run in runs:
        key = run.data.tags.get("trial_key")
        checkpoint = by_key.get(key)
        if checkpoint is None or run.data.tags.get("model_uri"):  # a resumed sweep logs once
            continue
        with checkpoint.as_directory() as folder:
            bundle = Path(folder) / "best"  # the best epoch's bundle, as train() leaves it
            if not (bundle / "model.pt").is_file():
                continue
            name = register_as if run is runs[0] else None  # the registry gets the best only
            model_uri = log_bundle(tracking.uri, run.info.run_id, bundle, name)
        tracking.tag_trial(key, {"model_uri": model_uri})
        done.append((key, model_uri))
        log(f"model: {key} logged to its run as {model_uri}"
            + (f", registered as '{register_as}'" if name else ""))
    return done


def ui_link(base: str, experiment_id: str) -> str:
    """The experiment's runs table in the sweep's saved view (save_runs_view). MLflow 3.17's UI
    picks model training over GenAI from a `workflowType` URL parameter (else the browser's
    last choice, GenAI by default), not from the experiment tag, so the link carries it."""
    return (f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs"
            f"?workflowType=machine_learning&viewStateShareKey={VIEW_KEY}")
