"""Cross-process reader/writer lock per device, so timing never overlaps other work on the same device.

Under pytest-xdist, correctness checks of several workers may share a GPU (shared lock) while a timing
measurement holds it alone (exclusive lock). `flock` locks die with their process, so a crashed worker
never leaves a stale lock behind. Every lock file (these and the JSON files') lives in one owner-only
folder per user and is opened without following symlinks.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

from .settings import BY_NAME, from_env

LOCK_DIR_ENV = BY_NAME["lock_dir"].env


class LockError(OSError):
    """A lock folder or lock file that cannot be trusted; the message says why and what to do."""


class LockTimeout(Exception):
    """The lock was not free within the time given."""


def uid() -> int:
    return os.getuid() if hasattr(os, "getuid") else 0


def owner_only_dir(folder: Path, *, what: str, setting: str) -> Path:
    """Create `folder` (0700) or check the one there: a real folder of this user, not a symlink, which
    nobody else can write. In a shared temp dir another user could plant it first (or a link in its
    place) to read or redirect what we write there. One of ours with wider permissions is tightened."""
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700, parents=True)
    info = os.lstat(folder)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise LockError(
            errno.ENOTDIR,
            f"the {what} {folder} is a symlink or not a folder; remove it, or set {setting} to a folder of yours",
        )
    if info.st_uid != uid():
        raise LockError(
            errno.EPERM,
            f"the {what} {folder} belongs to another user (uid {info.st_uid}, you are {uid()}); it is not used. "
            f"Remove it, or set {setting} to a folder of yours",
        )
    if info.st_mode & 0o077:
        os.chmod(folder, 0o700)
    return folder


def lock_dir() -> Path:
    """The per-user, owner-only folder of every lock file ($PERFGUARD_LOCK_DIR, else the temp dir)."""
    base: Path = from_env("lock_dir") or Path(tempfile.gettempdir())
    return owner_only_dir(base / f"pytest-perfguard-{uid()}", what="lock folder", setting=LOCK_DIR_ENV)


def open_lock_file(path: Path) -> int:
    """Open (create) a lock file without following a symlink: a planted link must not make us create or
    truncate a file elsewhere."""
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        return os.open(path, flags, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LockError(errno.ELOOP, f"the lock file {path} is a symlink; it is not followed. Remove it") from None
        raise


@contextlib.contextmanager
def file_lock(path: Path, *, exclusive: bool = True, timeout: float | None = None) -> Iterator[None]:
    """flock on `path` (opened with O_NOFOLLOW); LockTimeout when not free within `timeout` seconds."""
    fd = open_lock_file(path)
    try:
        mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        if timeout is None:
            fcntl.flock(fd, mode)
        else:
            end = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, mode | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= end:
                        raise LockTimeout(str(path)) from None
                    time.sleep(0.05)
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def lock_path(device: str) -> Path:
    safe = device.replace(":", "")
    return lock_dir() / f"device-{safe}.lock"


@contextlib.contextmanager
def device_lock(
    device: str, *, exclusive: bool, while_waiting: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext
) -> Iterator[None]:
    """Hold the device's lock; `while_waiting` wraps only the wait for it (the watchdog pauses there)."""
    path = lock_path(device)
    fd = open_lock_file(path)
    try:
        with while_waiting():
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
