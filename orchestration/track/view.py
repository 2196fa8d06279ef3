"""How a sweep's experiment opens in the MLflow UI: on its runs table, in a saved view.

MLflow 3's UI opens an experiment on its GenAI overview and shows the runs table with its
own default columns. A sweep's reader wants its scores: so the experiment is marked as model
training (mark_experiment), a saved view "mtbert: scores" puts the sweep, seed, scores and
swept params in the table with a chart of the swept dimensions (runs_view, save_runs_view),
and the link the sweep prints opens that view (ui_link). The tag that names a row's sweep is
here because the view shows it; tracking.py writes it on every run.
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



def ui_link(base: str, experiment_id: str) -> str:
    """The experiment's runs table in the sweep's saved view (save_runs_view). MLflow 3.17's UI
    picks model training over GenAI from a `workflowType` URL parameter (else the browser's
    last choice, GenAI by default), not from the experiment tag, so the link carries it."""
    return (f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs"
            f"?workflowType=machine_learning&viewStateShareKey={VIEW_KEY}")
