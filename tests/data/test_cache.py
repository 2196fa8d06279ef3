"""data.cache_dir entries are built once per machine, however many trials miss them at once."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from mtbert.data.cache import build_once

ROOT = Path(__file__).resolve().parents[2]

RACER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from mtbert.data.cache import build_once

    path, log = Path(sys.argv[1]), Path(sys.argv[2])
    while not Path(sys.argv[3]).exists():  # start together
        time.sleep(0.01)

    def build():
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\\n")
        time.sleep(1.0)  # a slow build: the others arrive while it runs
        return f"built by {os.getpid()}"

    value, built = build_once(path, lambda p: p.read_text() if p.is_file() else None, build,
                              lambda v, tmp: tmp.write_text(v))
    print(value, built)
""")


def test_racing_processes_build_once_and_share_the_result(tmp_path):
    path, log, go = tmp_path / "cache" / "entry.txt", tmp_path / "builds.log", tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", RACER, str(path), str(log), str(go)], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True) for _ in range(3)]
    go.touch()
    outs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    builders = log.read_text().split()
    assert len(builders) == 1, f"built {len(builders)} times: {outs}"
    assert sorted(o.endswith("True") for o in outs) == [False, False, True], outs
    assert {o.rsplit(" ", 1)[0] for o in outs} == {f"built by {builders[0]}"}
    assert [p.name for p in path.parent.iterdir()] == ["entry.txt"]  # no lock or temporary left


def test_a_failed_build_leaves_nothing_and_the_next_caller_builds(tmp_path):
    path = tmp_path / "entry.txt"

    def load(p):
        return p.read_text() if p.is_file() else None

    def fail():
        raise RuntimeError("out of memory")

    try:
        build_once(path, load, fail, lambda v, tmp: tmp.write_text(v))
    except RuntimeError:
        pass
    assert list(tmp_path.iterdir()) == []
    assert build_once(path, load, lambda: "ok", lambda v, tmp: tmp.write_text(v)) == ("ok", True)
    assert build_once(path, load, fail, lambda v, tmp: tmp.write_text(v)) == ("ok", False)
