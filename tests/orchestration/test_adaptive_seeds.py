"""Adaptive seeds (`seeds: {start, max, budget}`): seeds go only to the configurations of a claim
that is still open, round after round, until every claim is decided, `max` or the budget.

First the searcher on its own, fed planted figures the way Tune feeds it (suggest, results,
completions), so the rounds are exact; then a real tiny sweep (Ray Tune, sqlite MLflow, a
2-layer model on synthetic data), uninterrupted and interrupted after its first round and
resumed, with the same trials either way.
"""
from __future__ import annotations

import io
import json
import math
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient
from ray.tune.search import Searcher

from orchestration.run.searcher import make_searcher
from orchestration.sweep.load import load_sweep
from orchestration.sweep.plan import Planner

from .conftest import cli_env, descendants, run_cli, stop_pids, write_sweep

# --------------------------------------------------------------------------- the searcher alone

PLANTED = dict(space={"sharing.head_regime": ["S-I-I", "I-S-S"]}, baseline={"sharing.head_regime": "I-I-I"},
               claims=[{"name": "S-I-I > I-I-I", "metric": "overall", "a": {"sharing.head_regime": "S-I-I"},
                        "b": {"role": "baseline"}, "relation": ">"},
                       {"name": "I-S-S > I-I-I", "metric": "overall", "a": {"sharing.head_regime": "I-S-S"},
                        "b": {"role": "baseline"}, "relation": ">"}])


def planted(config: dict) -> float:
    """overall by configuration and seed: the baseline and S-I-I do not move with the seed, S-I-I
    0.3 above (a known difference: decided at the first look, verdicts' exact rule); I-S-S swings
    ±0.05 around the baseline (open until `max`)."""
    seed = config["seed"]
    shift = {"S-I-I": 0.3, "I-S-S": 0.05 * (-1) ** seed + 0.001 * seed, "I-I-I": 0.0}[
        config["config"]["sharing"]["head_regime"]]
    return 0.5 + shift


def drive(searcher, handed: list[str] | None = None, stop_after: int | None = None) -> list[str]:
    """Tune's part: take every trial the searcher hands out, end them once it waits, until it is
    FINISHED (or `stop_after` trials were handed out: an interrupted driver). Returns the keys."""
    handed = [] if handed is None else handed
    running: dict[str, dict] = {}
    while True:
        config = searcher.suggest(f"t{len(handed)}")
        if config == Searcher.FINISHED:
            assert not running
            return handed
        if config is not None:
            running[f"t{len(handed)}"] = config
            handed.append(config["key"])
            if stop_after is not None and len(handed) >= stop_after:
                return handed
            continue
        assert running, "the searcher waits with nothing running"
        for trial_id, config in list(running.items()):
            result = {"epoch": 1, "overall": planted(config), "config/key": config["key"]}
            searcher.on_trial_result(trial_id, result)
            searcher.on_trial_complete(trial_id, {**result, "done": True})
            del running[trial_id]


def by_variant(keys: list[str]) -> dict[str, list[int]]:
    out = defaultdict(list)
    for key in keys:
        variant, seed = key.rsplit("-s", 1)
        out[variant].append(int(seed))
    return dict(out)


def test_only_open_claims_get_seeds_until_max(tmp_path):
    sweep = load_sweep(write_sweep(tmp_path / "a.yaml", **PLANTED, seeds={"start": 2, "max": 5}))
    searcher = make_searcher(Planner(sweep))
    assert searcher.total_trials == 3 * 5  # Tune's num_samples: the most it may run
    keys = drive(searcher)
    # S-I-I was decided after the first round; I-S-S and its baseline went on, one seed a round, to 5.
    assert by_variant(keys) == {"baseline": [0, 1, 2, 3, 4], "p000": [0, 1], "p001": [0, 1, 2, 3, 4]}
    rounds = searcher.rounds.rounds
    assert [r["open"] for r in rounds] == [["I-S-S > I-I-I"]] * 3 + [[]]
    assert rounds[0]["verdicts"] == {"S-I-I > I-I-I": "holds", "I-S-S > I-I-I": "inconclusive"}
    assert rounds[-1]["end"] == "1 undecided claim(s) at 5 seeds"
    # Each claim is judged as a sequential design: looks from 2 to 5 paired seeds.
    assert [c.looks for c in sweep.claims] == [(2, 5), (2, 5)]


def test_a_budget_cuts_the_rounds_and_a_tm_claim_takes_the_baseline(tmp_path):
    claims = [{"name": "S-I-I beats I-S-S for its cost", "metric": "tm_relative_score",
               "a": {"sharing.head_regime": "S-I-I"}, "b": {"sharing.head_regime": "I-S-S"}, "relation": "≈"}]
    sweep = load_sweep(write_sweep(tmp_path / "b.yaml", **{**PLANTED, "claims": claims},
                                   seeds={"start": 2, "max": 6, "budget": {"trials": 11}}))
    searcher = make_searcher(Planner(sweep))
    assert searcher.total_trials == 11
    keys = drive(searcher)
    # The claim compares scores taken against each seed's baseline: the baseline gets the seed too.
    # 6 trials, then 3 a round while they fit: 9; a third round would make 12 > 11.
    assert by_variant(keys) == {"baseline": [0, 1, 2], "p000": [0, 1, 2], "p001": [0, 1, 2]}
    assert searcher.rounds.rounds[-1]["end"] == "budget.trials spent"


def test_budget_hours_counts_the_trials_time_not_the_setup(tmp_path):
    # One second of budget: the rounds go on however long the setup before the first trial took.
    path = write_sweep(tmp_path / "h.yaml", **PLANTED, seeds={"start": 2, "max": 5, "budget": {"hours": 1 / 3600}})
    searcher = make_searcher(Planner(load_sweep(path)))
    time.sleep(1.2)  # the shared setup: tokenizing, the frozen-layer cache, Ray's start
    assert by_variant(drive(searcher))["p001"] == [0, 1, 2, 3, 4]
    # Trials that take the second: no round after the first.
    slow = make_searcher(Planner(load_sweep(path)))
    handed = []
    while (config := slow.suggest(f"t{len(handed)}")) is not None:
        handed.append((f"t{len(handed)}", config))
    time.sleep(1.2)
    for trial_id, config in handed:
        result = {"epoch": 1, "overall": planted(config), "done": True}
        slow.on_trial_result(trial_id, result)
        slow.on_trial_complete(trial_id, result)
    assert slow.suggest("t9") == Searcher.FINISHED
    assert slow.rounds.rounds[-1]["end"].startswith("budget.hours spent: 0.0003")
    assert slow.rounds.describe_round().startswith("seeds: no round 2 (budget.hours spent: 0.0003")


def test_a_restored_searcher_adds_the_same_seeds(tmp_path):
    path = write_sweep(tmp_path / "c.yaml", **PLANTED, seeds={"start": 2, "max": 4})
    whole = drive(make_searcher(Planner(load_sweep(path))))

    first = make_searcher(Planner(load_sweep(path)))
    handed = drive(first, stop_after=8)  # the first round (6) and two trials of the second
    # Tune stops the running trials on an interrupt and passes their last result, without `done`:
    # they are not ended, a resume runs them on.
    first.on_trial_complete("t7", {"epoch": 1, "overall": 0.9})
    first.save(str(tmp_path / "searcher.pkl"))
    restored = make_searcher(Planner(load_sweep(path)))
    restored.restore(str(tmp_path / "searcher.pkl"))
    assert restored.suggest("t8") is None  # the round's trials (t6, t7) are still to end
    for trial_id in ("t6", "t7"):
        key = handed[int(trial_id[1:])]
        variant, seed = key.rsplit("-s", 1)
        config = {"seed": int(seed), "config": {"sharing": {"head_regime": {"baseline": "I-I-I", "p000": "S-I-I",
                                                                            "p001": "I-S-S"}[variant]}}}
        restored.on_trial_complete(trial_id, {"epoch": 1, "overall": planted(config), "done": True})
    assert drive(restored, handed) == whole


def test_more_seeds_for_an_ended_sweep_go_to_its_open_claims_only(tmp_path):
    from orchestration.run.searcher import SweepSearcher

    path = write_sweep(tmp_path / "m.yaml", **PLANTED, seeds={"start": 2, "max": 3})
    first = make_searcher(Planner(load_sweep(path)))
    handed = drive(first)
    assert by_variant(handed) == {"baseline": [0, 1, 2], "p000": [0, 1], "p001": [0, 1, 2]}
    first.save_to_dir(str(tmp_path))  # as Tune saves it in the sweep's folder
    more = SweepSearcher.restored(tmp_path)
    more.extend(5)
    assert [c.looks for c in more.planner.sweep.claims] == [(2, 3, 5), (2, 3, 5)]
    added = drive(more, [])
    # Only the open claim's configurations, only seeds they have not run: nothing trained twice.
    assert by_variant(added) == {"p001": [3, 4], "baseline": [3, 4]}
    assert more.rounds.rounds[-1]["end"] == "1 undecided claim(s) at 5 seeds"
    assert more.rounds.extended == [3]


def test_a_sweep_its_budget_stopped_goes_on_to_its_maximum_as_planned(tmp_path):
    # budget.trials stops the sweep after its first round, short of its maximum (5): more seeds
    # up to 5 go on under the looks it planned (2..5: every look's bound was set for them all),
    # not an extension of them; past 5 they extend as any ended sweep's do.
    from orchestration.errors import SweepError
    from orchestration.run.launch import _restored_for_more_seeds
    from orchestration.run.searcher import SweepSearcher

    path = write_sweep(tmp_path / "b.yaml", **PLANTED, seeds={"start": 2, "max": 5, "budget": {"trials": 6}})
    first = make_searcher(Planner(load_sweep(path)))
    assert by_variant(drive(first)) == {"baseline": [0, 1], "p000": [0, 1], "p001": [0, 1]}
    assert first.rounds.budget_stopped()
    (tmp_path / "b").mkdir()
    first.save_to_dir(str(tmp_path / "b"))
    state = {"adaptive": True}
    with pytest.raises(SweepError, match=r"--seeds-max 2: .*its budget stopped it at 2 seeds: from 3 to 5 it goes on"):
        _restored_for_more_seeds(tmp_path / "b", state, 2)
    more, folder = _restored_for_more_seeds(tmp_path / "b", state, 4)
    assert folder.name == "b-seeds4"
    more.extend(4)
    assert [c.looks for c in more.planner.sweep.claims] == [(2, 5), (2, 5)] and more.rounds.extended == []
    assert by_variant(drive(more, [])) == {"p001": [2, 3], "baseline": [2, 3]}  # the open claim's sides
    assert more.rounds.rounds[-1]["end"] == "1 undecided claim(s) at 4 seeds"
    past = SweepSearcher.restored(tmp_path / "b")
    past.extend(7)
    assert [c.looks for c in past.planner.sweep.claims] == [(2, 5, 7), (2, 5, 7)]


# --------------------------------------------------------------------------- a real sweep

# 1-bert (baseline) and 3-bert (k = 0: an encoder per task) on the tiny model, and 1-bert again
# with head dropout. 3-bert has more parameters at every seed, by the same count: decided at
# the first look. Head dropout moves overall by seed noise only at this budget: open until max.
REAL = dict(space={"sharing.encoder_shared_layers": [0, None]}, baseline={"heads.dropout": 0.3},
            seeds={"start": 2, "max": 3}, max_concurrent=2, tracking={"experiment": "adaptive"},
            claims=[{"name": "3-bert has more parameters", "metric": "params_total",
                     "a": {"sharing.encoder_shared_layers": 0}, "b": {"role": "baseline"},
                     "relation": ">", "min_effect": 1000},
                    {"name": "head dropout moves overall", "metric": "overall",
                     "a": {"sharing.encoder_shared_layers": None, "role": "search"}, "b": {"role": "baseline"},
                     "relation": ">", "min_effect": 1.0e-6}])
EXPECTED = {"baseline": [0, 1, 2], "p000": [0, 1], "p001": [0, 1, 2]}


def _trials(uri: str) -> tuple[object, dict[str, object]]:
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("adaptive")
    [parent] = client.search_runs([experiment.experiment_id], "tags.role = 'sweep'")
    children = client.search_runs([experiment.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}' and tags.role != 'configuration'")
    by_key = {r.data.tags["trial_key"]: r for r in children}
    assert len(by_key) == len(children), "a trial logged twice"
    return parent, by_key


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    work = tmp_path_factory.mktemp("adaptive")
    path = write_sweep(work / "adaptive.yaml", **REAL)
    uri = f"sqlite:///{work / 'mlflow.db'}"
    proc = run_cli(["sweep", "run", str(path), "--name", "whole", "--tracking-uri", uri, "--num-cpus", "2",
                    "--storage", str(work / "runs")], cwd=work, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {"work": work, "path": path, "uri": uri, "out": proc.stdout}


@pytest.mark.slow
def test_real_sweep_spends_seeds_on_the_open_claim(uninterrupted):
    out = uninterrupted["out"]
    parent, trials = _trials(uninterrupted["uri"])
    assert by_variant(sorted(trials)) == EXPECTED, out
    assert all(r.info.status == "FINISHED" for r in trials.values())
    assert "seeds: round 2 for 1 open claim(s) (head dropout moves overall): p001 seed 2, baseline seed 2" in out, out
    assert "seeds: no round 3 (1 undecided claim(s) at 3 seeds) after 8 trials" in out, out
    # The verdicts on the console and on the parent run, with the claims and their design.
    assert "claim 3-bert has more parameters: holds, A − B +" in out and "n=2 (sequential 2..3)" in out, out
    assert "claim head dropout moves overall: inconclusive" in out and "n=3 (sequential 2..3)" in out, out
    client = MlflowClient(uninterrupted["uri"])
    assert {"claims.json", "verdicts.json", "findings.md"} <= {a.path for a in client.list_artifacts(parent.info.run_id)}
    doc = json.loads(Path(client.download_artifacts(parent.info.run_id, "claims.json",
                                                    str(uninterrupted["work"]))).read_text())
    assert doc["seeds"] == {"start": 2, "max": 3, "budget": {}}
    assert [(c["name"], c["looks"], c["a"]["experiment"]) for c in doc["claims"]] == [
        ("3-bert has more parameters", [2, 3], "adaptive"), ("head dropout moves overall", [2, 3], "adaptive")]
    assert parent.data.tags["verdicts"] == "1 holds, 1 inconclusive" and parent.data.tags["claims"] == "2"
    # `mtbert findings` on the store alone says the same.
    proc = run_cli(["findings", "--tracking-uri", uninterrupted["uri"], "--format", "csv"], cwd=uninterrupted["work"])
    assert proc.returncode == 0, proc.stderr
    assert ",holds," in proc.stdout.splitlines()[1] and ",inconclusive," in proc.stdout.splitlines()[2]
    # The leaderboard's Δ overall of the head-dropout point is that claim's interval: its median,
    # its n, its share of the family (2 claims: 2.5%), no interval at 3 seeds over looks 2..3.
    judged = {r["claim"]: r for r in json.loads(Path(client.download_artifacts(
        parent.info.run_id, "verdicts.json", str(uninterrupted["work"]))).read_text())}
    claim = judged["head dropout moves overall"]
    proc = run_cli(["leaderboard", "--experiment", "adaptive", "--tracking-uri", uninterrupted["uri"],
                    "--format", "csv"], cwd=uninterrupted["work"])
    assert proc.returncode == 0, proc.stderr
    board = pd.read_csv(io.StringIO(proc.stdout)).set_index("variant").loc["p001"]
    assert board["overall_delta"] == pytest.approx(claim["delta"]) and board["overall_delta_n"] == claim["n"] == 3
    assert board["overall_delta_alpha"] == pytest.approx(claim["alpha"]) == 0.025
    assert math.isnan(board["overall_delta_low"]) and claim["low"] is None
    md = run_cli(["leaderboard", "--experiment", "adaptive", "--tracking-uri", uninterrupted["uri"]],
                 cwd=uninterrupted["work"]).stdout
    assert "sequential over looks 2..3" in md and "at the claim's level" in md


@pytest.mark.slow
def test_interrupted_after_the_first_round_resumes_to_the_same_trials(uninterrupted, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    log = tmp_path / "driver.log"
    with open(log, "w") as out:
        driver = subprocess.Popen([sys.executable, "-m", "mtbert.cli", "sweep", "run", str(uninterrupted["path"]),
                                   "--name", "cut", "--tracking-uri", uri, "--num-cpus", "2",
                                   "--storage", str(tmp_path / "runs")],
                                  cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, env=cli_env(),
                                  start_new_session=True)
    family: list[int] = []
    try:
        deadline = time.monotonic() + 300
        while "seeds: round 2" not in log.read_text():
            assert driver.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        family = descendants(driver.pid)
        driver.send_signal(signal.SIGINT)  # Ctrl-C: Tune saves the sweep, the driver says how to resume
        driver.wait(120)
    finally:
        stop_pids([driver.pid, *family, *descendants(driver.pid)], grace_s=5)
    assert "mtbert sweep resume cut" in log.read_text(), log.read_text()[-3000:]
    _, cut = _trials(uri)
    assert by_variant(sorted(k for k, r in cut.items() if r.info.status == "FINISHED")) != EXPECTED

    proc = run_cli(["sweep", "resume", "cut", "--storage", str(tmp_path / "runs"), "--num-cpus", "2"], cwd=tmp_path,
                   timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    _, resumed = _trials(uri)
    _, whole = _trials(uninterrupted["uri"])
    assert sorted(resumed) == sorted(whole) and by_variant(sorted(resumed)) == EXPECTED
    assert all(r.info.status == "FINISHED" for r in resumed.values())
    for key, run in whole.items():  # the same seeds train the same models
        assert resumed[key].data.metrics["overall"] == pytest.approx(run.data.metrics["overall"], abs=1e-6), key
    verdicts = [line for line in uninterrupted["out"].splitlines() if line.startswith("claim ")]
    assert [line for line in proc.stdout.splitlines() if line.startswith("claim ")] == verdicts


def test_the_closing_hint_names_a_maximum_resume_takes(tmp_path):
    # Sides that ran fewer seeds than the last look stopped at a budget: resume goes on up to
    # it. Sides that ran to it (a diverged seed leaves n, the pairs, below it) need a larger one.
    import pandas as pd

    from orchestration.run.launch import _more_seeds

    def hint(n: int, ran: int, needed: int) -> str:
        table = pd.DataFrame([{"verdict": "inconclusive", "looks": "3..8", "n": n, "a_n": ran, "b_n": ran,
                               "seeds_needed": needed}]).astype({"seeds_needed": "Int64"})
        [line] = _more_seeds(table, tmp_path / "s")
        return line.split("--seeds-max ")[1].split()[0]

    assert hint(n=4, ran=4, needed=7) == "7"  # budget-stopped at 4 of 8: 7 is within the plan
    assert hint(n=6, ran=8, needed=7) == "9"  # ran to 8, two diverged: only past 8
    assert hint(n=8, ran=8, needed=12) == "12"
