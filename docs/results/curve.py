"""The learning curve of a sweep: dev scores at every evaluation against training minutes,
read back from its MLflow store.

    python docs/results/curve.py --tracking-uri sqlite:///$PWD/runs/reference/mlflow.db \
        --experiment reference-minilm-cpu --output docs/results/reference/curve

Each child run's per-epoch history (epoch/overall, epoch/train_time_s, the task scores; see
orchestration/track/tracking.py) is grouped by the trial's variant (its role and swept values, not
its seed) and averaged over seeds at each evaluation. Writes <output>.md (one table per
variant: evaluation, training minutes, scores as mean ± std (n)) and <output>.png (overall
against training minutes, one line per variant, each seed drawn faintly).
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from mlflow.tracking import MlflowClient

from orchestration.report.reader import find_sweep

COLUMNS = [("overall", "Overall"), ("sst_acc", "SC acc."), ("para_acc", "PD acc."), ("sts_corr", "STS corr.")]


def histories(uri: str, experiment: str, sweep: str | None) -> dict[str, list[dict[int, dict]]]:
    """variant label -> one {epoch: {metric: value}} per child run. A variant is labelled by
    its role and the params that set it apart from the sweep's other variants."""
    client = MlflowClient(uri)
    exp_id, parent = find_sweep(uri, experiment, sweep)
    runs = client.search_runs([exp_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}' and tags.role != 'configuration'",
                              max_results=5000)
    variants = {r.data.tags.get("variant", ""): r.data.params for r in runs}
    differ = sorted(k for k in set().union(*map(set, variants.values())) if k != "train.seed"
                    and len({str(p.get(k)) for p in variants.values()}) > 1)
    out: dict[str, list[dict[int, dict]]] = {}
    for run in runs:
        tags, params = run.data.tags, run.data.params
        label = f"{tags.get('role', 'trial')}: " + ", ".join(f"{k}={params.get(k)}" for k in differ)
        per_epoch: dict[int, dict] = {}
        for key, _ in [("train_time_s", None), *COLUMNS]:
            for m in client.get_metric_history(run.info.run_id, f"epoch/{key}"):
                per_epoch.setdefault(m.step, {})[key] = m.value  # latest value per step wins
        if per_epoch:
            out.setdefault(label, []).append(per_epoch)
    return out


def fmt(values: list[float], digits: int = 3) -> str:
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f} ({len(values)})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tracking-uri", required=True)
    ap.add_argument("--experiment", required=True)
    ap.add_argument("--sweep", help="sweep run name or id (default: the latest)")
    ap.add_argument("--output", required=True, help="path without suffix: writes .md and .png")
    args = ap.parse_args()
    data = histories(args.tracking_uri, args.experiment, args.sweep)
    lines = [f"Learning curve of experiment `{args.experiment}`: dev scores at each evaluation, "
             "mean ± std (n seeds); training minutes exclude evaluation.", ""]
    for label, runs in sorted(data.items()):
        lines += [f"**{label}**", "", "| evaluation | train min | " + " | ".join(h for _, h in COLUMNS) + " |",
                  "|---:|---:|" + "---:|" * len(COLUMNS)]
        for epoch in sorted(set().union(*runs)):
            at = [r[epoch] for r in runs if epoch in r]
            cells = [fmt([a["train_time_s"] / 60 for a in at if "train_time_s" in a], 1)]
            cells += [fmt([a[k] for a in at if k in a]) for k, _ in COLUMNS]
            lines.append(f"| {epoch} | " + " | ".join(cells) + " |")
        lines.append("")
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text("\n".join(lines))

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, (label, runs) in enumerate(sorted(data.items())):
        colour = f"C{i}"
        for r in runs:
            steps = sorted(r)
            ax.plot([r[s]["train_time_s"] / 60 for s in steps], [r[s]["overall"] for s in steps],
                    color=colour, alpha=0.3, marker=".")
        epochs = sorted(set().union(*runs))
        ax.plot([statistics.mean(r[e]["train_time_s"] / 60 for r in runs if e in r) for e in epochs],
                [statistics.mean(r[e]["overall"] for r in runs if e in r) for e in epochs],
                color=colour, marker="o", label=label)
    ax.set_xlabel("training minutes (one core)")
    ax.set_ylabel("dev overall")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=120)
    print(f"wrote {out.with_suffix('.md')} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
