"""The package's structure in numbers, read from the source (ast): what the "one record, one reader" step
is measured by. Prints a table; changes nothing.

    python benchmarks/structure_count.py

- modules over 600 lines, by length;
- `.get(` calls per module (every one: on record data, settings, environment or git alike: the upper bound),
  and those on the dicts that records and files hold (a run's information, the device, the summary, a
  record's environment) outside the codecs, which the step wants at 0;
- places that read a results document's cases (`["results"]` or `.get("results"...)` on a mapping): the
  readers of the results JSON, one wanted;
- benchmarks/ and tests/ modules that import the package's private modules (anything but the package's top
  level and, for the studies, pytest_perfguard.research), and tests that import benchmarks/.
Import cycles and upward imports are counted by tests/unit/test_import_graph.py (0 of each is enforced).
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pytest_perfguard"
LONG = 600
RESEARCH = "pytest_perfguard.research"
# The dicts records and files hold (the run's information, the device, the summary, a record's environment).
DOCUMENT_DICTS = {"run", "device", "summary", "env"}
# The codecs: the results file and its records, the merged file, the baseline file and its migrations.
CODECS = {
    "pytest_perfguard/report/results.py",
    "pytest_perfguard/record.py",
    "pytest_perfguard/judge/baseline.py",
    "pytest_perfguard/judge/storage.py",
    "pytest_perfguard/judge/migrations.py",
    "pytest_perfguard/report/merge.py",  # the merged file's container, each run read by results.py
}


def _modules(folder: Path) -> list[Path]:
    """The folder's Python files, without bytecode caches and benchmarks/out (the scripts' ignored output)."""
    out = ROOT / "benchmarks" / "out"
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts and out not in p.parents)


def _gets(tree: ast.AST) -> int:
    return sum(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "get" for n in ast.walk(tree)
    )


def _document_gets(tree: ast.AST) -> list[int]:
    """Lines of `.get(` calls on a document's dict-held data: a receiver that is an attribute named as the
    dicts the records and files keep (`.run`, `.device`, `.summary`, `.env`), or a name a function bound to
    one. Counted outside the codecs (CODECS): elsewhere such data is read through typed fields."""
    lines = []
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        bound = {
            t.id
            for n in ast.walk(fn)
            if isinstance(n, ast.Assign) and _held(n.value)
            for t in n.targets
            if isinstance(t, ast.Name)
        }
        for n in ast.walk(fn):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "get":
                receiver = n.func.value
                if _held(receiver) or (isinstance(receiver, ast.Name) and receiver.id in bound):
                    lines.append(n.lineno)
    return sorted(set(lines))


def _held(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and node.attr in DOCUMENT_DICTS


def _results_reads(tree: ast.AST) -> int:
    """Subscripts ["results"] and .get("results", ...) calls."""
    count = 0
    for n in ast.walk(tree):
        subscript = isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant) and n.slice.value == "results"
        get = (
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr == "get"
            and bool(n.args)
            and isinstance(n.args[0], ast.Constant)
            and n.args[0].value == "results"
        )
        count += subscript or get
    return count


def _private_imports(tree: ast.AST) -> set[str]:
    """The package's submodules a module imports (`pytest_perfguard.x...`), but its research seam
    (pytest_perfguard.research, the names the studies use, in one place)."""
    found = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("pytest_perfguard."):
            found.add(n.module)
        elif isinstance(n, ast.Import):
            found |= {a.name for a in n.names if a.name.startswith("pytest_perfguard.")}
    return found - {RESEARCH}


def _imports_benchmarks(tree: ast.AST) -> bool:
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module and n.module.split(".")[0] == "benchmarks":
            return True
        if isinstance(n, ast.Import) and any(a.name.split(".")[0] == "benchmarks" for a in n.names):
            return True
    return False


def main() -> int:
    rows = []
    gets: Counter[str] = Counter()
    readers: Counter[str] = Counter()
    held: dict[str, list[int]] = {}
    for path in _modules(PACKAGE):
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        name = str(path.relative_to(ROOT))
        lines = text.count("\n")
        if lines > LONG:
            rows.append((lines, name))
        gets[name] = _gets(tree)
        if name not in CODECS and _document_gets(tree):
            held[name] = _document_gets(tree)
        if _results_reads(tree):
            readers[name] = _results_reads(tree)
    print(f"modules over {LONG} lines: {len(rows)}")
    for lines, name in sorted(rows, reverse=True):
        print(f"  {lines:5d}  {name}")
    print(f"\n.get( calls in the package: {sum(gets.values())}; by module, the ten most:")
    for name, n in gets.most_common(10):
        print(f"  {n:5d}  {name}")
    print(f"\n.get( on the dicts records and files hold, outside the codecs: {sum(map(len, held.values()))}")
    for name, at in sorted(held.items()):
        print(f"  {len(at):5d}  {name} (lines {', '.join(map(str, at))})")
    print(f"\nmodules that read a results document's cases: {len(readers)}")
    for name, n in readers.most_common():
        print(f"  {n:5d}  {name}")
    for folder in ("benchmarks", "tests"):
        private = {
            str(p.relative_to(ROOT)): len(_private_imports(ast.parse(p.read_text(encoding="utf-8"))))
            for p in _modules(ROOT / folder)
        }
        using = {k: v for k, v in private.items() if v}
        print(
            f"\n{folder}/ modules importing the package's submodules (not {RESEARCH}): {len(using)} of {len(private)}"
        )
        if folder == "benchmarks":
            for name in sorted(using):
                print(f"  {name}")
    tests_on_benchmarks = [
        str(p.relative_to(ROOT))
        for p in _modules(ROOT / "tests")
        if _imports_benchmarks(ast.parse(p.read_text(encoding="utf-8")))
    ]
    print(f"tests/ modules importing benchmarks/: {len(tests_on_benchmarks)} {tests_on_benchmarks}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
