"""The leaderboard's labels: the weights column (fixed weights, or the weighting method's name) and the regime."""
from orchestration.sweep.labels import fmt_weighting

TASKS = ["sst", "para", "sts"]
BEST = {"sst": "0.2", "para": "0.4", "sts": "0.4"}  # MLflow params are strings


def test_weights_column_names_the_method():
    assert fmt_weighting("static", None, TASKS) == "equal"
    assert fmt_weighting("static", BEST, TASKS) == "[.20 .40 .40]"
    for method in ("uncertainty", "gradnorm", "dwa", "cagrad"):
        assert fmt_weighting(method, None, TASKS) == method
    assert fmt_weighting("pcgrad", None, TASKS) == "pcgrad"
    assert fmt_weighting("pcgrad", BEST, TASKS) == "pcgrad [.20 .40 .40]"
    # Runs logged before loss.weighting existed: loss.pcgrad decides.
    assert fmt_weighting(None, None, TASKS, "True") == "pcgrad"
    assert fmt_weighting(None, BEST, TASKS, "False") == "[.20 .40 .40]"


def test_regime_label_names_a_whole_frozen_encoder():
    from orchestration.sweep.labels import regime_label

    swept = ["freeze.layers", "sharing.head_regime"]
    row = {"sharing.head_regime": "I-I-I", "sharing.encoder_shared_layers": "None"}
    assert regime_label({**row, "freeze.layers": "-1"}, swept, {"freeze.layers": 0}) == "I-I-I k=all freeze=all"
    assert regime_label({**row, "freeze.layers": "3"}, swept, {"freeze.layers": 0}) == "I-I-I k=all freeze=3"
    assert regime_label({**row, "freeze.layers": "0"}, swept, {"freeze.layers": 0}) == "I-I-I k=all"
