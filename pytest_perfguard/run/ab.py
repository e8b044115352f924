"""The base revision of an A/B run (`--perfguard-against REV`): its tree, and each case's twin in it.

The tree of REV is extracted once (`git archive`, streamed) into a per-user, owner-only cache folder keyed
by its commit SHA, under a lock, and reused by later runs, xdist workers and fresh confirmation processes.
Before each use the tree is checked against git's tree of REV (each file's object id recomputed), or,
where `git archive` rewrites files (export-subst), against the manifest hash taken at extraction: what
the base tree holds decides every A/B verdict, so a tree changed on disk is extracted again. Nothing in
the repository is written: no worktree bookkeeping, no baseline, no results.

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
import sys
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from ..gitrev import GitError, git, git_or_none
from ..judge.baseline import BaselineFile
from ..judge.policy import AB_OFFSET_LEVEL, AB_OFFSET_MIN_READINGS
from ..marker import MARK_NAME, PerfCase, Variant
from ..record import Status
from ..settings import BY_NAME, Settings, convert, resolve
from .basetree import DEFAULT_CACHE_DAYS, materialise
from .caseitem import CaseItem

PLUGIN_PACKAGE = "pytest_perfguard"


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
    # the per-process offsets the A/B gate counts, from 20 us and under, and where they came from
    offsets: tuple[OffsetUse, OffsetUse] | None = None

    def describe(self) -> str:
        """REV, its commit and subject (so a log says which commit the run compared with), and its tree."""
        try:
            subject = git(self.top, "log", "-1", "--format=%s", self.sha)
        except GitError:
            subject = ""
        commit = f"{self.sha[:12]} {subject!r}" if subject else self.sha[:12]
        text = f"{self.rev} ({commit}), tree in {self.root}"
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

    def twin(self, item: CaseItem, variant_name: str) -> Twin:
        module = self.module_for(item.path)
        if isinstance(module, str):
            status = Status.NEW if module.startswith("new:") else Status.NO_BASE
            return Twin(status, module)
        owner: Any = module
        if item.class_name is not None:
            owner = getattr(module, item.class_name, None)
        name = item.test
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
    head = git_or_none(top, "rev-parse", "HEAD")
    dirty = bool(git_or_none(top, "status", "--porcelain", "--untracked-files=no"))

    def say(text: str) -> None:
        config.issue_config_time_warning(pytest.PytestWarning(text), stacklevel=2)

    tree_root = materialise(top, sha, keep_days=resolve(config, BY_NAME["cache_days"]), say=say)
    return BaseTree(
        rev=rev, sha=sha, head_sha=head, dirty=dirty, top=top, root=tree_root, alias=f"_perfguard_base_{sha[:12]}"
    )


def _unknown_revision(top: Path, rev: str) -> str:
    shallow = git_or_none(top, "rev-parse", "--is-shallow-repository") == "true"
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


# ------------------------------------------------------------------------------------ the per-process offset
#
# Two loaded copies of the same code differ in each process by an offset that the head/base interval does not
# sample; the A/B gate's MDE and stop rule count it (settings.AB_PROCESS_SD). Its built-in values were fitted
# on H100s. An update fits it on the user's device: its fresh processes (update.process_samples) run as A/B
# runs against HEAD (`aa_base`), so each variant is timed against its own twin, loaded from the cached tree of
# HEAD exactly as `--perfguard-against` loads a base revision (separately built extensions included); each
# process's head/base reading is stored with its sample, and the baseline file's readings give the fit
# (baseline.AbOffset). An A/B run takes it from there (`use_stored_offset`).


def aa_base(root: Path, baseline_dir: Path, *, keep_days: float = DEFAULT_CACHE_DAYS) -> tuple[str | None, str]:
    """The commit an update's fresh processes time every variant against (A/A), its tree materialised in the
    cache; or None and why there is none. Only HEAD of a clean checkout is the code the update measures: a
    change to a tracked file would make the "A/A" an A/B of that change. Left out of that check: the baseline
    folder (an earlier update's entries waiting to be committed are data, never imported) and untracked files
    (git archive leaves them out of HEAD's tree, so a case in an untracked module has no twin and no reading)."""
    try:
        top = Path(git(root, "rev-parse", "--show-toplevel"))
    except GitError as exc:
        return None, f"{root} is not in a git repository ({exc})"
    sha = git_or_none(top, "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
    if not sha:
        return None, f"the git repository {top} has no commit yet"
    pathspec = ["--", "."]
    with contextlib.suppress(ValueError, OSError):
        folder = Path(baseline_dir).resolve().relative_to(top.resolve()).as_posix()
        if folder != ".":
            pathspec.append(f":(exclude){folder}")
    try:  # tracked files that differ from HEAD, staged or not
        files = git(top, "diff", "--name-only", "--no-renames", "HEAD", *pathspec).splitlines()
    except GitError as exc:
        return None, f"git diff failed in {top} ({exc})"
    if files:
        listed = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
        return None, (
            f"the working tree has uncommitted changes ({listed}), so HEAD is not the code this update measured"
        )
    try:
        materialise(top, sha, keep_days=keep_days)
    except pytest.UsageError as exc:
        return None, str(exc).removeprefix("perfguard: ")
    return sha, ""


_LARGEST_OFFSET = 0.099  # just under what the ab_process_sd settings accept


@dataclass(frozen=True)
class OffsetUse:
    """The per-process offset the A/B gate counts for one size class, and where it came from: "setting" (the
    command line, environment or ini), "fitted" (the baseline file's A/A readings) or "built-in"."""

    size: str  # "from 20 us" or "under 20 us"
    sd: float
    source: str
    detail: str

    def line(self) -> str:
        return f"perfguard: A/B per-process offset {self.size}: {self.sd:.2%}, {self.detail}"

    def to_json(self) -> dict[str, Any]:
        return {"sd": self.sd, "source": self.source, "detail": self.detail}


def use_stored_offset(
    settings: Settings, baseline: BaselineFile | None, device: str, where: str
) -> tuple[OffsetUse, OffsetUse]:
    """The per-process offsets an A/B run counts, from 20 us and under: a value set by the user stays; else
    the fit of the baseline file's A/A readings (`where` names the file) replaces the built-in value in
    `settings`, for a size class with at least policy.AB_OFFSET_MIN_READINGS readings; else the built-in
    H100 value stays. `device` is this GPU's id as samples name it (state.device_id)."""
    fitted = baseline.ab_offset() if baseline is not None and baseline.exists else None
    uses = []
    for name, size, small in (("ab_process_sd", "from 20 us", False), ("ab_small_process_sd", "under 20 us", True)):
        spec = BY_NAME[name]
        fit = None if fitted is None else (fitted.small if small else fitted.large)
        if name in settings.explicit:
            detail = f"as set ({spec.option}, {spec.env} or {spec.ini})"
            uses.append(OffsetUse(size, getattr(settings, name), "setting", detail))
        elif fitted is not None and fit is not None and fit.readings >= AB_OFFSET_MIN_READINGS:
            sd, past = fit.bound, ""
            try:
                convert(sd, spec)  # what the setting takes: fresh processes get the value as the setting
            except ValueError:
                sd, past = _LARGEST_OFFSET, f" (clamped to {_LARGEST_OFFSET:.2%}: no A/B margin covers such an offset)"
            setattr(settings, name, sd)
            cases = fitted.small_cases if small else fitted.large_cases
            gpus = len(fitted.devices)
            mine = "this one among them" if device in fitted.devices else "not this one"
            dates = fitted.dates[0] if fitted.dates[0] == fitted.dates[1] else "..".join(fitted.dates)
            detail = (
                f"fitted on this device model: the {AB_OFFSET_LEVEL:.0%} upper bound of {fit.fit:.2%} from "
                f"{fit.readings} A/A readings of {cases} case(s) ({fit.dof:.0f} dof) on {gpus} device(s), {mine}, "
                f"{dates or 'undated'}, in {where}{past}"
            )
            uses.append(OffsetUse(size, sd, "fitted", detail))
        else:
            if fit is not None:
                why = f"only {fit.readings} A/A reading(s) of this size in {where}, {AB_OFFSET_MIN_READINGS} needed"
            elif baseline is None or not baseline.exists:
                why = f"no baseline file {where} to fit it from"
            else:
                why = f"no A/A readings of this size in {where}"
            origin = "fitted on H100s" if settings.device.startswith("cuda") else "fitted on H100s, not on a CPU"
            detail = (
                f"built-in ({origin}): {why}; pytest --perfguard-update-baseline on a clean git checkout, "
                "on this device, stores them"
            )
            uses.append(OffsetUse(size, spec.default, "built-in", detail))
    return uses[0], uses[1]
