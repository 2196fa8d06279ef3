"""`mtbert sweep plan FILE`: what a sweep would run and roughly what it would cost, before any
of it is spent: its configurations and seeds, its trial count, the keys `--smoke` would clamp,
and an estimate of its time from one short measured run of each configuration. Neither Ray nor
the MLflow store is touched."""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mtbert.train.progress import makespan
from orchestration.report.verdicts import claim_alphas
from orchestration.sweep.load import load_sweep
from orchestration.sweep.plan import Planner
from orchestration.sweep.spec import Sweep

# What a sweep costs beyond its trials' own phases, from the overhead bench (docs/benchmarks.md,
# head-only trials on an idle 2-core CPU): a warm trial's slot is ~0.4 s longer than its work
# (its report, checkpoint and MLflow record), each worker's first trial ~4 s (its imports), and
# Ray's start and the sweep's closing steps (the best model logged, the leaderboard) a few
# seconds each. A loaded machine pays several times these (they are process starts and
# imports, which wait for a CPU like any work): the smoke sweep on a 2-core Xeon at a load of 6
# took 230 s against an estimate of 37 s without them. So they are scaled by the load
# (load_factor); a trial's own phases are measured at the present load and need no scaling.
TRIAL_OVERHEAD_S = 0.5
WORKER_FIRST_S = 4.0
RAY_START_S = 5.0
CLOSING_S = 5.0
# The short run that measures a trial: two epochs of this many steps, the second one timed.
MEASURE_STEPS = 4
# At most this many configurations are measured (each loads its model and scores the dev sets
# twice); a larger grid's other configurations are costed at their mean.
MEASURE_CONFIGS = 8


def _flat(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flat(v, key + "."))
        else:
            out[key] = v
    return out


def smoke_clamps(path: str | Path, overrides: list[str] | None) -> list[str]:
    """Each key `--smoke` changes, as `key: before -> after` (the sweep file's own keys and the
    base config's), from the sweep loaded both ways."""
    real, smoke = load_sweep(path, overrides, False), load_sweep(path, overrides, True)
    lines = []
    for where, a, b in (("", _flat(real.base), _flat(smoke.base)),
                        ("", {"num_samples": real.spec.num_samples, "seeds": real.seeds,
                              "resources.cpu": real.spec.resources.cpu, "resources.gpu": real.spec.resources.gpu,
                              "max_failures": real.spec.max_failures},
                         {"num_samples": smoke.spec.num_samples, "seeds": smoke.seeds,
                          "resources.cpu": smoke.spec.resources.cpu, "resources.gpu": smoke.spec.resources.gpu,
                          "max_failures": smoke.spec.max_failures})):
        for key in sorted(set(a) | set(b)):
            if key.startswith("data.cache_dir"):
                continue
            if a.get(key) != b.get(key):
                lines.append(f"{where}{key}: {a.get(key, '(unset)')} -> {b.get(key, '(unset)')}")
    return lines + [n for n in smoke.notes if n not in real.notes]


def _decidable(sweep: Sweep, claim, alpha: float) -> str:
    """When the claim's interval can first give a verdict: the median's needs more paired seeds
    than the mean's, and the more claims share the family, the more (verdicts.first_decidable).
    A design that stops before it (its fixed seeds, or adaptive seeds whose budget ends the
    rounds first) judges nothing, which is worth knowing before the compute is spent."""
    from orchestration.report.verdicts import DIVERGED_METRIC, first_decidable

    if claim.metric == DIVERGED_METRIC or sweep.smoke:  # a smoke run judges nothing
        return ""
    first = first_decidable(claim.looks, alpha, claim.interval)
    if first is None:
        return f"; no verdict within {claim.looks[-1] if claim.looks else len(sweep.seeds)} seeds at its level"
    seeds = sweep.adaptive.max if sweep.adaptive is not None else len(sweep.seeds)
    warn = f": the {seeds} seed(s) planned give no verdict" if first > seeds else ""
    return f"; its {claim.interval} interval decides from {first} paired seeds{warn}"


def concurrency(sweep: Sweep, num_cpus: int | None) -> int:
    """How many trials run at once on this machine: max_concurrent, within its CPUs and GPUs."""
    cpus = num_cpus or os.cpu_count() or 1
    res = sweep.spec.resources
    fit = max(1, int(cpus // res.cpu)) if res.cpu > 0 else cpus
    if res.gpu > 0:
        try:
            import torch

            fit = min(fit, int(torch.cuda.device_count() // res.gpu))
        except ImportError:
            fit = 0
    limit = sweep.spec.max_concurrent or fit
    return max(1, min(limit, fit))


def load_factor() -> float:
    """How many times an idle machine's fixed costs a sweep pays now: the 1-minute load average
    per CPU of the machine, 1 where the machine is idle (or its load unknown)."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average on this platform
        return 1.0
    return max(1.0, load / (os.cpu_count() or 1))


def measure_trial(config: dict[str, Any], threads: int) -> dict[str, float]:
    """Seconds of one trial of `config`, by its phases, from a run of two short epochs on the
    `threads` a trial gets: data and model once, the second (warm) epoch's steps and
    evaluation scaled to the trial's budget. Its data and frozen layers land in the sweep's
    caches, which the sweep then reads."""
    import torch

    from mtbert.config import build_config
    from mtbert.data.tokenize import prepare
    from mtbert.train.loop import steps_per_epoch, train

    cfg = build_config(config)
    epochs = cfg.train.epochs
    short = build_config(config, {"train.epochs": 2, "sampling.steps_per_epoch": MEASURE_STEPS,
                                  "train.save_checkpoint": False, "train.patience": None})
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        t0 = time.perf_counter()
        prepared = prepare(short, log=None)
        data_s = time.perf_counter() - t0
        result = train(short, prepared=prepared, log=None)
    finally:
        torch.set_num_threads(before)
    steps = steps_per_epoch(cfg, {t: len(ds) for t, ds in prepared.train.items()})
    phases = result.timings
    step_s = result.epochs[-1]["epoch_time_s"] / MEASURE_STEPS
    eval_s = phases.get("eval", 0.0) / 2
    return {"data_s": data_s, "model_s": phases.get("model", 0.0), "cache_s": phases.get("cache", 0.0),
            "step_s": step_s, "steps": steps * epochs, "eval_s": eval_s, "epochs": epochs,
            "trial_s": phases.get("model", 0.0) + steps * epochs * step_s + epochs * eval_s + TRIAL_OVERHEAD_S}


def plan_sweep(path: str | Path, overrides: list[str] | None = None, smoke: bool = False, measure: bool = True,
               num_cpus: int | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Print the plan of a sweep; returns its figures (trials, concurrency, the estimate)."""
    from orchestration.run.searcher import make_searcher

    sweep = load_sweep(path, overrides, smoke)
    planner = Planner(sweep)
    total = make_searcher(planner).total_trials
    fixed = planner.fixed_trials()
    seeds = (f"adaptive: {sweep.adaptive.start} seeds, up to {sweep.adaptive.max} where a claim is open"
             if sweep.adaptive is not None else f"{len(sweep.seeds)} ({', '.join(map(str, sweep.seeds))})")
    at_once = concurrency(sweep, num_cpus)
    log(f"sweep {sweep.name}{' (smoke)' if smoke else ''}: {total} trials{' at most' if sweep.adaptive else ''}, "
        f"search {sweep.spec.search.algorithm}, seeds {seeds}, {at_once} at a time "
        f"(resources cpu {sweep.spec.resources.cpu:g}, gpu {sweep.spec.resources.gpu:g}); "
        f"MLflow experiment {sweep.experiment!r}")
    configs: dict[str, dict] = {}
    for t in fixed:
        configs.setdefault(t["variant"], {"role": t["role"], "values": t["values"], "seeds": []})["seeds"].append(t["seed"])
    for variant, c in configs.items():
        values = ", ".join(f"{k}={v}" for k, v in c["values"].items()) or "(the base config)"
        log(f"  {variant:<12} {c['role']:<9} seeds {','.join(map(str, c['seeds'])):<8} {values}")
    if planner.optuna_trials():
        log(f"  + {planner.optuna_trials()} trials that Optuna samples as the sweep runs")
    for claim, alpha in zip(sweep.claims, claim_alphas(sweep.claims)):
        log(f"  claim {claim.name}: {claim.metric}, A {claim.relation} B{_decidable(sweep, claim, alpha)}")
    if not smoke:
        clamps = smoke_clamps(path, overrides)
        log(f"--smoke would clamp {len(clamps)} key(s)" + (": " + "; ".join(clamps) if clamps else ""))
    out: dict[str, Any] = {"trials": total, "concurrency": at_once, "configurations": len(configs)}
    if measure and fixed:
        out.update(_estimate(sweep, planner, fixed, total, at_once, log))
    return out


def _estimate(sweep: Sweep, planner: Planner, fixed: list[dict], total: int, at_once: int,
              log: Callable[[str], None]) -> dict[str, Any]:
    """Measure one trial of each configuration (a frozen encoder's trial and a fine-tuned one
    differ a hundredfold), then lay the trials out `at_once` at a time: the sweep's time, or
    under adaptive seeds its first round's and its most."""
    threads = max(1, int(sweep.spec.resources.cpu))
    costs: dict[str, dict[str, float]] = {}
    variants = list(dict.fromkeys(t["variant"] for t in fixed))
    for t in fixed:  # a grid of many configurations: the first MEASURE_CONFIGS, the rest at their mean
        if t["variant"] not in costs and len(costs) < MEASURE_CONFIGS:
            costs[t["variant"]] = measure_trial(t["config"], threads)
    # The model loads once in this process (the later measurements find it loaded); each trial
    # loads it in its own worker: every trial pays the first measurement's load.
    model_s = max(c["model_s"] for c in costs.values())
    for c in costs.values():
        c["trial_s"] += model_s - c["model_s"]
        c["model_s"] = model_s
    trial_s = {v: c["trial_s"] for v, c in costs.items()}
    mean_s = sum(trial_s.values()) / len(trial_s)
    trial_s.update({v: mean_s for v in variants if v not in trial_s})
    first = [trial_s[t["variant"]] for t in fixed] + [mean_s] * planner.optuna_trials()
    load = load_factor()
    # Each prefix of frozen layers is built once (the first measurement that needs it builds it).
    setup_s = costs[fixed[0]["variant"]]["data_s"] + sum(c["cache_s"] for c in costs.values())
    fixed_s = setup_s + (RAY_START_S + WORKER_FIRST_S + CLOSING_S) * load
    estimate = fixed_s + makespan(first, at_once)
    for v, c in costs.items():
        log(f"  a trial of {v}: {_hms(c['trial_s'])} ({c['steps']} steps of {c['step_s'] * 1000:.0f} ms, "
            f"{c['epochs']} evaluation(s) of {c['eval_s']:.1f} s, model {c['model_s']:.1f} s)")
    detail = (f"{len(first)} trials, {at_once} at a time; shared setup {setup_s:.0f} s; Ray, workers' imports "
              f"and closing {fixed_s - setup_s:.0f} s" + (f", {load:.1f}x an idle machine's" if load > 1 else ""))
    what = "the sweep" if sweep.adaptive is None else "its first round"
    line = f"estimate: {_hms(estimate)} for {what} at this machine's present load ({detail})"
    out = {"estimate_s": estimate, "load_factor": load, "trial_s": trial_s, "setup_s": setup_s}
    if sweep.adaptive is not None and total > len(first):
        design = sweep.adaptive
        later = [trial_s[v] for _ in range(design.start, design.max) for v in variants][:total - len(first)]
        most = fixed_s + makespan(first + later, at_once)
        if design.budget.hours is not None:  # no round starts past it; a started one runs whole
            most = min(most, fixed_s + design.budget.hours * 3600 + makespan(list(trial_s.values()), at_once))
        line += f"; up to {_hms(most)} if claims stay open to {design.max} seeds ({total} trials)"
        out["most_s"] = most
    measured = ("each configuration" if len(costs) == len(variants)
                else f"{len(costs)} of the {len(variants)} configurations, the others at their mean")
    log(line + f", from {MEASURE_STEPS} measured steps of {measured}; trials stopped early (ASHA, "
        "patience) make it shorter, a load that rises longer")
    return out


def _hms(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"
