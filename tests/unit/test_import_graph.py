"""The package's parts and the one direction of imports between them, read from the source (ast).

Floors, top to bottom; a module imports only its own part or a part on a lower floor, and two parts on
one floor know nothing of each other:

    research             the names the studies in benchmarks/ use (research.py), from any floor below
    commands, plugin     the `perfguard` command; the pytest hooks (the pytest11 entry point)
    run                  one case through pytest: runner, session, confirmation, A/B base tree, xdist
    report, measure      presenting records; taking the numbers
    judge                decision rules, verdicts, the stored baseline, statistics
    record               the typed record of one case (record.py, explanation.py)
    base                 settings, the user's API (marker.py), strict JSON and locks, git, device slugs

Every import counts: at module level, inside a function and under TYPE_CHECKING, because each is a
dependency a reader has to follow. No module-level cycle either. The package's ``__init__`` (the public
names, loaded lazily) is left out: Python runs it before any submodule, so importing it adds no edge.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "pytest_perfguard"
ROOT = PACKAGE.name

FLOORS: tuple[tuple[str, ...], ...] = (
    ("research",),
    ("commands", "plugin"),
    ("run",),
    ("report", "measure"),
    ("judge",),
    ("record",),
    ("base",),
)
# The modules directly in the package: the part each belongs to (subpackages are parts by their name).
TOP_LEVEL = {
    "plugin": "plugin",
    "research": "research",
    "record": "record",
    "explanation": "record",
    "settings": "base",
    "marker": "base",
    "jsonio": "base",
    "locks": "base",
    "gitrev": "base",
    "slugs": "base",
    "usage": "base",
}
FLOOR_OF = {part: n for n, parts in enumerate(FLOORS) for part in parts}

Graph = dict[str, set[str]]


def module_names(package: Path) -> dict[str, Path]:
    """Dotted name -> file, for every module and subpackage of `package`."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = [package.name, *path.relative_to(package).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute name a `from ... import` names, relative or not."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def imports_of(module: str, path: Path, known: Mapping[str, Path]) -> Iterator[tuple[str, int]]:
    """Each module of the package that `module` imports anywhere in its file, with the line."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, path.name == "__init__.py", node)
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in known:
                    yield sub, node.lineno
                elif target in known:
                    yield target, node.lineno


def import_graph(package: Path) -> tuple[Graph, dict[tuple[str, str], int]]:
    """Module -> the modules it imports (the package root left out, see above), and each edge's line."""
    known = module_names(package)
    graph: Graph = {name: set() for name in known if name != package.name}
    lines: dict[tuple[str, str], int] = {}
    for name in graph:
        for target, line in imports_of(name, known[name], known):
            if target != package.name and target != name:
                graph[name].add(target)
                lines.setdefault((name, target), line)
    return graph, lines


def part_of(module: str, top_level: Mapping[str, str] = TOP_LEVEL) -> str:
    """The part a module belongs to: its subpackage, or the group of a module directly in the package."""
    first = module.split(".")[1]
    return top_level.get(first, first) if module.count(".") == 1 else first


def upward_imports(graph: Graph, lines: Mapping[tuple[str, str], int], floors: Sequence[Sequence[str]]) -> list[str]:
    """Every import that goes up a floor or sideways between two parts of one floor, or touches a module of
    no known part."""
    floor_of = {part: n for n, parts in enumerate(floors) for part in parts}
    problems = []
    for module in sorted(graph):
        if part_of(module) not in floor_of:
            problems.append(f"{module}: belongs to no part; give it one in FLOORS or TOP_LEVEL ({Path(__file__).name})")
            continue
        for target in sorted(graph[module]):
            src, dst = part_of(module), part_of(target)
            if src == dst or dst not in floor_of:
                continue
            if floor_of[dst] <= floor_of[src]:
                way = "up" if floor_of[dst] < floor_of[src] else "sideways"
                problems.append(f"{module}:{lines[module, target]} imports {target} ({src} -> {dst}, {way})")
    return problems


def cycles(graph: Graph) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan), as a path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(_path_through(sorted(component), graph))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _path_through(component: list[str], graph: Graph) -> list[str]:
    """A cycle inside one strongly connected component, from its first module back to it."""
    members, start = set(component), component[0]
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for nxt in sorted(graph[node] & members):
            if nxt == start:
                return [*paths[node], start]
            if nxt not in paths:
                paths[nxt] = [*paths[node], nxt]
                queue.append(nxt)
    raise AssertionError(f"no cycle through {component}")  # a component of more than one module has one


def test_every_import_goes_down_the_floors() -> None:
    graph, lines = import_graph(PACKAGE)
    assert len(graph) > 30, f"found only {sorted(graph)} under {PACKAGE}"
    problems = upward_imports(graph, lines, FLOORS)
    assert not problems, "imports against the direction of the parts:\n" + "\n".join(problems)


def test_no_import_cycle() -> None:
    graph, _ = import_graph(PACKAGE)
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_every_part_is_on_a_floor() -> None:
    subpackages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert subpackages <= set(FLOOR_OF), f"subpackages on no floor: {sorted(subpackages - set(FLOOR_OF))}"
    assert set(TOP_LEVEL.values()) <= set(FLOOR_OF)


def _write(root: Path, files: Mapping[str, str]) -> Path:
    package = root / ROOT
    for rel, text in files.items():
        path = package / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return package


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        pytest.param(
            {"judge/verdict.py": "from ..measure import timing\n", "measure/timing.py": ""},
            "judge.verdict:1 imports pytest_perfguard.measure.timing (judge -> measure, up)",
            id="up-a-floor",
        ),
        pytest.param(
            {"report/view.py": "def f():\n    from ..measure.timing import Clock\n", "measure/timing.py": ""},
            "report.view:2 imports pytest_perfguard.measure.timing (report -> measure, sideways)",
            id="sideways-inside-a-function",
        ),
        pytest.param(
            {
                "marker.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .run import runner\n",
                "run/runner.py": "",
            },
            "marker:3 imports pytest_perfguard.run.runner (base -> run, up)",
            id="up-under-type-checking",
        ),
        pytest.param(
            {"jsonio.py": "import pytest_perfguard.commands.cli\n", "commands/cli.py": ""},
            "jsonio:1 imports pytest_perfguard.commands.cli (base -> commands, up)",
            id="absolute",
        ),
    ],
)
def test_an_upward_import_is_found(tmp_path: Path, files: dict[str, str], expected: str) -> None:
    """The check itself: a planted import against the floors is reported with its file and line."""
    subpackages = {f"{d}/__init__.py": "" for d in ("commands", "run", "report", "measure", "judge")}
    package = _write(tmp_path, {"__init__.py": "", **subpackages, **files})
    graph, lines = import_graph(package)
    assert upward_imports(graph, lines, FLOORS) == [f"{ROOT}.{expected}"]


def test_a_cycle_is_found_and_a_downward_import_is_not_a_problem(tmp_path: Path) -> None:
    package = _write(
        tmp_path,
        {
            "__init__.py": "",
            "run/__init__.py": "",
            "run/confirm.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .session import S\n",
            "run/session.py": "from .. import settings\ndef f():\n    from .confirm import in_child\n",
            "settings.py": "",
        },
    )
    graph, lines = import_graph(package)
    assert upward_imports(graph, lines, FLOORS) == []
    assert cycles(graph) == [[f"{ROOT}.run.confirm", f"{ROOT}.run.session", f"{ROOT}.run.confirm"]]


# The longest function the package may hold, its docstring aside: a longer one does several things, which
# belong in functions of their own (the measurement loop is the longest, at about 50).
MAX_FUNCTION_LINES = 60


def long_functions(package: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    out = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = node.body[0]
                doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                lines -= ((first.end_lineno or first.lineno) - first.lineno + 1) if doc else 0
                if lines > limit:
                    out.append(f"{path.relative_to(package.parent)}:{node.lineno} {node.name}: {lines} lines")
    return out


def test_no_function_is_longer_than_the_limit() -> None:
    assert long_functions(PACKAGE) == []


def test_a_long_function_is_found(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(61))
    (pkg / "m.py").write_text(f'def short():\n    """doc"""\n    return 1\n\n\ndef long():\n    """doc"""\n{body}\n')
    assert long_functions(pkg) == ["pkg/m.py:6 long: 62 lines"]


# ------------------------------------------------------------------------------------- the studies' imports

BENCHMARKS = PACKAGE.parent / "benchmarks"
STUDY_SEAMS = {ROOT, f"{ROOT}.research"}  # the user's top level, and the internals the studies use


def package_reaches(folder: Path) -> list[str]:
    """Every import of the package in the folder's Python files (benchmarks/out, the scripts' ignored output,
    left out) that names a module other than the package's top level and research.py, with its line."""
    out = folder / "out"
    found = []
    for path in sorted(folder.rglob("*.py")):
        if "__pycache__" in path.parts or out in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and node.level == 0
                else []
            )
            found += [
                f"{path.relative_to(folder)}:{node.lineno} imports {name}"
                for name in names
                if name.split(".")[0] == ROOT and name not in STUDY_SEAMS
            ]
    return found


def test_the_studies_reach_the_package_through_its_top_level_and_research_only() -> None:
    """benchmarks/ holds no internal name in place: a module the package moves changes research.py, never
    a script (`from pytest_perfguard.research import ...`)."""
    assert package_reaches(BENCHMARKS) == []


def test_a_study_reaching_past_research_is_found(tmp_path: Path) -> None:
    """What would get past the test above: an import by module path, plain or from; research itself and the
    top level pass, as does anything under out/."""
    (tmp_path / "ok.py").write_text(
        f"import {ROOT}\nfrom {ROOT} import perf_case\nfrom {ROOT}.research import decide\n", encoding="utf-8"
    )
    (tmp_path / "bad.py").write_text(
        f"from {ROOT}.judge.verdict import decide\nimport {ROOT}.measure.timing as engine\n", encoding="utf-8"
    )
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "copied.py").write_text(f"from {ROOT}.judge import policy\n", encoding="utf-8")
    assert package_reaches(tmp_path) == [
        f"bad.py:1 imports {ROOT}.judge.verdict",
        f"bad.py:2 imports {ROOT}.measure.timing",
    ]


def test_every_name_research_lists_is_there() -> None:
    """research.__all__ names what it imports: a name the package removed fails here, not in a GPU study."""
    import importlib

    research = importlib.import_module(f"{ROOT}.research")
    assert [name for name in research.__all__ if not hasattr(research, name)] == []


# The case's steps and what they call: pytest is not among their imports. The adapter (plugin.py, run/item.py,
# run/ending.py, confirm.Batch) makes a `CaseItem` of the item and pytest's outcome of the runner's `Ending`.
APART_FROM_PYTEST = (
    "run/runner.py",
    "run/timed.py",
    "run/checks.py",
    "run/workload.py",
    "run/watchdog.py",
    "measure",
    "judge",
)


def pytest_imports(paths: Sequence[Path]) -> list[str]:
    """Every import of pytest (or its private `_pytest`) in these files, at any level, with its line."""
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            if any(name.split(".")[0] in ("pytest", "_pytest") for name in names):
                found.append(f"{path.name}:{node.lineno}")
    return found


def _files(package: Path, where: Sequence[str]) -> list[Path]:
    out: list[Path] = []
    for part in where:
        path = package / part
        out.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    return out


def test_the_cases_steps_import_no_pytest() -> None:
    files = _files(PACKAGE, APART_FROM_PYTEST)
    assert all(f.is_file() for f in files) and len(files) > 20, files
    assert not pytest_imports(files), "pytest imported by the case's steps: " + ", ".join(pytest_imports(files))


def test_an_import_of_pytest_in_a_step_is_found(tmp_path: Path) -> None:
    step = tmp_path / "step.py"
    step.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from _pytest.nodes import Item\n")
    assert pytest_imports([step]) == ["step.py:3"]
    step.write_text("def f():\n    import pytest\n    return pytest\n")
    assert pytest_imports([step]) == ["step.py:2"]
    step.write_text("from . import pytest_like\nimport pytest_perfguard\n")
    assert pytest_imports([step]) == []
