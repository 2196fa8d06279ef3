"""`mtbert leaderboard`: a sweep as the papers print it, its Pareto plot and the importance its
parent run holds, in one call.

    mtbert leaderboard --experiment smoke --format md

The parts, each a module of report/:

    reader.py   the sweep's runs and artifacts in MLflow (find_sweep, child_runs, log_artifact)
    table.py    the table: a row per configuration (build_table, sort_table), its cells and caption
    plots.py    the Pareto plot (plot_pareto) and the importance bar chart
    export.py   the formats (FORMATS: md, csv, latex, html)

This module joins them: render (the table, then the importance, in one document),
leaderboard (`mtbert leaderboard`) and log_leaderboard (the parent run's leaderboard.md,
leaderboard.csv and pareto.png at the end of a sweep).
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from orchestration.errors import SweepError
from orchestration.report import affinity as aff, export, importance as imp, reader
from orchestration.report.plots import plot_pareto
from orchestration.report.table import build_table, export_table, sort_table, table_keys

PARETO_ARTIFACT = "pareto.png"  # the parent run's one Pareto plot


def render(table: pd.DataFrame, fmt: str, importance: pd.DataFrame | None = None,
           columns: Sequence[str] | None = None, title: str = "", affinity: pd.DataFrame | None = None) -> str:
    """The table in `fmt` (its `columns`, default_columns when None); md, latex and html follow
    it with the importance table when given, then the inter-task affinity table (csv stays one
    table: the importance is a csv of its own, importance.render). `title` names the sweep in a
    LaTeX comment and the HTML page."""
    def tables() -> list[export.Table]:
        found = [export_table(table, columns, fmt)]
        if importance is not None and not importance.empty:
            found.append(imp.export_table(importance))
        if affinity is not None and fmt != "md":
            found.append(aff.export_table(affinity))
        return found

    title = f"mtbert leaderboard: {title}" if title else "mtbert leaderboard"
    # The table itself is the csv: machines get the numbers, not the formatted cells.
    text = export.render(fmt, export.Document(title, table, tables, f"\n**{imp.IMPORTANCE_HEADING}**\n\n"))
    if affinity is not None and fmt == "md":  # under a heading of its own
        text += f"\n**{aff.HEADING}**\n\n" + export.markdown(aff.export_table(affinity))
    return text


def log_leaderboard(tracking) -> bool:
    """The sweep's table (leaderboard.md, leaderboard.csv) and Pareto plot (pareto.png) on its
    parent run, drawn from the final figures: at the end of every run and resume, so the
    parent never keeps a stale one. The markdown carries the importance the parent holds for
    these runs (importance.log_importance, the step before)."""
    parent = tracking.client.get_run(tracking.parent_run_id)
    runs = reader.child_runs(tracking.uri, tracking.experiment_id, tracking.parent_run_id,
                             *table_keys(parent.data.tags))
    table = sort_table(build_table(runs, parent.data.tags))
    if table.empty:
        return False
    importance, _ = imp.stored(tracking.uri, parent, table)
    affinity = aff.section(tracking.uri, tracking.experiment_id, parent)
    with tempfile.TemporaryDirectory() as tmp:
        plot_pareto(table, Path(tmp) / PARETO_ARTIFACT, title=parent.info.run_name)
        (Path(tmp) / "leaderboard.md").write_text(render(table, "md", importance, affinity=affinity))
        (Path(tmp) / "leaderboard.csv").write_text(render(table, "csv"))
        for name in (PARETO_ARTIFACT, "leaderboard.md", "leaderboard.csv"):
            tracking.client.log_artifact(tracking.parent_run_id, str(Path(tmp) / name))
    return True


def leaderboard(uri: str, experiment: str, sweep: str | None = None, fmt: str = "md",
                sort: str = "overall", plot: str | Path | None = None,
                importance_plot: str | Path | None = None, columns: Sequence[str] | None = None,
                say=None) -> tuple[str, pd.DataFrame, Any]:
    """(rendered table, the table, the parent run); draws and logs the Pareto plot if `plot`.
    The importance the parent holds for these runs follows the table (md, latex, html) and is
    drawn to `importance_plot`; importance.stored says why when there is none. `columns`:
    the printed table's (render); `say`: where find_sweep says which sweep it chose."""
    experiment_id, parent = reader.find_sweep(uri, experiment, sweep, say)
    runs = reader.child_runs(uri, experiment_id, parent.info.run_id, *table_keys(parent.data.tags))
    table = sort_table(build_table(runs, parent.data.tags), sort)
    if table.empty:
        raise SweepError(f"sweep {parent.info.run_name} ({parent.info.run_id}) has no finished trials yet")
    importance, _ = imp.stored(uri, parent, table)
    affinity = aff.section(uri, experiment_id, parent)
    # Rendered first: a --columns typo is one line before any file is written.
    text = render(table, fmt, importance, columns, title=parent.info.run_name, affinity=affinity)
    if plot is not None:
        path = plot_pareto(table, plot, title=parent.info.run_name)
        # Under the sweep's own name for it: each export replaces the one plot the parent holds.
        reader.log_artifact(uri, parent, path, PARETO_ARTIFACT)
    if importance is not None and importance_plot is not None:
        imp.plot_importance(importance, importance_plot, title=parent.info.run_name)
    return text, table, parent
