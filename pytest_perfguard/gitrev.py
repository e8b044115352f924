"""Git, asked read-only: the revision a run measured, and revisions to compare with."""

from __future__ import annotations

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


def head_sha(cwd: Path) -> str | None:
    """The commit checked out in `cwd`, or None outside a git repository."""
    try:
        return git(cwd, "rev-parse", "HEAD") or None
    except GitError:
        return None
