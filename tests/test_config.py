"""Typed config: overrides, loud errors naming the key path, flattening for MLflow."""
import dataclasses
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mtbert.config import Config, ConfigError, as_float, build_config, component_keys, flatten, load_config


def test_defaults_and_overrides():
    cfg = build_config({}, ["optim.lr=3e-4", "sharing.head_regime=S-I-S", "tasks=[sst,sts]",
                            "loss.weights={sst: 0.7, sts: 0.3}", "sharing.encoder_shared_layers=null"])
    assert cfg.optim.lr == 3e-4 and cfg.tasks == ["sst", "sts"]
    assert cfg.head_regime() == ["S", "I", "S"]
    assert cfg.loss_weight("sst") == 0.7 and cfg.sharing.encoder_shared_layers is None
    flat = flatten(cfg)
    assert flat["optim.lr"] == 3e-4 and flat["loss.weights.sts"] == 0.3
    assert "model.tiny.layers" in flat


def test_equal_weights_by_default():
    cfg = build_config({})
    assert [cfg.loss_weight(t) for t in cfg.tasks] == pytest.approx([1 / 3] * 3)


@pytest.mark.parametrize("raw, overrides, message", [
    ({"sharing": {"head_regim": "S-S-S"}}, [], "sharing.head_regim: unknown key (did you mean 'sharing.head_regime'?)"),
    ({}, ["optim.lr=fast"], "optim.lr: expected float, got 'fast'"),
    ({}, ["train.epochs=2.5"], "train.epochs: expected int, got 2.5"),
    ({}, ["sampling.strategy=random"], "sampling.strategy: unknown strategy 'random'; known: round_robin"),
    ({}, ["tasks=[sst, paraphrase]"], "tasks[1]: unknown task 'paraphrase' (did you mean 'para'?)"),
    ({}, ["sharing.head_regime=S-X-I"], "sharing.head_regime"),
    ({}, ["sharing.head_share_tasks=[para, nli]"], "sharing.head_share_tasks: 'nli'"),
    ({}, ["loss.pcgrad=true"], "loss.pcgrad: needs a loss for several tasks"),
    ({}, ["loss.weights={sst: -1}"], "loss.weights.sst: must be >= 0"),
    ({}, ["data.source=cs224n"], "data.dir: required"),
    ({"model": "bert"}, [], "model: expected a mapping"),
])
def test_errors_name_the_key(raw, overrides, message):
    with pytest.raises(ConfigError) as err:
        build_config(raw, overrides)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_yaml_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("optim:\n  lr: [1\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: line \d+"):
        load_config(bad)
    typo = tmp_path / "typo.yaml"
    typo.write_text("optim:\n  lrr: 0.1\n")
    with pytest.raises(ConfigError, match=r"typo.yaml: optim.lrr: unknown key \(did you mean 'optim.lr'\?\)"):
        load_config(typo)


def test_cli_prints_one_line_without_traceback(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("sharing:\n  head_regime: S-S-Q\n")
    proc = subprocess.run([sys.executable, "-m", "mtbert.cli", "train", "--config", str(cfg),
                           "--output", str(tmp_path / "out")], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "sharing.head_regime" in proc.stderr


def test_configuration_doc_names_every_key_and_no_other():
    """docs/configuration.md lists every key: each key of the schema (a component's settings
    included) opens a table row, written whole or as `.field` after a sibling (`loss.smart.weight`,
    `.epsilon`), a per-task mapping as `<task>`; and every key it names exists, so a renamed key
    leaves no stale row."""
    keys = set(flatten(Config()))
    for slot, registry in component_keys().items():
        for name in registry.load():
            keys |= {f"{slot}.{f.name}" for f in dataclasses.fields(registry.settings_of(name)) if f.name != "name"}
    named, in_table = set(), False
    for line in (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text().splitlines():
        in_table = line.startswith("| key |") or (in_table and line.startswith("|"))
        if in_table and line.startswith("| `"):
            prefix = ""
            for i, key in enumerate(re.findall(r"`([^`]+)`", line.split("|")[1])):
                if key.startswith("."):
                    key = prefix + key
                elif i == 0 or "." in key:  # not the component a setting belongs to: (`cagrad`)
                    prefix = key.rsplit(".", 1)[0]
                else:
                    continue
                named.add(key.split(".<")[0])  # data.files.<task>.train: the data.files mapping
    assert not keys - named, f"keys not in docs/configuration.md: {sorted(keys - named)}"
    assert not named - keys, f"docs/configuration.md names keys that are not: {sorted(named - keys)}"


def test_as_float_reads_yaml_1_1_numbers():
    assert as_float(yaml.safe_load("lr: 1e-5")["lr"]) == 1e-5  # YAML 1.1 reads it as a string
    assert as_float(3) == 3.0 and isinstance(as_float(3), float)
    assert as_float(10 ** 400) == math.inf  # an integer too large for a float
    assert as_float(True) is None and as_float("fast") is None and as_float(None) is None
