"""A sharing regime added by a user module (`plugins:`), in one file, is a config key like the
built-in ones: checked at load with a line naming it, off in the frozen reference, named in the
regime label, built into the model; and a sweep trains it beside a gradient-weighting method
from another plugin file, each run in MLflow with its regime, its method and its figures."""
from __future__ import annotations

import pickle

import pytest
from mlflow.tracking import MlflowClient

from mtbert.components import REGIMES, WEIGHTINGS
from mtbert.config import build_config, flatten, reference_settings, to_dict
from mtbert.errors import ConfigError
from orchestration.sweep.labels import regime_label

from ..plugins import GRADIENT_PLUGIN, REGIME_PLUGIN, installed
from .conftest import TINY_BASE, run_cli, write_sweep


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with installed(tmp_path, "myregime", REGIME_PLUGIN, REGIMES, "tied_top"), \
            installed(tmp_path, "mygradient", GRADIENT_PLUGIN, WEIGHTINGS, "unit_norm"):
        yield tmp_path


def tiny(**sharing):
    return {**TINY_BASE, "plugins": ["myregime"], "sharing": {"encoder_shared_layers": 0, **sharing}}


def test_a_plugin_regime_is_a_sharing_key(plugin_dir):
    cfg = build_config(tiny(tied_top=True))
    assert cfg.sharing.tied_top is True and flatten(to_dict(cfg))["sharing.tied_top"] is True
    assert pickle.loads(pickle.dumps(cfg)) == cfg  # a trial's config crosses processes
    assert build_config(tiny()).sharing.tied_top is False  # off unless set
    with pytest.raises(ConfigError, match=r"sharing\.tied_top: ties the tasks' private top layers"):
        build_config({**tiny(tied_top=True), "sharing": {"tied_top": True}})  # every layer shared
    with pytest.raises(ConfigError, match=r"sharing\.tied_tp: unknown key \(did you mean 'sharing\.tied_top'\?\)"):
        build_config(tiny(tied_tp=True))
    assert reference_settings()["sharing.tied_top"] is False
    label = regime_label({"sharing.head_regime": "I-I-I", "sharing.encoder_shared_layers": "0",
                          "sharing.tied_top": "True"}, ["sharing.tied_top"], {"sharing.tied_top": False})
    assert label == "I-I-I k=0 tied=True"


def test_without_the_plugin_the_key_is_unknown(tmp_path):
    with pytest.raises(ConfigError, match=r"sharing\.tied_top: unknown key"):
        build_config({"sharing": {"tied_top": True}})


def test_a_plugin_regime_changes_the_model(plugin_dir):
    from mtbert.model.multitask import MultitaskModel, count_params

    untied = MultitaskModel(build_config(tiny()), vocab_size=100)
    tied = MultitaskModel(build_config(tiny(tied_top=True)), vocab_size=100)
    tops = {id(layers[-1]) for layers in tied.task_layers.values()}
    assert len(tops) == 1 and len({id(layers[0]) for layers in tied.task_layers.values()}) == 3
    layer = sum(p.numel() for p in untied.layer(1).parameters())
    assert count_params(untied)[0] - count_params(tied)[0] == 2 * layer  # three tops, one kept


@pytest.mark.slow
def test_a_plugin_regime_and_a_plugin_gradient_method_are_swept(plugin_dir):
    write_sweep(plugin_dir / "plugins.yaml", name="plugins",
                base={"plugins": ["myregime", "mygradient"], "sharing": {"encoder_shared_layers": 0},
                      "loss": {"weighting": "unit_norm"}, "sampling": {"strategy": "tuple"}},  # every task each step
                space={"sharing.tied_top": [False, True], "loss.weighting": ["static", "unit_norm"]},
                max_concurrent=1, tracking={"log_models": "none"})
    proc = run_cli(["sweep", "run", "plugins.yaml", "--num-cpus", "1"], cwd=plugin_dir, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "4 trials, 4 finished" in proc.stdout, proc.stdout

    client = MlflowClient(f"sqlite:///{plugin_dir / 'mlflow.db'}")
    exp = client.get_experiment_by_name("plugins")
    runs = {(r.data.params["sharing.tied_top"], r.data.params["loss.weighting"]): r.data.metrics
            for r in client.search_runs([exp.experiment_id]) if "trial_key" in r.data.tags}
    assert set(runs) == {(t, w) for t in ("False", "True") for w in ("static", "unit_norm")}, runs.keys()
    for metrics in runs.values():
        assert {"overall", "params_total", "train_flops"} <= set(metrics), sorted(metrics)
    for method in ("static", "unit_norm"):  # the tied top is one layer where there were three
        assert runs[("True", method)]["params_total"] < runs[("False", method)]["params_total"]
    for tied in ("False", "True"):  # per-task gradients: a backward pass per task, counted
        assert runs[(tied, "unit_norm")]["train_flops"] > runs[(tied, "static")]["train_flops"]
        assert runs[(tied, "unit_norm")]["epoch/weight_sst"] != runs[(tied, "static")]["epoch/weight_sst"]
