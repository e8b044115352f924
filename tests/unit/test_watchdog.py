"""The per-case deadline: it fires on running time, and time queued for the device lock does not count; the
record a timeout keeps is the case's as it stood, and the case keeps nothing after it."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import cast

import pytest

from pytest_perfguard.record import CaseRecord, Outcome, Status
from pytest_perfguard.run.caseitem import CaseItem
from pytest_perfguard.run.runner import Runner
from pytest_perfguard.run.state import SessionState
from pytest_perfguard.run.watchdog import Deadline, doing
from pytest_perfguard.settings import Settings

_ITEM = CaseItem(
    "test_k.py::test_x[v-8]",
    "test_x[v-8]",
    "test_x",
    Path("test_k.py"),
    None,
    ("test_k.py", 1, "test_x[v-8]"),
    {},
    cast(pytest.Config, None),  # a confirmation's: none here
)


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


def test_a_timeout_keeps_the_record_as_it_stood_and_the_case_keeps_nothing_after_it() -> None:
    """The watchdog's thread keeps the timed-out case's record while the case's own thread may still run (a
    measurement still taking blocks): later writes by that thread do not reach what was kept, and its
    conclusion adds no second record; it waits for the process's end."""
    state = SessionState(settings=Settings())
    said: list[str] = []
    state.on_timeout = lambda message, item: said.append(message)
    runner = Runner(state, _ITEM)
    record = CaseRecord(id="test_k.py::test_x[v-8]", variant="v", notes=["found before the timeout"])
    runner._expire(record, "TIMEOUT: test_k.py::test_x[v-8] ran longer than 3s")
    # the case's thread goes on: its measurement ends and it writes the figures and a pass
    record.median_ns, record.outcome = 1000.0, Outcome.PASSED
    record.notes.append("written after the timeout")
    (kept,) = state.records
    assert (kept.outcome, kept.verdict, kept.median_ns) == (Outcome.FAILED, Status.TIMEOUT, None)
    assert kept.notes == ["found before the timeout"] and said == ["TIMEOUT: test_k.py::test_x[v-8] ran longer than 3s"]
    conclusion = threading.Thread(target=runner._conclude, args=(record,), daemon=True)
    conclusion.start()
    conclusion.join(0.5)
    assert conclusion.is_alive() and state.records == [kept]


def test_without_a_timeout_the_case_keeps_its_record() -> None:
    state = SessionState(settings=Settings())
    runner = Runner(state, _ITEM)
    record = CaseRecord(id="test_k.py::test_x[v-8]", variant="v", outcome=Outcome.PASSED, verdict=Status.PASS)
    runner._conclude(record)
    assert state.records == [record]


def test_the_timeout_line_names_the_step_and_tells_a_hang_from_a_measurement() -> None:
    assert doing("correctness check", 0.0, None, False, 5.0) == "in its correctness check"
    assert doing("timing", 10.0, None, True, 12.5) == "in timing for 2.5 s, before its first block ended"
    # 101 blocks, one every 10 ms after the first: the last 0.5 s ago is a measurement still running; 1.5 s, a hang
    assert "still measuring: 101 blocks of its measurement, the last 0.5 s ago" in doing(
        "timing", 0.0, (101, 0.0, 1.0), True, 1.5
    )
    assert "no block had ended for 1.5 s (101 had before that)" in doing("timing", 0.0, (101, 0.0, 1.0), True, 2.5)
    # blocks of 2 s each: a hang only past three of them
    assert "still measuring" in doing("timing", 0.0, (5, 2.0, 10.0), True, 15.0)
    assert "no block had ended for 6.5 s" in doing("timing", 0.0, (5, 2.0, 10.0), True, 16.5)
    # 20 s of set-up before the first block (captures, warm-up), then blocks of 10 ms: the set-up does not
    # make a hang 2 s later read as a measurement still running
    assert "no block had ended for 2.0 s (11 had before that)" in doing("timing", 0.0, (11, 20.0, 20.1), True, 22.1)
    # between two measurements (the eager call's timing, a wait for a quiet GPU) it is neither
    assert doing("timing", 0.0, (11, 20.0, 20.1), False, 22.1) == (
        "in timing for 22.1 s, between measurements: the last of 11 blocks ended 2.0 s ago"
    )
