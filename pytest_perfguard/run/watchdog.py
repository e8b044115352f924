"""A per-case deadline for kernels that never return.

A hung GPU kernel cannot be interrupted from Python: the only way out is to end the process. The watchdog
thread waits for the case to finish; past the deadline (time queued for the device lock does not count)
it reports TIMEOUT with the case name and what the case was doing (a call that never returned, or a
measurement still taking blocks at the limit), lets the session flush what it has (results file, step
summary; a worker sends the case's failure to the controller, which starts a fresh worker for the rest),
and exits.
"""

from __future__ import annotations

import contextlib
import copy
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

TIMEOUT_EXIT_CODE = 1
T = TypeVar("T")


class Deadline:
    """The running case's clock. `paused()` stops it while the case waits for another process (the device
    lock): a case queued behind a hung kernel must not be the one blamed for it."""

    def __init__(self, seconds: float) -> None:
        self._cond = threading.Condition()
        self._left = seconds
        self._expires_at: float | None = time.monotonic() + seconds
        self.done = False

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        with self._cond:
            if self._expires_at is not None:
                self._left = self._expires_at - time.monotonic()
                self._expires_at = None
        try:
            yield
        finally:
            with self._cond:
                self._expires_at = time.monotonic() + self._left
                self._cond.notify_all()

    def finish(self) -> None:
        with self._cond:
            self.done = True
            self._cond.notify_all()

    def wait_expired(self) -> bool:
        """Block until the case finishes (False) or its running time passes the limit (True)."""
        with self._cond:
            while not self.done:
                if self._expires_at is None:
                    self._cond.wait()
                    continue
                left = self._expires_at - time.monotonic()
                if left <= 0:
                    return True
                self._cond.wait(left)
            return False


@contextlib.contextmanager
def deadline(
    seconds: float,
    case_id: str,
    on_expire: Callable[[str], None] | None = None,
    where: Callable[[], str] | None = None,
) -> Iterator[Deadline]:
    """Watch the case; past `seconds`, say so (with `where()`: what the case was doing), then end the process."""
    if not seconds or seconds <= 0:
        yield Deadline(0.0)  # nobody watches it: pausing it is harmless
        return
    clock = Deadline(seconds)

    def watch() -> None:
        if not clock.wait_expired():
            return
        doing = ""
        if where is not None:
            with contextlib.suppress(Exception):
                doing = f" {where()}"
        message = (
            f"TIMEOUT: {case_id} ran longer than {seconds:g}s (--perfguard-case-timeout){doing}; ending the session"
        )
        if on_expire is not None:
            with contextlib.suppress(Exception):
                on_expire(message)
        else:
            sys.stderr.write(f"\nperfguard: {message}\n")
            sys.stderr.flush()
        sys.stdout.flush()
        os._exit(TIMEOUT_EXIT_CODE)

    thread = threading.Thread(target=watch, name="perfguard-deadline", daemon=True)
    thread.start()
    try:
        yield clock
    finally:
        clock.finish()


def doing(stage: str, timing_t0: float, block: tuple[int, float, float] | None, measuring: bool, now: float) -> str:
    """What a case was doing at its deadline, for the TIMEOUT line: its step; in timing (since `timing_t0`),
    whether a measurement was taking blocks (`block`: how many of its blocks had ended, when the first and
    the last did) or none had ended for over max(1 s, three times its blocks' mean time), as a call that
    never returns leaves it; or that it was between measurements (`measuring` false)."""
    if stage != "timing":
        return f"in its {stage}"
    head = f"in timing for {now - timing_t0:.1f} s"
    if block is None:
        return f"{head}, before its first block ended" if measuring else f"{head}, before its first measurement"
    blocks, first, last = block
    since = now - last
    if not measuring:
        return f"{head}, between measurements: the last of {blocks} blocks ended {since:.1f} s ago"
    # The first block's time holds the measurement's set-up (captures, warm-up): the mean is taken after it.
    mean = (last - first) / (blocks - 1) if blocks > 1 else last - timing_t0
    if since > max(1.0, 3 * mean):
        return (
            f"{head}: no block had ended for {since:.1f} s ({blocks} had before that), as a call that never "
            "returns leaves it"
        )
    return (
        f"{head}, still measuring: {blocks} blocks of its measurement, the last {since:.1f} s ago; a longer "
        "--perfguard-case-timeout or a shorter --perfguard-case-budget lets it finish"
    )


def snapshot(value: T) -> T:
    """A deep copy of what another thread may be writing (a dict it grows mid-copy raises: copy again)."""
    for _ in range(9):
        with contextlib.suppress(RuntimeError):
            return copy.deepcopy(value)
    return copy.deepcopy(value)
