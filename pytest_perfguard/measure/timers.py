"""Timers: what turns a list of calls (one per input copy) into a repeatable, timed sample.

On CUDA a sample is one replay of a CUDA graph holding the `reps` calls, timed with events, after the L2
cache was flushed outside the timed window: the queue stays full, so a 9 us kernel reads 9 us rather
than the host's launch latency, and a short spin holds the stream while the replay is launched, so the
events do not add that latency either. A wall-clock reading of each replay, closed by a device-wide
synchronise, is a cross-check for work the events did not see (another stream, host work): its excess
over the events' time is each sample's `gap_ns`, judged by integrity.unseen_work. A variant whose calls
cannot be captured is timed by stream launches. On CPU a sample reads an injectable clock,
`time.perf_counter_ns` by default, which makes the engine (timing.py) testable deterministically.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

Call = Callable[[], object]
Clock = Callable[[], int]


@dataclass(frozen=True)
class SampleTime:
    """Time per call for one sample, as the device saw it and as the host's wall clock saw it."""

    device_ns: float
    wall_ns: float
    gap_ns: float = 0.0  # the whole sample's wall time minus the device time the events cover (not per call)


class PreparedSample(Protocol):
    reps: int
    mode: str

    def __call__(self) -> SampleTime: ...


class Timer(Protocol):
    """Turns a list of calls (one per input copy) into a repeatable, timed sample."""

    kind: str

    def prepare(self, calls: Sequence[Call]) -> PreparedSample: ...

    def now_ns(self) -> int: ...

    def single_call_ns(self, call: Call) -> float: ...

    def overhead_ns(self) -> float:
        """The wall-minus-events gap of a sample doing no work: the floor of the unseen-work check, which
        asks for it (and counts its cost) after the measurement."""
        ...

    def call_bytes(self, call: Call) -> int:
        """The memory one call holds at its peak beyond what was allocated before it (its output and its
        workspace): each captured sample keeps that much in its graph's pool."""
        ...


class Watch(Protocol):
    """Watches the machine over a measurement's timed blocks for what makes their times wrong without the
    code changing: another process's load, stolen or throttled clocks (cpuwatch.CpuWatch, device.Disturbances).
    What it reports is a disturbance: the caller re-measures, and never fails or stores a disturbed case."""

    def start(self) -> None:
        """The timed blocks begin (after warm-up and the choice of reps)."""
        ...

    def block(self) -> str | None:
        """After each block: a disturbance seen now, or None."""
        ...

    def stop(self) -> list[str]:
        """The blocks are over: the disturbances judged over the whole timed window."""
        ...


# ----------------------------------------------------------------------------------------------- CPU


class _CpuSample:
    mode = "cpu"

    def __init__(self, calls: Sequence[Call], clock: Clock) -> None:
        self._calls = list(calls)
        self._clock = clock
        self.reps = len(self._calls)

    def __call__(self) -> SampleTime:
        clock = self._clock
        t0 = clock()
        for call in self._calls:
            call()
        elapsed = float(clock() - t0) / self.reps
        return SampleTime(elapsed, elapsed, 0.0)


class CpuTimer:
    """Host timer. `clock` is public so tests can drive the engine with a deterministic fake clock."""

    kind = "cpu"

    def __init__(self, clock: Clock = time.perf_counter_ns) -> None:
        self.clock = clock

    def prepare(self, calls: Sequence[Call]) -> PreparedSample:
        return _CpuSample(calls, self.clock)

    def now_ns(self) -> int:
        return self.clock()

    def single_call_ns(self, call: Call) -> float:
        t0 = self.clock()
        call()
        return float(self.clock() - t0)

    def overhead_ns(self) -> float:
        return 0.0  # one clock sees everything on the host

    def call_bytes(self, call: Call) -> int:
        return 0  # host samples are not captured: nothing stays allocated per sample


# ---------------------------------------------------------------------------------------------- CUDA


class _CudaGraphSample:
    mode = "cuda-graph"

    def __init__(self, timer: CudaTimer, calls: Sequence[Call], *, flush: bool = True) -> None:
        import torch

        self._timer = timer
        self._flush = flush
        self.reps = max(1, len(calls))
        dev = self._device = timer.device
        # torch.cuda.graph takes its capture stream and memory pool from the current device, and a call
        # may launch on the current device (Triton): the timer's device is current for all of it.
        with torch.cuda.device(dev):
            side = torch.cuda.Stream(dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):  # warm-up on a side stream, as graph capture requires
                for call in calls:
                    call()
            torch.cuda.current_stream(dev).wait_stream(side)
            torch.cuda.synchronize(dev)
            self._graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self._graph):
                for call in calls:
                    call()
            torch.cuda.synchronize(dev)
        self._pre = torch.cuda.Event(enable_timing=True)
        self._start = torch.cuda.Event(enable_timing=True)
        self._end = torch.cuda.Event(enable_timing=True)

    def __call__(self) -> SampleTime:
        """One replay between events, with the queue held so the events see the device's work alone.

        On an idle device the start event fires as soon as it is recorded, and the graph's work starts only
        when the host has launched the replay: the events would add that launch latency (several us, more
        on a busy or just-started host, and different in every process) to the sample, i.e. latency / reps
        to every call. A short spin kernel (nvbench's blocking kernel) holds the stream while the host
        records the start event and launches the replay; the hold grows if a launch outlasts it.
        """
        import torch

        dev = self._device
        timer = self._timer
        if self._flush:
            timer.flush_l2()
        torch.cuda.synchronize(dev)  # the flush stays out of the wall-clock reading
        # The replay launches on its capture device's current stream: the events are recorded there too.
        stream = torch.cuda.current_stream(dev)
        with torch.cuda.device(dev):  # the spin launches on the current device's current stream
            t0 = time.perf_counter_ns()
            self._pre.record(stream)
            torch.cuda._sleep(timer.hold_cycles)
            self._start.record(stream)
            t1 = time.perf_counter_ns()
            self._graph.replay()
            launch = float(time.perf_counter_ns() - t1)
            self._end.record(stream)
            torch.cuda.synchronize(dev)  # device-wide: work on any stream ends before the wall clock stops
            wall = float(time.perf_counter_ns() - t0)
        device = self._start.elapsed_time(self._end) * 1e6
        covered = self._pre.elapsed_time(self._end) * 1e6  # the hold is device time the wall clock sees
        timer.held(covered - device, launch)
        return SampleTime(device / self.reps, wall / self.reps, wall - covered)


class _CudaStreamSample:
    """Fallback for variants that cannot be captured: a spin kernel lets the host enqueue ahead."""

    mode = "cuda-stream"

    def __init__(self, timer: CudaTimer, calls: Sequence[Call], capture_error: str | None = None) -> None:
        import torch

        self.capture_error = capture_error  # why the calls could not be captured in a CUDA graph
        self._timer = timer
        self._calls = list(calls)
        self.reps = len(self._calls)
        self._pre = torch.cuda.Event(enable_timing=True)
        self._start = torch.cuda.Event(enable_timing=True)
        self._end = torch.cuda.Event(enable_timing=True)

    def __call__(self) -> SampleTime:
        import torch

        dev = self._timer.device
        self._timer.flush_l2()
        with torch.cuda.device(dev):  # the spin kernel and the calls launch on the current device
            torch.cuda.synchronize(dev)
            t0 = time.perf_counter_ns()
            self._pre.record()  # the spin is device time the wall clock sees: the gap counts from here
            torch.cuda._sleep(self._timer.spin_cycles)
            self._start.record()
            for call in self._calls:
                call()
            self._end.record()
            torch.cuda.synchronize(dev)
            wall = float(time.perf_counter_ns() - t0)
        device = self._start.elapsed_time(self._end) * 1e6
        covered = self._pre.elapsed_time(self._end) * 1e6
        return SampleTime(device / self.reps, wall / self.reps, wall - covered)


# The spin that holds the stream while a graph replay is launched: 40k cycles, about 20 us at 2 GHz; a
# replay whose launch takes more than 1 / HOLD_MARGIN of the hold doubles it (CudaTimer.held).
HOLD_CYCLES = 40_000
HOLD_MARGIN = 1.5
# The fewest input copies a CUDA measurement spreads each side over (_Size.placements).
MIN_COPIES = 8

_OVERHEAD_NS: dict[str, float] = {}  # CudaTimer.overhead_ns, per device, for this process


class CudaTimer:
    """CUDA-event timer over graph replays, with the L2 flushed before every sample."""

    kind = "cuda"

    def __init__(self, device: Any = None, *, cold_l2: bool = True, use_graph: bool = True) -> None:
        import torch

        self.device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        props = torch.cuda.get_device_properties(self.device)
        l2 = int(getattr(props, "L2_cache_size", 0) or 0)
        self.l2_bytes = l2
        self.use_graph = use_graph
        self.cold_l2 = cold_l2
        # Twice the L2 (at least 32 MiB), zeroed before each sample so no run inherits a warm cache.
        flush_bytes = max(2 * l2, 32 << 20)
        self._flush = torch.empty(flush_bytes // 4, dtype=torch.int32, device=self.device) if cold_l2 else None
        self.spin_cycles = 2_000_000
        self.hold_cycles = HOLD_CYCLES
        self.capture_errors: list[str] = []

    def held(self, hold_ns: float, launch_ns: float) -> None:
        """A graph sample's hold took `hold_ns` on the device while the host spent `launch_ns` launching the
        replay. A hold shorter than HOLD_MARGIN x the launch may have let the device wait for the graph: the
        hold doubles for the next samples (up to the fallback's spin)."""
        if hold_ns < HOLD_MARGIN * launch_ns:
            self.hold_cycles = min(2 * self.hold_cycles, self.spin_cycles)

    def flush_l2(self) -> None:
        if self._flush is not None:
            self._flush.zero_()

    def prepare(self, calls: Sequence[Call]) -> PreparedSample:
        error = None
        if self.use_graph:
            import torch

            current = torch.cuda.current_stream(self.device)
            try:
                return _CudaGraphSample(self, calls)
            except Exception as exc:  # capture is best effort: host syncs or CPU work inside a call break it
                # A capture that raised leaves its capture stream current (found on an H100, 2026-11-28, by the
                # guard of torch's global state): the fallback, and every later case, would launch there.
                torch.cuda.set_stream(current)
                torch.cuda.synchronize(self.device)
                error = f"{type(exc).__name__}: {exc}"
                self.capture_errors.append(error)
                self._end_aborted_capture()
        return _CudaStreamSample(self, calls, error)

    def _end_aborted_capture(self) -> None:
        """A capture that raised never ran its epilogue, so the default CUDA generator still counts itself as
        capturing, and the next random draw on the device anywhere in the process (a later case's inputs)
        fails with "Offset increment outside graph capture". One small capture that ends normally closes it."""
        import torch

        one = torch.zeros(1, device=self.device)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.device(self.device), torch.cuda.graph(graph):  # the aborted capture's device
                one.add_(1)  # a real kernel: an empty capture only warns
        except Exception as exc:  # the fallback still times the case; say why later draws may fail
            self.capture_errors.append(f"could not close the aborted capture: {type(exc).__name__}: {exc}")
        torch.cuda.synchronize(self.device)

    def now_ns(self) -> int:
        return time.perf_counter_ns()

    def overhead_ns(self) -> float:
        """The 90th percentile of an empty graph's replay gap (events, replay, device-wide sync), measured once
        per process and device: a timer is made per case, and measuring it per case cost each case 4 ms
        (median; up to 55 ms) of its integrity checks on H100s (benchmarks/results/integrity_2026-11-23)."""
        key = str(self.device)
        if key not in _OVERHEAD_NS:
            import torch

            one = torch.zeros(1, device=self.device)  # a one-element kernel: an empty graph cannot be replayed
            empty = _CudaGraphSample(self, [lambda: one.add_(0)], flush=False)
            gaps = sorted(empty().gap_ns for _ in range(50))
            _OVERHEAD_NS[key] = gaps[int(0.9 * len(gaps))]
        return _OVERHEAD_NS[key]

    def single_call_ns(self, call: Call) -> float:
        import torch

        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        with torch.cuda.device(self.device):  # the events and the call's launches on the timer's device
            torch.cuda.synchronize(self.device)
            start.record()
            call()
            end.record()
            end.synchronize()
        return float(start.elapsed_time(end) * 1e6)

    def call_bytes(self, call: Call) -> int:
        import torch

        with torch.cuda.device(self.device):
            torch.cuda.synchronize(self.device)
            before = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            call()
            torch.cuda.synchronize(self.device)
            return max(0, torch.cuda.max_memory_allocated(self.device) - before)


def make_timer(device: str, clock: Clock | None = None) -> Timer:
    """The timer for a device string ("cpu", "cuda", "cuda:1"); a clock only applies to the CPU timer."""
    if device.startswith("cuda"):
        if clock is not None:
            raise ValueError("an injected clock only drives the CPU timer; CUDA timing uses events")
        return CudaTimer(device)
    return CpuTimer(clock if clock is not None else time.perf_counter_ns)
