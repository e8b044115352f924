"""A per-case deadline for kernels that never return.

A hung GPU kernel cannot be interrupted from Python: the only way out is to end the process. The watchdog
thread waits for the case to finish; past the deadline it reports TIMEOUT with the case name, lets the
session flush what it has (results file, step summary), and exits. Under xdist the controller reports
the crashed worker's case and starts a fresh worker for the rest.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable, Iterator

TIMEOUT_EXIT_CODE = 1


@contextlib.contextmanager
def deadline(seconds: float, case_id: str, on_expire: Callable[[str], None] | None = None) -> Iterator[None]:
    if not seconds or seconds <= 0:
        yield
        return
    done = threading.Event()

    def watch() -> None:
        if done.wait(seconds):
            return
        message = f"TIMEOUT: {case_id} ran longer than {seconds:g}s (--perfguard-case-timeout); ending the session"
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
        yield
    finally:
        done.set()
