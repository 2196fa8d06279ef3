"""Search space -> trials: grid/random expansion, seeds, simplex, the Optuna searcher."""
from __future__ import annotations

import math

import numpy as np
import pytest

from orchestration.run.searcher import SweepSearcher, make_searcher
from orchestration.sweep.plan import Planner
from orchestration.sweep.space import Simplex, simplex_lattice
from orchestration.sweep.spec import load_sweep


def plan(sweep_file, overrides=None, smoke=False, **sections):
    return Planner(load_sweep(sweep_file(**sections), overrides, smoke=smoke))


def test_grid_times_seeds_baseline_first(sweep_file):
    planner = plan(sweep_file, space={"sharing.head_regime": ["S-I-I", "I-S-S", "S-S-S"],
                                      "optim.lr": {"type": "grid", "values": [1e-3, 1e-4]}},
                   seeds=[0, 1], baseline={"sharing.head_regime": "I-I-I"})
    trials = planner.fixed_trials()
    assert [t["key"] for t in trials[:2]] == ["baseline-s0", "baseline-s1"]
    assert len(trials) == 2 + 3 * 2 * 2 and planner.total_trials() == 14
    assert len({t["key"] for t in trials}) == len(trials)
    combos = {(t["values"]["sharing.head_regime"], t["values"]["optim.lr"]) for t in trials[2:]}
    assert len(combos) == 6
    for variant in {t["variant"] for t in trials}:
        group = [t for t in trials if t["variant"] == variant]
        assert sorted(t["seed"] for t in group) == [0, 1]
        assert all(t["values"] == group[0]["values"] for t in group)
        assert [t["config"]["train"]["seed"] for t in group] == [t["seed"] for t in group]
    assert trials[0]["config"]["sharing"]["head_regime"] == "I-I-I"
    assert trials[2]["config"]["optim"]["lr"] == trials[2]["values"]["optim.lr"]


def test_random_search_is_seeded(sweep_file):
    space = {"optim.lr": {"type": "loguniform", "low": 1e-5, "high": 1e-2},
             "freeze.layers": {"type": "randint", "low": 0, "high": 2},
             "sharing.head_regime": {"type": "grid", "values": ["S-I-I", "I-S-S"]}}
    a = plan(sweep_file, space=space, search={"algorithm": "random", "seed": 3}, num_samples=40)
    b = plan(sweep_file, space=space, search={"algorithm": "random", "seed": 3}, num_samples=40)
    c = plan(sweep_file, space=space, search={"algorithm": "random", "seed": 4}, num_samples=40)
    values = [t["values"] for t in a.fixed_trials()[1:]]
    assert len(values) == 40  # random: num_samples configurations; a grid dim is sampled
    assert values == [t["values"] for t in b.fixed_trials()[1:]]
    assert values != [t["values"] for t in c.fixed_trials()[1:]]
    lrs = [v["optim.lr"] for v in values]
    assert all(1e-5 <= lr <= 1e-2 for lr in lrs)
    assert {v["freeze.layers"] for v in values} == {0, 1, 2}  # randint's high is inclusive
    assert {v["sharing.head_regime"] for v in values} == {"S-I-I", "I-S-S"}


def test_grid_search_repeats_grid_and_resamples_the_rest(sweep_file):
    planner = plan(sweep_file, space={"sharing.head_regime": ["S-I-I", "I-S-S"],
                                      "optim.lr": {"type": "loguniform", "low": 1e-5, "high": 1e-2}},
                   num_samples=3)
    values = [t["values"] for t in planner.fixed_trials()[1:]]
    assert len(values) == 6
    assert [v["sharing.head_regime"] for v in values].count("S-I-I") == 3
    assert len({v["optim.lr"] for v in values}) == 6


def test_smoke_keeps_first_and_last_grid_points(sweep_file):
    planner = plan(sweep_file, smoke=True, space={"optim.lr": [1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7]})
    assert [t["values"]["optim.lr"] for t in planner.fixed_trials()[1:]] == [1e-1, 1e-4, 1e-7]


def test_simplex_lattice_and_explicit_weightings(sweep_file):
    lattice = simplex_lattice(["sst", "para", "sts"], 0.25)
    assert len(lattice) == 15  # C(4 + 2, 2)
    assert all(math.isclose(sum(p.values()), 1.0) and min(p.values()) >= 0 for p in lattice)
    planner = plan(sweep_file, space={"loss.weights": {"type": "simplex", "tasks": ["sts", "sst", "para"],
                                                       "values": [[0.4, 0.4, 0.2], [1 / 3, 1 / 3, 1 / 3]]}})
    weights = [t["config"]["loss"]["weights"] for t in planner.fixed_trials()[1:]]
    assert weights[0] == pytest.approx({"sts": 0.4, "sst": 0.4, "para": 0.2})
    assert sum(weights[1].values()) == pytest.approx(1.0)


def test_continuous_simplex_is_dirichlet_one():
    dim = Simplex("loss.weights", "x", tasks=["sst", "para", "sts"])
    rng = np.random.default_rng(0)
    draws = [dim.decode({f"loss.weights[{t}]": rng.uniform(1e-9, 1) for t in dim.tasks}) for _ in range(3000)]
    for d in draws:
        assert min(d.values()) >= 0 and sum(d.values()) == pytest.approx(1.0, abs=1e-9)
    # Dirichlet(1,1,1): each weight has mean 1/3 and the marginal Beta(1, 2) has variance 1/18.
    sst = np.array([d["sst"] for d in draws])
    assert sst.mean() == pytest.approx(1 / 3, abs=0.02)
    assert sst.var() == pytest.approx(1 / 18, abs=0.01)


def test_optuna_searcher_repeats_seeds_and_reports_the_mean(sweep_file):
    planner = plan(sweep_file, space={"optim.lr": {"type": "loguniform", "low": 1e-4, "high": 1e-2},
                                      "loss.weights": {"type": "simplex"}},
                   search={"algorithm": "optuna", "seed": 0}, num_samples=3, seeds=[0, 1])
    searcher = make_searcher(planner)
    assert searcher.total_trials == 2 + 3 * 2
    configs = [searcher.suggest(f"t{i}") for i in range(8)]
    assert [c["key"] for c in configs] == ["baseline-s0", "baseline-s1", "o000-s0", "o000-s1",
                                           "o001-s0", "o001-s1", "o002-s0", "o002-s1"]
    assert configs[2]["values"] == configs[3]["values"]
    assert sum(configs[2]["config"]["loss"]["weights"].values()) == pytest.approx(1.0)
    assert searcher.suggest("t8") == SweepSearcher.FINISHED
    searcher.on_trial_complete("t0", {"best_overall": 0.9})  # a baseline never reaches Optuna
    searcher.on_trial_complete("t2", {"best_overall": 0.2})
    study = searcher._inner._ot_study
    assert not [t for t in study.trials if t.value is not None]  # waits for the other seed
    searcher.on_trial_complete("t3", {"best_overall": 0.4})
    assert [t.value for t in study.trials if t.value is not None] == [pytest.approx(0.3)]


def test_optuna_multi_objective_and_restore(sweep_file, tmp_path):
    sections = dict(space={"optim.lr": {"type": "loguniform", "low": 1e-4, "high": 1e-2}},
                    search={"algorithm": "optuna", "objectives": ["best_overall max", "train_time_s min"]},
                    num_samples=4)
    searcher = make_searcher(plan(sweep_file, **sections))
    first = [searcher.suggest(f"t{i}") for i in range(3)]
    searcher.on_trial_complete("t1", {"best_overall": 0.5, "train_time_s": 10.0})
    assert searcher._inner._ot_study.trials[0].values == [0.5, 10.0]
    searcher.save(str(tmp_path / "state.pkl"))
    restored = make_searcher(plan(sweep_file, **sections))
    restored.restore(str(tmp_path / "state.pkl"))
    assert restored.suggest("t3")["key"] == "o002-s0"  # the plan continues where it stopped
    assert [c["key"] for c in first] == ["baseline-s0", "o000-s0", "o001-s0"]


def test_a_point_identical_to_the_baseline_is_the_baselines_run(sweep_file):
    planner = plan(sweep_file, space={"sharing.head_regime": ["S-I-I", "I-I-I"],
                                      "optim.lr": {"type": "grid", "values": [1e-3, 2e-3]}},
                   seeds=[0, 1], baseline={"sharing.head_regime": "I-I-I", "optim.lr": 1e-3})
    trials = planner.fixed_trials()
    # p002 (I-I-I, 1e-3) is the baseline under both seeds: planned once, as the baseline.
    assert [t["variant"] for t in trials] == ["baseline"] * 2 + ["p000"] * 2 + ["p001"] * 2 + ["p003"] * 2
    assert [t.get("stands_for") for t in trials[:2]] == [["p002"], ["p002"]]
    assert not any("stands_for" in t for t in trials[2:]) and planner.total_trials() == 8
    # The same values under another baseline override are a trial of their own.
    other = plan(sweep_file, space={"sharing.head_regime": ["I-I-I"]}, baseline={"sharing.head_regime": "I-I-I",
                                                                                "optim.lr": 5e-4})
    assert [t["key"] for t in other.fixed_trials()] == ["baseline-s0", "p000-s0"]
