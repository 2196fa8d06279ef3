"""Claims in a sweep file: parsed into Claims, every mistake one line naming the file and the
claim before Ray starts, and read back by `mtbert findings` from the file or from the claims
a sweep logged with its parent run (a real sqlite store, runs written by MLflow's client)."""
from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from mtbert.cli import main
from orchestration.errors import SweepError
from orchestration.report.findings import findings, logged_claims
from orchestration.sweep.claims import CLAIMS_FILE, Claim, read_claims, to_doc
from orchestration.sweep.load import load_sweep
from orchestration.sweep.plan import Planner

from .conftest import new_experiment

# baseline I-I-I, p000 S-I-I, p001 I-S-S
SECTIONS = dict(space={"sharing.head_regime": ["S-I-I", "I-S-S"]}, baseline={"sharing.head_regime": "I-I-I"},
                seeds=[0, 1], tracking={"experiment": "claims-test"})
GOOD = {"name": "S-I-I > I-I-I", "metric": "overall", "a": {"sharing.head_regime": "S-I-I"},
        "b": {"role": "baseline"}, "relation": ">"}


def claim(**changes) -> dict:
    out = {**GOOD, **changes}
    return {k: v for k, v in out.items() if v is not None}


def test_claims_parse_with_the_sweeps_experiment(sweep_file):
    sweep = load_sweep(sweep_file(**SECTIONS, claims=[
        GOOD,
        claim(name="I-S-S ~ I-I-I", a={"sharing.head_regime": "I-S-S", "role": "search"}, relation="~",
              min_effect=0.02, source="a paper, Table 1", paper_effect=-0.004, paper="0.51 vs 0.514"),
    ]))
    first, second = sweep.claims
    assert first == Claim("S-I-I > I-I-I", "overall", {"sharing.head_regime": "S-I-I", "experiment": "claims-test"},
                          {"role": "baseline", "experiment": "claims-test"}, ">")
    assert first.min_effect == 0.01 and first.looks is None and first.paper_effect is None
    # by default a sweep's table keeps its error rate as a whole, on the median's interval
    assert (first.error_rate, first.interval, first.chance) == ("family", "median", None)
    per_claim = load_sweep(sweep_file(**SECTIONS, claims=[claim(chance=0.2)],
                                      verdicts={"error_rate": "claim", "interval": "mean"})).claims[0]
    assert (per_claim.error_rate, per_claim.interval, per_claim.chance) == ("claim", "mean", 0.2)
    assert second.relation == "≈" and second.min_effect == 0.02 and second.paper_effect == -0.004
    assert (second.source, second.paper) == ("a paper, Table 1", "0.51 vs 0.514")
    # adaptive seeds: every claim is judged at the design's looks
    adaptive = load_sweep(sweep_file(**{**SECTIONS, "seeds": {"start": 3, "max": 8}}, claims=[GOOD]))
    assert adaptive.claims[0].looks == (3, 8) and adaptive.seeds == [0, 1, 2]


BAD = [
    ({"claims": {"name": "x"}}, "claims: expected a list of claims"),
    ({"claims": ["x"]}, "claims[0]: expected a mapping with name, metric, a, b, relation"),
    ({"claims": [claim(relaton=">")]}, "claims[0] (S-I-I > I-I-I).relaton: unknown key (did you mean 'relation'?)"),
    ({"claims": [claim(b=None)]}, "claims[0] (S-I-I > I-I-I).b: required"),
    ({"claims": [claim(name=3)]}, "claims[0].name: expected a non-empty string, got 3"),
    ({"claims": [claim(min_effect="big")]}, "claims[0] (S-I-I > I-I-I).min_effect: expected a number, got 'big'"),
    ({"claims": [claim(paper_effect=[1])]}, "claims[0] (S-I-I > I-I-I).paper_effect: expected a number, got [1]"),
    ({"claims": [claim(relation="=>")]},
     "claims[0] (S-I-I > I-I-I).relation: expected one of >, <, ≈ (or ~ for ≈); got '=>'"),
    ({"claims": [claim(min_effect=0)]}, "claims[0] (S-I-I > I-I-I).min_effect: must be > 0"),
    ({"claims": [GOOD, claim(a={"sharing.head_regime": "I-S-S"})]},
     "claims[1] (S-I-I > I-I-I).name: two claims named 'S-I-I > I-I-I'"),
    ({"claims": [claim(a={})]}, "claims[0] (S-I-I > I-I-I).a: expected a mapping of config keys to values"),
    ({"claims": [claim(b={"role": "base"})]},
     "claims[0] (S-I-I > I-I-I).b.role: expected one of baseline, reference, search; got 'base'"),
    ({"claims": [claim(b={"experiment": "other", "role": "baseline"})]},
     "claims[0] (S-I-I > I-I-I).b.experiment: a claim compares configurations of its own sweep"),
    ({"claims": [claim(metric="overal")]},
     "claims[0] (S-I-I > I-I-I).metric: 'overal' is not a figure the trials log (did you mean 'overall'?)"),
    ({"claims": [claim(metric="loss_sst")]},  # a per-epoch figure, not a run metric
     "claims[0] (S-I-I > I-I-I).metric: 'loss_sst' is not a figure the trials log"),
    ({"claims": [claim(a={"sharing.head_regim": "S-I-I"})]},
     "claims[0] (S-I-I > I-I-I).a.sharing.head_regim: not a config key (did you mean 'sharing.head_regime'?)"),
    ({"claims": [claim(a={"sharing.head_regime": "S-S-S"})]},
     "claims[0] (S-I-I > I-I-I).a: {'sharing.head_regime': 'S-S-S'} selects none of the sweep's 3 configurations"),
    ({"claims": [claim(a={"role": "search"})]},
     "claims[0] (S-I-I > I-I-I).a: {'role': 'search'} selects 2 configurations (p000, p001); name more keys"),
    ({"claims": [claim(b={"sharing.head_regime": "S-I-I"})]},
     "claims[0] (S-I-I > I-I-I): a and b select the same configuration (p000)"),
    ({"claims": [claim(b={"role": "reference"})]},  # no reference in this sweep
     "claims[0] (S-I-I > I-I-I).b: {'role': 'reference'} selects none of the sweep's 3 configurations"),
    ({"claims": [claim(a={"train.seed": 0})]}, "claims[0] (S-I-I > I-I-I).a.train.seed: seeds pair the two sides"),
    ({"seeds": {"start": 2, "max": 6}}, "seeds: adaptive seeds spend seeds where a claim is still open, and the "
     "sweep has no claims: (nothing to decide)"),
    ({"seeds": {"strat": 2, "max": 6}, "claims": [GOOD]}, "seeds.strat: unknown key (did you mean 'seeds.start'?)"),
    ({"seeds": {"start": 3, "max": 3}, "claims": [GOOD]}, "seeds.max: must be > start (3), got 3"),
    ({"seeds": {"start": 0, "max": 3}, "claims": [GOOD]}, "seeds.start: must be >= 1, got 0"),
    ({"seeds": {"start": 2, "max": 4, "budget": {"trials": 5}}, "claims": [GOOD]},
     "seeds.budget.trials: 5 < 6, the first round (3 configurations x 2 seeds)"),
    ({"seeds": {"start": 2, "max": 4, "budget": {"hours": 0}}, "claims": [GOOD]},
     "seeds.budget.hours: must be > 0, got 0"),
    ({"seeds": "three"}, "seeds: expected a list of seeds or an adaptive design {start, max, budget}, got 'three'"),
    ({"verdicts": {"error_rate": "per-claim"}, "claims": [GOOD]},
     "verdicts.error_rate: expected one of family, claim; got 'per-claim'"),
    ({"verdicts": {"interval": "t"}, "claims": [GOOD]}, "verdicts.interval: expected one of median, mean; got 't'"),
    ({"verdicts": {"rate": "claim"}, "claims": [GOOD]},
     "verdicts.rate: unknown key (did you mean 'verdicts.error_rate'?)"),
    ({"claims": [claim(chance="low")]}, "claims[0] (S-I-I > I-I-I).chance: expected a number, got 'low'"),
    ({"seeds": {"start": 2, "max": 4}, "claims": [GOOD], "search": {"algorithm": "optuna"},
      "space": {"optim.lr": {"type": "loguniform", "low": 1e-4, "high": 1e-2}}},
     "seeds: adaptive seeds need grid or random search"),
    ({"search": {"algorithm": "optuna"}, "space": {"optim.lr": {"type": "loguniform", "low": 1e-4, "high": 1e-2}},
      "claims": [claim(a={"optim.lrr": 1e-3})]},  # optuna: the keys are still checked
     "claims[0] (S-I-I > I-I-I).a.optim.lrr: not a config key (did you mean 'optim.lr'?)"),
]


@pytest.mark.parametrize("sections, message", BAD, ids=[m.split(":")[0] + str(i) for i, (_, m) in enumerate(BAD)])
def test_bad_claim_is_one_line_naming_file_and_claim(sweep_file, sections, message):
    path = sweep_file(**{**SECTIONS, **sections})
    with pytest.raises(SweepError) as err:
        load_sweep(path)
    text = str(err.value)
    assert "\n" not in text and text.startswith(f"{path}: "), text
    assert message in text, text


def test_optuna_checks_keys_only_and_the_cli_refuses_before_ray(sweep_file, capsys):
    # Optuna's configurations come later: a value no planned configuration has is not an error.
    sweep = load_sweep(sweep_file(**{**SECTIONS, "search": {"algorithm": "optuna"},
                                     "space": {"optim.lr": {"type": "loguniform", "low": 1e-4, "high": 1e-2}}},
                                  claims=[claim(a={"optim.lr": 1e-3})]))
    assert sweep.claims[0].a["optim.lr"] == 1e-3
    path = sweep_file(**SECTIONS, claims=[claim(relation="=>")])
    assert main(["sweep", "run", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err and "claims[0] (S-I-I > I-I-I).relation" in err
    import ray

    assert not ray.is_initialized()


def test_smoke_checks_the_real_plan_and_drops_what_it_does_not_run(sweep_file):
    regimes = ["S-I-I", "I-S-S", "S-S-I", "I-I-S", "S-S-S"]  # --smoke keeps 3 of 5: S-I-I, S-S-I, S-S-S
    sections = {**SECTIONS, "space": {"sharing.head_regime": regimes}}
    kept = claim(a={"sharing.head_regime": "S-S-I"})
    dropped = claim(name="I-S-S > I-I-I", a={"sharing.head_regime": "I-S-S"})
    sweep = load_sweep(sweep_file(**sections, claims=[kept, dropped]), smoke=True)
    assert [c.name for c in sweep.claims] == ["S-I-I > I-I-I"]
    assert any("not both of claim 'I-S-S > I-I-I': the claim is not judged" in n for n in sweep.notes)
    with pytest.raises(SweepError, match="selects none"):  # a typo is a typo under --smoke too
        load_sweep(sweep_file(**sections, claims=[claim(a={"sharing.head_regime": "S-X-I"})]), smoke=True)
    # Adaptive under --smoke: one seed each, a second where a claim is open.
    adaptive = load_sweep(sweep_file(**{**sections, "seeds": {"start": 3, "max": 12}}, claims=[kept]), smoke=True)
    assert (adaptive.adaptive.start, adaptive.adaptive.max, adaptive.seeds) == (1, 2, [0])
    assert adaptive.claims[0].looks == (2, 2)  # one seed has no interval: the looks begin at 2
    assert Planner(adaptive).total_trials() == 4 * 2  # baseline + 3 points, at most 2 seeds each


def test_a_configuration_equal_to_the_baseline_is_the_baseline(sweep_file):
    # The plan trains a point identical to the baseline once, as the baseline: a claim naming
    # its values names the baseline, and there is no searched configuration of them.
    sections = {**SECTIONS, "space": {"sharing.head_regime": ["S-I-I", "I-I-I"]}}
    sweep = load_sweep(sweep_file(**sections, claims=[claim(b={"sharing.head_regime": "I-I-I"})]))
    assert sweep.claims[0].b["sharing.head_regime"] == "I-I-I"
    with pytest.raises(SweepError, match=r"a and b select the same configuration \(baseline\)"):
        load_sweep(sweep_file(**sections, claims=[claim(a={"sharing.head_regime": "I-I-I"})]))
    with pytest.raises(SweepError, match="selects none of the sweep's 2 configurations"):
        load_sweep(sweep_file(**sections, claims=[claim(a={"sharing.head_regime": "I-I-I", "role": "search"})]))


# --------------------------------------------------------------------------- findings

SEEDS = (0, 1, 2)


def _sweep_runs(client: MlflowClient, experiment: str, claims: list[Claim] | None,
                overall: dict[str, tuple[str, str, list[float]]]) -> str:
    """A parent run as a sweep logs it (claims.json, tag claims) and one child per variant and
    seed. overall: variant -> (role, head regime param, per-seed overall)."""
    found = client.get_experiment_by_name(experiment)
    exp_id = found.experiment_id if found else new_experiment(client, experiment)
    parent = client.create_run(exp_id, tags={"role": "sweep", "claims": str(len(claims or []))}).info.run_id
    if claims:
        client.log_text(parent, to_doc(claims, {"fixed": list(SEEDS)}), CLAIMS_FILE)
    for variant, (role, regime, values) in overall.items():
        for seed, value in zip(SEEDS, values):
            run = client.create_run(exp_id, tags={"mlflow.parentRunId": parent, "variant": variant,
                                                  "role": role, "seed": str(seed)}).info.run_id
            client.log_param(run, "sharing.head_regime", regime)
            client.log_metric(run, "overall", value)
            client.set_terminated(run, "FINISHED")
    client.set_terminated(parent, "FINISHED")
    return parent


def test_findings_reads_claims_from_a_file_or_from_the_store(sweep_file, tmp_path, capsys):
    # Three seeds: the median's interval needs six, the mean's t-interval (near-normal
    # differences) decides on three; the file says which, and the store's claims.json keeps it.
    path = sweep_file(**SECTIONS, claims=[GOOD, claim(name="I-S-S < I-I-I", a={"sharing.head_regime": "I-S-S"},
                                                      relation="<")], verdicts={"interval": "mean"})
    from_file = read_claims(path)
    assert from_file == load_sweep(path).claims  # the same claims, without the plan's check
    assert {c.interval for c in from_file} == {"mean"}
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    runs = {"baseline": ("baseline", "I-I-I", [0.50, 0.60, 0.55]),
            "p000": ("search", "S-I-I", [0.55, 0.65, 0.60]),   # +0.05 at every seed
            "p001": ("search", "I-S-S", [0.45, 0.55, 0.50])}   # -0.05 at every seed
    _sweep_runs(client, "claims-test", None, runs)  # a sweep from before claims were logged
    with pytest.raises(SweepError, match="no sweep logged claims; name the sweep files"):
        logged_claims(uri)
    _, table = findings(uri, claims=from_file)
    assert table.set_index("claim")["verdict"].to_dict() == {"S-I-I > I-I-I": "holds", "I-S-S < I-I-I": "holds"}
    assert set(table["alpha"]) == {0.025}  # a family of two
    _, median = findings(uri, claims=read_claims(sweep_file("median.yaml", **SECTIONS, claims=[GOOD])))
    assert median.iloc[0]["verdict"] == "inconclusive" and median.iloc[0]["detail"].startswith("too few seeds")

    # The latest sweep of the experiment that logged claims: only its claims, over its runs.
    _sweep_runs(client, "claims-test", from_file[:1], runs)
    assert logged_claims(uri) == from_file[:1]
    text, table = findings(uri)
    assert list(table["claim"]) == ["S-I-I > I-I-I"] and table.iloc[0]["n"] == 3
    assert "| S-I-I > I-I-I |" in text and "**holds**" in text

    capsys.readouterr()
    assert main(["findings", "--tracking-uri", uri, "--format", "csv"]) == 0
    out = capsys.readouterr()
    assert out.out.count("\n") == 2 and "S-I-I > I-I-I" in out.out and "Downloading" not in out.err
    assert main(["findings", str(path), "--tracking-uri", uri, "--format", "csv"]) == 0
    assert "I-S-S < I-I-I" in capsys.readouterr().out
    assert main(["findings", str(path), "--tracking-uri", uri, "--error-rate", "claim"]) == 0
    assert "Per claim: each verdict is wrong with probability at most 5%" in capsys.readouterr().out
    bad = sweep_file("bad.yaml", **SECTIONS, claims=[claim(relation="=>")])
    assert main(["findings", str(bad), "--tracking-uri", uri]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{bad}: claims[0] (S-I-I > I-I-I).relation" in err
    none = sweep_file("none.yaml", **SECTIONS)  # a file without claims: one line, not a table of none
    assert main(["findings", str(none), "--tracking-uri", uri]) == 2
    assert capsys.readouterr().err.strip() == f"mtbert: error: {none}: no claims to judge (a sweep file's `claims:` holds them)"


def test_numbers_match_within_a_relative_tolerance():
    from orchestration.sweep.claims import same

    assert same(0.3333, 0.333) and same(0.0, 0.0) and same(2, 2.0)
    # Learning rates differ by factors, not by 1e-3: none may select another.
    assert not same(1e-4, 3e-4) and not same(5e-5, 1e-4) and not same(1e-9, 0.0)
