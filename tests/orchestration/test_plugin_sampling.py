"""A sampling strategy added by a user module (`plugins:`), with a setting of its own, is a
sweep dimension like any config key: each trial's config carries it, and a bad value or a
misspelt setting is refused when the sweep is loaded (here as `--smoke` loads it)."""
from __future__ import annotations

import pytest

from mtbert.components import SAMPLERS
from orchestration.errors import SweepError
from orchestration.sweep.spec import load_sweep

from ..plugins import SAMPLING_PLUGIN, installed
from .conftest import write_sweep

BASE = {"plugins": ["mysampling"], "sampling": {"strategy": "only"}}


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with installed(tmp_path, "mysampling", SAMPLING_PLUGIN, SAMPLERS, "only"):
        yield tmp_path


def test_a_plugin_strategy_setting_is_a_sweep_dimension(plugin_dir):
    path = write_sweep(plugin_dir / "only.yaml", base=BASE, space={"sampling.strategy.task": ["sst", "sts"]})
    sweep = load_sweep(path, smoke=True)
    assert [sweep.config_for({"sampling.strategy.task": t}, 0)["sampling"]["strategy"] for t in ("sst", "sts")] == [
        {"name": "only", "task": "sst"}, {"name": "only", "task": "sts"}]
    bad = write_sweep(plugin_dir / "bad.yaml", base=BASE, space={"sampling.strategy.task": ["sst", "nli"]})
    with pytest.raises(SweepError, match=r"space\.sampling\.strategy\.task: value 'nli': .*'nli' is not one of tasks"):
        load_sweep(bad, smoke=True)
    typo = write_sweep(plugin_dir / "typo.yaml", base=BASE, space={"sampling.strategy.tsk": ["sst"]})
    with pytest.raises(SweepError, match=r"not a setting of strategy only \(did you mean 'sampling\.strategy\.task'\?\)"):
        load_sweep(typo, smoke=True)
