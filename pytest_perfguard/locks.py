"""Cross-process reader/writer lock per device, so timing never overlaps other work on the same device.

Under pytest-xdist, correctness checks of several workers may share a GPU (shared lock) while a timing
measurement holds it alone (exclusive lock). `flock` locks die with their process, so a crashed worker
never leaves a stale lock behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path


def lock_path(device: str) -> Path:
    safe = device.replace(":", "")
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(os.environ.get("PERFGUARD_LOCK_DIR", tempfile.gettempdir())) / f"pytest-perfguard-{safe}-{uid}.lock"


@contextlib.contextmanager
def device_lock(
    device: str, *, exclusive: bool, while_waiting: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext
) -> Iterator[None]:
    """Hold the device's lock; `while_waiting` wraps only the wait for it (the watchdog pauses there)."""
    path = lock_path(device)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        with while_waiting():
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
