"""The base revision of an A/B run (`--perfguard-against REV`): its tree, and each case's twin in it.

The tree of REV is extracted once (`git archive`) into a per-user cache folder keyed by its commit SHA,
under a lock, and reused by later runs, xdist workers and fresh confirmation processes. Nothing in the
repository is written: no worktree bookkeeping, no baseline, no results.

The base side of a test module is imported from that tree under names of its own, so head and base coexist
in one process. While a base module is imported, every top-level module that the base tree provides on the
head's import path (``kernels``, a ``conftest``, helpers beside the test) resolves to the base tree's copy,
loaded as ``_perfguard_base_<sha>.<name>``; the plugin itself (``pytest_perfguard``) stays the head's. A base
module's relative imports keep working after the import; an absolute import of such a name made later, at
call time, gets the head's module (import what a kernel needs at module level).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from .gitrev import GitError, git
from .jsonio import JSONFileError, locked
from .marker import MARK_NAME, PerfCase, Variant
from .record import Status

PLUGIN_PACKAGE = "pytest_perfguard"


def cache_dir() -> Path:
    """Where base trees are kept: $PERFGUARD_CACHE_DIR, else the per-user cache folder."""
    explicit = os.environ.get("PERFGUARD_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "pytest-perfguard"


@dataclass
class Twin:
    """A head case's counterpart at the base revision, or why there is none (`status` and `reason`)."""

    status: Status | None = None  # None: a usable twin
    reason: str = ""
    case: PerfCase | None = None
    variant: Variant | None = None
    factory: Any = None

    @property
    def ok(self) -> bool:
        return self.status is None


@dataclass
class BaseTree:
    rev: str
    sha: str
    head_sha: str | None
    dirty: bool
    top: Path  # the head's git top level
    root: Path  # the base tree (the repository's top level at REV)
    alias: str
    modules: dict[Path, ModuleType | str] = field(default_factory=dict)  # test file -> module, or why not

    def describe(self) -> str:
        text = f"{self.rev} ({self.sha[:12]}), tree in {self.root}"
        if self.sha == self.head_sha:
            text += (
                "; uncommitted changes against HEAD"
                if self.dirty
                else "; REV is HEAD and the tree is clean: an A/A run, every case compares identical code"
            )
        return text

    # ------------------------------------------------------------------------------------- modules

    def module_for(self, head_file: Path) -> ModuleType | str:
        head_file = head_file.resolve()
        if head_file not in self.modules:
            self.modules[head_file] = self._import(head_file)
        return self.modules[head_file]

    def _import(self, head_file: Path) -> ModuleType | str:
        try:
            rel = head_file.relative_to(self.top)
        except ValueError:
            return f"no base: {head_file} is outside the repository"
        base_file = self.root / rel
        if not base_file.is_file():
            return f"new: {rel} does not exist at {self.rev}"
        dirs = self._search_dirs(head_file)
        names = _top_level_names(dirs) - {PLUGIN_PACKAGE}
        package = _alias_package(self.alias, dirs)
        name = f"{self.alias}.__tests__." + ".".join(rel.with_suffix("").parts)
        try:
            with _redirected(package.__name__, names):
                spec = importlib.util.spec_from_file_location(name, base_file)
                assert spec is not None and spec.loader is not None
                module = importlib.util.module_from_spec(spec)
                sys.modules[name] = module
                spec.loader.exec_module(module)
        except BaseException as exc:
            sys.modules.pop(name, None)
            if isinstance(exc, KeyboardInterrupt):
                raise
            where = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            return f"no base: importing {rel} at {self.rev} failed: {where}"
        return module

    def _search_dirs(self, head_file: Path) -> list[Path]:
        """The base tree's twins of the head's import path entries inside the repository, and of the test
        file's folder (pytest's prepend import mode puts it first)."""
        entries = [str(head_file.parent), *sys.path]
        out: list[Path] = []
        for entry in entries:
            try:
                rel = Path(entry or ".").resolve().relative_to(self.top)
            except (ValueError, OSError):
                continue
            twin = self.root / rel
            if twin.is_dir() and twin not in out:
                out.append(twin)
        return out

    # ------------------------------------------------------------------------------------- twins

    def twin(self, item: pytest.Item, variant_name: str) -> Twin:
        module = self.module_for(Path(str(item.path)))
        if isinstance(module, str):
            status = Status.NEW if module.startswith("new:") else Status.NO_BASE
            return Twin(status, module)
        owner: Any = module
        cls = getattr(item, "cls", None)
        if cls is not None:
            owner = getattr(module, cls.__name__, None)
        name = getattr(item, "originalname", item.name)
        fn = getattr(owner, name, None) if owner is not None else None
        if fn is None:
            return Twin(Status.NEW, f"new: {name} does not exist at {self.rev}")
        mark = next((m for m in getattr(fn, "pytestmark", []) if m.name == MARK_NAME), None)
        if mark is None:
            return Twin(Status.NEW, f"new: {name} is not a perf case at {self.rev}")
        case: PerfCase = mark.args[0]
        if variant_name not in case.variants:
            return Twin(Status.NEW, f"new: variant {variant_name!r} does not exist at {self.rev}")
        return Twin(case=case, variant=case.variants[variant_name], factory=mark.kwargs.get("factory"))


def base_arguments(factory: Any, params: dict[str, Any]) -> dict[str, Any] | str:
    """The base factory's arguments from the head's, or why they do not fit."""
    missing = [p for p in inspect.signature(factory).parameters if p not in params]
    if missing:
        return f"not comparable: the base test takes parameters the head does not give: {missing}"
    return {p: params[p] for p in inspect.signature(factory).parameters}


# ------------------------------------------------------------------------------------ the base tree


def open_base(config: pytest.Config, rev: str) -> BaseTree:
    """Check REV and materialise its tree; every bad input is a usage error that says what to run."""
    root = config.rootpath
    try:
        top = Path(git(root, "rev-parse", "--show-toplevel"))
    except GitError as exc:
        raise pytest.UsageError(
            f"perfguard: --perfguard-against {rev}: {root} is not in a git repository ({exc}); the A/B gate "
            "compares with a git revision"
        ) from None
    try:
        sha = git(top, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except GitError:
        sha = ""
    if not sha:
        raise pytest.UsageError(_unknown_revision(top, rev))
    head = _optional(top, "rev-parse", "HEAD")
    dirty = bool(_optional(top, "status", "--porcelain", "--untracked-files=no"))
    tree_root = materialise(top, sha)
    return BaseTree(
        rev=rev, sha=sha, head_sha=head, dirty=dirty, top=top, root=tree_root, alias=f"_perfguard_base_{sha[:12]}"
    )


def _optional(top: Path, *args: str) -> str | None:
    try:
        return git(top, *args)
    except GitError:
        return None


def _unknown_revision(top: Path, rev: str) -> str:
    shallow = _optional(top, "rev-parse", "--is-shallow-repository") == "true"
    if shallow:
        return (
            f"perfguard: --perfguard-against {rev}: the revision is not in this shallow clone. Fetch it "
            f"(git fetch --no-tags origin {rev}, or git fetch --unshallow), or check out with fetch-depth: 0 "
            "in GitHub Actions. Nothing was run."
        )
    return (
        f"perfguard: --perfguard-against {rev}: unknown git revision. Give a SHA, a branch or a tag that "
        f"git rev-parse {rev} finds (a remote branch may need git fetch origin first). Nothing was run."
    )


def materialise(top: Path, sha: str) -> Path:
    """The tree of commit `sha`, extracted once into the cache (atomically, under a lock)."""
    folder = cache_dir() / "base"
    target = folder / sha
    if (target / ".perfguard-complete").is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    try:
        with locked(folder / f"{sha}.tree", timeout=600):
            if (target / ".perfguard-complete").is_file():
                return target
            tmp = Path(tempfile.mkdtemp(prefix=f".{sha[:12]}.", dir=folder))
            try:
                archive = subprocess.run(
                    ["git", "archive", "--format=tar", sha], cwd=top, capture_output=True, check=True, timeout=600
                ).stdout
                with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
                    tar.extractall(tmp, filter="data")
                (tmp / ".perfguard-complete").write_text(sha + "\n", encoding="utf-8")
                if target.exists():
                    shutil.rmtree(target)
                os.replace(tmp, target)
            finally:
                if tmp.exists():
                    shutil.rmtree(tmp, ignore_errors=True)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError, tarfile.TarError, JSONFileError) as exc:
        detail = exc.stderr.decode(errors="replace").strip() if isinstance(exc, subprocess.CalledProcessError) else exc
        raise pytest.UsageError(
            f"perfguard: could not extract the tree of {sha[:12]} into {folder}: {detail}. Set PERFGUARD_CACHE_DIR "
            "to a writable folder."
        ) from None
    return target


# ------------------------------------------------------------------------------------ imports


def _top_level_names(dirs: Sequence[Path]) -> set[str]:
    names: set[str] = set()
    for d in dirs:
        for child in d.iterdir():
            if child.suffix == ".py" and child.stem.isidentifier():
                names.add(child.stem)
            elif child.is_dir() and (child / "__init__.py").is_file() and child.name.isidentifier():
                names.add(child.name)
    return names


def _alias_package(alias: str, dirs: Sequence[Path]) -> ModuleType:
    """The package the base tree's modules live under; its path is the base twins of the import path."""
    package = sys.modules.get(alias)
    if package is None:
        package = ModuleType(alias, "modules of a base revision, imported by pytest-perfguard")
        package.__path__ = []
        package.__spec__ = importlib.machinery.ModuleSpec(alias, None, is_package=True)
        sys.modules[alias] = package
    paths = package.__path__
    for d in dirs:
        if str(d) not in paths:
            paths.append(str(d))
    return package


class _Existing(importlib.abc.Loader):
    """Hands an already imported module to the import system under another name."""

    def __init__(self, module: ModuleType) -> None:
        self.module = module

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return self.module

    def exec_module(self, module: ModuleType) -> None:
        return None


class _Redirect(importlib.abc.MetaPathFinder):
    def __init__(self, alias: str, names: set[str]) -> None:
        self.alias = alias
        self.names = names

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] not in self.names:
            return None
        module = importlib.import_module(f"{self.alias}.{fullname}")
        return importlib.util.spec_from_loader(fullname, _Existing(module))


@contextlib.contextmanager
def _redirected(alias: str, names: set[str]) -> Iterator[None]:
    """While active, `import NAME` of a shadowed name gets the base tree's module; afterwards the head's
    modules are back under their names and the base's stay under the alias."""

    def shadowed(key: str) -> bool:
        return key.split(".")[0] in names

    saved = {k: sys.modules.pop(k) for k in list(sys.modules) if shadowed(k)}
    finder = _Redirect(alias, names)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for key in [k for k in sys.modules if shadowed(k)]:
            del sys.modules[key]
        sys.modules.update(saved)
