"""bench/search.py's accounting on a planted table: budgets are never overrun, a search that
reports reaching the grid's best did measure it, and ASHA spends fewer epochs per trial."""
import importlib.util
import itertools
from pathlib import Path

import pytest

pytest.importorskip("optuna")
spec = importlib.util.spec_from_file_location("search_bench", Path(__file__).resolve().parents[1] / "bench" / "search.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

EPOCHS = 6


def planted_table():
    """3 x 3 x 3 configurations; the score rises with every index and saturates over epochs."""
    table = {}
    for a, b, c in itertools.product(range(3), repeat=3):
        final = 0.5 + 0.05 * a + 0.03 * b + 0.01 * c
        table[(f"r{a}", str(b), str(c))] = [final - 0.1 / e for e in range(1, EPOCHS + 1)]
    return table


@pytest.mark.parametrize("method", ["random", "tpe+asha"])
@pytest.mark.parametrize("share", [0.1, 0.3, 1.0])
def test_budget_is_never_overrun_and_reaching_is_measured(method, share):
    table = planted_table()
    grid_epochs = len(table) * EPOCHS
    best_possible = max(max(c) for c in table.values())
    for seed in range(3):
        budget = int(share * grid_epochs)
        best, improvements, spent = bench.search(table, method, budget, seed)
        assert spent <= budget
        if method == "random":
            assert spent % EPOCHS == 0  # no early stopping: whole trials only
        assert best <= best_possible
        assert improvements[-1][1] == best and [b for _, b in improvements] == sorted(b for _, b in improvements)
        when = bench.reached(improvements, best_possible - 0.01)
        assert (when is not None) == (best >= best_possible - 0.01)
        if when is not None:
            assert 1 <= when <= spent


def test_asha_tries_more_configurations_than_random_for_the_same_budget():
    import optuna

    table = planted_table()
    budget = int(0.3 * len(table) * EPOCHS)
    counts = {}
    for method in ("random", "tpe+asha"):
        trials = []
        original = optuna.study.Study.ask

        def counting_ask(self, *a, **k):
            trial = original(self, *a, **k)
            trials.append(trial)
            return trial
        optuna.study.Study.ask = counting_ask
        try:
            bench.search(table, method, budget, 0)
        finally:
            optuna.study.Study.ask = original
        counts[method] = len(trials)
    assert counts["random"] == budget // EPOCHS
    assert counts["tpe+asha"] >= 2 * counts["random"], counts  # pruned trials cost 1 or 3 epochs, not 6
