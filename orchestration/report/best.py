"""`mtbert best`: what a researcher takes away from a sweep. Its best configuration (judged by
the mean over the seeds every configuration ran, track/models.py's best_configuration and
shared_seeds) and, for that configuration's best
seed, every name its model goes by: the MLflow run, the logged model, the registered version
and the bundle folder on disk. Each model line is a `mtbert predict --model ...` command that
runs as printed. The frozen reference is a yardstick, never the best (`--include-reference`
lets it compete); where its mean beats every trained configuration, a line says so.
"""
from __future__ import annotations

import json
import math
import shlex
from pathlib import Path
from typing import Any

from orchestration.errors import SweepError
from orchestration.paths import tool


def _children(client, experiment_id: str, parent_run_id: str) -> list:
    """Every trial run of the sweep (not its configurations'), page by page (a sweep can pass
    search_runs' 1,000 a page)."""
    from orchestration.track.tracking import SEED_RUNS

    runs, token = [], None
    while True:
        page = client.search_runs([experiment_id], f"tags.`mlflow.parentRunId` = '{parent_run_id}' and {SEED_RUNS}",
                                  max_results=1000, page_token=token)
        runs += list(page)
        token = page.token
        if not token:
            return runs


def _why_none(runs: list) -> str:
    """What became of a sweep's trials when none finished: ' yet' while some still run, else
    the count per status and the first failure's reason (its `error` tag), in the same line."""
    status: dict[str, int] = {}
    for run in runs:
        status[run.info.status] = status.get(run.info.status, 0) + 1
    if not runs or status.get("RUNNING") or status.get("SCHEDULED"):
        return " yet"
    counts = ", ".join(f"{n} {s}" for s, n in sorted(status.items()))
    failed = sorted((r for r in runs if r.data.tags.get("error")), key=lambda r: r.data.tags.get("trial_key", ""))
    first = ""
    if failed:
        run = failed[0]
        reason = run.data.tags["error"].strip().splitlines()[-1][:300]
        first = f"; trial {run.data.tags.get('trial_key', run.info.run_id)}: {reason}"
    return f": all {len(runs)} ended without a result ({counts}){first}"


def _registered(client, run_id: str) -> list[tuple[str, int]]:
    """(name, version) of each registered model version made from the run, newest first; []
    where the store has no registry."""
    from mlflow.exceptions import MlflowException

    try:
        versions = client.search_model_versions(f"run_id = '{run_id}'")
    except MlflowException:
        return []
    return sorted(((v.name, int(v.version)) for v in versions), key=lambda v: (v[0], -v[1]))


def _bundle(parent_tags: dict[str, str], run) -> Path | None:
    """The trial's output/best in the sweep's Ray storage, where it still exists on this machine
    (a sweep run on a cluster keeps it on the cluster's volume)."""
    storage, key = parent_tags.get("ray_experiment"), run.data.tags.get("trial_key")
    if not storage or not key:
        return None
    trial_id = run.data.tags.get("trial_id")
    # launch._trial_dirname: <trial_key>_<trial id>; any id where a resumed trial got another.
    folders = [Path(storage) / f"{key}_{trial_id}"] if trial_id else []
    folders += sorted(Path(storage).glob(f"{key}_*")) if Path(storage).is_dir() else []
    for folder in folders:
        best = folder / "output" / "best"
        if (best / "bundle.json").is_file() or (best / "model.pt").is_file():
            return best
    return None


def _values(parent_tags: dict[str, str], params: dict[str, str]) -> dict[str, str]:
    """The swept keys' values of the configuration, as logged (a loss-weight mapping: one per task)."""
    keys = [k for k in parent_tags.get("space_keys", "").split(",") if k]
    return {name: value for key in keys for name, value in sorted(params.items())
            if name == key or name.startswith(key + ".")}


def reference_overall(runs: list) -> float | None:
    """The frozen reference's mean overall over its finished seeds (None: the sweep ran none)."""
    from orchestration.sweep.labels import REFERENCE

    values = [r.data.metrics["overall"] for r in runs if r.data.tags.get("role") == REFERENCE
              and r.info.status == "FINISHED" and "overall" in r.data.metrics]
    return sum(values) / len(values) if values else None


def ranked_by(shared: list[str]) -> str:
    """How the best configuration was ranked (models.shared_seeds), in words."""
    if not shared:
        return "the mean over all its seeds (no seed is shared by every configuration)"
    return f"the mean over seed{'s' if len(shared) > 1 else ''} {', '.join(shared)}, those every configuration ran"


def best_summary(runs: list, include_reference: bool = False) -> dict[str, Any]:
    """The best configuration as the sweep reports it (its summary line, its parent run): its
    variant, its mean overall with the 95% half-width and n seeds, and its best seed (the model);
    how it was ranked (ranked_on: the shared seeds, [] for none; ranked_overall: its mean over
    them; ranked_by: in words); {} when no trial finished. The frozen reference competes only
    with `include_reference`."""
    from orchestration.stats import mean_ci
    from orchestration.track.models import best_configuration, contenders, ranking_mean, shared_seeds

    best = best_configuration(runs, include_reference)
    if not best:
        return {}
    mean, half, n = mean_ci(r.data.metrics["overall"] for r in best)
    shared = shared_seeds(contenders(runs, include_reference))
    top = best[0].data
    return {"variant": top.tags.get("variant", ""), "trial_key": top.tags.get("trial_key"), "overall": mean,
            "half": half, "n": n, "seed_overall": top.metrics["overall"], "ranked_on": shared,
            "ranked_overall": ranking_mean(best, shared), "ranked_by": ranked_by(shared),
            "tm": {name: sum(v) / len(v) for name in ("tm_relative_score_compute", "tm_relative_score")
                   if (v := [r.data.metrics[name] for r in best if name in r.data.metrics])}}


def best_model(uri: str, experiment: str, sweep: str | None = None, say=None,
               include_reference: bool = False) -> dict[str, Any]:
    """The sweep's best configuration and its best seed's model, as a plain dict (the JSON
    `mtbert best --format json` prints); the frozen reference only with `include_reference`."""
    from mlflow.tracking import MlflowClient

    from orchestration.report.reader import find_sweep
    from orchestration.sweep.labels import REFERENCE
    from orchestration.track.models import best_configuration

    experiment_id, parent = find_sweep(uri, experiment, sweep, say)
    client = MlflowClient(uri)
    runs = _children(client, str(experiment_id), parent.info.run_id)
    summary, best = best_summary(runs, include_reference), best_configuration(runs, include_reference)
    if not best:
        raise SweepError(f"sweep {parent.info.run_name} ({parent.info.run_id}) has no finished trials"
                         + ("" if include_reference or reference_overall(runs) is None else
                            " besides the frozen reference (--include-reference lets it compete)")
                         + _why_none(runs))
    reference = reference_overall(runs)
    top = best[0]
    tags = top.data.tags
    registered = _registered(client, top.info.run_id)
    # Which run the sweep logged its model to: the best seed's, unless the sweep logged none
    # or (a sweep whose runs changed since) another's.
    logged = [r for r in runs if r.data.tags.get("model_uri")]
    bundle = _bundle(parent.data.tags, top)
    return {
        "tracking_uri": uri, "experiment": experiment, "sweep": parent.info.run_name,
        "sweep_run_id": parent.info.run_id,
        "configuration": summary["variant"], "values": _values(parent.data.tags, top.data.params),
        "overall": summary["overall"], "ci95_half": None if math.isnan(summary["half"]) else summary["half"],
        "reference_overall": reference,
        "reference_beats_all": bool(reference is not None and summary["variant"] != REFERENCE
                                    and reference > summary["overall"]),
        "ranked_on": summary["ranked_on"], "ranked_overall": summary["ranked_overall"],
        "ranked_by": summary["ranked_by"],
        "n": summary["n"], "seeds": sorted((r.data.tags.get("seed") for r in best if r.data.tags.get("seed")),
                                            key=lambda s: (len(s), s)),
        "best_seed": {
            "trial_key": tags.get("trial_key"), "seed": tags.get("seed"), "overall": summary["seed_overall"],
            "run_id": top.info.run_id, "model_uri": tags.get("model_uri"),
            "registered": [{"name": n, "version": v, "uri": f"models:/{n}/{v}"} for n, v in registered],
            "bundle": str(bundle) if bundle is not None else None,
        },
        "models_logged_to": [{"trial_key": r.data.tags.get("trial_key"), "run_id": r.info.run_id,
                              "model_uri": r.data.tags["model_uri"]} for r in logged],
    }


def render_text(found: dict[str, Any]) -> str:
    """Comment lines that say what was chosen, then one `mtbert predict --model ...` line per
    name of the model (a shell pastes the whole text: the comments are comments)."""
    seed = found["best_seed"]
    interval = (f" ± {found['ci95_half']:.4f} (95%)" if found["ci95_half"] is not None else "")
    values = " ".join(f"{k}={v}" for k, v in found["values"].items())
    lines = [f"# sweep {found['sweep']} (parent run {found['sweep_run_id']}) in experiment '{found['experiment']}'",
             f"# best configuration {found['configuration']}" + (f": {values}" if values else ""),
             f"#   overall {found['overall']:.4f}{interval} over {found['n']} seed(s) "
             f"({', '.join(found['seeds'])}); ranked by {found['ranked_by']}"
             + (f": {found['ranked_overall']:.4f}" if found["ranked_on"] and found["ranked_on"] != found["seeds"]
                else ""),
             f"# its best seed {seed['trial_key']} (seed {seed['seed']}): overall {seed['overall']:.4f}, "
             f"MLflow run {seed['run_id']}"]
    if found.get("reference_beats_all"):
        lines.insert(2, f"# the frozen reference (a yardstick, not a contender) beats every trained configuration: "
                        f"overall {found['reference_overall']:.4f}")
    predict = f"{tool('mtbert')} predict --tracking-uri {shlex.quote(found['tracking_uri'])} --model"
    if seed["model_uri"]:
        lines.append(f"{predict} {shlex.quote(seed['model_uri'])}   # the model logged to its run")
        lines.append(f"{predict} {seed['run_id']}   # its MLflow run (the model it logged)")
    for reg in seed["registered"]:
        lines.append(f"{predict} {shlex.quote(reg['uri'])}   # registered as '{reg['name']}', version {reg['version']}")
    if seed["bundle"]:
        lines.append(f"{tool('mtbert')} predict --model {shlex.quote(seed['bundle'])}   # the bundle on disk")
    if not seed["model_uri"]:
        others = [m for m in found["models_logged_to"] if m["run_id"] != seed["run_id"]]
        why = (f"the sweep logged its model to {', '.join(m['trial_key'] or m['run_id'] for m in others)}"
               if others else "the sweep logged none (tracking.log_models: none, or the trial kept no checkpoint)")
        lines.append(f"# no MLflow model for this seed: {why}")
    if not seed["bundle"]:
        lines.append("# no bundle on disk here: the sweep's Ray storage is gone or on another machine")
    return "\n".join(lines) + "\n"


def render(found: dict[str, Any], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(found, indent=2) + "\n"
    return render_text(found)

