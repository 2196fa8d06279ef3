"""A sweep's models in MLflow: logged after the sweep, and found again by the names it prints.

Logging: the best seed of the best configuration (best_configuration: judged by the mean over
the seeds every configuration ran), or every trial's with `tracking.log_models: all`, logs its
bundle to its child run as a pyfunc model that takes text (MtbertModel), registered when
`tracking.register_model` names it. The model carries mtbert's code and, for a slim bundle, its pretrained weights, so that it
loads where neither is installed.

Finding: what `mtbert predict --model` accepts besides a bundle folder.

    runs/<sweep>/<trial>/output/best     a bundle folder (used as it is; a trial's links into its checkpoint)
    models:/m-0123...  models:/NAME/3    an MLflow model URI (what a sweep prints, or the registry's)
    models:/NAME@champion                 a registry alias
    runs:/<run id>/<path>                 a model stored as a run's artifact
    <run id>                              32 hex digits: the model that run logged
    NAME                                  a registered model: its latest version

A logged model carries the bundle as its `bundle` artifact; it is downloaded once into
`<cache>/models/<digest of the store and what the URI names>` and loaded from there like any
bundle folder. A registry version or alias is keyed by the model version's source, so an alias
moved to another version downloads that one; an entry whose files are missing or cut short is
downloaded again.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import pandas as pd  # at import: MLflow resolves MtbertModel.predict's hint in these globals

from mtbert.errors import first_line
from mtbert.outputs import remove_path
from orchestration.errors import SweepError
from orchestration.paths import fluent_tracking_uri

RUN_ID = re.compile(r"[0-9a-f]{32}")
MODEL_NAME = "model"  # the logged model's name in its run
CACHE = Path(".mtbert_cache")


# --------------------------------------------------------------------------- finding

def model_uri(ref: str, tracking_uri: str) -> str:
    """The MLflow model URI a --model reference names (a registered name: its latest version)."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    if ref.startswith(("models:/", "runs:/")):
        return ref
    client = MlflowClient(tracking_uri)
    if RUN_ID.fullmatch(ref):
        try:
            run = client.get_run(ref)
            logged = client.search_logged_models([run.info.experiment_id], f"source_run_id = '{ref}'")
        except MlflowException as exc:
            raise SweepError(f"--model {ref}: {first_line(exc)} (store {tracking_uri})") from None
        if not logged:
            raise SweepError(f"--model {ref}: run {ref} logged no model (a sweep logs the best trial's; "
                             "tracking.log_models: all logs every trial's)")
        return f"models:/{logged[0].model_id}"
    try:
        versions = client.search_model_versions(f"name = '{ref}'")
    except MlflowException as exc:
        raise SweepError(f"--model {ref}: cannot read the model registry of {tracking_uri}: "
                         f"{first_line(exc)}") from None
    if not versions:
        raise SweepError(f"--model {ref}: neither a folder nor a registered model in {tracking_uri} "
                         "(give a bundle folder, a models:/ URI, a run id or a registered name)")
    return f"models:/{ref}/{max(int(v.version) for v in versions)}"


def resolve_bundle(ref: str, tracking_uri: str, cache: Path = CACHE,
                   log: Callable[[str], None] = print) -> Path:
    """A local bundle folder for `ref`: the folder itself, or the logged model's bundle
    artifact, downloaded once per model it names (see _pinned) and read from the cache
    after that."""
    if Path(ref).exists():
        return Path(ref)
    import mlflow
    from mlflow.exceptions import MlflowException

    uri = model_uri(ref, tracking_uri)
    source, fetch = _pinned(ref, uri, tracking_uri)
    folder = cache / "models" / hashlib.blake2b(f"{tracking_uri}|{source}".encode(), digest_size=12).hexdigest()
    found = _complete(folder)
    if found is not None:
        log(f"model: {uri} read from the cache {folder}")
        return found
    if folder.exists():  # an earlier download cut short, or a file since changed: fetched again
        log(f"model: the cache {folder} is incomplete: downloading again")
        remove_path(folder)
    log(f"model: downloading {fetch} into the cache {folder}")
    # Into a side folder of its own first, renamed when whole: an interrupted download never
    # looks cached, and two commands fetching the same model at once do not mix their files.
    folder.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=folder.name + ".partial-", dir=folder.parent))
    partial.chmod(folder.parent.stat().st_mode & 0o777)  # the cache's own access, not mkdtemp's owner-only
    try:
        try:
            # models:/ URIs resolve through the process-wide store, whatever tracking_uri= says.
            with fluent_tracking_uri(tracking_uri), download_bars():
                mlflow.artifacts.download_artifacts(artifact_uri=fetch, dst_path=str(partial))
        except MlflowException as exc:
            raise SweepError(f"--model {ref}: {first_line(exc)} (store {tracking_uri})") from None
        bundle = _bundle_in(partial)
        if bundle is None:
            raise SweepError(f"--model {ref}: {uri} is not an mtbert model (no bundle artifact inside)")
        sizes = {str(f.relative_to(partial)): f.stat().st_size for f in sorted(partial.rglob("*")) if f.is_file()}
        (partial / COMPLETE).write_text(json.dumps({"source": source, "files": sizes}, indent=1))
        try:
            partial.rename(folder)
        except OSError:  # another command finished the same download first: its copy is used
            if _complete(folder) is None:
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return folder / bundle.relative_to(partial)


COMPLETE = "mtbert-download.json"  # written last: the files of a whole download and their sizes


def _pinned(ref: str, uri: str, tracking_uri: str) -> tuple[str, str]:
    """(what `uri` names now, a URI that downloads exactly that). A registry version or alias
    is pinned to the model version's source, so the cache follows the registry: an alias
    moved, or a model registered again under the same name, is another entry. Other URIs (a
    model id, runs:/) name one thing for good and are their own key."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    m = re.fullmatch(r"models:/(?P<name>[^/@]+)(?:/(?P<version>\d+)|@(?P<alias>[^/]+))", uri)
    if m is None:
        return uri, uri
    client = MlflowClient(tracking_uri)
    try:
        version = (client.get_model_version_by_alias(m["name"], m["alias"]) if m["alias"]
                   else client.get_model_version(m["name"], m["version"]))
    except MlflowException as exc:
        raise SweepError(f"--model {ref}: {first_line(exc)} (store {tracking_uri})") from None
    return f"{version.source}|{version.run_id}", f"models:/{m['name']}/{version.version}"


def _complete(folder: Path) -> Path | None:
    """The bundle of a cache entry whose files are all there at their downloaded sizes, else None."""
    try:
        files = json.loads((folder / COMPLETE).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    for name, size in files.items():
        f = folder / name
        if not f.is_file() or f.stat().st_size != size:
            return None
    return _bundle_in(folder)


@contextmanager
def download_bars() -> Iterator[None]:
    """MLflow draws a progress bar per downloaded file: kept on a terminal, off where the
    console is a log or a pipe (a bar's every redraw becomes a line there). A setting the user
    made in MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR wins."""
    if NO_BAR in os.environ or (sys.stdout.isatty() and sys.stderr.isatty()):
        yield
        return
    os.environ[NO_BAR] = "false"
    try:
        yield
    finally:
        os.environ.pop(NO_BAR, None)


NO_BAR = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"


def _bundle_in(folder: Path) -> Path | None:
    """The bundle a logged model carries (its pyfunc `artifacts/` keeps the folder's own name)."""
    marks = sorted((folder / "artifacts").glob("*/bundle.json")) if folder.is_dir() else []
    return marks[0].parent if marks else None


# --------------------------------------------------------------------------- logging

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
            os.environ.setdefault(NO_BAR, "false")
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


def contenders(runs: list, include_reference: bool = False) -> dict[str, list]:
    """variant -> the finished runs with a finite `overall` of each configuration that competes
    for best. A single-task run never competes (it has one task's head, not a multitask
    model); the frozen reference (role `reference`) is a yardstick, not a contender: left out
    unless `include_reference`, so the summary line, the parent's best_config tag and the
    registered model never name it."""
    import math

    from orchestration.sweep.labels import REFERENCE, SINGLE_TASK

    groups: dict[str, list] = {}
    for run in runs:
        role = run.data.tags.get("role")
        if role == SINGLE_TASK or (not include_reference and role == REFERENCE):
            continue
        if run.info.status == "FINISHED" and math.isfinite(run.data.metrics.get("overall", math.nan)):
            groups.setdefault(run.data.tags.get("variant") or run.info.run_id, []).append(run)
    return groups


def shared_seeds(groups: dict[str, list]) -> list[str]:
    """The best configuration's ranking rule: each configuration's mean `overall` over the seeds
    every competing configuration finished (tag `seed`), so that under adaptive seeds one lucky
    seed of a configuration decided early does not outrank the seeds all of them ran. [] when
    no seed is shared: then each is ranked by the mean over all its seeds (best_summary says so)."""
    seeds = [{r.data.tags.get("seed") for r in group} - {None} for group in groups.values()]
    return sorted(set.intersection(*seeds), key=lambda s: (len(s), s)) if seeds else []


def ranking_mean(group: list, shared: list[str]) -> float:
    """A configuration's mean overall by shared_seeds' rule: over the shared seeds, else all its own."""
    values = [r.data.metrics["overall"] for r in group if not shared or r.data.tags.get("seed") in shared]
    return sum(values) / len(values)


def best_configuration(runs: list, include_reference: bool = False) -> list:
    """The finished runs of the contending configuration (tag `variant`: one configuration's
    seeds, see contenders) with the best mean `overall` by shared_seeds' rule, its best seed
    first; [] when none finished. Judged by the mean, not by one lucky seed; with one seed per
    configuration that is the best run. Ties go to the configuration with more seeds."""
    groups = contenders(runs, include_reference)
    if not groups:
        return []
    shared = shared_seeds(groups)
    best = max(groups.values(), key=lambda g: (ranking_mean(g, shared), len(g)))
    return sorted(best, key=lambda r: -r.data.metrics["overall"])


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
