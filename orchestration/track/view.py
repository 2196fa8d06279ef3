"""How a sweep's experiment opens in the MLflow UI: on its configurations, in a saved view.

MLflow 3's UI opens an experiment on its GenAI overview and shows the runs table with its
own default columns. A sweep's reader compares configurations, not seeds: so the experiment is
marked as model training (mark_experiment) and two saved views are written
(save_runs_view). "mtbert: configurations", which the link the sweep prints opens (ui_link),
shows one row per configuration's run (tracking.py) with the swept params, overall and its
95% interval, the seeds it stands on and how many diverged, the task scores and the costs, best
first. "mtbert: seeds" shows the trials' runs, each with its sweep and seed. Both open their
chart tab on a parallel-coordinates chart of the swept dimensions against the objective. The
tag that names a row's sweep is here because the view shows it; tracking.py writes it on every
run.
"""
from __future__ import annotations

import json
import time
from typing import Any

from mtbert.figures import in_view

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"  # the UI's "model training" kind


def mark_experiment(client, experiment_id: str) -> None:
    """Tag the experiment as model training unless someone already chose its kind: MLflow 3's
    UI opens an experiment on its GenAI overview unless `mlflow.experimentKind` (the UI's
    ExperimentKind enum) says otherwise."""
    experiment = client.get_experiment(experiment_id)
    if EXPERIMENT_KIND_TAG not in (experiment.tags or {}):
        client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)


# MLflow 3.17 keeps a saved view ("Save as new view") as an experiment tag
# `mlflow.sharedViewState.<key>` and opens it from the URL parameter `viewStateShareKey=<key>`;
# its state may carry a search filter, which is what picks configurations or seeds.
VIEW_KEY, SEEDS_VIEW_KEY = "mtbert", "mtbert-seeds"
VIEW_TAG_PREFIX = "mlflow.sharedViewState."
VIEW_NAME, SEEDS_VIEW_NAME = "mtbert: configurations", "mtbert: seeds"
VIEW_FIGURES = in_view()  # the figures declared `view` (mtbert/figures.py); each sweep adds its task scores
# Which sweep and which seed a row is: tags of every run (the sweep run's name, tracking.py).
SWEEP_RUN_TAG = "sweep_run"
VIEW_TAGS = [SWEEP_RUN_TAG, "seed"]
# A configuration's run: its role tag (its seeds' runs keep their own) and what it stands on
# (tracking.py writes them). The filters pick a sweep's configurations or its trials (seeds).
CONFIGURATION = "configuration"
CONFIGURATION_FILTER, SEEDS_FILTER = f"tags.role = '{CONFIGURATION}'", f"tags.role != '{CONFIGURATION}'"
CONFIGURATION_TAGS = ["configuration_role", "diverged_seeds"]
SEED_TAGS = ["diverged"]  # a seed that failed to train says why (tracking.diverged_reason)
CONFIGURATION_METRICS = ["seeds", "seeds_diverged"]
VIEW_CHART = "mtbert-swept"  # the parallel-coordinates chart of the view's chart tab, and its section


def swept_params(key: str, values: list[Any]) -> list[str]:
    """The MLflow params a swept key's values are logged as: the key itself, or for a mapping
    (loss weights) one param per entry, as mtbert.config.flatten spreads it (loss.weights.sst)."""
    from mtbert.config import flatten

    return list(dict.fromkeys(name for v in values for name in flatten({key: v}))) or [key]


def interval(metric: str) -> list[str]:
    """The ends of a configuration's 95% interval of a figure's mean (tracking.py logs them)."""
    return [f"{metric}_ci_low", f"{metric}_ci_high"]


def runs_view(objective: str, task_metrics: list[str], swept: list[str], ascending: bool = False,
              created_ms: int | None = None, seeds: bool = False) -> str:
    """The tag value of a saved view: MLflow's envelope (name, createdAt, updatedAt, state),
    `state` the JSON of the runs table's UI state (the keys its JS reads). Columns, keyed as the
    UI keys them (tags.`name`, metrics.`name`, ...), best first. The configurations' view
    (default): the swept params as logged (`swept_params`), the objective and overall with
    their intervals, the seeds and diverged seeds, the task scores and the costs. The seeds'
    view (`seeds`): the sweep and seed of each row, why it diverged where it did, the scores, the
    swept params. Its chart tab
    opens on a parallel-coordinates chart of the swept params against the objective."""
    scores = list(dict.fromkeys([objective, "overall", *task_metrics, *VIEW_FIGURES]))
    if seeds:
        columns = ([f"tags.`{t}`" for t in [*VIEW_TAGS, *SEED_TAGS]] + [f"metrics.`{m}`" for m in scores]
                   + [f"params.`{k}`" for k in swept]
                   + ["attributes.`Dataset`", "attributes.`Source`", "attributes.`Models`"])
    else:
        ends = [e for m in dict.fromkeys([objective, "overall"]) for e in interval(m)]
        metrics = list(dict.fromkeys([objective, *ends, *CONFIGURATION_METRICS, *scores]))
        columns = ([f"params.`{k}`" for k in swept] + [f"metrics.`{m}`" for m in metrics]
                   + [f"tags.`{t}`" for t in CONFIGURATION_TAGS])
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
    state = {"searchFilter": SEEDS_FILTER if seeds else CONFIGURATION_FILTER,
             "orderByKey": f"metrics.`{objective}`", "orderByAsc": ascending, "selectedColumns": columns,
             "columnOrder": columns, "columnWidths": widths, "compareRunCharts": [chart],
             "compareRunSections": [section], "isAccordionReordered": True, "runsHiddenMode": "SHOW_ALL"}
    now = int(time.time() * 1000)
    return json.dumps({"name": SEEDS_VIEW_NAME if seeds else VIEW_NAME, "createdAt": created_ms or now,
                       "updatedAt": now, "state": json.dumps(state)})


def save_runs_view(client, experiment_id: str, objective: str, task_metrics: list[str], swept: list[str],
                   ascending: bool = False) -> None:
    """Write (or refresh, for this sweep's tasks and keys) the two views: configurations (the
    one the sweep's link opens) and seeds. `swept`: the params of the swept keys (swept_params)."""
    tags = client.get_experiment(experiment_id).tags or {}
    for key, seeds in ((VIEW_KEY, False), (SEEDS_VIEW_KEY, True)):
        tag = VIEW_TAG_PREFIX + key
        created = None
        if tags.get(tag):
            try:
                created = int(json.loads(tags[tag])["createdAt"])
            except (ValueError, KeyError, TypeError):
                pass
        client.set_experiment_tag(experiment_id, tag,
                                  runs_view(objective, task_metrics, swept, ascending, created, seeds))


def ui_link(base: str, experiment_id: str, key: str = VIEW_KEY) -> str:
    """The experiment's runs table in a saved view (save_runs_view; the configurations' by
    default). MLflow 3.17's UI picks model training over GenAI from a `workflowType` URL
    parameter (else the browser's last choice, GenAI by default), not from the experiment tag,
    so the link carries it."""
    return (f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs"
            f"?workflowType=machine_learning&viewStateShareKey={key}")
