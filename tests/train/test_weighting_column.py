"""The leaderboard's weights column: fixed weights, or the weighting method's name."""
from orchestration.labels import fmt_weighting

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
