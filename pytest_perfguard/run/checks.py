"""The integrity steps around one case's timing: what the guard checks before it times (a patched timer, a
declared kernel that is not the one run, constant inputs) and after (the timed outputs are the checked
ones, the events saw the work, the speed is physically possible, a constant input is no shortcut).

Each check's wall time is counted apart from the case's time (`CaseRecord.checks`). The checks live in
measure/integrity.py; this module runs them in the case's order, under the device lock they need, and keeps
what they found (flags returned; notes, seconds and percentages of peak held) for the runner to record.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch

from ..marker import Variant
from ..measure import copies, integrity, peaks
from ..measure.correctness import CorrectnessReport, Inputs
from ..measure.cpuwatch import RUN_WAIT_FLOOR_NS, CpuWatch
from ..measure.device import Disturbances
from ..measure.timers import Timer, Watch
from ..measure.timing import Measurement
from ..record import CaseRecord
from ..settings import Settings
from .workload import Trial, draw_seeds, finite, input_bytes


def capture_error(m: Measurement) -> str | None:
    """Why a timed sample could not be captured in a CUDA graph (the first member's that could not), or None."""
    samples: list[object] = [*m.members, m.sample]
    return next((e for x in samples if (e := getattr(x, "capture_error", None))), None)


def machine_watch(settings: Settings, kind: str, trial: Trial, *, floor_ns: float = RUN_WAIT_FLOOR_NS) -> Watch | None:
    """What watches the machine while the case is timed or checked: NVML on a GPU; on CPU the host's load,
    unless the case times on an injected clock (the host's load cannot move it) or the watch is turned off.
    `floor_ns`: the least run-queue wait that counts on CPU (cpuwatch.CpuWatch.floor_ns)."""
    if kind == "cuda":
        return Disturbances.open(settings.device)
    if trial.case.clock is not None or not settings.cpu_watch:
        return None
    return CpuWatch(floor_ns=floor_ns)


class DeviceLock(Protocol):
    """The runner's lock on the case's device (shared for checks, exclusive for anything timed)."""

    def __call__(self, *, exclusive: bool) -> AbstractContextManager[None]: ...


class IntegrityChecks:
    """The checks of one case, and the seconds each took."""

    def __init__(
        self, settings: Settings, kind: str, lock: DeviceLock, bindings: Callable[[], dict[str, tuple[Any, Any]]]
    ) -> None:
        self.settings = settings
        self.kind = kind  # "cuda" or "cpu"
        self.lock = lock
        # The engine functions as the timing step holds them, (now, at import): read at each check, so that a
        # patch made during the case (by its kernel, in its timed calls) is seen after timing.
        self.bindings = bindings
        self.spent: dict[str, float] = {}  # seconds per check, outside the timed window
        self.notes: list[str] = []  # what the checks saw that passed, for the record's notes
        self.timed_notes: list[str] = []  # what the checks on the timed figures said (physics, constant input)
        self.pct_peak: tuple[float | None, float | None] = (None, None)  # % of peak compute, bandwidth
        # What disturbed a check that could not decide (the memo check's rounds): the case is inconclusive.
        self.disturbances: list[str] = []

    @contextlib.contextmanager
    def _check(self, name: str) -> Iterator[None]:
        """Adds the wall time of the block to `spent[name]`. On CUDA the block ends with a synchronise, so
        the device work a check queued is its own cost, not the next step's. Enter it inside the device
        lock: waiting for the lock is not a check's cost."""
        t0 = time.monotonic()
        try:
            yield
        finally:
            if self.kind == "cuda":
                torch.cuda.synchronize(torch.device(self.settings.device))
            self.spent[name] = self.spent.get(name, 0.0) + time.monotonic() - t0

    def probe(self, variant: Variant) -> integrity.ProfiledCall | None:
        """The profiler wrapped around the correctness gate's last call, for a variant that declares
        `not_kernels`."""
        if not variant.not_kernels:
            return None
        return integrity.ProfiledCall(torch.device(self.settings.device) if self.kind == "cuda" else None)

    def seconds(self) -> dict[str, float]:
        """Seconds per check, rounded as the record keeps them."""
        return {name: round(s, 4) for name, s in sorted(self.spent.items())}

    def _patched(self) -> str | None:
        with self._check("patched timer"):
            patched = integrity.patched_timers(self.bindings())
        return integrity.patched_message(patched) if patched else None

    def before_timing(
        self, trial: Trial, report: CorrectnessReport, probe: integrity.ProfiledCall | None
    ) -> str | None:
        """Checks that need no timing: a patched timer, a declared kernel that is not, constant inputs."""
        patched = self._patched()
        if patched:
            return patched
        if probe is not None and probe.names is not None:
            # The profiled call is the gate's last; the check's cost is what the profiler added to it: that
            # call's time minus the gate's previous, unprofiled call (at least the profiler's own start, stop
            # and parse). With one seed there is no previous call, and the whole call counts.
            profiled = report.per_seed[-1].call_s
            plain = report.per_seed[-2].call_s if len(report.per_seed) > 1 else 0.0
            self.spent["silent fallback"] = max(probe.own_s, profiled - plain)
            fallback = integrity.forbidden_kernel(probe.names, trial.variant.not_kernels)
            if fallback:
                return fallback
        with self.lock(exclusive=False), self._check("degenerate input"):
            trial.constants = integrity.constant_inputs(trial.first)
        return None

    def after_timing(self, trial: Trial, figures: CaseRecord, m: Measurement, timer: Timer) -> str | None:
        """What was timed is what was checked; the events saw the work; the speed is physically possible;
        a constant input is not a shortcut. `figures`: the record with the timing's figures, read only."""
        patched = self._patched()
        if patched:
            return patched
        wrong = self._timed_outputs(trial, m)
        if wrong:
            return wrong
        forked = integrity.forked_work(capture_error(m))
        if forked:
            return forked
        if m.mode.startswith("cuda"):
            with self.lock(exclusive=True), self._check("unseen work"):
                overhead = timer.overhead_ns()
            hidden = integrity.unseen_work(m.gap_ns, m.sample_ns, overhead, m.reps)
            if hidden:
                return hidden
        with self._check("physics"):
            impossible = self._physics(figures, trial, m)
        if impossible or not trial.constants:
            return impossible
        return self._degenerate(trial, m, timer)

    def _timed_outputs(self, trial: Trial, m: Measurement) -> str | None:
        """What was timed is what was checked: the last timed output on copy 0, then every timed copy on new
        values, then the time on new values against seen ones (a memo)."""
        s, case = self.settings, trial.case
        overrides = [case.tolerance, trial.variant.tolerance]
        with self.lock(exclusive=True), self._check("timed outputs"):
            wrong = copies.timed_outputs(
                m.outputs, trial.first, case.reference, overrides, seed=trial.seeds[0], oracles=trial.oracles
            )
        if wrong or trial.timed is None or not m.members:
            return wrong
        drawn = itertools.count()
        start = s.seed + 7919 if s.seed is not None else None

        def fresh(i: int) -> tuple[int, Inputs]:
            # A seed no other step uses, a new one on every call: a round that wrote back a value the variant
            # saw in the round before would let a memo of one entry pass.
            seed = draw_seeds(1, start + next(drawn) if start is not None else None)[0]
            return seed, trial.make_inputs(seed)

        rotation = copies.TimedCopies(m.members, m.reps, trial.timed.inputs, m.outputs, fresh)
        # On a GPU the memo check's first look rides on the copies' check (one more replay a sample); a host
        # timer needs its own rounds, whose host work is the same for both kinds of values.
        pairs: list[float] | None = [] if self.kind == "cuda" else None
        with self.lock(exclusive=True), self._check("every timed copy"):
            wrong = copies.every_copy(rotation, case.reference, overrides, pairs=pairs)
        if wrong:
            return wrong

        # Its confirming rounds are watched, any run-queue wait over the share counting: a memo flag fails the
        # case and must not rest on rounds another process slowed.
        def watch() -> Watch | None:  # made only where the confirming rounds run: most cases never need it
            return machine_watch(self.settings, self.kind, trial, floor_ns=0.0)

        with self.lock(exclusive=True), self._check("seen values"):
            seen = copies.seen_values(rotation, host=self.kind != "cuda", first=pairs or (), watch=watch)
        self.notes.append(seen.note)
        if seen.disturbed:
            self.disturbances.append(seen.disturbed)
        return seen.flag

    def _degenerate(self, trial: Trial, m: Measurement, timer: Timer) -> str | None:
        """A constant input timed against a varied one: a kernel that skips work on it is flagged."""
        s, case = self.settings, trial.case
        seed = draw_seeds(1, s.seed + 104_729 if s.seed is not None else None)[0]
        assert m.sample is not None  # measure() always returns the variant's sample
        with self.lock(exclusive=True), self._check("degenerate input"):
            seen = integrity.degenerate_inputs(
                trial.variant.fn,
                trial.first,
                trial.constants,
                timer,
                m.sample,
                reps=m.reps,
                degenerate_ns=m.time.estimate,
                spent_ns=m.elapsed_s * 1e9,
                reference=case.reference,
                overrides=[case.tolerance, trial.variant.tolerance],
                seed=seed,
            )
        if seen.note:
            self.timed_notes.append(seen.note)
        return seen.flag

    def _physics(self, figures: CaseRecord, trial: Trial, m: Measurement) -> str | None:
        """% of peak for the record, and the flag when a throughput exceeds the device's peak."""
        if self.kind != "cuda":
            self.timed_notes.append("physics check: not on CPU (no peak table for a host)")
            return None
        device = torch.device(self.settings.device)
        name, peak = peaks.device_peak(device.index if device.index is not None else torch.cuda.current_device())
        if peak is None:
            self.timed_notes.append(f"physics check skipped: no peak known for {name}")
            return None
        dtype = figures.correctness.dtype if figures.correctness is not None else ""
        compute, bandwidth = (
            finite(None if x is None else round(x, 2))
            for x in peaks.percent_of_peak(peak, tflops=figures.tflops, gbps=figures.gbps, dtype=dtype)
        )
        self.pct_peak = (compute, bandwidth)
        # Derived bytes count the output, which may still sit in L2 when the events stop: the bound uses the
        # inputs alone, read cold (the L2 is flushed before every sample). Given bytes are taken as given.
        given = trial.case.bytes is not None
        bound_bytes = figures.bytes if given else float(input_bytes(trial.first))
        bound_gbps = bound_bytes / m.time.estimate if bound_bytes and m.time.estimate > 0 else None
        return peaks.impossible_speed(peak, tflops=figures.tflops, gbps=bound_gbps)
