"""Git, asked read-only: the revision a run measured, and revisions to compare with."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path


class GitError(Exception):
    """A git question that has no answer here; the message says what to run."""


def git(cwd: Path, *args: str, check: bool = True) -> str:
    """Output of a git command in `cwd`, stripped; GitError (with git's message) when it fails."""
    try:
        proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=120)
    except FileNotFoundError:
        raise GitError("git is not installed (not found on PATH)") from None
    except subprocess.TimeoutExpired:
        raise GitError(f"git {' '.join(args)} did not finish in 120 s") from None
    if check and proc.returncode != 0:
        raise GitError(proc.stderr.strip() or f"git {' '.join(args)} failed with exit {proc.returncode}")
    return proc.stdout.strip()


def git_or_none(cwd: Path, *args: str) -> str | None:
    """Output of a git command in `cwd`, or None when git has no answer (a question whose absence is one)."""
    try:
        return git(cwd, *args)
    except GitError:
        return None


def head_sha(cwd: Path) -> str | None:
    """The commit checked out in `cwd`, or None outside a git repository."""
    return git_or_none(cwd, "rev-parse", "HEAD") or None


# Untracked files larger than this are digested by name and size only: the digest marks a tree as changed,
# it does not have to prove what changed.
_UNTRACKED_CONTENT_BYTES = 8 << 20


def tree_digest(cwd: Path) -> str | None:
    """A digest of the working tree's uncommitted changes (tracked edits, staged or not, and untracked files
    git does not ignore), or None for a clean tree or outside a repository. Two runs of the same changes on
    the same commit get the same digest; a results file that carries one did not measure the bare commit."""
    try:
        status = git(cwd, "status", "--porcelain", "--untracked-files=all")
        if not status:
            return None
        h = hashlib.sha256(git(cwd, "diff", "HEAD", "--binary").encode())
        top = Path(git(cwd, "rev-parse", "--show-toplevel"))
        for name in sorted(git(cwd, "ls-files", "--others", "--exclude-standard").splitlines()):
            path = top / name
            h.update(name.encode())
            try:
                size = path.stat().st_size
                h.update(path.read_bytes() if size <= _UNTRACKED_CONTENT_BYTES else str(size).encode())
            except OSError:
                continue
    except GitError:
        return None
    return h.hexdigest()[:16]


def measured(sha: str | None, dirty: str | None) -> str:
    """How a report names the code a run measured: the commit, marked when the tree had changes."""
    if sha is None:
        return "no commit recorded"
    return f"{sha[:12]} with uncommitted changes (digest {dirty})" if dirty else sha[:12]
