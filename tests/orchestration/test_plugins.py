"""A task added by a user module (`plugins:`) runs in a real sweep: the driver validates it,
the Ray trial processes import it from the shipped module, and the leaderboard shows its
column in a process that never imported it."""
from __future__ import annotations

import re
import sys
import textwrap

import pytest

from mtbert.config import ConfigError, build_config
from mtbert.tasks import TASKS

from .conftest import run_cli, write_sweep

PLUGIN = textwrap.dedent('''
    from mtbert.tasks import TaskSpec, register_task

    register_task(TaskSpec(name="polarity", kind="binary", metric_name="polarity_acc", pair=False))
''')


@pytest.mark.slow
def test_sweep_with_a_plugin_task(tmp_path):
    (tmp_path / "mytasks.py").write_text(PLUGIN)
    write_sweep(tmp_path / "plugin.yaml", name="plugin",
                base={"plugins": ["mytasks"], "tasks": ["sst", "polarity"]},
                space={"optim.lr": [2e-3, 3e-3]}, max_concurrent=2,  # neither is the base 1e-3 (the baseline)
                tracking={"log_models": "none"})  # the table is read, not a model
    proc = run_cli(["sweep", "run", "plugin.yaml", "--num-cpus", "2"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "3 trials, 3 finished" in proc.stdout, proc.stdout  # the base config is the baseline

    table = run_cli(["leaderboard", "--experiment", "plugin"], cwd=tmp_path)
    assert table.returncode == 0, table.stderr[-2000:]
    header, _, *rows = [line for line in table.stdout.splitlines() if line.startswith("|")]
    assert "polarity_acc" in header and "PD acc." not in header, header
    column = header.split("|").index(" polarity_acc ")
    assert all(0.0 <= float(row.split("|")[column]) <= 1.0 for row in rows), rows


def test_plugin_errors_name_the_entry(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "broken_plugin.py").write_text("raise RuntimeError('no licence key')\n")
    cases = {"not_there_anywhere": "plugins[0]: cannot import 'not_there_anywhere'",
             "mytasks.py": "plugins[0]: 'mytasks.py' is not a module name",
             "broken_plugin": "plugins[0]: importing 'broken_plugin' raised RuntimeError: no licence key"}
    for name, message in cases.items():
        with pytest.raises(ConfigError, match="^" + re.escape(f"sweep.yaml: {message}")):
            build_config({"plugins": [name]}, source="sweep.yaml")


def test_plugin_registers_before_tasks_are_checked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plugin_for_config.py").write_text(PLUGIN.replace("polarity", "polarity2"))
    with pytest.raises(ConfigError, match="unknown task 'polarity2'"):
        build_config({"tasks": ["sst", "polarity2"]})
    try:
        cfg = build_config({"plugins": ["plugin_for_config"], "tasks": ["sst", "polarity2"]})
        assert cfg.tasks == ["sst", "polarity2"]
    finally:  # the registry is per process: leave it as the other tests expect
        TASKS.pop("polarity2", None)
        sys.modules.pop("plugin_for_config", None)
