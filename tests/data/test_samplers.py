"""Samplers against their formulas (pals-annealed-sampling.txt eq. 3-4 for annealed)."""
from __future__ import annotations

import math
from collections import Counter

import pytest

from mtbert.data.samplers import TaskBatches, annealed_alpha, task_probabilities, task_schedule

SIZES = {"sst": 8544, "para": 16170, "sts": 6040}  # the CS224N train sizes: far from uniform
EPOCHS = 5


def test_probabilities_per_strategy():
    total = sum(SIZES.values())
    assert task_probabilities("proportional", SIZES, 2, EPOCHS) == pytest.approx({t: n / total for t, n in SIZES.items()})
    assert task_probabilities("uniform", SIZES, 1, EPOCHS) == pytest.approx({t: 1 / 3 for t in SIZES})
    assert task_probabilities("round_robin", SIZES, 1, EPOCHS) == pytest.approx({t: 1 / 3 for t in SIZES})
    assert task_probabilities("tuple", SIZES, 1, EPOCHS) == {t: 1.0 for t in SIZES}


def test_annealed_alpha_runs_from_one_to_a_fifth():
    assert annealed_alpha(1, EPOCHS) == 1.0
    assert annealed_alpha(EPOCHS, EPOCHS) == pytest.approx(0.2)
    assert annealed_alpha(3, EPOCHS) == pytest.approx(0.6)
    assert annealed_alpha(1, 1) == 1.0
    first = task_probabilities("annealed", SIZES, 1, EPOCHS)
    last = task_probabilities("annealed", SIZES, EPOCHS, EPOCHS)
    assert first == pytest.approx(task_probabilities("proportional", SIZES, 1, EPOCHS))
    norm = sum(n ** 0.2 for n in SIZES.values())
    assert last == pytest.approx({t: n ** 0.2 / norm for t, n in SIZES.items()})
    assert task_probabilities("annealed", SIZES, 1, 1) == pytest.approx(first)
    # Flatter every epoch: the largest task's share only falls.
    shares = [task_probabilities("annealed", SIZES, e, EPOCHS)["para"] for e in range(1, EPOCHS + 1)]
    assert shares == sorted(shares, reverse=True) and shares[0] > shares[-1] > 1 / 3


@pytest.mark.parametrize("strategy,epoch", [("proportional", 1), ("annealed", 1), ("annealed", 3),
                                            ("annealed", EPOCHS), ("uniform", 2)])
def test_empirical_frequencies_match_probabilities(strategy, epoch):
    steps = 20_000
    schedule = task_schedule(strategy, SIZES, epoch, EPOCHS, steps, seed=5)
    assert len(schedule) == steps and all(len(s) == 1 for s in schedule)
    counts = Counter(s[0] for s in schedule)
    for task, p in task_probabilities(strategy, SIZES, epoch, EPOCHS).items():
        tolerance = 4 * math.sqrt(p * (1 - p) / steps)  # 4 binomial standard deviations
        assert abs(counts[task] / steps - p) < tolerance, (task, counts[task] / steps, p)


def test_random_schedules_are_seeded_by_seed_and_epoch():
    a = task_schedule("proportional", SIZES, 1, EPOCHS, 200, seed=1)
    assert a == task_schedule("proportional", SIZES, 1, EPOCHS, 200, seed=1)
    assert a != task_schedule("proportional", SIZES, 2, EPOCHS, 200, seed=1)
    assert a != task_schedule("proportional", SIZES, 1, EPOCHS, 200, seed=2)


def test_round_robin_gives_every_task_equal_turns():
    schedule = task_schedule("round_robin", SIZES, 1, EPOCHS, 9, seed=0)
    assert schedule == [["sst"], ["para"], ["sts"]] * 3
    # With steps not a multiple of T the cycle continues across epochs, so no task is favoured.
    counts = Counter(s[0] for e in range(1, EPOCHS + 1) for s in task_schedule("round_robin", SIZES, e, EPOCHS, 7, 0))
    assert set(counts) == set(SIZES) and max(counts.values()) - min(counts.values()) <= 1


def test_tuple_trains_every_task_every_step():
    assert task_schedule("tuple", SIZES, 1, EPOCHS, 4, seed=0) == [list(SIZES)] * 4


def test_bad_arguments_name_the_key():
    with pytest.raises(ValueError, match="sampling.strategy: unknown strategy 'random'"):
        task_probabilities("random", SIZES, 1, EPOCHS)
    with pytest.raises(ValueError, match="epoch must be in 1..5"):
        task_probabilities("annealed", SIZES, 0, EPOCHS)
    with pytest.raises(ValueError, match="every task needs training examples"):
        task_probabilities("proportional", {"sst": 0, "sts": 3}, 1, EPOCHS)


def test_task_batches_cover_each_pass_and_reshuffle():
    batches = TaskBatches(n=10, batch_size=4, seed=3)
    passes = []
    for _ in range(3):
        drawn = [batches.next() for _ in range(3)]
        assert [len(b) for b in drawn] == [4, 4, 2]  # a batch never spans two passes
        passes.append([i for b in drawn for i in b])
    assert all(sorted(p) == list(range(10)) for p in passes)
    assert passes[0] != passes[1] != passes[2]
    assert batches.passes == 2
    again = TaskBatches(n=10, batch_size=4, seed=3)
    assert [i for _ in range(3) for i in again.next()] == passes[0]
    assert TaskBatches(n=10, batch_size=4, seed=4).next() != passes[0][:4]


@pytest.mark.parametrize("temperature,cap", [(1.0, None), (2.0, None), (5.0, None), (2.0, 7000)])
def test_temperature_sampling_frequencies_match_n_to_the_one_over_t(temperature, cap):
    capped = {t: min(n, cap) if cap else n for t, n in SIZES.items()}
    norm = sum(n ** (1 / temperature) for n in capped.values())
    expected = {t: n ** (1 / temperature) / norm for t, n in capped.items()}
    assert task_probabilities("temperature", SIZES, 1, EPOCHS, temperature=temperature, size_cap=cap) == pytest.approx(expected)
    steps = 20_000
    counts = Counter(s[0] for s in task_schedule("temperature", SIZES, 1, EPOCHS, steps, seed=3,
                                                 temperature=temperature, size_cap=cap))
    for task, p in expected.items():
        assert abs(counts[task] / steps - p) < 4 * math.sqrt(p * (1 - p) / steps), (task, counts[task] / steps, p)
    if temperature == 1.0:  # T = 1 is proportional sampling
        assert expected == pytest.approx(task_probabilities("proportional", SIZES, 1, EPOCHS))
    if cap:  # the cap evens out the two large tasks: sst and para both count 7000
        assert expected["sst"] == pytest.approx(expected["para"])
