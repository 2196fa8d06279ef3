"""What a researcher takes away from a sweep, as they get it: the LaTeX and HTML files of
`mtbert leaderboard` (built with pdflatex, opened in a browser where those are installed),
its chosen columns, the Pareto plot, which sweep it reads by default, and what MLflow holds
(the saved view's columns and chart, the sweep's summary on its parent run)."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from mtbert.cli import main
from orchestration.report.plots import MIN_SCORE_SPAN, SIZE_SPREAD, _text_box, pareto_figure
from orchestration.report.reader import child_runs, find_sweep
from orchestration.report.table import LR_HEADER, all_columns, build_table, sort_table, table_keys
from orchestration.sweep.load import load_sweep

from .conftest import SWEEPS, write_sweep

TAGS = {"role": "sweep", "tasks": "sst,para,sts", "task_metrics": "sst_acc,para_acc,sts_corr",
        "space_keys": "sharing.head_regime,optim.lr", "tm_score": "compute"}
# variant -> (role, head regime, lr, mean overall, model size MB); three seeds each.
CONFIGS = {"baseline": ("baseline", "I-I-I", "0.001", 0.600, 90.6), "p000": ("search", "S-I-I", "0.0003", 0.640, 91.2),
           "p001": ("search", "I-S-S", "0.0003", 0.610, 91.8), "p003": ("search", "S-S-I", "0.001", 0.620, 91.0)}
SEED_SHIFT = (-0.012, 0.0, 0.012)
EPOCHS = {"baseline": (2, 2, 2), "p000": (1, 2, 3), "p001": (3, 3, 2), "p003": (1, 1, 1)}


def _trial(client, exp: str, parent: str, variant: str, seed: int, start: int, status: str = "FINISHED",
           tags: dict | None = None, figures: dict | None = None) -> None:
    role, regime, lr, mean, size = CONFIGS.get(variant, ("search", "S-S-S", "0.001", 0.5, 91.0))
    run = client.create_run(exp, run_name=f"{variant}-s{seed}", start_time=start, tags={
        "mlflow.parentRunId": parent, "trial_key": f"{variant}-s{seed}", "variant": variant, "seed": str(seed),
        "role": role, "stopped_early": "false", **(tags or {})})
    score = mean + SEED_SHIFT[seed]
    values = {"overall": score, "sst_acc": score - 0.2, "para_acc": score + 0.1, "sts_corr": score + 0.05,
              "best_epoch": float(EPOCHS.get(variant, (1, 1, 1))[seed]), "train_time_s": 100.0 + 10 * seed,
              "tm_time_s": 100.0 + 10 * seed, "tm_flops": 4e12 * (1 + 0.1 * len(regime.replace("I", ""))) * (1 + 0.01 * seed),
              "model_size_mb": size, "peak_memory_mb": 900.0 + seed, "tm_relative_score": 1.0 + score - 0.6,
              "tm_relative_score_compute": 1.0 + score - 0.6, **(figures or {})}
    params = [Param("sharing.head_regime", regime), Param("optim.lr", lr), Param("train.seed", str(seed))]
    client.log_batch(run.info.run_id, params=params,
                     metrics=[Metric(k, v, 0, 0) for k, v in values.items() if v is not None])
    client.set_terminated(run.info.run_id, status)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Experiment `paper`: sweep paper-1, four configurations x three seeds finished (one seed
    stopped early by ASHA) and a failed trial whose error is not ASCII; then the newer sweep
    paper-2, whose only trials failed or are still running."""
    tmp = tmp_path_factory.mktemp("exports")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("paper", artifact_location=(tmp / "mlartifacts").as_uri())
    older = client.create_run(exp, run_name="paper-1", start_time=1_000, tags=TAGS).info.run_id
    start = 1_001
    for variant in CONFIGS:
        for seed in range(3):
            early = {"stopped_early": "true"} if (variant, seed) == ("p001", 2) else {}
            _trial(client, exp, older, variant, seed, start, tags=early)
            start += 1
    _trial(client, exp, older, "p002", 0, start, "FAILED", tags={"error": "TrainingError: loss → nan (σ ≥ 1e4)"},
           figures={k: None for k in ("overall",)})
    client.set_terminated(older, "FINISHED")
    newer = client.create_run(exp, run_name="paper-2", start_time=3_000, tags=TAGS).info.run_id
    _trial(client, exp, newer, "p000", 0, 3_001, "FAILED", tags={"error": "ValueError: boom"})
    _trial(client, exp, newer, "p001", 0, 3_002, "RUNNING")
    return uri, tmp, client, older


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    """Plots a command draws without --output go under runs/ of the folder it runs in."""
    monkeypatch.chdir(tmp_path)


def _leaderboard(store, tmp_path, capsys, *args: str) -> tuple[str, str]:
    uri = store[0]
    capsys.readouterr()
    code = main(["leaderboard", "--experiment", "paper", "--tracking-uri", uri, *args])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out, err


def _table(store) -> pd.DataFrame:
    uri, _, client, older = store
    experiment_id, parent = find_sweep(uri, "paper", "paper-1")
    return sort_table(build_table(child_runs(uri, experiment_id, parent.info.run_id, *table_keys(parent.data.tags)),
                                  parent.data.tags))


# --------------------------------------------------------------------------- which sweep

def test_the_default_sweep_is_the_latest_with_finished_trials_and_says_so(store, tmp_path, capsys):
    out, err = _leaderboard(store, tmp_path, capsys, "--output", str(tmp_path / "board.md"))
    assert ("sweep paper-1: the latest in 'paper' with finished trials, not the newer paper-2 (none finished)"
            in err.splitlines()), err
    assert "| S-I-I k=all |" in (tmp_path / "board.md").read_text()
    assert main(["leaderboard", "--experiment", "paper", "--tracking-uri", store[0], "--sweep", "paper-2"]) != 0
    assert "sweep paper-2 " in capsys.readouterr().err  # named: that one, though it has nothing finished


# --------------------------------------------------------------------------- LaTeX

def test_latex_export_is_ascii_booktabs_a_page_wide_with_a_legend_for_what_it_shows(store, tmp_path, capsys):
    _leaderboard(store, tmp_path, capsys, "--format", "latex", "--output", str(tmp_path / "board.tex"))
    tex = (tmp_path / "board.tex").read_text()
    assert tex.isascii(), sorted({c for c in tex if not c.isascii()})
    head = tex.splitlines()[:2]
    assert head[0] == "% mtbert leaderboard: paper-1"
    assert r"\usepackage{booktabs}" in head[1] and r"\usepackage{graphicx}" in head[1] and head[1].startswith("%")
    assert r"\begin{table*}" in tex and r"\resizebox{\ifdim\width>\textwidth\textwidth\else\width\fi}{!}" in tex
    assert r"\toprule" in tex and r"\midrule" in tex and r"\bottomrule" in tex
    # A one-line caption above; the legend as notes below the table, in a smaller font.
    caption = re.search(r"\\caption\{(.*)\}", tex)[1]
    assert caption == r"Mean $\pm$ half-width of its 95\% confidence interval over n seeds.", caption
    notes = re.search(r"\{\\footnotesize\\raggedright (.*)\\par\}", tex)[1]
    assert "`" not in notes and len(notes) < 1000, notes
    # The legend names the marks present (stopped early, failed) and no others.
    assert r"$^\dagger$ stopped early" in notes and r"$\times$ failed" in notes
    for absent in (r"$^\ddagger$", "interrupted", r"$\S$", "also searched", "frozen reference"):
        assert absent not in notes, absent
    # The weights are equal on every row: the notes say so instead of a column.
    assert r"Every row: w {[}sst para sts{]} equal." in notes
    # 13 columns: two tables one over the other, each led by the label columns.
    assert tex.count(r"\begin{tabular}{") == 2
    lines = [line.split(" & ") for line in tex.splitlines() if " & " in line]
    heads = [line for line in lines if line[0] == "Regime"]
    rows = {}
    for line in lines:
        # A row's second part goes on after its first, without the label columns again.
        rows[line[0]] = rows[line[0]] + line[2:] if line[0] in rows else line
    header = [re.sub(r"\\begin\{tabular\}\[b\]\{@\{\}[lr]@\{\}\}(.*)\\end\{tabular\}", r"\1", h).replace("\\\\", " ")
              for h in rows["Regime"]]
    assert len(heads) == 2 and all(h[:2] == heads[0][:2] for h in heads)
    assert header[:4] == ["Regime", LR_HEADER, "Overall", r"$\Delta$ overall vs *"], header
    assert "TM-rel. (wall)" not in " ".join(header)  # the headline TM score only: a page holds it
    best = rows["S-I-I k=all"]
    assert best[2].startswith(r"\textbf{0.640}") and r"$\pm$" in best[2]  # the best overall, bold, with its interval
    epoch = header.index("Epoch")
    assert best[epoch] == r"2{\scriptsize\,(1--3)}"  # a count: median (range), never mean $\pm$ interval
    failed = next(line for name, line in rows.items() if name.startswith("S-S-S"))
    assert r"$\times$ (TrainingError: loss $\to$ nan (?" in failed[0]  # every character printable


@pytest.mark.slow
def test_latex_export_builds_with_pdflatex(store, tmp_path, capsys):
    pdflatex = shutil.which("pdflatex")
    if pdflatex is None:
        pytest.skip("pdflatex is not installed (Debian: apt-get install texlive-latex-base texlive-latex-recommended)")
    _leaderboard(store, tmp_path, capsys, "--format", "latex", "--output", str(tmp_path / "board.tex"))
    # A one-column article: the narrowest common page, where 14 columns overflowed by 542 pt.
    (tmp_path / "paper.tex").write_text("\\documentclass{article}\n\\usepackage{booktabs}\n\\usepackage{graphicx}\n"
                                        "\\begin{document}\n\\input{board.tex}\n\\end{document}\n")
    proc = subprocess.run([pdflatex, "-interaction=nonstopmode", "-halt-on-error", "paper.tex"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    log = (tmp_path / "paper.log").read_text(errors="replace")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert (tmp_path / "paper.pdf").stat().st_size > 0
    assert "Overfull \\hbox" not in log and "Unicode character" not in log, log[-3000:]


# --------------------------------------------------------------------------- HTML

def test_html_export_is_a_styled_page_with_each_caption_first(store, tmp_path, capsys):
    _leaderboard(store, tmp_path, capsys, "--format", "html", "--output", str(tmp_path / "board.html"))
    page = (tmp_path / "board.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "<style>" in page and '<meta charset="utf-8">' in page and "<title>mtbert leaderboard: paper-1</title>" in page
    tables = re.findall(r"<table[^>]*>(.*?)</table>", page, re.S)
    assert tables and all(t.lstrip().startswith("<caption>") for t in tables)
    assert "<strong>0.640</strong>" in page  # the best overall


@pytest.mark.slow
def test_html_export_renders_in_a_browser(store, tmp_path, capsys):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium) to render the HTML export")
    from PIL import Image

    _leaderboard(store, tmp_path, capsys, "--format", "html", "--output", str(tmp_path / "board.html"))
    common = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1400,900"]
    url = (tmp_path / "board.html").as_uri()
    subprocess.run([*common, f"--screenshot={tmp_path / 'shot.png'}", url], capture_output=True, timeout=120)
    shot = Image.open(tmp_path / "shot.png").convert("L")
    low, high = shot.getextrema()
    assert shot.size == (1400, 900) and high - low > 100  # something drawn, not a blank page
    dom = subprocess.run([*common, "--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
    # As the browser parsed it: every table's first child is its caption.
    tables = re.findall(r"<table[^>]*>(.*?)</table>", dom, re.S)
    assert tables and all(re.match(r"\s*<caption>", t) for t in tables), dom[:2000]


# What the page measures of itself as the browser lays it out: the document's width against
# the window's, and each table's box (its width, the width of what it holds, its overflow).
MEASURE = """<script>
document.body.setAttribute("data-measured", JSON.stringify({
  page: document.documentElement.scrollWidth, window: window.innerWidth,
  boxes: [...document.querySelectorAll(".scroll")].map(b => ({
    width: b.clientWidth, content: b.scrollWidth, overflow: getComputedStyle(b).overflowX,
    lines: Math.max(...[...b.querySelectorAll("th")].map(h => {
      const s = getComputedStyle(h);
      const text = h.clientHeight - parseFloat(s.paddingTop) - parseFloat(s.paddingBottom);
      return Math.round(text / parseFloat(s.lineHeight)); }))}))}));
</script>"""


@pytest.mark.slow
@pytest.mark.parametrize("columns", [None, "every"])
def test_html_export_fits_a_1280_px_window(columns, store, tmp_path, capsys):
    """Default columns and every column the table has: the page is never wider than the
    window; a table wider than its box scrolls inside it (nothing clipped); a header wraps onto
    two lines at most."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium) to lay out the HTML export")
    every = ["--columns", ",".join(all_columns(_table(store)))] if columns else []
    _leaderboard(store, tmp_path, capsys, "--format", "html", "--output", str(tmp_path / "board.html"), *every)
    page = (tmp_path / "board.html").read_text().replace("</body>", MEASURE + "</body>")
    (tmp_path / "measured.html").write_text(page)
    proc = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           "--disable-background-networking", "--disable-component-update", "--disable-sync",
                           f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,900", "--dump-dom",
                           (tmp_path / "measured.html").as_uri()], capture_output=True, text=True, timeout=120)
    found = re.search(r'data-measured="([^"]*)"', proc.stdout)
    assert found, proc.stdout[-2000:] + proc.stderr[-2000:]
    measured = json.loads(found[1].replace("&quot;", '"'))
    assert measured["window"] == 1280 and measured["page"] <= measured["window"], measured
    for box in measured["boxes"]:
        assert box["width"] <= measured["window"], measured
        assert box["content"] <= box["width"] or box["overflow"] == "auto", measured  # wider: it scrolls
        assert box["lines"] <= 2, measured


# --------------------------------------------------------------------------- columns

def test_columns_are_chosen_by_their_csv_names(store, tmp_path, capsys):
    out, _ = _leaderboard(store, tmp_path, capsys, "--columns", "overall,model_size_mb,lr,best_epoch")
    lines = out.splitlines()
    assert lines[0] == f"| Regime | {LR_HEADER} | Overall | Size (MB) | Epoch |"  # the regime first, then the labels
    caption = lines[lines.index("") + 1]
    assert "TM-rel." not in caption and "Peak mem." not in caption and "Δ overall" not in caption  # not shown
    assert "Epoch: best dev epoch, median (range)." in caption
    row = next(line for line in lines if line.startswith("| S-I-I k=all |"))
    assert row.endswith("| 2 (1–3) |") and row.count("±") == 2  # overall and size carry intervals; the epoch not
    plot = tmp_path / "typo.pareto.png"
    capsys.readouterr()
    assert main(["leaderboard", "--experiment", "paper", "--tracking-uri", store[0], "--columns", "overall,speed",
                 "--output", str(tmp_path / "typo.md")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("mtbert: error: --columns speed: not a column of this table; choose from regime, lr, "
                              "weights, overall, overall_delta, best_epoch, sst_acc,"), err
    assert not plot.exists() and not (tmp_path / "typo.md").exists()  # refused before anything was written


def test_the_importance_table_follows_the_same_rules(store, tmp_path, capsys):
    uri = store[0]
    assert main(["importance", "--experiment", "paper", "--tracking-uri", uri, "--sweep", "paper-1",
                 "--permutations", "99", "--format", "latex", "--output", str(tmp_path / "imp.tex")]) == 0
    tex = (tmp_path / "imp.tex").read_text()
    assert tex.isascii() and r"\begin{table*}" in tex and r"\usepackage{booktabs}" in tex.splitlines()[1]
    # Four configurations of little difference: no key is bold, and the caption says what bold would mean.
    assert r"\textbf{" not in tex.split(r"\midrule")[1] and "the key matters beyond seed noise" in tex
    assert main(["importance", "--experiment", "paper", "--tracking-uri", uri, "--sweep", "paper-1",
                 "--permutations", "99", "--format", "html", "--output", str(tmp_path / "imp.html")]) == 0
    page = (tmp_path / "imp.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and '<table class="mtbert-importance">\n<caption>' in page
    # The leaderboard's own export carries it as a second table, the same way.
    _leaderboard(store, tmp_path, capsys, "--sweep", "paper-1", "--format", "html", "--output",
                 str(tmp_path / "both.html"))
    both = (tmp_path / "both.html").read_text()
    assert both.count("<caption>") == 2 and '<table class="mtbert-importance">\n<caption>' in both


# --------------------------------------------------------------------------- the Pareto plot

def _labels_in_table(store, tmp_path, capsys) -> set[str]:
    out, _ = _leaderboard(store, tmp_path, capsys, "--sweep", "paper-1")
    rows = out.split("\n\n")[0].splitlines()[2:]  # the leaderboard, not the importance table below it
    return {row.split(" | ")[0][2:] for row in rows if "✗" not in row}  # finished rows: the plotted ones


def test_pareto_points_are_labelled_as_the_table_rows_without_overlap(store, tmp_path, capsys):
    fig = pareto_figure(_table(store))
    ax = fig.axes[0]
    texts = [t for t in ax.texts]
    assert {t.get_text() for t in texts} == _labels_in_table(store, tmp_path, capsys)  # every point, the same names
    renderer = fig.canvas.get_renderer()
    boxes = [_text_box(t, renderer) for t in texts]
    assert not [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:] if a.overlaps(b)]


def test_pareto_bars_are_seed_intervals_and_the_axes_do_not_magnify_noise(store):
    from matplotlib.container import ErrorbarContainer

    table = _table(store)
    fig = pareto_figure(table)
    ax = fig.axes[0]
    [bars] = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert bars.has_yerr and bars.has_xerr  # overall and FLOPs both differ between seeds
    done = table[table["status"] == "finished"]
    low, high = ax.get_ylim()
    assert low <= (done["overall"] - done["overall_ci95"]).min() and high >= (done["overall"] + done["overall_ci95"]).max()
    # Configurations 0.005 apart with intervals 0.004 wide: the axis still spans MIN_SCORE_SPAN.
    close = table.copy()
    close.loc[done.index, "overall"] = [0.700 + 0.005 * i for i in range(len(done))]
    close.loc[done.index, "overall_ci95"] = 0.002
    low, high = pareto_figure(close).axes[0].get_ylim()
    assert high - low >= MIN_SCORE_SPAN


def test_pareto_draws_model_size_only_where_it_differs_enough(store):
    table = _table(store)
    fig = pareto_figure(table)  # 90.6-91.8 MB: 1.3% apart
    sizes = {float(s) for c in fig.axes[0].collections if c.get_label() in ("configuration", "on the Pareto front")
             for s in c.get_sizes()}
    assert len(sizes) == 1
    assert any(f"within {SIZE_SPREAD:.0%}, one marker size" in t.get_text() for t in fig.texts)
    wide = table.copy()
    wide.loc[wide["regime"] == "S-I-I k=all", "model_size_mb"] = 182.4  # twice the others: drawn, in proportion
    collections = [c for c in pareto_figure(wide).axes[0].collections
                   if c.get_label() in ("configuration", "on the Pareto front") and len(c.get_offsets())]
    drawn = sorted(float(s) for c in collections for s in c.get_sizes())
    assert drawn[-1] / drawn[0] == pytest.approx(182.4 / 91.0, rel=1e-6)  # marker areas: S-I-I's and S-S-I's


def test_a_crowded_pareto_plot_labels_its_front_and_the_baseline(store):
    import numpy as np

    from orchestration.report.plots import MAX_LABELS, pareto_front

    done = _table(store)
    done = done[done["status"] == "finished"]
    rng = np.random.default_rng(0)
    crowd = pd.concat([done.iloc[[0]]] + [done.iloc[[1]].assign(role="search", regime=f"S-I-I k={i}")
                                          for i in range(MAX_LABELS + 10)], ignore_index=True)
    crowd["overall"] = rng.uniform(0.5, 0.7, len(crowd))
    crowd["tm_flops"] = rng.uniform(3e12, 6e12, len(crowd))
    crowd.attrs.update(done.attrs)
    fig = pareto_figure(crowd)
    front = set(pareto_front(list(zip(crowd["tm_flops"], crowd["overall"])))) | {0}  # and the baseline
    expected = {crowd["regime"][i] + ("*" if i == 0 else "") + (" †" if crowd["stopped_early"][i] else "")
                for i in front}
    assert {t.get_text() for t in fig.axes[0].texts} == expected
    assert any("labels on the Pareto front and the baseline" in t.get_text() for t in fig.texts)


# --------------------------------------------------------------------------- MLflow

def test_a_smoke_run_has_an_experiment_of_its_own():
    assert load_sweep(SWEEPS / "smoke.yaml").experiment == "smoke"
    assert load_sweep(SWEEPS / "smoke.yaml", smoke=True).experiment == "smoke-smoke"


def test_the_saved_view_shows_the_swept_params_as_logged_the_seed_and_the_sweep(tmp_path):
    from orchestration.run.launch import _runs_view
    from orchestration.sweep.plan import Planner
    from orchestration.track.tracking import SweepTracking, check_tracking

    from .test_tracking import run_trial

    sweep = load_sweep(write_sweep(tmp_path / "view.yaml", space={"loss.weights": {"type": "simplex"},
                                                                   "sharing.head_regime": ["S-I-I", "I-S-S"]},
                                   search={"algorithm": "random", "seed": 0}, num_samples=2))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    check_tracking(uri)
    tracking = SweepTracking.start(uri, "view", "view-1", sweep.name, {"tasks": "sst,para,sts"}, None,
                                   view=_runs_view(sweep))
    try:
        tags = tracking.client.get_experiment(tracking.experiment_id).tags
        weights = ["params.`loss.weights.sst`", "params.`loss.weights.para`", "params.`loss.weights.sts`"]
        # The configurations' view opens on what was swept; the seeds' on which sweep and seed.
        state = json.loads(json.loads(tags["mlflow.sharedViewState.mtbert"])["state"])
        assert state["selectedColumns"][:4] == [*weights, "params.`sharing.head_regime`"]
        state = json.loads(json.loads(tags["mlflow.sharedViewState.mtbert-seeds"])["state"])
        assert set(weights) <= set(state["selectedColumns"]) and "params.`loss.weights`" not in state["selectedColumns"]
        assert state["selectedColumns"][:2] == ["tags.`sweep_run`", "tags.`seed`"]
        [chart] = state["compareRunCharts"]
        assert chart["type"] == "PARALLEL" and chart["selectedMetrics"] == ["overall"]
        assert chart["selectedParams"] == ["loss.weights.sst", "loss.weights.para", "loss.weights.sts",
                                           "sharing.head_regime"]
        assert [s["uuid"] for s in state["compareRunSections"]] == [chart["metricSectionId"]]
        # A searched trial's run carries what those columns read.
        trial = next(t for t in Planner(sweep).fixed_trials() if t["role"] == "baseline")
        trial = {**trial, "config": {**trial["config"], "loss": {**trial["config"]["loss"],
                                                                 "weights": {"sst": 0.2, "para": 0.3, "sts": 0.5}}}}
        run = tracking.client.get_run(run_trial(tracking, trial, [0.4, 0.5], 1.0, 1.0))
        assert run.data.tags["sweep_run"] == "view-1" and run.data.tags["seed"] == str(trial["seed"])
        assert {k: run.data.params[k] for k in ("loss.weights.sst", "loss.weights.para", "loss.weights.sts")} == \
            {"loss.weights.sst": "0.2", "loss.weights.para": "0.3", "loss.weights.sts": "0.5"}
    finally:
        tracking.release()


def test_the_parent_run_carries_the_sweeps_summary(tmp_path):
    from orchestration.run.launch import _log_summary
    from orchestration.stats import mean_ci
    from orchestration.sweep.plan import Planner
    from orchestration.track.tracking import SweepTracking, check_tracking

    from .test_tracking import run_trial

    sweep = load_sweep(write_sweep(tmp_path / "sum.yaml", space={"sharing.head_regime": ["S-I-I", "I-S-S"]},
                                   seeds=[0, 1], base={"train": {"epochs": 3}}))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    check_tracking(uri)
    tracking = SweepTracking.start(uri, "sum", "sum-1", sweep.name, {"tasks": "sst,para,sts"}, None)
    try:
        trials = {t["key"]: t for t in Planner(sweep).fixed_trials()}
        run_trial(tracking, trials["baseline-s0"], [0.30, 0.40, 0.35], 10.0, 2.0)
        run_trial(tracking, trials["baseline-s1"], [0.32, 0.42, 0.41], 10.0, 2.0)
        run_trial(tracking, trials["p000-s0"], [0.30, 0.50, 0.50], 5.0, 1.0)
        run_trial(tracking, trials["p000-s1"], [0.30, 0.44, 0.60], 5.0, 1.0)
        run_trial(tracking, trials["p001-s0"], [0.20, 0.30], 4.0, 1.5)  # 2 of 3 epochs: stopped early
        run_trial(tracking, trials["p001-s1"], [0.10], 4.0, 1.5, status="FAILED", error="ValueError: boom")
        _log_summary(tracking, tracking.children())
        assert tracking.flush()
        parent = tracking.client.get_run(tracking.parent_run_id)
        mean, half, n = mean_ci([0.50, 0.60])  # p000: the best mean overall over its seeds
        assert parent.data.tags["best_config"] == "p000"
        assert parent.data.metrics["best_config_overall"] == pytest.approx(mean)
        assert parent.data.metrics["best_config_overall_ci95"] == pytest.approx(half)
        assert parent.data.metrics["best_config_n"] == n == 2
        assert {k: parent.data.metrics[k] for k in ("trials", "trials_finished", "trials_stopped_early",
                                                    "trials_failed", "trials_interrupted")} == \
            {"trials": 6, "trials_finished": 5, "trials_stopped_early": 1, "trials_failed": 1, "trials_interrupted": 0}
    finally:
        tracking.release()
