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

Across all of mtbert/ and orchestration/, module by module: no import cycle (a deferred import
and one under `if TYPE_CHECKING:` count as well), and no module uses another's private names
(a leading underscore), nor a third-party package's private modules or names (`torch._C`):
what a module keeps to itself may change under its users without a word.

Each module is also imported alone in a fresh interpreter, so none relies on another module
having been imported first, and no module-level cycle hides behind a lucky import order.

No function of mtbert/ and orchestration/ runs past MAX_LINES lines (its `def` to its last
line) unless it says why in one line: a comment `# long: <why>` on the line above its `def` (or
above its decorators), or a docstring line `long: <why>`.
"""
from __future__ import annotations

import ast
import functools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "orchestration"
PROJECT = ("mtbert", "orchestration")  # the packages whose modules are held to the rules below
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
MAX_LINES = 60  # a function's lines, its `def` to its last, past which it says why (LONG)
LONG = "long:"  # the reason's mark: `# long: <why>` above the def, or `long: <why>` in the docstring


# --------------------------------------------------------------------------- the checker
# Written once: the tests on the project's modules and the tests on a planted tree (which
# show that each rule does fail) call the same functions.

def modules_of(root: Path, packages: tuple[str, ...] = PROJECT) -> dict[str, Path]:
    """Every module of `packages` under `root`, by its dotted name (a package by its own)."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


@functools.lru_cache(maxsize=None)
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _private(name: str) -> bool:
    """A leading underscore, a dunder (__doc__, __version__) aside."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _absolute(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The module a `from` statement reads from, a relative one resolved against `module`."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    anchor = package[: len(package) - node.level + 1]
    return ".".join(anchor + ([node.module] if node.module else []))


def imports_of(module: str, modules: dict[str, Path]) -> list[tuple[int, str, str | None]]:
    """Every import statement anywhere in `module`'s file (in a function, under `if
    TYPE_CHECKING:`, ...), as (line, module imported, name taken from it or None).
    `from a.b import c` imports the module a.b.c where that is a module of `modules`."""
    path = modules[module]
    found = []
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, path, node)
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    found.append((node.lineno, f"{base}.{alias.name}", None))
                else:
                    found.append((node.lineno, base, alias.name))
    return found


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the modules of `modules` it imports (itself left out)."""
    return {module: {target for _, target, _ in imports_of(module, modules)
                     if target in modules and target != module}
            for module in modules}


def import_cycles(graph: dict[str, set[str]]) -> list[str]:
    """A line for each group of modules that import one another (the strongly connected
    components of the graph, by Tarjan's algorithm): the shortest way round from the group's
    first module, `a -> b -> a`, then the whole group where it holds more."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:  # recursive: the graph has a few hundred modules at most
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    cycles = []
    for group in sorted(groups):
        start, members = group[0], set(group)
        came_from: dict[str, str] = {}
        frontier = [start]
        while start not in came_from:  # breadth first, back to the start
            nxt_frontier = []
            for node in frontier:
                for nxt in sorted(graph[node] & members):
                    if nxt not in came_from:
                        came_from[nxt] = node
                        nxt_frontier.append(nxt)
            frontier = nxt_frontier
        path = [start]
        while path[-1] != start or len(path) == 1:
            path.append(came_from[path[-1]])
        path = path[::-1]
        rest = sorted(members - set(path))
        cycles.append(" -> ".join(path) + (f" (one cycle of the group with {', '.join(rest)})" if rest else ""))
    return cycles


def long_functions(modules: dict[str, Path], limit: int = MAX_LINES) -> list[str]:
    """`path:line: name is N lines` for every function (method, nested one) of `modules` longer
    than `limit` lines that gives no reason: a `# long: <why>` comment on the line above its
    `def` or its first decorator, or a `long: <why>` line in its docstring."""
    found = []
    for module, path in modules.items():
        lines = path.read_text().splitlines()
        where = path.relative_to(path.parents[len(module.split(".")) - 1 + (path.name == "__init__.py")])
        for node in ast.walk(_tree(path)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            length = node.end_lineno - node.lineno + 1
            if length <= limit:
                continue
            top = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            above = lines[top - 2].strip() if top >= 2 else ""
            doc = ast.get_docstring(node) or ""
            said = [above.removeprefix("#").strip()] + [line.strip() for line in doc.splitlines()]
            if not any(line.startswith(LONG) and line.removeprefix(LONG).strip() for line in said):
                found.append(f"{where}:{node.lineno}: {node.name} is {length} lines")
    return found


def _is_third_party(module: str, packages: tuple[str, ...]) -> bool:
    top = module.split(".")[0]
    return bool(top) and top not in packages and top not in sys.stdlib_module_names and top != "__future__"


def _bound_names(module: str, modules: dict[str, Path], packages: tuple[str, ...]) -> dict[str, str]:
    """The names an import binds in `module`'s file (anywhere in it) -> the dotted module, or
    third-party name, each stands for."""
    path = modules[module]
    bound = {}
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    bound[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, path, node)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                # A project name stands for a module only where it is one; a third-party
                # one may be either, and its private parts are off limits both ways.
                if full in modules or _is_third_party(base, packages):
                    bound[alias.asname or alias.name] = full
    return bound


def private_uses(modules: dict[str, Path], packages: tuple[str, ...] = PROJECT) -> list[str]:
    """`path:line: what` for every use of a private name across modules: `from x import _y`
    where x is another module of `packages`, `x._y` where the name x is bound to such a
    module (by `import x`, `import a.x as x`, `from a import x`), and any private module or
    name of a third-party package, imported or reached through its attributes (`torch._C`)."""
    found = []
    for module, path in modules.items():
        where = path.relative_to(path.parents[len(module.split(".")) - 1 + (path.name == "__init__.py")])
        for line, target, name in imports_of(module, modules):
            third = _is_third_party(target, packages)
            if third and any(_private(part) for part in target.split(".")):
                found.append(f"{where}:{line}: imports {target}, private to {target.split('.')[0]}")
            elif name is not None and _private(name) and target != module and (third or target in modules):
                found.append(f"{where}:{line}: imports {name}, private to {target}")
        bound = _bound_names(module, modules, packages)
        for node in ast.walk(_tree(path)):
            if not isinstance(node, ast.Attribute) or not isinstance(node.ctx, ast.Load):
                continue
            chain, inner = [], node
            while isinstance(inner, ast.Attribute):
                chain.append(inner.attr)
                inner = inner.value
            if not isinstance(inner, ast.Name) or inner.id not in bound:
                continue
            dotted = bound[inner.id]
            for attr in reversed(chain):  # outermost first: a.b._c reads b, then _c
                if dotted in modules:
                    if _private(attr) and dotted != module:
                        found.append(f"{where}:{node.lineno}: uses {dotted}.{attr}, private to {dotted}")
                        break
                elif _is_third_party(dotted, packages):
                    if _private(attr):
                        found.append(f"{where}:{node.lineno}: uses {dotted}.{attr}, "
                                     f"private to {dotted.split('.')[0]}")
                        break
                else:
                    break  # the standard library, or a name of the project that is no module
                dotted = f"{dotted}.{attr}"
    return sorted(set(found), key=_by_place)


def _by_place(line: str) -> tuple[str, int, str]:
    """`path:line: what` in file, then line order."""
    path, number, what = line.split(":", 2)
    return path, int(number), what


# --------------------------------------------------------------------------- orchestration's rooms

def _place(module: str) -> str | None:
    """The room of `orchestration.<room>...`, `cli`, `shared`; None for the package itself."""
    parts = module.split(".")
    if len(parts) < 2:
        return None
    if parts[1] in SHARED:
        return "shared"
    return parts[1]


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
    graph = import_graph(modules_of(ROOT, ("orchestration",)))
    for module in sorted(graph):
        here = _place(module)
        for target in sorted(graph[module]):
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


@pytest.mark.parametrize("module", sorted(modules_of(ROOT, ("orchestration",))))
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


# --------------------------------------------------------------------------- every module of the project

def test_no_import_cycle():
    cycles = import_cycles(import_graph(modules_of(ROOT)))
    assert not cycles, "modules that import one another (deferred imports count):\n" + "\n".join(cycles)


def test_no_private_name_of_another_module():
    uses = private_uses(modules_of(ROOT))
    assert not uses, ("private names used outside their module (make them public, or keep the use "
                      "inside):\n" + "\n".join(uses))


PLANTED = {  # a tree with each kind of fault once, beside ones that break no rule
    "pkg/__init__.py": "",
    "pkg/a.py": "from pkg.b import helper\n\ndef _hidden():\n    return helper()\n",
    "pkg/b.py": "def helper():\n    from pkg import a  # deferred: still a cycle\n    return a\n",
    "pkg/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.d import D\n",
    "pkg/d.py": "import pkg.c\nD = 1\n",
    "pkg/e.py": "from pkg.a import _hidden\n",
    "pkg/f.py": ("import pkg.a\nfrom pkg import a as alias\nfrom .a import _hidden as h\n\n"
                 "def g():\n    return pkg.a._hidden(), alias._hidden()\n"),
    "pkg/g.py": ("import os\nimport torch._C\nfrom ray.train._internal import session\n"
                 "from torch import nn\nimport numpy as np\n\n"
                 "def h():\n    os._exit(0)\n    return nn._reduction, np.random._x, nn.Module, pkg_a()\n"),
    "pkg/h.py": "import pkg.a as whole\nfrom pkg.a import __doc__\n\ndef _own():\n    return _own, whole.__name__\n",
    "pkg/sub/__init__.py": "from . import leaf\n",
    "pkg/sub/leaf.py": "from .. import b\n",
}


def _planted(tmp_path: Path) -> dict[str, Path]:
    for name, text in PLANTED.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return modules_of(tmp_path, ("pkg",))


def test_the_checks_find_planted_cycles(tmp_path):
    assert import_cycles(import_graph(_planted(tmp_path))) == [
        "pkg.a -> pkg.b -> pkg.a",  # one import deferred into a function
        "pkg.c -> pkg.d -> pkg.c",  # one under `if TYPE_CHECKING:`
    ]  # a relative import from a subpackage resolves (pkg.sub.leaf -> pkg.b), and is no cycle


def test_the_checks_find_planted_private_uses(tmp_path):
    assert private_uses(_planted(tmp_path), ("pkg",)) == [
        "pkg/e.py:1: imports _hidden, private to pkg.a",
        "pkg/f.py:3: imports _hidden, private to pkg.a",  # relative, under another name
        "pkg/f.py:6: uses pkg.a._hidden, private to pkg.a",  # both ways of naming the module
        "pkg/g.py:2: imports torch._C, private to torch",
        "pkg/g.py:3: imports ray.train._internal, private to ray",
        "pkg/g.py:9: uses numpy.random._x, private to numpy",
        "pkg/g.py:9: uses torch.nn._reduction, private to torch",
    ]  # not: os._exit (the standard library), dunders, a module's own private names


def test_no_long_function_without_a_reason():
    long = long_functions(modules_of(ROOT))
    assert not long, (f"functions over {MAX_LINES} lines: split them into named steps, or say why not in "
                      f"one line (`# {LONG} <why>` above the def):\n" + "\n".join(long))


def _body(n: int) -> str:
    return "".join(f"    x{i} = {i}\n" for i in range(n))


def test_the_check_finds_a_planted_long_function(tmp_path):
    text = ("def short():\n" + _body(MAX_LINES - 1)  # exactly the limit
            + "\n\ndef long():\n" + _body(MAX_LINES)
            + "\n\n# long: one table of cases, read top to bottom\n@staticmethod\ndef said():\n" + _body(MAX_LINES)
            + '\n\ndef in_doc():\n    """What it does.\n\n    long: the reason\n    """\n' + _body(MAX_LINES)
            + "\n\n# long:\ndef empty_reason():\n" + _body(MAX_LINES)
            + "\n\nclass C:\n    def method(self):\n" + "".join(f"        y{i} = {i}\n" for i in range(MAX_LINES)))
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "m.py").write_text(text)
    lines = text.splitlines()
    assert long_functions(modules_of(tmp_path, ("pkg",))) == [
        f"pkg/m.py:{lines.index('def long():') + 1}: long is {MAX_LINES + 1} lines",
        # a mark without a reason
        f"pkg/m.py:{lines.index('def empty_reason():') + 1}: empty_reason is {MAX_LINES + 1} lines",
        f"pkg/m.py:{lines.index('    def method(self):') + 1}: method is {MAX_LINES + 1} lines",
    ]
