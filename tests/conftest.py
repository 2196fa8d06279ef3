"""How `make test` shares the suite between pytest-xdist workers (`-n N --dist loadgroup`).

- A test that uses a module-scoped fixture (a trained run, a sweep, a Ray cluster) runs on
  the worker that runs the module's other users of it, so the fixture is built once, not once
  per worker. test_every_sweep is the exception: its module fixture is a local Ray (seconds)
  and its thirty-odd smoke sweeps are better spread.
- Every user of the session's shared `mlflow_server` runs on one worker: one server.
- `slow` tests go first: the long end-to-end runs start while the short tests fill the gaps,
  instead of a 100 s test starting last.
- Each worker trains with one intra-op thread (below).

The groups travel from the workers' collection to the scheduler in a small file, not as
`xdist_group` marks: pytest 9.2 builds node ids that xdist 3.8's loadgroup can no longer
suffix with the group, so those marks are silently ignored (pytest-xdist#1386). A plain
`pytest` (no -n) runs as before.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

WORKER = os.environ.get("PYTEST_XDIST_WORKER")
ROOT = Path(__file__).resolve().parents[1]
# What mtbert and MLflow write into the working folder when a test forgets its own folder:
# left in the repository, they ride along in every Ray job the cluster tests submit.
LITTER = ("mlruns", "mlartifacts", "mlflow.db", "runs")
_litter_before = pytest.StashKey[set]()  # which of them were there before the run
GROUPS_DIR = "MTBERT_TEST_GROUPS"  # the folder, named by the controller, where workers write the groups

if WORKER:
    # Several workers on a 2-core runner: torch's default of one OpenMP thread per core then
    # oversubscribes the CPU, and its threads spin at every barrier waiting for a core. One
    # thread per process (and per CLI it starts: the variable is inherited) does the same
    # work in a fraction of the CPU time. Ray does the same for its trial workers (ray#6998).
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# Module fixtures cheaper than what their tests run: spread the tests, build the fixture per worker.
SPREAD = ("tests/sweeps/test_every_sweep.py",)
SHARED_SERVER = "mlflow_server"  # tests/orchestration/conftest.py, session-scoped


def _group(item: pytest.Item) -> str | None:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    module = item.nodeid.split("::", 1)[0]
    defs = info.name2fixturedefs
    scopes = {name: defs[name][-1].scope for name in info.names_closure if defs.get(name)}
    if scopes.get(SHARED_SERVER) == "session":
        return "mlflow-server"
    if module not in SPREAD and {"module", "class"} & set(scopes.values()):
        return module
    return None


def _loadgroup(config: pytest.Config) -> bool:
    return getattr(config.option, "dist", "no") == "loadgroup"


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_litter_before] = {name for name in LITTER if (ROOT / name).exists()}
    if not WORKER and _loadgroup(config) and getattr(config.option, "numprocesses", None):
        os.environ[GROUPS_DIR] = tempfile.mkdtemp(prefix="mtbert-test-groups-")  # the workers inherit it


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Tests keep to their own folders: what one left in the repository fails the run."""
    if WORKER:
        return
    left = [name for name in LITTER if (ROOT / name).exists() and name not in session.config.stash[_litter_before]]
    if left:
        print(f"\ntests left {', '.join(left)} in {ROOT.name}/: a test wrote to the working folder "
              f"instead of its tmp_path", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config: pytest.Config) -> None:
    if not WORKER and os.environ.get(GROUPS_DIR):
        shutil.rmtree(os.environ.pop(GROUPS_DIR), ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not (WORKER and os.environ.get(GROUPS_DIR)):
        return
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: order kept within
    groups = {item.nodeid: group for item in items if (group := _group(item)) is not None}
    out = Path(os.environ[GROUPS_DIR]) / f"{WORKER}.json"
    out.with_suffix(".tmp").write_text(json.dumps(groups))
    out.with_suffix(".tmp").replace(out)  # whole or absent, for the scheduler


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if not (_loadgroup(config) and os.environ.get(GROUPS_DIR)):
        return None
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # units in collection order: slow first (above)

    class GroupScheduling(LoadScopeScheduling):
        """LoadScope with our groups as its scopes: a grouped test's unit is its group, any
        other test is a unit of its own. Units go out in collection order, one at a time."""

        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # every worker has collected by the first call
                files = sorted(Path(os.environ[GROUPS_DIR]).glob("*.json"))
                self.groups = json.loads(files[0].read_text()) if files else {}
            return self.groups.get(nodeid, nodeid)

    return GroupScheduling(config, log)
