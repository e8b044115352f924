"""The base revision's tree on disk: extracted once (`git archive`, streamed) into a per-user, owner-only
cache folder keyed by its commit SHA, under a lock, and reused by later runs, xdist workers and fresh
confirmation processes. Before each use the tree is checked against git's tree of REV (each file's object id
recomputed), or, where `git archive` rewrites files (export-subst), against the manifest hash taken at
extraction: what the base tree holds decides every A/B verdict, so a tree changed on disk is extracted again.
Killed extractions are swept, and trees unused for the cache's days are evicted. How the base side is
imported from the tree is ab.py's."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import posixpath
import shutil
import stat
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from ..gitrev import GitError, git, git_or_none
from ..jsonio import JSONFileError, dumps, locked, write_text_atomic
from ..locks import LockError, owner_only_dir
from ..settings import BY_NAME, from_env

CACHE_DIR_ENV = BY_NAME["cache_dir"].env
DEFAULT_CACHE_DAYS: float = BY_NAME["cache_days"].default  # a tree unused this long is removed
_TEMP_SUFFIX = ".tmp"
_CHUNK = 1 << 20


def cache_dir() -> Path:
    """Where base trees are kept: $PERFGUARD_CACHE_DIR, else the per-user cache folder."""
    explicit: Path | None = from_env("cache_dir")
    if explicit is not None:
        return explicit
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "pytest-perfguard"


def materialise(
    top: Path, sha: str, *, keep_days: float = DEFAULT_CACHE_DAYS, say: Callable[[str], None] | None = None
) -> Path:
    """The tree of commit `sha`, extracted once into the cache (atomically, under a lock) and checked
    against its manifest before every use; a tree that fails the check is extracted again, and `say` is
    told why. Trees unused for `keep_days` days are removed (0: never)."""
    try:
        folder = owner_only_dir(_cache_root() / "base", what="cache folder", setting=CACHE_DIR_ENV)
    except LockError as exc:
        raise pytest.UsageError(f"perfguard: {exc.strerror}") from None
    except OSError as exc:
        raise pytest.UsageError(
            f"perfguard: cannot create the cache folder {cache_dir()} ({exc.strerror or exc}); set "
            f"{CACHE_DIR_ENV} to a folder of yours"
        ) from None
    try:
        tree_id = git(top, "rev-parse", f"{sha}^{{tree}}")
    except GitError as exc:
        raise pytest.UsageError(f"perfguard: git rev-parse {sha[:12]}^{{tree}} failed: {exc}") from None
    sweep_temp_trees(folder)
    target = folder / sha
    try:
        with _tree_lock(folder, sha, timeout=600):
            problem = verify_tree(folder, sha, tree_id, top)
            if problem is None:
                os.utime(_manifest_path(folder, sha))  # last used: eviction counts from here
            else:
                if problem and say is not None:
                    say(
                        f"perfguard: the cached tree of {sha[:12]} in {target} {problem}: it was changed or "
                        "damaged after extraction and is extracted again from git"
                    )
                _extract(top, sha, tree_id, folder)
    except _UnsafeEntry as exc:
        raise pytest.UsageError(f"perfguard: the tree of {sha[:12]} cannot be used as the A/B base: {exc}") from None
    except subprocess.CalledProcessError as exc:
        raise pytest.UsageError(
            f"perfguard: git archive {sha[:12]} failed: {exc.stderr.decode(errors='replace').strip()}"
        ) from None
    except (subprocess.TimeoutExpired, tarfile.TarError) as exc:
        raise pytest.UsageError(f"perfguard: could not extract the tree of {sha[:12]}: {exc}") from None
    except JSONFileError as exc:  # the lock: held too long by another run, or a lock folder not ours
        raise pytest.UsageError(f"perfguard: {exc}") from None
    except OSError as exc:
        detail = exc.strerror or exc
        raise pytest.UsageError(
            f"perfguard: could not write the tree of {sha[:12]} into {folder}: {detail}. Free some space, or set "
            f"{CACHE_DIR_ENV} to a writable folder of yours"
        ) from None
    evict_trees(folder, keep_days, keep=sha)
    return target


class _UnsafeEntry(Exception):
    """An entry of the base revision's tree that is not recreated (a symlink out of the tree, a device)."""


def _cache_root() -> Path:
    """The cache folder. A base tree is code the run imports, so nobody else may write it: the default
    folder is owner-only; in one given by $PERFGUARD_CACHE_DIR (its mode is the user's choice: it may be
    /tmp) the `base` folder inside is, and is checked."""
    folder = cache_dir()
    if from_env("cache_dir") is not None:
        folder.mkdir(parents=True, exist_ok=True)
        return folder
    return owner_only_dir(folder, what="cache folder", setting=CACHE_DIR_ENV)


def _manifest_path(folder: Path, sha: str) -> Path:
    return folder / f"{sha}.manifest.json"


def tree_digest(root: Path) -> tuple[str, int]:
    """sha256 over the sorted (path, kind and mode, content hash or link target) of every entry under
    `root`, without following links; and the number of bytes of content."""
    entries: list[str] = []
    size = 0
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        for name in dirnames:
            path = base / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                entries.append(f"{rel}\0l\0{os.readlink(path)}")
            else:
                entries.append(f"{rel}\0d")
        for name in filenames:
            path = base / name
            rel = path.relative_to(root).as_posix()
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                entries.append(f"{rel}\0l\0{os.readlink(path)}")
                continue
            if not stat.S_ISREG(info.st_mode):
                entries.append(f"{rel}\0?{info.st_mode:o}")
                continue
            digest = hashlib.sha256()
            with path.open("rb") as handle:
                while chunk := handle.read(_CHUNK):
                    digest.update(chunk)
            size += info.st_size
            entries.append(f"{rel}\0f{info.st_mode & 0o111:o}\0{digest.hexdigest()}")
    entries.sort()
    return hashlib.sha256("\n".join(entries).encode("utf-8", "surrogateescape")).hexdigest(), size


def git_mismatch(top: Path, sha: str, root: Path) -> str | None:
    """None when the files, links and modes under `root` are exactly git's tree of `sha` (each file's git
    object id recomputed from its content, against `git ls-tree -r`); else the first difference. Git, not
    anything in the cache, is the reference here."""
    algo = git_or_none(top, "rev-parse", "--show-object-format") or "sha1"
    listing = subprocess.run(
        ["git", "ls-tree", "-r", "-z", "--full-tree", sha], cwd=top, capture_output=True, check=True, timeout=120
    ).stdout
    expected: dict[str, tuple[str, str]] = {}
    for record in listing.split(b"\0"):
        if not record:
            continue
        meta, _, raw_name = record.partition(b"\t")
        mode, kind, oid = meta.decode().split(" ")
        if kind == "blob":
            expected[os.fsdecode(raw_name)] = (mode, oid)
    seen: set[str] = set()
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            seen.add(rel)
            if rel not in expected:
                return f"has {rel}, which is not in git's tree"
            mode, oid = expected[rel]
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                got_mode, content = "120000", os.fsencode(os.readlink(path))
                digest = hashlib.new(algo, b"blob %d\0" % len(content) + content).hexdigest()
            elif stat.S_ISREG(info.st_mode):
                got_mode = "100755" if info.st_mode & 0o100 else "100644"
                digest = _blob_id(path, info.st_size, algo)
            else:
                return f"has {rel}, which is neither a file nor a symlink"
            if got_mode != mode or digest != oid:
                return f"has {rel}, which differs from git's"
    missing = sorted(set(expected) - seen)
    return f"lacks {missing[0]}" if missing else None


def _blob_id(path: Path, size: int, algo: str) -> str:
    digest = hashlib.new(algo, b"blob %d\0" % size)
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def verify_tree(folder: Path, sha: str, tree_id: str, top: Path | None = None) -> str | None:
    """None when the cached tree of `sha` is what was extracted from git tree `tree_id`; "" when there is
    none; else what is wrong with it. With `top` (the repository), a tree whose extraction matched git's
    blobs exactly is checked against git itself; one that did not (export-subst, export-ignore) against
    its manifest's hash."""
    target = folder / sha
    manifest_path = _manifest_path(folder, sha)
    if not target.exists() and not manifest_path.exists():
        return ""
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "has no readable manifest"
    if not isinstance(manifest, dict) or manifest.get("tree") != tree_id or manifest.get("sha") != sha:
        return f"has a manifest of another tree (git rev-parse {sha[:12]}^{{tree}} is {tree_id[:12]})"
    if not target.is_dir() or target.is_symlink():
        return "is missing or not a folder"
    if top is not None and manifest.get("exact") is True:
        wrong = git_mismatch(top, sha, target)
        return None if wrong is None else f"{wrong} (a file was added, removed or edited)"
    if tree_digest(target)[0] != manifest.get("digest"):
        return "does not match its manifest (a file was added, removed or edited)"
    return None


def _extract(top: Path, sha: str, tree_id: str, folder: Path) -> None:
    """`git archive` streamed into a temp folder (no whole archive in memory), its manifest written, then
    both moved into place."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{sha}.", suffix=_TEMP_SUFFIX, dir=folder))
    try:
        with tempfile.TemporaryFile() as errors:
            proc = subprocess.Popen(
                ["git", "archive", "--format=tar", sha], cwd=top, stdout=subprocess.PIPE, stderr=errors
            )
            assert proc.stdout is not None
            broken: tarfile.TarError | None = None
            try:
                with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
                    for member in tar:
                        _check_entry(member)
                        try:
                            tar.extract(member, tmp, filter="data")
                        except tarfile.FilterError as exc:
                            raise _UnsafeEntry(f"{member.name} cannot be extracted safely ({exc})") from None
            except tarfile.TarError as exc:
                broken = exc  # a git that failed midway: its message is the cause, if it has one
            finally:
                # Read what git still writes after the archive's end marker (its record padding) before
                # closing: closed early, git dies of SIGPIPE, exit -13 with nothing on stderr, and a base tree
                # that was extracted whole read as "git archive failed" (a loaded 2-core machine, 2026-11-28).
                with contextlib.suppress(OSError, ValueError):
                    while proc.stdout.read(1 << 16):
                        pass
                proc.stdout.close()
                code = proc.wait(timeout=600)
            if code != 0:
                errors.seek(0)
                raise subprocess.CalledProcessError(code, proc.args, stderr=errors.read())
            if broken is not None:
                raise broken
        digest, size = tree_digest(tmp)
        exact = git_mismatch(top, sha, tmp) is None  # False where .gitattributes changes the archive
        manifest = {"sha": sha, "tree": tree_id, "digest": digest, "bytes": size, "exact": exact}
        target = folder / sha
        manifest_path = _manifest_path(folder, sha)
        with contextlib.suppress(FileNotFoundError):
            manifest_path.unlink()  # no manifest until the tree beside it is complete
        if target.exists() or target.is_symlink():
            _remove(target)
        os.replace(tmp, target)
        write_text_atomic(manifest_path, dumps(manifest))
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _check_entry(member: tarfile.TarInfo) -> None:
    """A symlink is recreated only when it stays inside the tree; git trees hold nothing but files,
    folders, links (and submodules, which git archive writes as empty folders)."""
    if member.issym():
        where = posixpath.normpath(posixpath.join(posixpath.dirname(member.name), member.linkname))
        if posixpath.isabs(member.linkname) or where == ".." or where.startswith("../"):
            raise _UnsafeEntry(
                f"its symlink {member.name} -> {member.linkname} points outside the tree, so it is not recreated "
                "in the cache (a link out of the cache would let the base code reach anything). Make the link "
                "point inside the repository, or compare with a revision without it"
            )
    elif not (member.isfile() or member.isdir()):
        raise _UnsafeEntry(f"{member.name} is neither a file, a folder nor a symlink")


def _remove(path: Path) -> None:
    if path.is_symlink() or not path.is_dir():
        path.unlink()
    else:
        shutil.rmtree(path)


def _tree_lock(folder: Path, sha: str, *, timeout: float) -> AbstractContextManager[None]:
    """The lock of one revision's cached tree, in the cache folder itself: the folder is what processes
    share (PERFGUARD_CACHE_DIR), while their temp dirs, where the per-user lock folder lives, can differ, and
    two processes with different lock folders would each take the tree as free and sweep the other's
    half-extracted tree as a killed extraction's. A sharded run under act (tests/test_workflows.py) once lost
    a shard so: its extraction failed with "No such file or directory"."""
    return locked(folder / f"{sha}.tree", timeout=timeout, lock_at=folder / f".{sha}.lock")


def sweep_temp_trees(folder: Path) -> list[Path]:
    """Remove temp trees that a killed extraction left: one whose revision's lock is free is no one's."""
    removed: list[Path] = []
    for entry in folder.iterdir():
        if not (entry.name.startswith(".") and entry.name.endswith(_TEMP_SUFFIX)):
            continue
        sha = entry.name[1:].split(".", 1)[0]
        try:
            with _tree_lock(folder, sha, timeout=0):
                _remove(entry)
                removed.append(entry)
        except (JSONFileError, OSError):
            continue  # an extraction of that revision is running now
    return removed


def evict_trees(folder: Path, keep_days: float, keep: str = "") -> list[str]:
    """Remove the trees not used for `keep_days` days (each under its lock, skipped while in use)."""
    if keep_days <= 0:
        return []
    cutoff = time.time() - keep_days * 86400
    shas = {
        entry.name.removesuffix(".manifest.json")
        for entry in folder.iterdir()
        if not entry.name.startswith(".") and (entry.name.endswith(".manifest.json") or entry.is_dir())
    }
    removed: list[str] = []
    for sha in sorted(shas - {keep}):
        tree, manifest = folder / sha, _manifest_path(folder, sha)
        try:
            if (manifest if manifest.exists() else tree).lstat().st_mtime >= cutoff:
                continue
            with _tree_lock(folder, sha, timeout=0):
                if tree.exists() or tree.is_symlink():
                    _remove(tree)
                with contextlib.suppress(FileNotFoundError):
                    manifest.unlink()
            removed.append(sha)
        except (JSONFileError, OSError):
            continue  # in use by another run, or gone meanwhile
    return removed
