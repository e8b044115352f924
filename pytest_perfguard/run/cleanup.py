"""What a killed run leaves behind, and how a child process is kept from outliving its session.

`kill -9` of pytest runs no cleanup: a fresh confirmation process it started would go on (reparented to
PID 1, still holding the GPU), and its temp folder and the temp file of an interrupted atomic write stay.
So the child is asked to die with its parent (Linux: PR_SET_PDEATHSIG), and the next session removes the
leftovers whose owner process is gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import stat
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

CONFIRM_PREFIX = "perfguard-confirm-"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# A leftover whose owner cannot be told (no pid in its name) is removed only when this old.
UNKNOWN_OWNER_AGE_S = 24 * 3600
# write_text_atomic's temp file: ".<name>.<pid>.<8 hex>.tmp"
_ATOMIC_TMP = re.compile(r"^\..+\.(\d+)\.[0-9a-f]{8}\.tmp$")
_CONFIRM_DIR = re.compile(rf"^{CONFIRM_PREFIX}(?:(\d+)-)?")


def die_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` that makes the child receive SIGKILL when this process dies, however it dies; None
    where prctl is not to be had (not Linux). Loaded here, before the fork: the child only calls it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the request took effect
            os._exit(1)

    return arm


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def _orphaned(pid_text: str | None, mtime: float) -> bool:
    """A leftover with the pid of a process that is gone, or (no pid known) an old one."""
    if pid_text is not None:
        pid = int(pid_text)
        return pid != os.getpid() and not _alive(pid)
    return time.time() - mtime > UNKNOWN_OWNER_AGE_S


def sweep_confirm_dirs(folder: Path | None = None) -> list[Path]:
    """Remove this user's confirmation temp folders whose session is gone."""
    root = Path(folder or tempfile.gettempdir())
    removed: list[Path] = []
    uid = os.getuid() if hasattr(os, "getuid") else None
    with contextlib.suppress(OSError):
        for entry in root.iterdir():
            match = _CONFIRM_DIR.match(entry.name)
            if match is None:
                continue
            try:
                info = entry.lstat()
            except OSError:
                continue
            if not stat.S_ISDIR(info.st_mode) or (uid is not None and info.st_uid != uid):
                continue  # not ours, or not what we make: never touched
            if _orphaned(match.group(1), info.st_mtime):
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
    return removed


def sweep_atomic_temps(folder: Path) -> list[Path]:
    """Remove temp files of atomic writes (baselines, results) whose writer was killed mid-write."""
    removed: list[Path] = []
    with contextlib.suppress(OSError):
        for entry in folder.iterdir():
            match = _ATOMIC_TMP.match(entry.name)
            if match is None:
                continue
            try:
                info = entry.lstat()
                if stat.S_ISREG(info.st_mode) and _orphaned(match.group(1), info.st_mtime):
                    entry.unlink()
                    removed.append(entry)
            except OSError:
                continue
    return removed
