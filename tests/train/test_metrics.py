"""Metrics agree with scipy / scikit-learn; the TM-relative score reproduces the paper's tables."""
import numpy as np
import pytest
from scipy.stats import pearsonr
from sklearn.metrics import accuracy_score

from mtbert.tasks import get_task
from mtbert.train.metrics import accuracy, overall, pearson, tm_relative_score


def test_accuracy_and_pearson_match_reference():
    rng = np.random.default_rng(0)
    for _ in range(5):
        y = rng.integers(0, 5, 200)
        p = np.where(rng.random(200) < 0.6, y, rng.integers(0, 5, 200))
        assert accuracy(p, y) == pytest.approx(accuracy_score(y, p))
        a, b = rng.normal(size=300), rng.normal(size=300)
        b = a * 0.5 + b
        assert pearson(a, b) == pytest.approx(pearsonr(a, b)[0], abs=1e-12)


def test_pearson_of_constant_prediction_is_zero():
    assert pearson(np.ones(10), np.arange(10)) == 0.0


def test_cs224n_mapping_and_overall():
    assert get_task("sts").cs224n_score(0.5) == pytest.approx(0.75)
    assert get_task("sst").cs224n_score(0.5) == 0.5
    assert overall([0.5, 0.8, 0.2]) == pytest.approx(0.5)


# mops-tm-relative-score.txt, Table 1 (pretrained weights): I-I-I* is the baseline.
BASE = {"overall": 0.328, "train_time_s": 3188.01, "model_size_mb": 497}
TABLE1 = [  # (overall, time, size, printed TM-relative)
    (0.354, 3251.50, 483, 0.357),
    (0.342, 3418.73, 483, 0.328),
    (0.339, 3198.43, 469, 0.358),
    (0.377, 3389.97, 469, 0.375),
    (0.392, 3210.24, 469, 0.412),
]


def test_tm_relative_baseline_is_one():
    assert tm_relative_score(BASE, BASE) == 1.0


@pytest.mark.parametrize("score, time, size, printed", TABLE1)
def test_tm_relative_reproduces_table1(score, time, size, printed):
    run = {"overall": score, "train_time_s": time, "model_size_mb": size}
    # The paper prints the ratio scaled by the baseline's overall score.
    assert tm_relative_score(run, BASE) * BASE["overall"] == pytest.approx(printed, abs=1.5e-3)
