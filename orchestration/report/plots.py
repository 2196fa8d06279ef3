"""The report's figures: the sweep's Pareto plot and the importance bar chart.

    plot_pareto(table, "runs/smoke-pareto.png")     # a leaderboard table (table.build_table)
    save(importance_figure(found, title, paired=False, alpha=0.05), "runs/smoke-importance.png")

(importance.plot_importance draws its table with its own `paired` and `alpha`.)

The Pareto plot puts overall against the headline score's cost on the full-epoch-budget basis
(tm.py), so trials ASHA stopped are not drawn as cheap: one point per finished configuration,
labelled as its table row, its seeds' 95% intervals as bars, the non-dominated configurations
joined by a step line. matplotlib is imported only when a figure is drawn, with its file-only
backend (Agg).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from orchestration.report.table import TM_COLUMNS, figure_label, row_label, tm_column


def save(fig, path: str | Path) -> Path:
    """The figure as a PNG at `path` (its folder made), then closed."""
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- Pareto plot

def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the non-dominated points for (time: lower better, score: higher better)."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, best = [], -math.inf
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front


def cost_axis(table: pd.DataFrame) -> str:
    """The Pareto plot's cost: the headline TM score's, counted FLOPs or measured seconds, both
    on the full-epoch-budget basis."""
    return "tm_flops" if tm_column(table) == TM_COLUMNS["compute"] and "tm_flops" in table else "tm_time_s"


# Model sizes closer than this (max/min − 1) are one marker size: 90.6 and 91.8 MB drawn as
# the smallest and largest marker would make a 1% difference look like the plot's widest.
SIZE_SPREAD = 0.05
# The overall axis spans at least this much: a 0.005 gap between configurations whose
# intervals are 0.02 wide must not fill the plot's height.
MIN_SCORE_SPAN = 0.05
MIN_COST_SPAN = 0.3  # the cost axis spans at least this share of the largest cost
MARKER_AREA = 60.0  # points², the largest model's marker (areas are proportional to size)
# Points labelled at most: past it a plot is a cloud, labels would hide it and placing them
# costs seconds; the Pareto front and the baseline keep theirs (said below the plot).
MAX_LABELS = 40


def point_labels(data: pd.DataFrame) -> list[str]:
    """The plot's name for each row: its label in the table (regime and marks), with the
    learning rate and weights added where rows would otherwise share a label."""
    records = data.to_dict("records")
    labels = [row_label(r) for r in records]
    for label in {x for x in labels if labels.count(x) > 1}:
        same = [i for i, x in enumerate(labels) if x == label]
        extra = [k for k in ("lr", "weights") if len({str(records[i][k]) for i in same}) > 1]
        for i in same:
            labels[i] = " ".join([label, *(f"lr={records[i][k]}" if k == "lr" else f"w={records[i][k]}"
                                           for k in extra)])
    return labels


def _halves(data: pd.DataFrame, key: str) -> pd.Series:
    """A column's 95% CI half-widths, 0 where there is none (one seed)."""
    col = f"{key}_ci95"
    return data[col].fillna(0.0) if col in data else pd.Series(0.0, index=data.index)


def _score_limits(y: pd.Series, half: pd.Series) -> tuple[float, float]:
    """Every interval inside, a margin in proportion to the widest, and MIN_SCORE_SPAN at
    least: the axis never magnifies differences the intervals say are noise."""
    low, high = float((y - half).min()), float((y + half).max())
    margin = max(0.5 * float(half.max()), 0.1 * (high - low))
    span = max(high - low + 2 * margin, MIN_SCORE_SPAN)
    middle = (low + high) / 2
    return middle - span / 2, middle + span / 2


def _cost_limits(x: pd.Series, half: pd.Series) -> tuple[float, float]:
    """Every interval inside with a margin, and at least MIN_COST_SPAN of the largest cost
    wide (from zero when that reaches it): a 2% cost gap never spans the plot's width."""
    low, high = float((x - half).min()), float((x + half).max())
    margin = 0.08 * (high - low)
    # `or 1.0`: every cost zero (head-only trials counted by encoder FLOPs) still gets an axis
    span = max(high - low + 2 * margin, MIN_COST_SPAN * high) or 1.0
    middle = (low + high) / 2
    start = max(middle - span / 2, 0.0)
    return start, start + span


def _place_labels(ax, xs: list[float], ys: list[float], labels: list[str], areas: list[float],
                  xerr: list[float], yerr: list[float]) -> None:
    """Each point's label ("": none) at the first spot, nearest first on rings around the
    point, that covers no marker, other label or error bar and stays inside the axes; where
    none is clear, the spot that covers least (a bar's thin line counting for less than a
    marker or a word). A label set away from its point gets a leader line."""
    renderer = ax.figure.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    scale = ax.figure.dpi / 72  # points to pixels
    centres = ax.transData.transform(list(zip(xs, ys)))
    taken = []  # (x0, y0, x1, y1, weight)
    for (px, py), area in zip(centres, areas):
        r = math.sqrt(area) / 2 * scale + 1
        taken.append((px - r, py - r, px + r, py + r, 1.0))
    for x, y, dx, dy in zip(xs, ys, xerr, yerr):
        (left, low), (right, high) = ax.transData.transform([(x - dx, y - dy), (x + dx, y + dy)])
        px, py = ax.transData.transform((x, y))
        cap = 3 * scale
        if dy > 0:
            taken.append((px - cap, low, px + cap, high, 0.3))
        if dx > 0:
            taken.append((left, py - cap, right, py + cap, 0.3))
    angles = [math.radians(a) for a in (45, -45, 135, -135, 0, 180, 90, -90, 20, -20, 160, -160, 70, -70, 110, -110)]
    spots = [(r * math.cos(a), r * math.sin(a)) for r in (5, 12, 20, 30, 42, 56, 72, 90) for a in angles]

    def overlap(box) -> float:
        outside = (max(frame.x0 - box.x0, 0) + max(box.x1 - frame.x1, 0)) * box.height + \
                  (max(frame.y0 - box.y0, 0) + max(box.y1 - frame.y1, 0)) * box.width
        return outside + sum(w * max(0.0, min(box.x1, x1) - max(box.x0, x0)) * max(0.0, min(box.y1, y1) - max(box.y0, y0))
                             for x0, y0, x1, y1, w in taken)

    def annotate(i: int, dx: float, dy: float):
        far = math.hypot(dx, dy) > 6
        text = ax.annotate(labels[i], (xs[i], ys[i]), xytext=(dx, dy), textcoords="offset points", fontsize=7,
                           ha="left" if dx > 1 else "right" if dx < -1 else "center",
                           va="bottom" if dy > 1 else "top" if dy < -1 else "center",
                           arrowprops=dict(arrowstyle="-", lw=0.5, color="0.5", shrinkA=0, shrinkB=3) if far else None)
        return text, _text_box(text, renderer)

    for i in sorted((i for i, label in enumerate(labels) if label), key=lambda i: -ys[i]):  # "": no label
        best = None
        for dx, dy in spots:
            text, box = annotate(i, dx, dy)
            cost = overlap(box)
            if best is None or cost < best[0]:
                if best is not None:
                    best[1].remove()
                best = (cost, text, box)
            else:
                text.remove()
            if cost == 0:
                break
        box = best[2]
        taken.append((box.x0, box.y0, box.x1, box.y1, 1.0))


def _text_box(text, renderer):
    """An annotation's text alone: its window extent also spans its leader line, which may
    cross other labels' lines."""
    from matplotlib.text import Text

    text.update_positions(renderer)
    return Text.get_window_extent(text, renderer)


def plot_pareto(table: pd.DataFrame, path: str | Path, title: str = "") -> Path:
    """The Pareto plot (pareto_figure) as a PNG at `path`."""
    return save(pareto_figure(table, title), path)  # the figure first: it picks matplotlib's file-only backend


def pareto_figure(table: pd.DataFrame, title: str = ""):
    """Overall against cost, one point per finished configuration, labelled as its table row,
    with its seeds' 95% intervals as bars; the axes never zoom so far that noise looks like a
    difference; marker area gives model size where sizes differ by more than SIZE_SPREAD; the
    non-dominated configurations are joined by a step line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = cost_axis(table)
    data = table[table["status"] == "finished"] if "status" in table else table
    data = data.dropna(subset=["overall", x]) if not data.empty else data
    fig, ax = plt.subplots(figsize=(8, 5), dpi=130)
    ax.set_xlabel("training FLOPs on the full epoch budget" if x == "tm_flops"
                  else "train time on the full epoch budget (s)")
    ax.set_ylabel("best dev overall")
    ax.set_title(title or ("overall vs training compute" if x == "tm_flops" else "overall vs train time"), fontsize=10)
    ax.grid(alpha=0.3)
    notes = [] if data.empty else _draw_configurations(fig, ax, data.reset_index(drop=True), x)
    if notes:
        fig.text(0.01, 0.01, "; ".join(notes), fontsize=7, color="0.35", ha="left", va="bottom")
    if data.empty:
        fig.tight_layout()
    return fig


def _draw_configurations(fig, ax, data: pd.DataFrame, x: str) -> list[str]:
    """The points, their bars, the front, the axes' limits, the legend and the labels of a
    non-empty plot; returns the notes for below it."""
    xerr, yerr = _halves(data, x), _halves(data, "overall")
    notes = _error_bars(ax, data, x, xerr, yerr)
    sizes = data["model_size_mb"]
    low, high = float(sizes.min()), float(sizes.max())
    by_size = low > 0 and high / low - 1 > SIZE_SPREAD
    area = MARKER_AREA * sizes / high if by_size else pd.Series(MARKER_AREA * 0.6, index=data.index)
    if not by_size and high > 0:
        notes.append(f"model size {low:.1f}–{high:.1f} MB: within {SIZE_SPREAD:.0%}, one marker size"
                     if high > low else f"model size {low:.1f} MB")
    front = pareto_front(list(zip(data[x], data["overall"])))
    on_front = data.index.isin(front)
    base = (data["role"] == "baseline").to_numpy()
    marks = area.where(~base, area * 3)  # the baseline's star is larger
    _scatter(ax, data, x, marks, on_front, base)
    fx, fy = data.loc[front, x], data.loc[front, "overall"]
    ax.step(fx, fy, where="post", color="tab:blue", linewidth=1, alpha=0.7, zorder=1, label="Pareto front")
    ax.set_xlim(*_cost_limits(data[x], xerr))
    ax.set_ylim(*_score_limits(data["overall"], yerr))
    _legend(ax, (low, high) if by_size else None)
    labels = point_labels(data)
    if len(data) > MAX_LABELS:
        labels = [label if on_front[i] or base[i] else "" for i, label in enumerate(labels)]
        notes.append(f"{len(data)} configurations: labels on the Pareto front and the baseline")
    fig.tight_layout(rect=(0, 0.05 if notes else 0, 1, 1))
    _place_labels(ax, list(data[x]), list(data["overall"]), labels, list(marks), list(xerr), list(yerr))
    return notes


def _error_bars(ax, data: pd.DataFrame, x: str, xerr: pd.Series, yerr: pd.Series) -> list[str]:
    """The seeds' 95% intervals as bars, where any configuration has one; the note that says so."""
    if bool((yerr > 0).any()) or bool((xerr > 0).any()):
        ax.errorbar(data[x], data["overall"], xerr=xerr if bool((xerr > 0).any()) else None,
                    yerr=yerr if bool((yerr > 0).any()) else None, fmt="none", ecolor="0.45",
                    elinewidth=0.8, capsize=2.5, zorder=1)
        return [f"bars: 95% confidence interval over seeds (n = {data['n'].min():g}"
                + (f"–{data['n'].max():g})" if data["n"].max() != data["n"].min() else ")")]
    if bool((data["n"] == 1).all()):
        return ["one seed per configuration: no intervals"]
    return []


def _scatter(ax, data: pd.DataFrame, x: str, marks: pd.Series, on_front, base) -> None:
    """The configurations off the front, on it, and the baseline's star, in that order."""
    for pick, style in [(~base & ~on_front, dict(c="#9fb7d4", edgecolors="#3b5b85", linewidths=0.6, zorder=2,
                                                 label="configuration")),
                        (~base & on_front, dict(c="tab:blue", edgecolors="black", linewidths=0.6, zorder=3,
                                                label="on the Pareto front")),
                        (base, dict(marker="*", c="tab:red", edgecolors="black", linewidths=0.5, zorder=4,
                                    label="baseline *"))]:
        ax.scatter(data[x][pick], data["overall"][pick], s=marks[pick], **style)


def _legend(ax, sizes: tuple[float, float] | None) -> None:
    """One legend right of the axes (a second one is left out of the layout): the markers, then
    where marker area gives model size (`sizes`: the smallest and largest, MB) a heading and two sizes."""
    handles, names = ax.get_legend_handles_labels()
    if sizes is not None:
        low, high = sizes
        handles += [ax.scatter([], [], s=0, c="none"),
                    *(ax.scatter([], [], s=MARKER_AREA * mb / high, c="white", edgecolors="0.3")
                      for mb in (low, high))]
        names += ["marker area ∝ model size:", f"{low:.1f} MB", f"{high:.1f} MB"]
    ax.legend(handles, names, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)


# --------------------------------------------------------------------------- importance

def importance_figure(found: pd.DataFrame, title: str = "", *, paired: bool, alpha: float):
    """A bar per dimension, one panel per figure, of an importance table (importance.COLUMNS):
    its share, dark where the key matters (p <= `alpha`), pale where it is not told apart from
    seed noise; `paired` (two configurations): their paired difference with its interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = list(dict.fromkeys(found["figure"])) or [""]
    dims = list(found.groupby("dimension", sort=False)["importance"].mean().sort_values(na_position="first").index)
    fig, axes = plt.subplots(1, len(order), figsize=(2.6 * len(order) + 1.6, 0.45 * len(dims) + 1.6),
                             dpi=120, sharey=True, squeeze=False)
    for ax, figure in zip(axes[0], order):
        part = found[found["figure"] == figure].set_index("dimension").reindex(dims)
        matters = part["matters"].astype(object).fillna(False).astype(bool).to_numpy()
        colours = ["tab:blue" if m else "lightsteelblue" for m in matters]
        if paired:
            effect = part["effect"].to_numpy(dtype=float)
            ax.barh(range(len(dims)), np.nan_to_num(effect), color=colours)
            low, high = part["low"].to_numpy(dtype=float), part["high"].to_numpy(dtype=float)
            ax.errorbar(effect, range(len(dims)), xerr=[effect - low, high - effect], fmt="none", ecolor="black",
                        capsize=3)
            ax.axvline(0, color="black", lw=0.8)
        else:
            ax.barh(range(len(dims)), part["importance"].fillna(0.0), color=colours)
            for i, p in enumerate(part["p"].to_numpy(dtype=float)):
                if not math.isnan(p):
                    ax.text(0.98, i, f"p {p:.3f}", ha="right", va="center", fontsize=7)
            ax.set_xlim(0, 1)
        ax.set_yticks(range(len(dims)), dims, fontsize=8)
        ax.set_title(figure_label(figure), fontsize=9)
        ax.grid(axis="x", alpha=0.3)
    axes[0][0].set_ylabel("configurations" if paired else "swept key")
    fig.supxlabel("paired difference (second - first)" if paired else
                  f"share of the figure's variance (fANOVA); dark: p <= {alpha}", fontsize=9)
    fig.suptitle(title or "importance of the swept dimensions", fontsize=10)
    fig.tight_layout()
    return fig
