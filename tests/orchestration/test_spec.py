"""Sweep files: every shipped one validates; bad ones fail at load in one line naming the key."""
from __future__ import annotations

from pathlib import Path

import pytest

from mtbert.cli import main
from orchestration.errors import SweepError
from orchestration.sweep.load import load_sweep
from orchestration.sweep.plan import Planner

from .conftest import SHARED, SWEEPS

SHIPPED = sorted(SWEEPS.rglob("*.yaml"))


def test_sweeps_are_shipped():
    names = {str(p.relative_to(SWEEPS)) for p in SHIPPED}
    assert "smoke.yaml" in names and len(names) >= 4


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(SWEEPS)))
def test_shipped_sweep_smoke_validates_and_plans(path):
    sweep = load_sweep(path, smoke=True)
    planner = Planner(sweep)
    trials = planner.fixed_trials()
    assert trials[0]["role"] == "baseline"
    assert sweep.base["model"]["name_or_path"] == "tiny" and sweep.base["data"]["source"] == "synthetic"
    assert sweep.spec.resources.gpu == 0
    assert 2 <= planner.total_trials() <= 8  # seconds, not hours


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(SWEEPS)))
def test_shipped_sweep_says_how_to_run_it(path):
    lines = path.read_text().splitlines(keepends=True)
    head = "".join(lines[:next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))])
    assert f"mtbert sweep run sweeps/{path.relative_to(SWEEPS)}" in head


@pytest.mark.shared
@pytest.mark.skipif(not SHARED.is_dir(), reason="needs ../shared (real data and encoder)")
@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(SWEEPS)))
def test_shipped_sweep_validates_in_full(path, monkeypatch):
    monkeypatch.chdir(SWEEPS.parent)  # shipped sweeps name ../shared relative to the project root
    sweep = load_sweep(path)
    Planner(sweep).fixed_trials()  # every grid/random point is a valid config


BAD = [
    ({"num_sample": 3}, "num_sample: unknown key (did you mean 'num_samples'?)"),
    ({"search": {"algoritm": "grid"}}, "search.algoritm: unknown key (did you mean 'search.algorithm'?)"),
    ({"num_samples": "many"}, "num_samples: expected int, got 'many'"),
    ({"search": {"algorithm": "bayes"}}, "search.algorithm: expected one of grid, random, optuna; got 'bayes'"),
    ({"space": {"sharing.head_regim": {"type": "grid", "values": ["S-I-I"]}}},
     "space.sharing.head_regim: unknown key (did you mean 'sharing.head_regime'?)"),
    ({"space": {"sharing.head_regime": {"type": "choice", "values": ["S-I-I", "X-Y-Z"]}}},
     "space.sharing.head_regime: value 'X-Y-Z': expected S/I letters"),
    ({"space": {"sharing.encoder_shared_layers": [0, 9]}},
     "space.sharing.encoder_shared_layers: value 9: 9 > 2 layers of 'tiny'"),
    ({"space": {"optim.lr": {"type": "uniformm", "low": 0.1, "high": 0.2}}},
     "space.optim.lr.type: expected one of grid, choice, uniform, loguniform, randint, simplex, points; got 'uniformm' (did you mean 'uniform'?)"),
    ({"space": {"optim.lr": {"type": "loguniform", "low": 0, "high": 0.1}}}, "space.optim.lr.low: must be > 0"),
    ({"space": {"optim.lr": {"type": "uniform", "low": 0.1, "hi": 0.2}}},
     "space.optim.lr.hi: unknown key for type uniform (did you mean 'high'?)"),
    ({"space": {"optim.lr": {"type": "uniform", "low": -1.0, "high": 0.1}}},
     "space.optim.lr: value -1.0: must be > 0"),
    ({"space": {"loss.weights": {"type": "simplex", "values": [[0.5, 0.5, 0.5]]}}},
     "space.loss.weights.values[0]: weights must sum to 1, got 1.5"),
    ({"space": {"loss.weights": {"type": "simplex", "tasks": ["sst", "paraa"], "values": [[0.5, 0.5]]}}},
     "space.loss.weights: value {'sst': 0.5, 'paraa': 0.5}: loss.weights.paraa: 'paraa' is not one of tasks"),
    ({"space": {"freeze.layers": {"type": "simplex"}}}, "space.freeze.layers: type simplex produces loss weights"),
    ({"base": {"optim": {"lrr": 0.1}}}, "base: optim.lrr: unknown key (did you mean 'optim.lr'?)"),
    ({"base": {"train": {"epochs": "two"}}}, "base: train.epochs: expected int, got 'two'"),
    ({"search": {"metric": "best_overal"}}, "search.metric: unknown metric 'best_overal' (did you mean 'best_overall'?)"),
    ({"search": {"objectives": ["overall max"]}}, "search.objectives: multi-objective search needs algorithm optuna"),
    ({"search": {"algorithm": "optuna", "objectives": ["overall maximum"]}, "space": {"optim.lr": [0.1, 0.2]}},
     "search.objectives[0]: expected 'metric max' or 'metric min'"),
    ({"baseline": {"sharing.head_regime": "I-X-I"}}, "baseline: sharing.head_regime: expected S/I letters"),
    ({"scheduler": {"type": "asha", "grace_period": 5}}, "scheduler.grace_period: 5 > max_t 2"),
    ({"seeds": [1, 1]}, "seeds: duplicate seed in [1, 1]"),
    ({"search": {"algorithm": "optuna"}}, "space: optuna needs at least one dimension to search"),
    ({"space": {"train.seed": [0, 1]}}, "space.train.seed: use the top-level `seeds:` list"),
    ({"base_config": "missing.yaml"}, "base_config: "),
    ({"reference": {"optim.lrr": 0.1}}, "reference: optim.lrr: unknown key (did you mean 'optim.lr'?)"),
    ({"reference": 3}, "reference: expected bool or mapping of Any, got 3"),
]


@pytest.mark.parametrize("sections, message", BAD, ids=[m.split(":")[0] for _, m in BAD])
def test_bad_sweep_is_one_line_naming_the_key(sweep_file, sections, message):
    path = sweep_file(**sections)
    with pytest.raises(SweepError) as err:
        load_sweep(path)
    text = str(err.value)
    assert isinstance(err.value, ValueError)
    assert "\n" not in text
    assert text.startswith(str(path)), text
    assert message in text, text


def test_cli_prints_one_line_without_traceback(sweep_file, capsys):
    path = sweep_file(space={"sharing.head_regime": {"type": "choice", "values": ["S-I-I", "Q-Q-Q"]}})
    assert main(["sweep", "run", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert err.startswith("mtbert: error: ") and "space.sharing.head_regime: value 'Q-Q-Q'" in err


def test_invalid_yaml_names_the_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("space:\n  optim.lr: [1, 2\n")
    with pytest.raises(SweepError, match=r"broken.yaml: line \d+ not valid YAML"):
        load_sweep(path)


def test_set_routes_sweep_and_config_keys(sweep_file):
    path = sweep_file(space={"optim.lr": [0.1, 0.2]})
    sweep = load_sweep(path, ["num_samples=3", "search.seed=7", "optim.weight_decay=0.5", "base.train.epochs=3"])
    assert sweep.spec.num_samples == 3 and sweep.spec.search.seed == 7
    assert sweep.base["optim"]["weight_decay"] == 0.5 and sweep.base["train"]["epochs"] == 3
    with pytest.raises(SweepError, match="--set space.optim.lr: 'space' can only be changed in the sweep file"):
        load_sweep(path, ["space.optim.lr=1"])


def test_smoke_shrinks_and_pins(sweep_file):
    path = sweep_file(base={"model": {"name_or_path": "bert-base-uncased"}, "train": {"epochs": 10}},
                      space={"model.name_or_path": ["bert-base-uncased", "roberta-base"],
                             "sharing.encoder_shared_layers": [0, 6]},
                      resources={"cpu": 8, "gpu": 1}, num_samples=9, seeds=[3, 4, 5],
                      smoke={"sampling.steps_per_epoch": 2})
    sweep = load_sweep(path, smoke=True)
    assert sweep.base["model"]["name_or_path"] == "tiny" and sweep.base["train"]["epochs"] == 2
    assert sweep.base["sampling"]["steps_per_epoch"] == 2  # the sweep's own smoke: section
    assert sweep.base["model"]["tiny"]["layers"] == 6  # deep enough for the swept k = 6
    assert [d.key for d in sweep.dims] == ["sharing.encoder_shared_layers"]
    assert any("model.name_or_path" in n for n in sweep.notes)
    assert sweep.spec.resources.cpu == 1 and sweep.spec.resources.gpu == 0
    assert sweep.spec.num_samples == 2 and sweep.seeds == [3]
    # --set is the later word and wins over the shrink.
    assert load_sweep(path, ["train.epochs=3", "seeds=[3,4]"], smoke=True).base["train"]["epochs"] == 3


def test_base_config_file_and_absolute_paths(tmp_path, sweep_file, monkeypatch):
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "base.yaml").write_text("optim: {lr: 0.01}\ndata: {cache_dir: cache}\n")
    path = sweep_file(base_config="conf/base.yaml", base={"data": {"dir": "data/minbert"}})
    monkeypatch.chdir(tmp_path)
    sweep = load_sweep(path)
    assert sweep.base["optim"]["lr"] == 0.01
    assert sweep.base["data"]["dir"] == str(tmp_path / "data" / "minbert")
    assert sweep.base["data"]["cache_dir"] == str(tmp_path / "cache")
    trial = Planner(sweep).fixed_trials()[0]
    assert Path(trial["config"]["data"]["dir"]).is_absolute()


def test_tracking_uri_resolution(tmp_path, monkeypatch):
    from orchestration.paths import resolve_tracking_uri

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert resolve_tracking_uri(None, None, tmp_path) == f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert resolve_tracking_uri("sqlite:///x/m.db", None, tmp_path) == f"sqlite:///{tmp_path / 'x' / 'm.db'}"
    assert resolve_tracking_uri(None, "http://h:5000", tmp_path) == "http://h:5000"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:////abs/e.db")
    assert resolve_tracking_uri(None, None, tmp_path) == "sqlite:////abs/e.db"


def test_resume_of_an_unknown_sweep_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", "resume", "no-such-sweep"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("mtbert: error: no-such-sweep: not a sweep folder (no mtbert_sweep.json), nor the start of "
                   "a sweep's name under runs/; give the folder or its name")
    assert main(["sweep", "resume", "no-such-sweep", "--storage", "elsewhere"]) == 2
    assert capsys.readouterr().err.strip() == ("mtbert: error: no-such-sweep: not a sweep folder (no mtbert_sweep.json), "
                                               "nor the start of a sweep's name under --storage elsewhere; give the "
                                               "folder or its name")
    (tmp_path / "runs" / "half").mkdir(parents=True)
    (tmp_path / "runs" / "half" / "mtbert_sweep.json").write_text("{}")
    assert main(["sweep", "resume", "half"]) == 2
    assert "the sweep died before Ray Tune saved its state; run it again" in capsys.readouterr().err


def test_resume_finds_a_sweep_by_the_start_of_its_name_and_lists_the_candidates_when_several(tmp_path, monkeypatch,
                                                                                           capsys):
    monkeypatch.chdir(tmp_path)
    for name in ("share-20261127-101500", "other-20261127-101500"):
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "mtbert_sweep.json").write_text("{}")
    assert main(["sweep", "resume", "share"]) == 2  # found by its sweep's name: the folder is the one
    assert f"{tmp_path / 'runs' / 'share-20261127-101500'}: the sweep died before" in capsys.readouterr().err
    (tmp_path / "runs" / "share-20261128-090000").mkdir()
    (tmp_path / "runs" / "share-20261128-090000" / "mtbert_sweep.json").write_text("{}")
    assert main(["sweep", "resume", "share"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("2 sweeps start with this name under " + str(tmp_path / "runs")
                        + ": share-20261127-101500, share-20261128-090000; give one of them"), err


def test_reference_runs_beside_the_baseline_under_each_seed(sweep_file):
    sweep = load_sweep(sweep_file(reference={"train.epochs": 3}, seeds=[0, 1],
                                  base={"sts": {"head": "cosine_mlp"}}))
    trials = Planner(sweep).fixed_trials()
    ref = [t for t in trials if t["role"] == "reference"]
    assert [t["key"] for t in ref] == ["reference-s0", "reference-s1"]
    assert [t["role"] for t in trials[:4]] == ["baseline", "baseline", "reference", "reference"]
    config = ref[0]["config"]
    # the encoder as it came, linear heads; the recipe's STS head, not the base's; the mapping on top
    assert config["freeze"]["layers"] == -1 and config["sharing"]["head_regime"] == "none"
    assert config["sts"]["head"] == "regression" and config["train"]["epochs"] == 3  # tiny's recipe
    assert load_sweep(sweep_file()).reference is None


def test_the_smoke_check_reads_the_epoch_budget_the_real_sweep_runs(sweep_file):
    """--smoke checks ASHA's grace period against the real sweep's budget, which a baseline
    that trains longer raises: one rule for both (spec.epoch_budget)."""
    asha = {"scheduler": {"type": "asha", "grace_period": 3}}
    longer = sweep_file(baseline={"train": {"epochs": 4}}, **asha)
    assert load_sweep(longer).epoch_budget() == 4
    assert load_sweep(longer, smoke=True).spec.scheduler.grace_period >= 1  # accepted
    with pytest.raises(SweepError, match="grace_period: 3 > 2, the epoch budget of the real sweep"):
        load_sweep(sweep_file(**asha), smoke=True)
