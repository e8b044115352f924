"""Live progress while a case measures: one line rewritten in place on a terminal, one line per case in a log.

A GPU run takes minutes and each case measures for seconds; without this the run looks hung. On a TTY the
line (case, variant, blocks, CI half-width against its target, elapsed and remaining budget) is redrawn at
most `rate` times a second through pytest's terminal reporter and cleared when the case ends. Elsewhere
(CI logs) a redrawn line would be a flood, so each case gets one line when it ends. `-q` shows nothing.

Under xdist the measuring happens in workers, which have no terminal: a live line would need a channel
from each worker to the controller for every redraw, and xdist offers none short of test reports. The
controller therefore prints each case's completion line when its report (which carries the record)
arrives; the live line is shown only in a single-process run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, cast

import pytest

from ..measure.timing import Progress
from ..record import CaseRecord
from ..report.formats import format_time, plus_minus, shape_label

Clock = Callable[[], float]


def progress_text(name: str, p: Progress) -> str:
    """ "perfguard: 14 blocks  CI ±2.31% (target 1.00%)  1.2 s, 3.8 s left  test_x[fast-8]": the figures
    first, so they stay in place from case to case and a long case id is what a narrow terminal cuts."""
    width = p.widest()
    ci = "CI -" if not math.isfinite(width) else f"CI ±{width * 100:.2f}%"
    left = max(0.0, p.budget_s - p.elapsed_s)
    return (
        f"perfguard: {p.blocks} block{'' if p.blocks == 1 else 's'}  {ci} (target {p.target * 100:.2f}%)  "
        f"{p.elapsed_s:.1f} s, {left:.1f} s left  {name}"
    )


def done_text(r: CaseRecord) -> str:
    """One line per finished case: what a CI log shows instead of the live line."""
    name = f"{r.test}[{r.variant}] {shape_label(r)}".rstrip()
    if not r.timed:
        return f"perfguard: {name}: {r.verdict or r.outcome}"
    ci = "" if r.ci_ns is None else " " + plus_minus(r.median_ns, r.ci_ns)
    return (
        f"perfguard: {name}: {format_time(r.median_ns)}{ci}, {r.blocks} blocks in {r.elapsed_s or 0:.1f} s "
        f"({(r.stop_reason or '?').split('+')[0]}): {r.verdict}"  # the table says if it was re-measured
    )


class ProgressLine:
    """Draws progress on pytest's terminal reporter. `live`: redraw a line while a case measures (a TTY, in
    a single process); otherwise one line per measured case. `clock` is a constructor argument so tests of
    the rate limit do not sleep."""

    def __init__(
        self,
        reporter: Any,
        *,
        live: bool,
        distributed: bool = False,
        capture: Any = None,
        records: Callable[[], list[CaseRecord]] = list,
        rate: float = 10.0,
        clock: Clock = time.monotonic,
    ) -> None:
        self.reporter = reporter
        self.live = live
        self.distributed = distributed
        self.capture = capture  # pytest's capture manager: a test's output capture hides the terminal
        self.interval = 1.0 / rate
        self.clock = clock
        self._last = -math.inf
        self._drawn = False
        self._column = 0
        self._saved = ""
        self.records = records  # this process's records so far: a new one means a case ended
        self._seen = 0

    def _terminal(self) -> AbstractContextManager[None]:
        if self.capture is None:
            return nullcontext()
        return cast("AbstractContextManager[None]", self.capture.global_and_fixture_disabled())

    def callback(self, name: str) -> Callable[[Progress], None] | None:
        """What `measure` calls after each block of case `name`; None when there is no live line."""
        if not self.live:
            return None

        def update(p: Progress) -> None:
            now = self.clock()
            if now - self._last < self.interval:
                return
            self._last = now
            writer = getattr(self.reporter, "_tw", None)
            width = int(getattr(writer, "fullwidth", 80))
            with self._terminal():
                if not self._drawn:
                    # The line goes below pytest's current one ("tests/x.py ..", or a -v node id);
                    # `_clear` puts the cursor back at its end, so the result mark continues it.
                    self._saved = str(getattr(writer, "_current_line", ""))
                    self._column = int(getattr(writer, "width_of_current_line", 0))
                    if self._column:
                        self.reporter.write("\n")
                    self._drawn = True
                self.reporter.rewrite(progress_text(name, p)[: width - 1], erase=True)

        return update

    def _clear(self) -> None:
        with self._terminal():
            self.reporter.rewrite("", erase=True)
            self.reporter.write("\r" + (f"\x1b[A\x1b[{self._column}C" if self._column else ""), flush=True)
            writer = getattr(self.reporter, "_tw", None)
            if writer is not None and hasattr(writer, "_current_line"):
                # pytest's writer counts what it wrote on the line to place "[ 50%]"; the live line is gone.
                writer._current_line = self._saved
        self._drawn = False
        self._last = -math.inf

    def finished(self, records: list[CaseRecord]) -> None:
        """A case ended: clear the live line, or print one line per measured case."""
        if self._drawn:
            self._clear()
        if self.live:
            return
        for r in records:
            if r.timed:
                self._log_line(done_text(r))

    def _log_line(self, text: str) -> None:
        """A line of its own between pytest's result marks, with no blank line after it."""
        writer = getattr(self.reporter, "_tw", None)
        if self.reporter.currentfspath or getattr(writer, "width_of_current_line", 0):
            self.reporter.write("\n")
        if self.distributed:
            self.reporter.write(text + "\n", flush=True)  # xdist's result marks carry no path prefix
            return
        # pytest ends the line itself: the next item's path prefix, or the summary, starts with a newline.
        self.reporter.currentfspath = None
        self.reporter.write(text, flush=True)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """The live line goes before pytest writes the item's result mark."""
        if self._drawn:
            self._clear()

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        """In a single process: the records this item made; a log line goes after the item's result mark."""
        fresh = self.records()[self._seen :]
        self._seen += len(fresh)
        if fresh:
            self.finished(fresh)


PROGRESS = pytest.StashKey[ProgressLine]()


def setup(
    config: pytest.Config, records: Callable[[], list[CaseRecord]], *, worker: bool, distributed: bool
) -> ProgressLine | None:
    """The run's progress display, registered as a plugin, or None: off under -q and in xdist workers."""
    reporter = config.pluginmanager.getplugin("terminalreporter")
    if worker or reporter is None or config.get_verbosity() < 0:
        return None
    live = bool(getattr(reporter, "isatty", False)) and not distributed
    capture = config.pluginmanager.getplugin("capturemanager")
    line = ProgressLine(reporter, live=live, distributed=distributed, capture=capture, records=records)
    config.stash[PROGRESS] = line
    config.pluginmanager.register(line, "perfguard-progress")
    return line
