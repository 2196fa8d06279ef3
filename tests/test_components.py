"""Components own their settings: a weighting method or a sampling strategy is chosen by name
or with its settings, its settings are config keys (--set, flatten/MLflow), old spellings still
load, validation only reads, a plug-in's component brings settings the config did not know
(and trains), and config and the methods do not import each other."""
from __future__ import annotations

import copy
import logging
import subprocess
import sys
import textwrap

import pytest

from mtbert.components import SAMPLERS, WEIGHTINGS
from mtbert.config import ConfigError, build_config, flatten, resolve, to_dict, validate

from .plugins import GRADIENT_PLUGIN, SAMPLING_PLUGIN, WEIGHTING_PLUGIN, installed

TUPLE = {"sampling.strategy": "tuple"}


def test_a_method_by_name_or_with_its_settings():
    by_name = build_config({"loss": {"weighting": "cagrad"}}, TUPLE)
    assert by_name.loss.weighting.name == "cagrad" and by_name.loss.weighting.c == 0.4
    mapping = build_config({"loss": {"weighting": {"name": "cagrad", "c": 0.2}}}, TUPLE)
    assert mapping.loss.weighting.c == 0.2
    # A setting set over a method named alone keeps the method.
    dotted = build_config({"loss": {"weighting": "gradnorm"}}, {**TUPLE, "loss.weighting.alpha": 0.5})
    assert (dotted.loss.weighting.name, dotted.loss.weighting.alpha, dotted.loss.weighting.lr) == ("gradnorm", 0.5, 0.025)
    # As MLflow params: the method under its key, each setting below it.
    flat = flatten(mapping)
    assert flat["loss.weighting"] == "cagrad" and flat["loss.weighting.c"] == 0.2
    assert flatten(build_config({}))["loss.weighting"] == "static"
    # The resolved config rebuilds to the same config (result.json, bundles, Ray trials).
    assert build_config(to_dict(mapping)) == mapping


@pytest.mark.parametrize("overrides, message", [
    ({"loss.weighting": {"name": "cagrad", "cc": 1}},
     "loss.weighting.cc: not a setting of method cagrad (did you mean 'loss.weighting.c'?); its settings: c"),
    ({"loss.weighting": {"name": "static", "c": 1}}, "loss.weighting.c: not a setting of method static; it has none"),
    ({"loss.weighting": {"c": 0.2}}, "loss.weighting.name: missing"),
    ({"loss.weighting": "dwaa"}, "loss.weighting: unknown method 'dwaa' (did you mean 'dwa'?)"),
    ({"loss.weighting": ["dwa"]}, "loss.weighting: expected a method name, or a mapping"),
    ({"loss.weighting": {"name": "cagrad", "c": -1}, **TUPLE}, "loss.weighting.c: must be >= 0, got -1"),
    ({"loss.weighting": {"name": "gradnorm", "lr": 0}, **TUPLE}, "loss.weighting.lr: must be > 0"),
    ({"loss.weighting": {"name": "dwa", "temperature": "hot"}}, "loss.weighting.temperature: expected float"),
    ({"loss.weighting": "cagrad"}, "loss.weighting: cagrad needs a loss for several tasks"),
])
def test_setting_errors_are_one_line_naming_the_key(overrides, message):
    with pytest.raises(ConfigError) as err:
        build_config({}, overrides)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_old_spellings_load_with_a_deprecation_line(caplog, monkeypatch):
    import mtbert.config

    monkeypatch.setattr(mtbert.config, "_said", set())  # each line is said once per process
    caplog.set_level(logging.WARNING, logger="mtbert.config")
    old = build_config({"loss": {"weighting": "cagrad", "cagrad": {"c": 0.1}, "dwa": {"temperature": 3.0}}}, TUPLE)
    assert old.loss.weighting == build_config({"loss": {"weighting": {"name": "cagrad", "c": 0.1}}}, TUPLE).loss.weighting
    assert "loss.cagrad: write its settings as loss.weighting: {name: cagrad, ...}" in caplog.text
    # Written both ways, the new spelling wins; an old block of another method is checked, then unused.
    both = build_config({"loss": {"weighting": {"name": "cagrad", "c": 0.3}, "cagrad": {"c": 0.1}}}, TUPLE)
    assert both.loss.weighting.c == 0.3
    with pytest.raises(ConfigError, match=r"^config: loss\.dwa\.temperature: must be > 0"):
        build_config({}, {"loss.dwa.temperature": 0})
    pcgrad = build_config({}, {"loss.pcgrad": True, **TUPLE})
    assert pcgrad.loss.weighting.name == "pcgrad" and flatten(pcgrad)["loss.pcgrad"] is True
    assert "loss.pcgrad: true is the old spelling of loss.weighting: pcgrad" in caplog.text


def test_a_strategy_by_name_or_with_its_settings():
    by_name = build_config({"sampling": {"strategy": "temperature"}})
    assert by_name.sampling.strategy.name == "temperature" and by_name.sampling.strategy.temperature == 2.0
    mapping = build_config({"sampling": {"strategy": {"name": "temperature", "temperature": 3.0, "size_cap": 500}}})
    assert (mapping.sampling.strategy.temperature, mapping.sampling.strategy.size_cap) == (3.0, 500)
    dotted = build_config({"sampling": {"strategy": "temperature"}},
                          ["sampling.strategy.temperature=3", "sampling.strategy.size_cap=500"])
    assert dotted == mapping
    flat = flatten(mapping)
    assert flat["sampling.strategy"] == "temperature" and flat["sampling.strategy.temperature"] == 3.0
    assert flatten(build_config({}))["sampling.strategy"] == "round_robin"
    assert build_config(to_dict(mapping)) == mapping


@pytest.mark.parametrize("overrides, message", [
    ({"sampling.strategy": {"name": "temperature", "temprature": 3}},
     "sampling.strategy.temprature: not a setting of strategy temperature (did you mean "
     "'sampling.strategy.temperature'?); its settings: temperature, size_cap"),
    ({"sampling.strategy": {"name": "tuple", "temperature": 3}},
     "sampling.strategy.temperature: not a setting of strategy tuple; it has none"),
    ({"sampling.strategy": "anealed"}, "sampling.strategy: unknown strategy 'anealed' (did you mean 'annealed'?)"),
    ({"sampling.strategy": {"name": "temperature", "temperature": 0}}, "sampling.strategy.temperature: must be > 0"),
    ({"sampling.strategy": {"name": "temperature", "size_cap": 0}}, "sampling.strategy.size_cap: must be > 0"),
])
def test_strategy_setting_errors_are_one_line_naming_the_key(overrides, message):
    with pytest.raises(ConfigError) as err:
        build_config({}, overrides)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_flat_sampling_settings_load_with_a_deprecation_line(caplog, monkeypatch):
    import mtbert.config

    monkeypatch.setattr(mtbert.config, "_said", set())
    caplog.set_level(logging.WARNING, logger="mtbert.config")
    old = build_config({"sampling": {"strategy": "temperature", "temperature": 3.0, "size_cap": 500}})
    assert old.sampling.strategy == build_config(
        {"sampling": {"strategy": {"name": "temperature", "temperature": 3.0, "size_cap": 500}}}).sampling.strategy
    assert ("sampling.temperature, sampling.size_cap: write the temperature strategy's settings as "
            "sampling.strategy: {name: temperature, ...}") in caplog.text
    # The old --set spelling too; the new spelling wins where both are written.
    by_set = build_config({}, ["sampling.strategy=temperature", "sampling.temperature=4"])
    assert by_set.sampling.strategy.temperature == 4.0
    both = build_config({"sampling": {"strategy": {"name": "temperature", "temperature": 5.0}, "temperature": 3.0}})
    assert both.sampling.strategy.temperature == 5.0
    # A config saved before (result.json, a bundle's config.yaml) carries them at their defaults: no line.
    caplog.clear()
    monkeypatch.setattr(mtbert.config, "_said", set())
    saved = build_config({"sampling": {"strategy": "annealed", "steps_per_epoch": None, "temperature": 2.0,
                                       "size_cap": None}})
    assert saved.sampling.strategy.name == "annealed" and "deprecated" not in caplog.text


def test_a_config_from_before_components_loads():
    """result.json / bundle config.yaml as older versions wrote them: every method's block."""
    raw = to_dict(build_config({}, TUPLE))
    raw["loss"] = {"weights": None, "weighting": "gradnorm", "pcgrad": False,
                   "uncertainty": {"init": 0.0}, "gradnorm": {"alpha": 1.0, "lr": 0.025},
                   "dwa": {"temperature": 2.0}, "cagrad": {"c": 0.4}, "smart": {"weight": 0.0}}
    cfg = build_config(raw)
    assert cfg.loss.weighting.name == "gradnorm" and cfg.loss.weighting.alpha == 1.0


def test_validate_only_reads():
    cfg = build_config({}, {"sharing.cascade": "sst > para", "pairs.encoding": "cross",
                            "loss.weighting": {"name": "cagrad", "c": 0.2}, **TUPLE})
    assert cfg.sharing.cascade == "sst>para"  # resolve() wrote it in its one spelling
    before = copy.deepcopy(cfg)
    validate(cfg)
    assert cfg == before
    assert resolve(copy.deepcopy(cfg)) == cfg  # and resolving again changes nothing


def test_sharing_checks_are_the_models_too():
    """A config built by hand, never validated, meets the same checks in the model."""
    from mtbert.model.multitask import MultitaskModel

    cfg = build_config({}, {"pairs.encoding": "cross"})
    cfg.sharing.cascade = "sst>para"
    cfg.sharing.head_regime = "S-I"
    with pytest.raises(ConfigError, match="sharing.cascade: downstream heads read"):
        validate(cfg)
    with pytest.raises(ConfigError, match="sharing.cascade: downstream heads read"):
        MultitaskModel(cfg, vocab_size=100)




@pytest.fixture
def scaled_plugin(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    with installed(tmp_path, "scaled_weighting", WEIGHTING_PLUGIN, WEIGHTINGS, "scaled") as module:
        yield module


def test_a_plugin_method_brings_its_settings(scaled_plugin):
    from mtbert.train.weighting import make_weighting

    cfg = build_config({"plugins": [scaled_plugin], "loss": {"weighting": {"name": "scaled", "scale": 0.25}}})
    assert flatten(cfg)["loss.weighting.scale"] == 0.25
    assert make_weighting(cfg).settings.scale == 0.25
    assert build_config(to_dict(cfg)) == cfg
    with pytest.raises(ConfigError, match=r"loss\.weighting\.scale: must be in \(0, 1\], got 2\.0"):
        build_config({"plugins": [scaled_plugin]}, {"loss.weighting": "scaled", "loss.weighting.scale": 2})


@pytest.fixture
def unit_norm_plugin(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    with installed(tmp_path, "unit_norm_weighting", GRADIENT_PLUGIN, WEIGHTINGS, "unit_norm") as module:
        yield module


def test_a_gradient_method_from_outside_the_package_trains_with_its_setting(unit_norm_plugin, tmp_path):
    """The plug-in gives its coefficients alone: the per-task gradients, the step and the cost
    of the extra passes come from GradientWeighting."""
    from mtbert.train.loop import train

    quick = {"plugins": [unit_norm_plugin], "sampling.strategy": "tuple", "sampling.steps_per_epoch": 4,
             "train.epochs": 1, "data.synthetic.train_size": 60, "data.synthetic.dev_size": 12,
             "train.save_checkpoint": False, "data.cache_dir": str(tmp_path / "cache")}
    with pytest.raises(ConfigError, match=r"loss\.weighting\.scale: must be > 0, got -1\.0"):
        build_config({}, {**quick, "loss.weighting": "unit_norm", "loss.weighting.scale": -1})
    with pytest.raises(ConfigError, match=r"loss\.weighting\.scael: not a setting of method unit_norm"):
        build_config({}, {**quick, "loss.weighting": {"name": "unit_norm", "scael": 2}})
    runs = {name: train(build_config({}, {**quick, "loss.weighting": name, **extra}), log=None).epochs[-1]
            for name, extra in (("unit_norm", {"loss.weighting.scale": 2.0}), ("static", {}))}
    assert all(runs["unit_norm"][f"weight_{t}"] > 0 for t in ("sst", "para", "sts"))
    # Its two extra backward passes per step are in the trial's count.
    assert runs["unit_norm"]["train_flops"] > 1.3 * runs["static"]["train_flops"]


def test_config_and_the_methods_do_not_import_each_other():
    code = textwrap.dedent("""
        import sys
        import mtbert.config
        assert "mtbert.train.weighting" not in sys.modules and "torch" not in sys.modules, "config"
        del sys.modules["mtbert.config"]
        import mtbert.train.weighting
        assert "mtbert.config" not in sys.modules, "weighting"
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.fixture
def only_plugin(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    with installed(tmp_path, "only_sampling", SAMPLING_PLUGIN, SAMPLERS, "only") as module:
        yield module


def test_a_plugin_strategy_brings_its_settings_and_trains(only_plugin, tmp_path):
    from mtbert.train.loop import train

    with pytest.raises(ConfigError, match="sampling.strategy: unknown strategy 'only'"):
        build_config({}, {"sampling.strategy": "only"})
    raw = {"plugins": [only_plugin], "sampling": {"strategy": {"name": "only", "task": "sts"}, "steps_per_epoch": 6}}
    cfg = build_config(raw, {"train.epochs": 1, "data.synthetic.train_size": 120, "data.synthetic.dev_size": 30,
                             "train.save_checkpoint": False, "data.cache_dir": str(tmp_path / "cache")})
    assert flatten(cfg)["sampling.strategy.task"] == "sts"
    assert build_config(to_dict(cfg)) == cfg
    with pytest.raises(ConfigError, match=r"sampling\.strategy\.task: 'nli' is not one of tasks"):
        build_config(raw, ["sampling.strategy.task=nli"])
    epoch = train(cfg, log=None).epochs[-1]
    # Only the chosen task trained: the weighting reports a weight for the tasks it saw.
    assert [t for t in cfg.tasks if f"weight_{t}" in epoch] == ["sts"]
