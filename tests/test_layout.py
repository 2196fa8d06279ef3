"""orchestration/ by what it does, and imports that point one way.

The rooms, and what each may import (besides itself and the shared top-level modules
errors.py, paths.py and stats.py, which import no room):

    sweep   defining a sweep        -> nothing
    track   tracking it in MLflow   -> sweep    (labels: the names a configuration goes by)
    report  reporting on it         -> sweep, track    (claims and labels; the best configuration)
    run     running it on Ray Tune  -> sweep, track, report    (the plan, tracking writes, the
                                       end-of-sweep tables and the adaptive seeds' verdicts)
    cli.py  the commands            -> any room

So the rooms are layers, sweep <- track <- report <- run <- cli, and no cycle among them can
form. Every `import` and `from` counts, those deferred into a function included: a deferred
import is still a dependency, only a later one.

Each module is also imported alone in a fresh interpreter, so none relies on another module
having been imported first, and no module-level cycle hides behind a lucky import order.
"""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "orchestration"
SHARED = {"errors", "paths", "stats"}  # leaves every room uses; they import no room
TOP = SHARED | {"cli"}
ALLOWED = {  # room -> the rooms it may import
    "sweep": set(),
    "track": {"sweep"},
    "report": {"sweep", "track"},
    "run": {"sweep", "track", "report"},
    "cli": {"sweep", "track", "report", "run"},
}
ROOMS = ["sweep", "run", "track", "report"]


def _modules() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def _place(module: str) -> str | None:
    """The room of `orchestration.<room>...`, `cli`, `shared`; None for the package itself."""
    parts = module.split(".")
    if len(parts) < 2:
        return None
    if parts[1] in SHARED:
        return "shared"
    return parts[1]


def _imports(module: str) -> set[str]:
    """The orchestration modules `module` imports anywhere in its file (absolute names)."""
    path = ROOT / Path(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            # `from orchestration.run import launch` imports orchestration.run.launch
            found.update(f"{base}.{alias.name}" for alias in node.names
                         if (ROOT / Path(*base.split(".")) / f"{alias.name}.py").is_file())
    return {name for name in found if name == "orchestration" or name.startswith("orchestration.")}


def test_every_module_has_a_room():
    """A new file goes into a room (or is one of the few shared ones at the top)."""
    for path in PACKAGE.glob("*.py"):
        assert path.stem in TOP | {"__init__"}, f"orchestration/{path.name}: put it in one of {ROOMS}"
    for path in PACKAGE.iterdir():
        if path.is_dir() and path.name != "__pycache__":
            assert path.name in ROOMS, f"orchestration/{path.name}/: not one of the rooms {ROOMS}"
    for room in ROOMS:
        init = PACKAGE / room / "__init__.py"
        assert init.is_file() and ast.get_docstring(ast.parse(init.read_text())), \
            f"orchestration/{room}/__init__.py: its docstring is the room's map"


def test_rooms_import_one_way():
    wrong = []
    for module in _modules():
        here = _place(module)
        for target in _imports(module):
            there = _place(target)
            if here in (None, there) or there is None:
                continue  # the package itself, or within one room
            if here == "shared":
                ok = there == "shared"
            else:
                ok = there == "shared" or there in ALLOWED[here]
            if not ok:
                wrong.append(f"{module} imports {target} ({here} -> {there})")
    assert not wrong, "imports against the rooms' direction:\n" + "\n".join(wrong)


@pytest.mark.parametrize("module", _modules())
def test_imports_alone(module):
    run = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]


MENTION = re.compile(r"(?<![\w./-])orchestration[./]([a-z_]+)(?:[./]([a-z_]+))?")


def test_mentions_name_modules_that_exist():
    """A module path written in code, comments and docs (`orchestration.<room>.<module>`, or as
    a file path) names a module of the current layout: a moved file leaves no stale mention."""
    files = [*ROOT.glob("*.md"), *ROOT.glob("docs/**/*.md"), *ROOT.glob("sweeps/*.md"), ROOT / "Makefile",
             *(p for d in ("mtbert", "orchestration", "tests", "bench", "docs", "docker")
               for p in (ROOT / d).rglob("*") if p.suffix in (".py", ".sh", ".md") or p.name == "Dockerfile")]
    stale = []
    for path in files:
        if not path.is_file():
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for match in MENTION.finditer(line):
                first, second = match[1], match[2]
                if first.startswith(("test_", "_")) or first in ("conftest", "py"):
                    continue  # tests/orchestration/... written relative to tests/, a dunder, bench's file
                if first in TOP:
                    continue
                if first not in ROOMS or (second and not (PACKAGE / first / f"{second}.py").is_file()):
                    stale.append(f"{path.relative_to(ROOT)}:{number}: {match[0]}")
    assert not stale, "mentions of modules that are not there:\n" + "\n".join(stale)


def test_a_sweep_saved_before_the_rooms_still_resumes():
    """Its Tune state names the flat modules; a resume aliases them to the rooms' (launch.py)."""
    flat = "orchestration" + ".searcher"  # the name before the rooms
    code = ("import pickle, orchestration.run.launch as launch; launch._flat_names(); "
            f"from orchestration.run.searcher import SweepSearcher; import {flat} as old; "
            "assert old.SweepSearcher is SweepSearcher; "
            "saved = pickle.dumps(SweepSearcher, 0).replace(b'orchestration.run.searcher', "
            f"b'{flat}'); assert b'{flat}\\n' in saved; assert pickle.loads(saved) is SweepSearcher")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]


def test_a_sweep_saved_before_a_move_still_resumes():
    """Its Tune state names a moved object's old module, also under the flat name; a resume
    finds it there (launch.MOVED), and the module itself no longer holds it."""
    code = ("import pickle, orchestration.run.launch as launch, orchestration.run.callbacks as callbacks\n"
            "assert not hasattr(callbacks, 'ProgressPrinter')\n"
            "launch._flat_names(); launch._moved_names()\n"
            "from orchestration.run.progress import ProgressPrinter\n"
            "saved = pickle.dumps(ProgressPrinter, 0)\n"
            "for old in (b'orchestration.run.callbacks', b'orchestration' + b'.callbacks'):\n"
            "    assert pickle.loads(saved.replace(b'orchestration.run.progress', old)) is ProgressPrinter\n")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
