"""Synthetic data: valid labels for every task kind, determinism, and a signal simple models find."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from scipy.stats import pearsonr
from sklearn.feature_extraction.text import CountVectorizer
from sklearn.linear_model import LogisticRegression, Ridge

from mtbert.data.synthetic import make_synthetic, vocabulary
from mtbert.tasks import TASKS, TaskSpec, get_task


def check_shape(task: TaskSpec, n: int = 600) -> list:
    examples = make_synthetic(task, n, seed=11)
    assert len(examples) == n
    for e in examples:
        assert e.text.strip() and (e.text2 is not None) == task.pair
        assert task.parse_label(e.label) == e.label, f"{task.name}: invalid label {e.label!r}"
        assert set((e.text + " " + (e.text2 or "")).split()) <= set(vocabulary()) | {"."}
    labels = [e.label for e in examples]
    if task.kind == "regression":
        lo, hi = task.label_range
        assert np.std(labels) > 0.15 * (hi - lo)  # spread over the range, not a constant
    else:
        classes = task.num_classes if task.kind == "multiclass" else 2
        counts = Counter(labels)
        assert set(counts) == set(range(classes))
        assert min(counts.values()) > 0.5 * n / classes  # roughly balanced
    return examples


@pytest.mark.parametrize("name", ["sst", "para", "sts"])
def test_builtin_tasks(name):
    check_shape(get_task(name))


def test_made_up_tasks_get_data_by_kind(toy_tasks):
    for spec in toy_tasks.values():
        assert TASKS[spec.name] is spec
        check_shape(spec)


def test_deterministic_given_seed_and_small_vocabulary():
    task = get_task("para")
    assert make_synthetic(task, 50, 7) == make_synthetic(task, 50, 7)
    assert make_synthetic(task, 50, 7) != make_synthetic(task, 50, 8)
    assert 150 <= len(vocabulary()) <= 500


# --------------------------------------------------------------------------- learnable signal
# Models far weaker than a transformer, trained on one seed and scored on another, must beat
# chance by a wide margin: the labels follow the text, not the seed.

def split(task: TaskSpec, n_train: int = 1500, n_dev: int = 500):
    return make_synthetic(task, n_train, seed=1), make_synthetic(task, n_dev, seed=2)


def overlap(e) -> float:
    a, b = set(e.text.split()) - {"."}, set(e.text2.split()) - {"."}
    return len(a & b) / len(a | b)


def bag_of_words(train, dev):
    bow = CountVectorizer(token_pattern=r"\S+").fit([e.text for e in train])
    return bow.transform([e.text for e in train]), bow.transform([e.text for e in dev])


@pytest.mark.parametrize("name,minimum", [("sst", 0.8), ("toy_topic3", 0.8)])  # chance 0.2, 0.33
def test_single_sentence_classes_follow_polarity_words(toy_tasks, name, minimum):
    # Classes are ordered by the summed polarity, so a linear score rounded to a class fits.
    task = get_task(name)
    train, dev = split(task)
    x_train, x_dev = bag_of_words(train, dev)
    model = Ridge(alpha=0.3).fit(x_train, [e.label for e in train])
    predicted = np.clip(np.rint(model.predict(x_dev)), 0, task.num_classes - 1)
    assert (predicted == [e.label for e in dev]).mean() > minimum


def test_single_sentence_binary_follows_polarity_words(toy_tasks):
    train, dev = split(toy_tasks["toy_polar"])
    x_train, x_dev = bag_of_words(train, dev)
    model = LogisticRegression().fit(x_train, [e.label for e in train])
    assert (model.predict(x_dev) == [e.label for e in dev]).mean() > 0.8  # chance 0.5


def test_single_sentence_regression_follows_polarity_words(toy_tasks):
    train, dev = split(toy_tasks["toy_rating"])
    x_train, x_dev = bag_of_words(train, dev)
    model = Ridge(alpha=0.3).fit(x_train, [e.label for e in train])
    r = pearsonr(model.predict(x_dev), [e.label for e in dev])[0]
    assert r > 0.8


def test_paraphrase_is_decided_by_overlap():
    train, dev = split(get_task("para"))
    x = np.array([[overlap(e)] for e in train])
    model = LogisticRegression().fit(x, [e.label for e in train])
    accuracy = (model.predict(np.array([[overlap(e)] for e in dev])) == [e.label for e in dev]).mean()
    assert accuracy > 0.8  # chance 0.5


@pytest.mark.parametrize("name", ["sts", "toy_relate"])
def test_similarity_follows_overlap(toy_tasks, name):
    _, dev = split(get_task(name))
    assert pearsonr([overlap(e) for e in dev], [e.label for e in dev])[0] > 0.8


def test_pair_classes_follow_overlap(toy_tasks):
    train, dev = split(toy_tasks["toy_overlap4"])
    model = LogisticRegression().fit([[overlap(e)] for e in train], [e.label for e in train])
    accuracy = (model.predict([[overlap(e)] for e in dev]) == [e.label for e in dev]).mean()
    assert accuracy > 0.5  # chance 0.25
