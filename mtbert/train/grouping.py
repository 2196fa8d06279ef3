"""From inter-task affinities to a grouping of the tasks, and from a grouping to mtbert's sharing
keys (docs/affinity.md). Plain data in, plain data out: no torch, no MLflow (numpy, and matplotlib for a heatmap); the telemetry
(mtbert/train/affinity.py), the leaderboard's affinity section and `mtbert affinity` read it.

The affinities are TAG's lookahead Z(i -> j) (how a step on task i's loss changes task j's), each
a run's mean over its epochs. A grouping is a partition of the tasks; its score is TAG's: each
task's mean affinity from the other members of its group, summed over the tasks (a task alone
scores 0, so a group pays only where its members help each other):

    score(P) = sum_j  mean_{i in G(j), i != j} Z(i -> j)        G(j): the group of j in P

Every partition is scored for up to EXHAUSTIVE tasks (Bell(8) = 4140 partitions); beyond, a beam
search adds the tasks one at a time to a group or a new one, keeping the BEAM best partial
groupings (the search TAG runs beyond a few tasks is a branch and bound over the same score).

What mtbert's sharing keys can express: the encoder's bottom k layers are shared by every task
(sharing.encoder_shared_layers), and the hidden head layers marked S by one set of tasks
(sharing.head_share_tasks), every other task having its own. So a grouping is expressible when
at most one group has several tasks; `expressible` finds the best such grouping, which is what
the sweep fragment runs.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

AFFINITY, COSINE = "affinity", "cosine"
WHOLE, ENCODER, HEADS = "", "encoder", "heads"  # the shared parts a series may be of ("": all of them)
PAIR_SEPARATOR = "-to-"  # affinity/sst-to-para: MLflow names allow no '>', task names no '-'
FOLDER = "affinity"  # under a run's output folder: JSON_FILE and a heatmap per epoch (epoch-<n>.png)
JSON_FILE = "affinity.json"
EXHAUSTIVE = 8  # tasks up to which every partition is scored
BEAM = 64  # partial groupings the beam search keeps beyond that

Affinities = dict[tuple[str, str], float]  # (i, j) -> Z(i -> j)
Grouping = tuple[tuple[str, ...], ...]


def head_layer(depth: int) -> str:
    """The part name of one shared hidden head layer (1 = nearest the encoder)."""
    return f"head-layer-{depth}"


def encoder_layer(depth: int) -> str:
    """The part name of one shared encoder layer (1 = nearest the embeddings)."""
    return f"encoder-layer-{depth}"


def series_name(kind: str, first: str, second: str, part: str = WHOLE) -> str:
    """affinity/<i>-to-<j> (i's step, j's loss) or cosine/<i>-<j>, under the part's name when
    it is one part of the shared set: affinity/encoder/sst-to-para."""
    pair = f"{first}{PAIR_SEPARATOR}{second}" if kind == AFFINITY else f"{first}-{second}"
    return "/".join(x for x in (kind, part, pair) if x)


def parse_name(name: str) -> tuple[str, str, str, str] | None:
    """(kind, part, first, second) of a series name, None for any other name."""
    parts = name.split("/")
    if len(parts) not in (2, 3) or parts[0] not in (AFFINITY, COSINE):
        return None
    part = parts[1] if len(parts) == 3 else WHOLE
    pair = parts[-1].split(PAIR_SEPARATOR) if parts[0] == AFFINITY else parts[-1].split("-")
    if len(pair) != 2 or not all(pair):
        return None
    return parts[0], part, pair[0], pair[1]


def affinities(means: dict[str, float], part: str = WHOLE) -> Affinities:
    """The Z(i -> j) of one part from a dict of series values (other names ignored)."""
    out: Affinities = {}
    for name, value in means.items():
        parsed = parse_name(name)
        if parsed and parsed[0] == AFFINITY and parsed[1] == part and not math.isnan(value):
            out[(parsed[2], parsed[3])] = value
    return out


def mean_over_epochs(epochs: dict[int, dict[str, float]]) -> dict[str, float]:
    """Each series' mean over the epochs that measured it (TAG averages over training)."""
    names = {n for m in epochs.values() for n in m}
    return {n: float(np.mean([m[n] for m in epochs.values() if n in m])) for n in sorted(names)}


def tasks_of(z: Affinities) -> list[str]:
    return list(dict.fromkeys(t for pair in z for t in pair))


# --------------------------------------------------------------------------- the score

def onto(task: str, group: Sequence[str], z: Affinities) -> float:
    """Task's mean affinity from the other members of its group (0 alone; a pair not measured
    counts 0)."""
    others = [i for i in group if i != task]
    return sum(z.get((i, task), 0.0) for i in others) / len(others) if others else 0.0


def score(grouping: Sequence[Sequence[str]], z: Affinities) -> float:
    """TAG's score of a grouping: the sum over tasks of `onto`."""
    return sum(onto(t, g, z) for g in grouping for t in g)


def canonical(grouping: Sequence[Sequence[str]], order: Sequence[str]) -> Grouping:
    """Groups and their tasks in `order`'s order: one spelling per partition."""
    rank = {t: k for k, t in enumerate(order)}
    groups = [tuple(sorted(g, key=rank.__getitem__)) for g in grouping if g]
    return tuple(sorted(groups, key=lambda g: rank[g[0]]))


def partitions(items: Sequence[str]) -> Iterator[list[list[str]]]:
    """Every partition of `items` (the first item's group, then the rest's partitions)."""
    if not items:
        yield []
        return
    first, rest = items[0], list(items[1:])
    for partition in partitions(rest):
        yield [[first]] + partition
        for k in range(len(partition)):
            yield partition[:k] + [[first] + partition[k]] + partition[k + 1:]


def beam_partitions(items: Sequence[str], z: Affinities, width: int = BEAM) -> list[list[list[str]]]:
    """Partitions built one task at a time (into a group or a new one), the `width` best partial
    ones kept at each step (and for each number of groups, so every size stays in reach)."""
    beam: list[list[list[str]]] = [[]]
    for task in items:
        grown = [p[:k] + [p[k] + [task]] + p[k + 1:] for p in beam for k in range(len(p))] + [p + [[task]] for p in beam]
        by_size: dict[int, list[list[list[str]]]] = {}
        for p in sorted(grown, key=lambda p: -score(p, z)):
            by_size.setdefault(len(p), []).append(p)
        beam = [p for ps in by_size.values() for p in ps[:max(1, width // len(by_size))]]
    return beam


def best_groupings(tasks: Sequence[str], z: Affinities) -> dict[int, tuple[float, Grouping]]:
    """For each number of groups, the best grouping found and its score: every partition up to
    EXHAUSTIVE tasks, a beam search beyond."""
    tasks = list(tasks)
    found = partitions(tasks) if len(tasks) <= EXHAUSTIVE else beam_partitions(tasks, z)
    best: dict[int, tuple[float, Grouping]] = {}
    for p in found:
        g, s = canonical(p, tasks), score(p, z)
        k = len(g)
        # Ties go to the spelling first in order, so a result never depends on the search's path.
        if k not in best or s > best[k][0] + 1e-12 or (abs(s - best[k][0]) <= 1e-12 and g < best[k][1]):
            best[k] = (s, g)
    return dict(sorted(best.items()))


def best_grouping(tasks: Sequence[str], z: Affinities) -> tuple[float, Grouping]:
    """The best grouping of any size (the fewest groups among equal scores: less to train)."""
    found = best_groupings(tasks, z)
    return max(found.values(), key=lambda sg: (round(sg[0], 12), -len(sg[1])))


def expressible(tasks: Sequence[str], z: Affinities) -> tuple[float, Grouping]:
    """The best grouping with at most one group of several tasks: what sharing.head_share_tasks
    can train (every subset of two or more tasks, and every task alone)."""
    tasks = list(tasks)
    alone = canonical([[t] for t in tasks], tasks)
    best = (score(alone, z), alone)
    for size in range(len(tasks), 1, -1):
        for group in itertools.combinations(tasks, size):
            g = canonical([list(group)] + [[t] for t in tasks if t not in group], tasks)
            s = score(g, z)
            if s > best[0] + 1e-12:
                best = (s, g)
    return best


# --------------------------------------------------------------------------- the sharing keys

def sharing_keys(grouping: Grouping, tasks: Sequence[str], head_depth: int) -> dict:
    """The sharing keys that train an expressible grouping: its group's tasks share every hidden
    head layer (S x head_depth, at least one), all tasks when the group is all of them; every
    task alone: no head layer shared. Raises ValueError for a grouping with two groups of
    several tasks (none of mtbert's keys trains it)."""
    groups = [list(g) for g in grouping if len(g) > 1]
    if len(groups) > 1:
        raise ValueError(f"grouping {format_grouping(grouping)}: two groups of several tasks; "
                         "sharing.head_share_tasks names one")
    depth = max(1, head_depth)
    if not groups:
        return {"sharing.head_regime": "-".join(["I"] * depth), "sharing.head_share_tasks": None}
    share = None if len(groups[0]) == len(tasks) else groups[0]
    return {"sharing.head_regime": "-".join(["S"] * depth), "sharing.head_share_tasks": share}


def layer_scores(means: dict[str, float], tasks: Sequence[str], part, layers: int) -> list[float] | None:
    """TAG's score of all tasks in one group on each of `layers` layers measured alone (the
    part names `part(1)`, `part(2)`, ...): what the regimes and depths below add up. None when
    a layer's affinities are missing."""
    per_layer = []
    for k in range(1, layers + 1):
        z = affinities(means, part(k))
        if not z:
            return None
        per_layer.append(score([list(tasks)], z))
    return per_layer


def regime_scores(means: dict[str, float], tasks: Sequence[str], depth: int) -> dict[str, float] | None:
    """A predicted score of every S/I head regime of `depth` hidden layers, from one run that
    shares every head layer (S-...-S) and measured each alone (head-layer-k): a regime's score is
    TAG's score of all tasks in one group on each layer it shares, summed over those layers
    (I-...-I scores 0). So a layer whose tasks help each other counts for sharing it, one where
    they hurt each other against. None when a layer's affinities are missing."""
    per_layer = layer_scores(means, tasks, head_layer, depth)
    if per_layer is None:
        return None
    return {"-".join(letters): sum(v for v, letter in zip(per_layer, letters) if letter == "S")
            for letters in itertools.product("IS", repeat=depth)}


def depth_scores(means: dict[str, float], tasks: Sequence[str], layers: int) -> dict[int, float] | None:
    """A predicted score of sharing the bottom k of `layers` encoder layers, k = 0..layers, from
    one run that shares all of them and measured each alone (encoder-layer-k): the layer scores
    of its bottom k layers summed (k = 0 scores 0), as regime_scores sums the head layers a
    regime shares. None when a layer's affinities are missing."""
    per_layer = layer_scores(means, tasks, encoder_layer, layers)
    if per_layer is None:
        return None
    return {k: float(sum(per_layer[:k])) for k in range(layers + 1)}


def format_grouping(grouping: Sequence[Sequence[str]]) -> str:
    return " | ".join("{" + ", ".join(g) + "}" for g in grouping)


# --------------------------------------------------------------------------- matrices and heatmaps

def matrices(means: dict[str, float], tasks: Sequence[str], part: str = WHOLE) -> dict[str, np.ndarray]:
    """{"affinity": Z, "cosine": C} as T x T arrays in `tasks`' order (row i, column j: Z(i -> j);
    the diagonal NaN), from a dict of series means; NaN where a pair was not measured."""
    index = {t: k for k, t in enumerate(tasks)}
    out = {kind: np.full((len(tasks), len(tasks)), math.nan) for kind in (AFFINITY, COSINE)}
    for name, value in means.items():
        parsed = parse_name(name)
        if parsed is None or parsed[1] != part or parsed[2] not in index or parsed[3] not in index:
            continue
        kind, _, a, b = parsed
        out[kind][index[a], index[b]] = value
        if kind == COSINE:
            out[kind][index[b], index[a]] = value
    return out


def draw_heatmap(mats: dict[str, np.ndarray], path: Path, title: str, tasks: Sequence[str] | None = None) -> Path:
    """Z and the cosines side by side, each cell printed; red helps/agrees, blue hurts/conflicts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    size = mats[AFFINITY].shape[0]
    labels = list(tasks) if tasks is not None else [str(k) for k in range(size)]
    fig, axes = plt.subplots(1, 2, figsize=(4 + 1.6 * size, 1.5 + 0.8 * size))
    for ax, (kind, heading) in zip(axes, ((AFFINITY, "lookahead Z(row -> column)"), (COSINE, "gradient cosine"))):
        mat = mats[kind]
        bound = float(np.nanmax(np.abs(mat))) if np.isfinite(mat).any() else 1.0
        image = ax.imshow(np.nan_to_num(mat), cmap="RdBu_r", vmin=-bound or -1, vmax=bound or 1)
        for (r, c), v in np.ndenumerate(mat):
            if not math.isnan(v):
                ax.text(c, r, f"{v:.2g}", ha="center", va="center", fontsize=8)
        ax.set_xticks(range(size), labels, rotation=30)
        ax.set_yticks(range(size), labels)
        ax.set_title(heading, fontsize=9)
        fig.colorbar(image, ax=ax, shrink=0.8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
