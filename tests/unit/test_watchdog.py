"""The per-case deadline: it fires on running time, and time queued for the device lock does not count."""

from __future__ import annotations

import threading
import time

from pytest_perfguard.run.watchdog import Deadline


def _expires(clock: Deadline) -> threading.Event:
    fired = threading.Event()

    def watch() -> None:
        if clock.wait_expired():
            fired.set()

    threading.Thread(target=watch, daemon=True).start()
    return fired


def test_fires_once_running_time_passes_the_limit() -> None:
    clock = Deadline(0.2)
    assert _expires(clock).wait(5.0)


def test_finishing_in_time_never_fires() -> None:
    clock = Deadline(0.5)
    fired = _expires(clock)
    clock.finish()
    assert not fired.wait(1.0)


def test_time_spent_paused_does_not_count() -> None:
    clock = Deadline(0.6)
    fired = _expires(clock)
    with clock.paused():
        assert not fired.wait(1.2)  # twice the limit, all of it queued
    t0 = time.monotonic()
    assert fired.wait(5.0)  # the clock runs again and the remaining time expires
    assert time.monotonic() - t0 >= 0.3
