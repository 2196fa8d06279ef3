"""A `points` dimension: tied config overrides (a weighting method with the epochs that give it
the same compute) checked point by point at load, expanded as one grid value crossed with the
others, selected by claims through its config keys, shrunk by --smoke key by key, and, for
real, logged to MLflow as ordinary params and labelled in the leaderboard."""
from __future__ import annotations

import json
import re

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from orchestration.errors import SweepError
from orchestration.report import importance as imp
from orchestration.sweep.claims import configurations, pick
from orchestration.sweep.load import load_sweep
from orchestration.sweep.plan import Planner
from orchestration.sweep.space import POINTS_TAG

from .conftest import run_cli, write_sweep

TUPLE = {"sampling": {"strategy": "tuple"}}  # pcgrad and cagrad need every task's loss in one step
ARM = {"type": "points", "values": [{"loss.weighting": "pcgrad"}, {"loss.weighting": "cagrad"},
                                    {"loss.weighting": "static", "train.epochs": 6}]}


def _claim(a: dict, b: dict) -> dict:
    return {"name": "a vs b", "metric": "overall", "a": a, "b": b, "relation": ">"}


BAD = [
    ({"loss.weighting": "static", "train.epoch": 6},
     "space.arm.values[1].train.epoch: unknown key (did you mean 'train.epochs'?)"),
    ({"loss.weighting": "static", "train.epochs": "six"},
     "space.arm.values[1].train.epochs: value 'six': expected int, got 'six'"),
    ({"loss.weighting": "pcgradd"}, "space.arm.values[1].loss.weighting: value 'pcgradd': unknown method 'pcgradd'"),
    ({"loss": {"weighting": "static"}, "heads": {"dropout": 1.5}},  # nested like base: is dotted
     "space.arm.values[1].heads.dropout: value 1.5: must be in [0, 1)"),
    ({"train.seed": 3}, "space.arm.values[1].train.seed: use the top-level `seeds:` list"),
    ({"loss.weighting": "pcgrad"}, "space.arm.values[1]: the same overrides as values[0]"),
    ("static", "space.arm.values[1]: expected a mapping of config keys to values, got 'static'"),
]


@pytest.mark.parametrize("point, message", BAD, ids=["unknown-key", "bad-int", "unknown-method", "nested-range",
                                                     "seed", "duplicate", "not-a-mapping"])
def test_a_bad_point_is_one_line_naming_the_point_and_key(sweep_file, point, message):
    path = sweep_file(base=TUPLE, space={"arm": {"type": "points", "values": [{"loss.weighting": "pcgrad"}, point]}})
    with pytest.raises(SweepError) as err:
        load_sweep(path)
    text = str(err.value)
    assert "\n" not in text and text.startswith(f"{path}: "), text
    assert message in text, text


@pytest.mark.parametrize("space, message", [
    ({"optim.lr": [1e-4], "arm": {"type": "points", "values": [{"optim.lr": 1e-3}]}},
     "space.arm.values[0].optim.lr: also set by space.optim.lr"),
    ({"arm": {"type": "points", "values": [{"loss.weighting": "cagrad"}]}, "loss.weighting.c": [0.2]},
     "space.loss.weighting.c: also set by space.arm"),
    ({"arm": {"type": "points", "values": []}}, "space.arm.values: expected a non-empty list of points"),
    ({"arm": {"type": "points", "value": [{}]}}, "space.arm.value: unknown key for type points (did you mean 'values'?)"),
])
def test_a_key_is_set_by_one_dimension_only(sweep_file, space, message):
    with pytest.raises(SweepError, match=r"^\S+: " + re.escape(message)):
        load_sweep(sweep_file(base=TUPLE, space=space))


def test_points_are_grid_values_crossed_with_a_grid_dimension(sweep_file):
    path = sweep_file(base=TUPLE, space={"arm": ARM, "heads.dropout": [0.1, 0.3]})
    sweep = load_sweep(path)
    planner = Planner(sweep)
    searched = [t for t in planner.fixed_trials() if t["role"] == "search"]
    got = [(t["values"].get("loss.weighting"), t["values"].get("train.epochs"), t["values"]["heads.dropout"])
           for t in searched]
    assert sorted(got, key=str) == sorted([(w, e, d) for w, e in (("pcgrad", None), ("cagrad", None), ("static", 6))
                                           for d in (0.1, 0.3)], key=str)
    # A key a point leaves out keeps the base config's value; the point's keys are config keys.
    for t in searched:
        assert "arm" not in t["values"]
        assert t["config"]["loss"]["weighting"]["name"] == t["values"]["loss.weighting"]
        assert t["config"]["train"]["epochs"] == t["values"].get("train.epochs", 2)
        assert t["config"]["heads"]["dropout"] == t["values"]["heads.dropout"]
    assert sweep.epoch_budget() == 6  # ASHA's max_t sees the point's epochs
    assert sweep.dims[0].config_keys() == ["loss.weighting", "train.epochs"]
    assert sweep.dims[0].describe() == {"type": "points", "keys": ["loss.weighting", "train.epochs"],
                                        "values": ARM["values"]}

    # Random search draws one point per sample; Optuna suggests an index among the points.
    drawn = load_sweep(sweep_file("random.yaml", base=TUPLE, space={"arm": ARM},
                                  search={"algorithm": "random", "seed": 1}, num_samples=4))
    values = [t["values"] for t in Planner(drawn).fixed_trials() if t["role"] == "search"]
    assert len(values) == 4 and all(v in ARM["values"] for v in values)
    optuna = load_sweep(sweep_file("optuna.yaml", base=TUPLE, space={"arm": ARM, "heads.dropout": [0.1, 0.3]},
                                   search={"algorithm": "optuna"}, num_samples=2))
    planner = Planner(optuna)
    assert set(planner.raw_space(expand_grid=False)) == {"arm", "heads.dropout"}
    trial = planner.from_raw({"arm": 2, "heads.dropout": 1}, "o001", 0)
    assert trial["values"] == {"loss.weighting": "static", "train.epochs": 6, "heads.dropout": 0.3}
    assert trial["config"]["train"]["epochs"] == 6


def test_claims_select_a_point_by_its_keys(sweep_file):
    static = {"loss.weighting": "static", "train.epochs": 6}
    path = sweep_file(base=TUPLE, space={"arm": ARM}, claims=[_claim(static, {"loss.weighting": "pcgrad"})])
    sweep = load_sweep(path)
    configs = configurations(Planner(sweep).fixed_trials())
    [hit] = pick(configs, static)
    assert hit.role == "search" and hit.flat["train.epochs"] == 6 and hit.flat["loss.weighting"] == "static"
    [pcgrad] = pick(configs, {"loss.weighting": "pcgrad"})
    assert pcgrad.flat["train.epochs"] == 2
    assert len(sweep.claims) == 1

    # Without its epochs the static point and the (static) baseline both answer: one line says so.
    vague = sweep_file("vague.yaml", base=TUPLE, space={"arm": ARM},
                       claims=[_claim({"loss.weighting": "static"}, {"loss.weighting": "pcgrad"})])
    with pytest.raises(SweepError, match=r"claims\[0\] \(a vs b\)\.a: .* selects 2 configurations"):
        load_sweep(vague)


def test_smoke_drops_the_keys_it_pins_from_each_point(sweep_file):
    space = {"arm": {"type": "points", "values": [
        {"loss.weighting": "pcgrad", "train.epochs": 2},
        {"loss.weighting": "static", "train.epochs": 6},
        {"loss.weighting": "static", "train.epochs": 8}]}}
    claims = [_claim({"loss.weighting": "static", "train.epochs": 6}, {"loss.weighting": "pcgrad"})]
    sweep = load_sweep(sweep_file(base=TUPLE, space=space, claims=claims), smoke=True)
    [dim] = sweep.dims
    assert dim.points == [{"loss.weighting": "pcgrad"}, {"loss.weighting": "static"}]
    assert "--smoke pins train.epochs (dropped from the points of arm; 2 of 3 points left)" in sweep.notes
    assert not sweep.claims  # it names a key --smoke pins: not judged, and a note says so
    # The pinned keys are still checked: a bad value there fails the smoke run too.
    space["arm"]["values"][2]["train.epochs"] = "eight"
    with pytest.raises(SweepError, match=r"space\.arm\.values\[2\]\.train\.epochs: value 'eight'"):
        load_sweep(sweep_file("bad.yaml", base=TUPLE, space=space), smoke=True)
    # A points dimension whose every key --smoke pins is dropped, as a plain dimension is.
    only = load_sweep(sweep_file("pinned.yaml", space={"arm": {"type": "points", "values": [
        {"train.epochs": 3, "train.batch_size": 4}, {"train.epochs": 5}]}}), smoke=True)
    assert not only.dims and "--smoke pins train.epochs, train.batch_size (space dimension arm dropped)" in only.notes


def test_importance_reads_a_points_dimension_as_one_factor():
    rows = []
    for i, (weighting, epochs) in enumerate((("pcgrad", 2), ("cagrad", 2), ("static", 6))):
        for j, dropout in enumerate((0.1, 0.3)):
            rows.append({"status": "FINISHED", "tags.variant": f"p{2 * i + j:03d}", "tags.role": "search",
                         "tags.seed": "0", "params.loss.weighting": weighting, "params.train.epochs": str(epochs),
                         "params.heads.dropout": str(dropout), "metrics.overall": 0.5 + 0.1 * i})
    tags = {"task_metrics": "", "space_keys": "loss.weighting,train.epochs,heads.dropout",
            POINTS_TAG: json.dumps({"arm": ["loss.weighting", "train.epochs"]})}
    points = imp.points(pd.DataFrame(rows), tags, "tm_relative_score_compute")
    assert [(d.name, d.kind, len(d.choices)) for d in points.dims] == [("arm", "categorical", 3),
                                                                        ("heads.dropout", "float", 0)]
    assert points.values["arm"].iloc[-1] == "loss.weighting=static train.epochs=6"


@pytest.mark.slow
def test_a_points_sweep_logs_its_keys_as_params_and_labels_its_rows(tmp_path):
    """A real --smoke sweep: the points' keys reach MLflow as the trials' own params, and the
    leaderboard's rows name what each point changed."""
    write_sweep(tmp_path / "arms.yaml", name="arms", base=TUPLE, max_concurrent=1, tracking={"log_models": "none"},
                space={"arm": {"type": "points", "values": [
                    {"loss.weighting": "pcgrad"},
                    {"loss.weighting": "static", "train.epochs": 6, "heads.dropout": 0.3}]}},
                claims=[_claim({"loss.weighting": "static", "heads.dropout": 0.3}, {"loss.weighting": "pcgrad"})])
    proc = run_cli(["sweep", "run", "arms.yaml", "--smoke", "--num-cpus", "1"], cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "3 trials, 3 finished" in proc.stdout, proc.stdout[-3000:]
    assert "--smoke pins train.epochs (dropped from the points of arm)" in proc.stdout + proc.stderr

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("arms-smoke")
    runs = client.search_runs([exp.experiment_id])
    [parent] = [r for r in runs if r.data.tags.get("role") == "sweep"]
    assert parent.data.tags["space_keys"] == "loss.weighting,heads.dropout"
    assert json.loads(parent.data.tags[POINTS_TAG]) == {"arm": ["loss.weighting", "heads.dropout"]}
    params = {r.data.tags["variant"]: r.data.params for r in runs if "trial_key" in r.data.tags}
    assert "arm" not in {k for p in params.values() for k in p}  # a name, not a config key
    got = {v: (p["loss.weighting"], p["heads.dropout"], p["train.epochs"]) for v, p in params.items()}
    assert got == {"baseline": ("static", "0.1", "2"), "p000": ("pcgrad", "0.1", "2"),
                   "p001": ("static", "0.3", "2")}, got

    table = run_cli(["leaderboard", "--experiment", "arms-smoke", "--format", "csv"], cwd=tmp_path)
    assert table.returncode == 0, table.stderr[-2000:]
    rows = {line.split(",")[0]: line for line in table.stdout.splitlines()[1:] if line}
    assert set(rows) >= {"baseline", "p000", "p001"}, table.stdout
    assert ",pcgrad," in rows["p000"] and "dropout" not in rows["p000"], rows["p000"]
    assert "dropout=0.3" in rows["p001"] and ",equal," in rows["p001"], rows["p001"]
    assert "dropout" not in rows["baseline"], rows["baseline"]
