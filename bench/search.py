"""Search that beats a grid, measured: random search and Optuna TPE + ASHA against the full
grid of the head-only space over the frozen MiniLM (sweeps/search/head_only_grid.yaml).

    python bench/search.py                      # runs the grid once (~20 min on 2 cores), then the searches
    python bench/search.py --budgets 0.1,0.2,0.3 --search-seeds 10

The grid is a real mtbert sweep (Ray Tune trials, full-dev scores per epoch in MLflow), run
once into --tracking-uri; a later call reads it from there. Every configuration's per-epoch
curve is then the table the searches draw from: mtbert's training is deterministic for a
configuration and seed (the resume tests hold it to equality), so a search that picks a
configuration and trains it for e epochs sees exactly the first e points of its curve. That
makes each search cost seconds, so it can run under many search seeds, and its compute is
counted exactly, in epochs trained.

- random: Optuna's RandomSampler; every trial trains its full epoch budget.
- tpe+asha: Optuna's TPESampler with its SuccessiveHalvingPruner (asynchronous successive
  halving: rungs at 1, 3, 9... epochs, reduction factor 3), the pairing a sweep gets from
  `search: {algorithm: optuna}` + `scheduler: {type: asha}`.

A search stops when its next trial would overrun its budget (a share of the grid's epochs).
It "reaches" the grid when one of its measured epochs is within a tolerance of the grid's best
overall (several, --tolerances: on a flat space 0.01 is met by half the grid); the share
printed is the grid compute spent when it first did.
"""
from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._real import MINBERT, MINILM  # noqa: E402

SWEEP = ROOT / "sweeps" / "search" / "head_only_grid.yaml"
EXPERIMENT = "search-grid"
KEYS = ("sharing.head_regime", "optim.head_lr", "loss.weights")  # the grid's dimensions


# --------------------------------------------------------------------------- the grid's table

def ensure_grid(uri: str, storage: Path, num_cpus: int) -> None:
    """Run (or resume) the grid sweep unless the store holds a finished one."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    if experiment is not None and client.search_runs(
            [experiment.experiment_id], "tags.role = 'sweep' and attributes.status = 'FINISHED'", max_results=1):
        return
    name = "search-grid"
    cmd = [sys.executable, "-m", "mtbert.cli", "sweep"]
    if (storage / name).is_dir():
        cmd += ["resume", name, "--storage", str(storage), "--num-cpus", str(num_cpus)]
    else:
        cmd += ["run", str(SWEEP), "--name", name, "--tracking-uri", uri, "--storage", str(storage),
                "--num-cpus", str(num_cpus)]
    print("grid:", " ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)


def read_table(uri: str) -> dict[tuple, list[float]]:
    """{configuration: overall after epoch 1, 2, ...} of the grid's finished trials."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    if experiment is None:
        return {}
    runs = client.search_runs([experiment.experiment_id], "tags.role = 'search' and attributes.status = 'FINISHED'",
                              max_results=5000)  # the grid's points (its baseline run repeats one of them)
    table: dict[tuple, list[float]] = {}
    for run in runs:
        params = run.data.params
        weights = "/".join(params.get(f"loss.weights.{t}", "-") for t in ("sts", "sst", "para"))
        config = (params.get("sharing.head_regime"), params.get("optim.head_lr"), weights)
        history = client.get_metric_history(run.info.run_id, "epoch/overall")
        by_step = {int(m.step): m.value for m in sorted(history, key=lambda m: m.timestamp)}
        curve = [by_step[s] for s in sorted(by_step)]
        if curve:
            table[config] = curve
    lengths = {len(c) for c in table.values()}
    if len(lengths) > 1:
        raise SystemExit(f"{EXPERIMENT}: curves of different lengths {sorted(lengths)}: an unfinished grid?")
    return table


# --------------------------------------------------------------------------- the searches

def search(table: dict[tuple, list[float]], method: str, budget_epochs: int,
           seed: int) -> tuple[float, list[tuple[int, float]], int]:
    """(best overall measured, [(epochs spent, new best)] at each improvement, epochs spent)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    configs = sorted(table)
    choices = [sorted({c[i] for c in configs}) for i in range(len(KEYS))]
    epochs = len(next(iter(table.values())))
    if method == "random":
        sampler, pruner = optuna.samplers.RandomSampler(seed=seed), optuna.pruners.NopPruner()
    else:
        sampler = optuna.samplers.TPESampler(seed=seed)
        pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=3)
    study = optuna.create_study(direction="maximize", sampler=sampler, pruner=pruner)
    spent, best, improvements = 0, -math.inf, []
    # A trial may stop at any epoch, so the last one only starts while one epoch is left;
    # random trials always run the full budget, so they start only when it fits.
    while spent + (epochs if method == "random" else 1) <= budget_epochs:
        trial = study.ask()
        config = tuple(trial.suggest_categorical(k, choices[i]) for i, k in enumerate(KEYS))
        curve, trial_best = table[config], -math.inf
        for epoch, value in enumerate(curve, start=1):
            if spent >= budget_epochs:
                break
            spent += 1
            trial_best = max(trial_best, value)
            if value > best:
                best = value
                improvements.append((spent, best))
            trial.report(value, epoch)
            if trial.should_prune():
                break
        study.tell(trial, trial_best)
    return best, improvements, spent


def reached(improvements: list[tuple[int, float]], target: float) -> int | None:
    """Epochs spent when the search first measured target or better, None if it never did."""
    return next((spent for spent, best in improvements if best >= target), None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tracking-uri", default=f"sqlite:///{ROOT / 'runs' / 'search' / 'mlflow.db'}")
    ap.add_argument("--storage", type=Path, default=ROOT / "runs" / "search" / "tune")
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--budgets", default="0.1,0.2,0.3", help="shares of the grid's epochs")
    ap.add_argument("--search-seeds", type=int, default=10)
    ap.add_argument("--tolerances", default="0.01,0.003,0.001",
                    help="distances from the grid's best that count as reaching it")
    args = ap.parse_args()
    if not MINILM.is_dir() or not MINBERT.is_dir():
        print("../shared model or data not found: skipped")
        return
    ensure_grid(args.tracking_uri, args.storage, args.num_cpus)
    table = read_table(args.tracking_uri)
    epochs = len(next(iter(table.values())))
    grid_epochs = len(table) * epochs
    best_config = max(table, key=lambda c: max(table[c]))
    grid_best = max(table[best_config])
    tolerances = [float(t) for t in args.tolerances.split(",")]
    print(f"grid: {len(table)} configurations x {epochs} epochs = {grid_epochs} epochs; best overall "
          f"{grid_best:.4f} ({', '.join(f'{k}={v}' for k, v in zip(KEYS, best_config))}); configurations "
          + ", ".join(f"within {t}: {sum(max(c) >= grid_best - t for c in table.values())}" for t in tolerances))
    print("\n| method | budget | best found (mean) | " + " | ".join(
        f"within {t}: seeds, grid share when reached (median)" for t in tolerances) + " |")
    print("|---|---:|---:|" + "---:|" * len(tolerances))
    for method in ("random", "tpe+asha"):
        for share in (float(b) for b in args.budgets.split(",")):
            budget = int(round(share * grid_epochs))
            outcomes = [search(table, method, budget, seed) for seed in range(args.search_seeds)]
            cells = []
            for t in tolerances:
                hits = [r for _, imp, _ in outcomes if (r := reached(imp, grid_best - t)) is not None]
                when = f"{statistics.median(hits) / grid_epochs:.1%}" if hits else "-"
                cells.append(f"{len(hits)} of {len(outcomes)}, {when}")
            print(f"| {method} | {share:.0%} ({budget} epochs) | {statistics.mean(b for b, _, _ in outcomes):.4f} | "
                  + " | ".join(cells) + " |", flush=True)

if __name__ == "__main__":
    main()
