"""`mtbert sweep plan`: the planned configurations and seeds, the trial count, the keys --smoke
would clamp and an estimate from a short measured run, with no Ray started and no store made."""
from __future__ import annotations

import re

import pytest

from .conftest import SWEEPS, run_cli


def test_plan_lists_what_would_run_and_estimates_its_time_without_ray_or_a_store(sweep_file, tmp_path):
    path = sweep_file(space={"sharing.head_regime": ["S-I-I", "I-S-S"]}, search={"algorithm": "grid"},
                      baseline={"sharing.head_regime": "I-I-I"}, seeds=[0, 1], max_concurrent=2,
                      base={"data": {"cache_dir": str(tmp_path / "cache")}})
    work = tmp_path / "work"
    work.mkdir()
    out = run_cli(["sweep", "plan", str(path), "--num-cpus", "2"], cwd=work)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("sweep tiny: 6 trials, search grid, seeds 2 (0, 1), 2 at a time"), lines[0]
    rows = [line.split() for line in lines[1:4]]
    assert [(r[0], r[1], r[3]) for r in rows] == [("baseline", "baseline", "0,1"), ("p000", "search", "0,1"),
                                                  ("p001", "search", "0,1")]
    assert "sharing.head_regime=S-I-I" in lines[2] and "sharing.head_regime=I-S-S" in lines[3]
    clamps = next(line for line in lines if line.startswith("--smoke would clamp"))
    assert "train.batch_size: 8 -> " not in clamps and "num_samples" not in clamps  # already small: kept
    # Each configuration measured, each costed on a line of its own; the trials laid out 2 at a time.
    costs = [line for line in lines if line.startswith("  a trial of ")]
    assert [line.split(":")[0] for line in costs] == ["  a trial of baseline", "  a trial of p000",
                                                      "  a trial of p001"], lines
    assert all(re.search(r": \dm\d\ds \(8 steps of \d+ ms, 2 evaluation\(s\) of [\d.]+ s, model [\d.]+ s\)$", line)
               for line in costs), costs
    estimate = next(line for line in lines if line.startswith("estimate: "))
    match = re.match(r"estimate: (\d+)m(\d\d)s for the sweep at this machine's present load \(6 trials, 2 at a "
                     r"time; shared setup \d+ s; Ray, workers' imports and closing \d+ s", estimate)
    assert match, estimate
    assert "up to" not in estimate and "from 4 measured steps of each configuration" in estimate
    assert 0 < int(match[1]) * 60 + int(match[2]) < 600
    # Nothing was started or written where the user stands: no store, no Ray folder.
    assert sorted(p.name for p in work.iterdir()) == []


def test_plan_without_measuring_names_every_key_smoke_would_clamp(sweep_file, tmp_path):
    path = sweep_file(space={"optim.lr": [1e-3, 2e-3]}, search={"algorithm": "grid"}, seeds=[0, 1, 2],
                      base={"train": {"epochs": 5, "batch_size": 16}, "freeze": {"layers": 2}})
    out = run_cli(["sweep", "plan", str(path), "--no-measure"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    clamps = next(line for line in out.stdout.splitlines() if line.startswith("--smoke would clamp"))
    for change in ("train.epochs: 5 -> 2", "train.batch_size: 16 -> 8", "seeds: [0, 1, 2] -> [0]"):
        assert change in clamps, clamps
    assert "estimate" not in out.stdout


# Solo: the estimate reads the load when the plan runs, and the suite's parallel pass changes
# it under the sweep that follows (seen: 51 s planned against 221 s run beside other tests).
@pytest.mark.slow
@pytest.mark.solo
def test_the_plans_estimate_is_within_a_factor_of_three_of_the_sweeps_time(tmp_path):
    """The smoke sweep (tiny encoder, synthetic data) planned, then run as planned: the plan's
    estimate and the sweep's own wall time (its summary line) within a factor of 3 either way,
    at the load the machine carries when both run (the estimate scales its fixed costs by it)."""
    args = [str(SWEEPS / "smoke.yaml"), "--smoke", "--num-cpus", "2"]
    plan = run_cli(["sweep", "plan", *args], cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    estimate = re.search(r"^estimate: (\d+)m(\d\d)s .*$", plan.stdout, re.M)
    assert estimate, plan.stdout
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = run_cli(["sweep", "run", *args, "--tracking-uri", uri, "--storage", str(tmp_path / "runs"),
                   "--name", "planned"], cwd=tmp_path, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    real = re.search(r"^sweep planned FINISHED in (\d+)m(\d\d)s", run.stdout, re.M)
    assert real, run.stdout
    estimate_s, real_s = (int(m[1]) * 60 + int(m[2]) for m in (estimate, real))
    print(f"\n{estimate[0]}\n{real[0]}\nsweep plan's estimate {estimate_s} s, the sweep's wall {real_s} s: "
          f"{estimate_s / real_s:.2f}x")
    assert real_s / 3 <= estimate_s <= real_s * 3, (plan.stdout, run.stdout)


def test_plan_says_from_how_many_seeds_each_claim_can_be_decided(sweep_file, tmp_path):
    # The median's interval (the default) needs 6 paired seeds at 5% on a fixed design, more in
    # a family: three fixed seeds judge nothing, which the plan says before any compute.
    claim = {"name": "S-I-I > I-I-I", "metric": "overall", "a": {"sharing.head_regime": "S-I-I"},
             "b": {"sharing.head_regime": "I-I-I"}, "relation": ">"}
    space = {"space": {"sharing.head_regime": ["S-I-I"]}, "search": {"algorithm": "grid"},
             "baseline": {"sharing.head_regime": "I-I-I"}}
    fixed = run_cli(["sweep", "plan", str(sweep_file("fixed.yaml", **space, seeds=[0, 1, 2], claims=[claim])),
                     "--no-measure"], cwd=tmp_path)
    assert fixed.returncode == 0, fixed.stderr
    assert "claim S-I-I > I-I-I: overall, A > B; its median interval decides from 6 paired seeds: the 3 seed(s) " \
           "planned give no verdict" in fixed.stdout, fixed.stdout
    adaptive = run_cli(["sweep", "plan", str(sweep_file("adaptive.yaml", **space, seeds={"start": 3, "max": 12},
                                                        claims=[claim])), "--no-measure"], cwd=tmp_path)
    assert "its median interval decides from 6 paired seeds\n" in adaptive.stdout, adaptive.stdout


def test_an_adaptive_plan_costs_each_configuration_and_says_its_first_round_and_its_most(sweep_file, tmp_path):
    # A configuration ten times longer than the baseline is costed as such (a plan that timed
    # the first trial alone put a real sweep of frozen and fine-tuned trials at a sixth of its
    # time); under adaptive seeds the first round is planned and the rest is "up to".
    claim = {"name": "longer > baseline", "metric": "overall", "a": {"sampling.steps_per_epoch": 40},
             "b": {"role": "baseline"}, "relation": ">"}
    path = sweep_file(space={"sampling.steps_per_epoch": [40]}, search={"algorithm": "grid"},
                      baseline={"sampling.steps_per_epoch": 4}, seeds={"start": 2, "max": 4}, claims=[claim],
                      max_concurrent=1, base={"data": {"cache_dir": str(tmp_path / "cache")}})
    out = run_cli(["sweep", "plan", str(path), "--num-cpus", "1"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    costs = {m[1]: (m[2], int(m[3])) for m in re.finditer(r"^  a trial of (\w+): (\dm\d\ds) \((\d+) steps", out.stdout,
                                                          re.M)}
    assert {v: steps for v, (_, steps) in costs.items()} == {"baseline": 8, "p000": 80}, out.stdout
    estimate = next(line for line in out.stdout.splitlines() if line.startswith("estimate: "))
    assert re.match(r"estimate: \dm\d\ds for its first round at this machine's present load \(4 trials, 1 at a "
                    r"time; ", estimate), estimate
    assert re.search(r"; up to \dm\d\ds if claims stay open to 4 seeds \(8 trials\), from 4 measured steps",
                     estimate), estimate


def test_a_large_grid_is_costed_from_a_bounded_number_of_measurements(sweep_file, tmp_path):
    from orchestration.run.dryrun import MEASURE_CONFIGS

    path = sweep_file(space={"optim.lr": [1e-3 * (2 + i) for i in range(MEASURE_CONFIGS + 2)]},
                      search={"algorithm": "grid"}, base={"data": {"cache_dir": str(tmp_path / "cache")}})
    out = run_cli(["sweep", "plan", str(path), "--num-cpus", "2"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert sum(line.startswith("  a trial of ") for line in out.stdout.splitlines()) == MEASURE_CONFIGS
    assert f"from 4 measured steps of {MEASURE_CONFIGS} of the {MEASURE_CONFIGS + 3} configurations, the others " \
           "at their mean" in out.stdout, out.stdout
