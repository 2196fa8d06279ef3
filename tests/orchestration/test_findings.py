"""`mtbert findings` on a small synthetic MLflow store: runs written directly, no training.

Planted: 3-bert beats 1-bert at every seed (holds), hybrid ties 3-bert within a hair (≈ holds),
freezing moves STS up at some seeds and down at others (inconclusive), S-S-I loses to I-I-I
at every seed (contradicted), the weighting [sst .2 para .4 sts .4] loses to equal weights
(holds); the cascade and PAL sweeps were never run.
"""
from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from mtbert.cli import main
from orchestration.errors import SweepError
from orchestration.report.findings import findings, judge_claims, read_runs
from orchestration.sweep.claims import Claim
from orchestration.sweep.claims import read_claims

from .conftest import SWEEPS, new_experiment

STUDY_FILES = sorted(str(p) for p in (SWEEPS / "study").glob("*.yaml"))
CLAIMS = [c for path in STUDY_FILES for c in read_claims(path)]  # the study's claims, as its files declare them

SEEDS = list(range(10))  # enough for the median's interval of a family of 8 claims (9 seeds)
# seed-to-seed spread, shared by every configuration
SPREAD = [0.00, 0.08, -0.05, 0.03, -0.07, 0.05, -0.02, 0.06, -0.04, 0.01]


def _sweep(client: MlflowClient, experiment: str, configs: dict[str, tuple[str, dict, list[dict]]]) -> None:
    """configs: variant -> (role, params, per-seed metrics)."""
    exp_id = new_experiment(client, experiment)
    parent = client.create_run(exp_id, tags={"role": "sweep"}).info.run_id
    for variant, (role, params, per_seed) in configs.items():
        for seed, metrics in zip(SEEDS, per_seed):
            run = client.create_run(exp_id, tags={"mlflow.parentRunId": parent, "variant": variant,
                                                  "role": role, "seed": str(seed)})
            rid = run.info.run_id
            for key, value in params.items():
                client.log_param(rid, key, value)
            for key, value in metrics.items():
                client.log_metric(rid, key, value)
            client.set_terminated(rid, "FINISHED")
    client.set_terminated(parent, "FINISHED")


def _overall(shift: float, jitter: list[float] | None = None) -> list[dict]:
    jitter = jitter or [0.0] * len(SEEDS)
    return [{"overall": 0.70 + s + shift + j, "sts_corr": 0.80 + s + shift + j} for s, j in zip(SPREAD, jitter)]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    uri = f"sqlite:///{tmp_path_factory.mktemp('findings') / 'mlflow.db'}"
    client = MlflowClient(uri)
    _sweep(client, "study-encoder-sharing", {
        "baseline": ("baseline", {"sharing.encoder_shared_layers": "0"}, _overall(0.0)),
        "p000": ("search", {"sharing.encoder_shared_layers": "3"},
                 _overall(0.001, [0.0005, -0.0005, 0.001, 0.0, -0.001] * 2)),
        "p001": ("search", {"sharing.encoder_shared_layers": "None"},
                 _overall(-0.03, [0.002, -0.002, 0.001, 0.0, -0.001] * 2)),
        # the frozen reference also logs k = None: selectors skip it unless they name its role
        "reference": ("reference", {"sharing.encoder_shared_layers": "None"}, _overall(0.2)),
    })
    _sweep(client, "study-freezing", {
        "baseline": ("baseline", {"freeze.layers": "0"}, _overall(0.0)),
        "p000": ("search", {"freeze.layers": "3"}, _overall(0.0, [0.02, -0.02, 0.015, -0.015, 0.0] * 2)),
        "p001": ("search", {"freeze.layers": "-1"}, _overall(-0.1)),
    })
    _sweep(client, "study-head-regimes-frozen", {
        "baseline": ("baseline", {"sharing.head_regime": "I-I-I"}, _overall(0.0)),
        "p000": ("search", {"sharing.head_regime": "S-S-I"},
                 _overall(-0.03, [0.002, -0.002, 0.001, 0.0, -0.001] * 2)),
    })
    # loss weights log spread over loss.weights.<task>; the selector's mapping matches key by key
    _sweep(client, "study-loss-weights-frozen", {
        "baseline": ("baseline", {"loss.weights": "None"}, _overall(0.0)),
        "p000": ("search", {"loss.weights.sts": "0.4", "loss.weights.sst": "0.4", "loss.weights.para": "0.2"},
                 _overall(0.01)),
        "p001": ("search", {"loss.weights.sts": "0.4", "loss.weights.sst": "0.2", "loss.weights.para": "0.4"},
                 _overall(-0.05, [0.002, -0.002, 0.001, 0.0, -0.001] * 2)),
    })
    return uri


def test_planted_effects_get_their_verdicts(store):
    table = judge_claims(read_runs(store), CLAIMS).set_index("claim")
    verdicts = table["verdict"].to_dict()
    assert verdicts["3-bert > 1-bert"] == "holds"
    assert table.loc["3-bert > 1-bert", "delta"] == pytest.approx(0.03) and table.loc["3-bert > 1-bert", "n"] == 10
    assert verdicts["hybrid-bert ≈ 3-bert"] == "holds"
    assert verdicts["freezing the bottom half lifts STS"] == "inconclusive"
    # ±0.02 around 0 at 10 seeds: the observed spread needs more seeds to call it
    assert table.loc["freezing the bottom half lifts STS", "seeds_needed"] > 10
    # the table's 8 claims share 5%: each interval at 5%/8, the median's
    assert set(table["alpha"]) == {0.05 / 8} and set(table["method"]) == {"median"}
    assert table.loc["3-bert > 1-bert", "paper_inside"] is False  # the paper's +0.011 against a clear +0.03
    assert verdicts["S-S-I beats I-I-I on a frozen encoder"] == "contradicted"
    assert verdicts["loss weights [sst .2 para .4 sts .4] below equal (frozen I-S-S)"] == "holds"
    for claim in ("cascade sst>para>sts lifts STS", "annealed sampling beats round robin",
                  "PALs ≈ no PALs with annealed sampling"):
        assert verdicts[claim] == "not run"
    assert set(verdicts) == {c.name for c in CLAIMS}


def test_markdown_and_csv(store):
    text, _ = findings(store, claims=CLAIMS)
    # the study's files declare adaptive seeds (3..12), so the intervals are the sequential ones
    assert "| 3-bert > 1-bert |" in text and "**holds**" in text and "(n=10, sequential 3..12)" in text
    assert "Family-wise: the chance that any of these 8 verdicts is wrong is at most 5%" in text
    assert "paired by seed" in text and "**not run**" in text
    csv, _ = findings(store, ["study-freezing"], fmt="csv", claims=CLAIMS)
    assert csv.splitlines()[0].startswith("claim,source,metric,relation,min_effect")
    assert "freezing the bottom half lifts STS" in csv and ",inconclusive," in csv


def test_one_line_claim_and_loose_selector(store):
    runs = read_runs(store)
    extra = Claim("freezing everything costs overall", "overall",
                  {"experiment": "study-freezing", "freeze.layers": -1}, {"experiment": "study-freezing",
                                                                          "role": "baseline"}, "<")
    assert judge_claims(runs, [extra]).iloc[0]["verdict"] == "holds"
    # hybrid is above 3-bert by 0.001 at every seed, well inside the 0.01 that matters
    tie = Claim("hybrid-bert > 3-bert", "overall",
                {"experiment": "study-encoder-sharing", "sharing.encoder_shared_layers": 3},
                {"experiment": "study-encoder-sharing", "sharing.encoder_shared_layers": 0}, ">")
    assert judge_claims(runs, [tie]).iloc[0]["verdict"] == "no difference that matters"
    loose = Claim("loose", "overall", {"experiment": "study-freezing", "role": "search"},
                  {"experiment": "study-freezing", "role": "baseline"}, ">")
    with pytest.raises(SweepError, match="matches 2 configurations of one sweep"):
        judge_claims(runs, [loose])


def test_cli(store, capsys, tmp_path):
    assert main(["findings", *STUDY_FILES, "--tracking-uri", store, "--experiment", "study-encoder-sharing"]) == 0
    out = capsys.readouterr().out
    assert "| hybrid-bert ≈ 3-bert |" in out and "**not run**" in out
    assert main(["findings", *STUDY_FILES, "--tracking-uri", store, "--output", str(tmp_path / "f.md")]) == 0
    assert "contradicted" in (tmp_path / "f.md").read_text()
    assert main(["findings", "--tracking-uri", store, "--experiment", "nope"]) != 0
    assert "--experiment nope: no such experiment" in capsys.readouterr().err
