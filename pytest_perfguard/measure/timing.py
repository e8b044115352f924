"""Timers and the adaptive, interleaved measurement engine.

A *call* is one invocation of a kernel variant; a *sample* times `reps` calls (each on its own copy of
the inputs) and yields a time per call; a *block* holds a few samples of the variant and of the
reference (`against`) in random order and keeps one median per side. Blocks are the unit of statistics:
samples inside one block are correlated, blocks much less so.

On CUDA a sample is one replay of a CUDA graph holding the `reps` calls, timed with events, after the L2
cache was flushed outside the timed window: the queue stays full, so a 9 us kernel reads 9 us rather
than the host's launch latency, and a short spin holds the stream while the replay is launched, so the
events do not add that latency either. A wall-clock reading of each replay, closed by a device-wide
synchronise, is a cross-check for work the events did not see (another stream, host work): its excess
over the events' time is each sample's `gap_ns`, judged by integrity.unseen_work. On CPU the same engine uses an
injectable clock,
`time.perf_counter_ns` by default, which makes the statistics testable deterministically.
"""

from __future__ import annotations

import math
import random
import re
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from ..judge.stats import Interval, log_interval, relative_half_width

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


# -------------------------------------------------------------------------------------------- engine


@dataclass(frozen=True)
class MeasureConfig:
    """Knobs of one measurement. Defaults follow nvbench's spirit: a minimum of blocks and time, stop on CI width."""

    target: float = 0.01  # stop once both relative CI half-widths are under this
    budget_s: float = 5.0  # time budget for this measurement (the case's budget)
    min_blocks: int = 12
    min_time_s: float = 0.0  # keep measuring at least this long (GPU: span clock and thermal states)
    max_blocks: int = 400
    samples_per_block: int = 5
    min_sample_ns: float = 200_000.0  # a sample should take at least this long
    max_reps: int = 64
    warmup_calls: int = 3
    confidence: float = 0.95
    max_copy_bytes: int = 1 << 30  # memory cap for the input copies a sample rotates through
    # On CUDA, each side's samples spread over MIN_COPIES input copies (_Size.placements). Off only in an
    # A/B run, whose verdict is the head/base ratio: head and base share their copies, so placement moves both.
    spread_copies: bool = True
    # With a base side (A/B): every `recapture_every` blocks all sides are prepared anew (new graphs on new
    # allocations), in a random order. Placement moves a small kernel's time by more than its in-capture
    # noise, so the head/base ratio is judged on these groups, and its interval includes placement.
    recapture_every: int = 2
    min_groups: int = 16
    # With a base side, whether the variant/against interval must narrow too. Recaptures move the two by
    # different amounts, so that interval narrows slowly (1-4% after 400 blocks for cuda_scalar on H100s),
    # and under the A/B gate it decides nothing unless a max_ratio gate is set: then the runner leaves it on.
    stop_on_ratio: bool = True
    # With a base side, how far the head/base interval is from done, given the capture-group ratios and the
    # case's time per call in ns (at most 1: done). The A/B gate sets it from its MDE, whose margin depends on
    # the case's size. None: its relative half-width must reach `target`, as the other intervals must.
    ab_progress: Callable[[Sequence[float], float], float] | None = None


@dataclass
class Measurement:
    """What one measurement saw: block medians, their intervals, and why it stopped."""

    variant_blocks: list[float]
    against_blocks: list[float] | None
    time: Interval  # ns per call (ratio scale)
    ratio: Interval | None  # variant / against, paired per block
    log_time: Interval
    log_ratio: Interval | None
    stop_reason: str
    reps: int
    samples_per_block: int
    mode: str
    elapsed_s: float
    wall_ratio: float  # median wall / device time per call (1.0 on CPU)
    notes: list[str] = field(default_factory=list)  # disturbances seen while timing (watch, on_block)
    base_blocks: list[float] | None = None  # the base revision's twin, timed in the same blocks
    groups: list[int] | None = None  # the capture group of each block (A/B)
    gap_ns: float = 0.0  # median over the variant's samples of wall minus event time (whole sample)
    sample_ns: float = 0.0  # median device time of one variant sample (all reps calls)
    # What was timed, for the integrity checks: the variant's prepared sample, and the output of the last
    # call on each input copy. Under a CUDA graph these are the graph's own output tensors, which every
    # replay overwrites, so after a replay they hold what the timed calls computed.
    sample: PreparedSample | None = None
    outputs: dict[int, object] = field(default_factory=dict)
    # Every sample the variant's blocks took in turn: member j timed input copies j*reps .. (j+1)*reps-1.
    members: list[PreparedSample] = field(default_factory=list)

    @property
    def blocks(self) -> int:
        return len(self.variant_blocks)

    def ab_ratios(self) -> list[float]:
        """Head/base per capture group: the geometric mean of the group's block ratios."""
        if self.base_blocks is None or self.groups is None:
            return []
        return group_ratios(self.variant_blocks, self.base_blocks, self.groups)


@dataclass(frozen=True)
class Progress:
    """Where a measurement stands after a block, for a live progress display."""

    blocks: int
    elapsed_s: float
    budget_s: float
    target: float
    # The widest relative CI half-width the stop rule waits on, computed on demand: a display that draws
    # ten times a second skips most blocks, and the interval of 400 blocks is not free.
    widest: Callable[[], float]


def group_ratios(head: Sequence[float], base: Sequence[float], groups: Sequence[int]) -> list[float]:
    sums: dict[int, list[float]] = {}
    for h, b, g in zip(head, base, groups, strict=True):
        sums.setdefault(g, []).append(math.log(h / b))
    return [math.exp(sum(v) / len(v)) for _, v in sorted(sums.items())]


def choose_reps(single_ns: float, cfg: MeasureConfig, bytes_per_copy: int) -> int:
    """How many calls (input copies) one sample holds: enough to fill min_sample_ns, within memory."""
    want = math.ceil(cfg.min_sample_ns / max(single_ns, 1.0))
    mem_cap = max(1, cfg.max_copy_bytes // max(bytes_per_copy, 1))
    return int(max(1, min(want, cfg.max_reps, mem_cap)))


def refine_reps(
    makers: dict[str, Callable[[int], Call]],
    timer: Timer,
    cfg: MeasureConfig,
    reps: int,
    single_ns: float,
    bytes_per_copy: int,
    rounds: int = 3,
) -> tuple[int, float]:
    """Re-choose `reps` from replays of a sample, not from one launch on an idle queue.

    One launch on an idle queue reads the host's launch latency, and on a freshly started machine or in a
    process's first cases that latency is several times the kernel's time: the engine then put 1-3 calls
    in a sample instead of the 25 it meant to, each sample measured a replay's fixed cost, and cases
    read 1.1-1.8x slow in that process alone (benchmarks/results/fresh_machine_2026-11-25). The time per
    call of a replayed sample is the kernel's own, so reps grows until a sample fills min_sample_ns.
    """
    for _ in range(rounds):
        per_call = 0.0
        for make in makers.values():
            sample = timer.prepare([make(i) for i in range(reps)])
            per_call = max(per_call, min(sample().device_ns for _ in range(3)))
            del sample  # its graph and memory pool go before the next side's capture
        if per_call <= 0:
            break
        single_ns = per_call
        wanted = choose_reps(per_call, cfg, bytes_per_copy)
        if wanted <= reps:
            break
        reps = wanted
    return reps, single_ns


def _intervals(v: list[float], a: list[float] | None, confidence: float) -> tuple[Interval, Interval | None]:
    log_t = log_interval(v, confidence)
    if a is None:
        return log_t, None
    log_r = log_interval([x / y for x, y in zip(v, a, strict=True)], confidence)
    return log_t, log_r


def measure(
    variant: Callable[[int], Call],
    against: Callable[[int], Call] | None,
    timer: Timer,
    cfg: MeasureConfig,
    *,
    copies: int | None = None,
    bytes_per_copy: int = 0,
    rng: random.Random | None = None,
    on_block: Callable[[], str | None] | None = None,
    base: Callable[[int], Call] | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    watch: Watch | None = None,
) -> Measurement:
    """Times `variant` (and `against`, and `base`, interleaved) until the CIs are narrow enough or the
    budget is spent.

    `variant(i)`, `against(i)` and `base(i)` return a zero-argument call that runs on input copy `i`; all
    sides use the same copies, so the per-block ratios compare like with like. `base` is the same variant
    at another revision (the A/B gate). `watch` and `on_block` (after each block) may report a disturbance
    (throttling, another process's load); it is kept in the measurement's notes, and the caller re-measures
    and never fails or stores a disturbed case. `on_progress` sees each block (the live progress line); it
    must not measure anything.
    """
    rng = rng or random.Random()
    t_start = timer.now_ns()
    sides = {"v": variant, "a": against, "b": base}
    makers, kept = _keeping_outputs({side: make for side, make in sides.items() if make is not None})
    size = _size(makers, timer, cfg, copies, bytes_per_copy, recapture=base is not None)
    samples = _prepared(makers, timer, rng, size)
    tally = _Tally({side: [] for side in makers})
    stop_reason = "max_blocks"
    if watch is not None:
        watch.start()
    while len(tally.blocks["v"]) < cfg.max_blocks:
        n = len(tally.blocks["v"])
        if size.every and n and n % size.every == 0:
            samples = _recaptured(samples, kept, makers, timer, rng, size)
        tally.block(samples, rng, size, n)
        if on_block is not None:
            tally.seen(on_block())
        if watch is not None:
            tally.seen(watch.block())
        n += 1
        spent = timer.now_ns() - t_start
        if on_progress is not None:
            on_progress(tally.progress(n, spent, cfg))
        stop = _stop_reason(tally, size, cfg, n, spent)
        if stop is not None:
            stop_reason = stop
            break
    if watch is not None:
        for problem in watch.stop():
            tally.seen(problem)
    return tally.measurement(
        cfg,
        size,
        stop_reason,
        (timer.now_ns() - t_start) / 1e9,
        samples["v"],
        timer.kind,
        kept["v"],
        base is not None,
    )


def _recaptured(
    samples: dict[str, PreparedSample],
    kept: dict[str, dict[int, object]],
    makers: dict[str, Callable[[int], Call]],
    timer: Timer,
    rng: random.Random,
    size: _Size,
) -> dict[str, PreparedSample]:
    """Every side captured afresh (the A/B gate's capture groups). The old graphs go first: two sets of
    captures of a large case need twice the memory. Their kept outputs go too: a graph's memory pool lives
    while any tensor from it does (the new captures keep new ones). With them kept, an H100 worker timing
    torch_hybrid S4096 under A/B held 52 GB in graph pools and ran out of memory
    (benchmarks/results/two_gpu_h100_2026-11-26)."""
    samples.clear()
    for outputs in kept.values():
        outputs.clear()
    return _prepared(makers, timer, rng, size)


def _keeping_outputs(
    makers: dict[str, Callable[[int], Call]],
) -> tuple[dict[str, Callable[[int], Call]], dict[str, dict[int, object]]]:
    """The sides' call makers, each call keeping the output of its last run on each copy (the integrity
    checks read the variant's). All sides alike: a side whose outputs were dropped would let the allocator (a
    CUDA graph's pool) give all its copies one output buffer, a smaller write footprint than the others',
    and read faster. Keeping only the head's outputs was the one asymmetry left when A/A runs read a
    head/base bias of +0.1-0.2%."""
    kept: dict[str, dict[int, object]] = {side: {} for side in makers}

    def recording(side: str, make: Callable[[int], Call]) -> Callable[[int], Call]:
        def maker(i: int) -> Call:
            call = make(i)

            def run() -> object:
                out = call()
                kept[side][i] = out
                return out

            return run

        return maker

    return {side: recording(side, make) for side, make in makers.items()}, kept


@dataclass(frozen=True)
class _Size:
    """How a measurement samples: calls per sample, samples per block, the blocks it needs at least, every
    how many blocks the A/B sides are captured afresh (0: never), and how many samples of each side, each on
    its own input copies, are taken in turn (`placements`)."""

    reps: int
    samples_per_block: int
    min_blocks: int
    every: int
    placements: int = 1


def _size(
    makers: dict[str, Callable[[int], Call]],
    timer: Timer,
    cfg: MeasureConfig,
    copies: int | None,
    bytes_per_copy: int,
    *,
    recapture: bool,
) -> _Size:
    """Warm-up outside the measurement (JIT, autotune, lazy module loading, allocator growth), then the
    sample size from the slowest side's single call."""
    firsts = {side: make(0) for side, make in makers.items()}
    for _ in range(cfg.warmup_calls):
        for call in firsts.values():
            call()
    single = max(min(timer.single_call_ns(call) for _ in range(3)) for call in firsts.values())
    # A copy costs its inputs and what a captured call keeps in its graph's pool (output and workspace).
    # Counting the inputs alone, torch_hybrid S4096 (GBs of fp32 scores per call) got five placements per
    # side, and an update's A/A processes, with three sides, left the case out on H100s: by all signs out of
    # memory (benchmarks/results/timing_fixes_h100_2026-11-26, hosts H and I).
    bytes_per_copy += max(timer.call_bytes(call) for call in firsts.values())
    reps = copies if copies is not None else choose_reps(single, cfg, bytes_per_copy)
    if copies is None and timer.kind == "cuda":
        # Always from replays: one launch on an idle queue can read 200 us or more for a 6-30 us kernel,
        # and then chose one call per sample. On a fresh H100 a third of the cases got one call in some
        # processes and not in others, and read 2-4 us slower per call there (benchmarks/results/
        # timing_fixes_h100_2026-11-26). A long kernel's refinement is one capture of its few calls.
        reps, single = refine_reps(makers, timer, cfg, reps, single, bytes_per_copy)
    every = cfg.recapture_every if recapture else 0
    min_blocks = max(cfg.min_blocks, cfg.min_groups * every) if every else cfg.min_blocks
    # Slow calls get fewer samples per block, so min_blocks blocks still fit the budget where possible.
    per_block_ns = single * reps * len(makers)
    budget_ns = cfg.budget_s * 1e9
    spb = int(max(1, min(cfg.samples_per_block, budget_ns // max(min_blocks * per_block_ns, 1.0))))
    placements = 1
    if timer.kind == "cuda" and cfg.spread_copies:
        # A kernel's time can depend on where its inputs lie: cuda_scalar at S2048 causal reads 1.10 or 1.20 ms
        # by the allocation alone, and with one call a sample every process timed one placement and read one
        # speed (benchmarks/results/timing_fixes_h100_2026-11-26). Each side spreads over MIN_COPIES copies.
        # Recaptures do not replace this: the allocator hands a recapture the blocks it just freed, and an
        # update's A/A processes, recapturing every two blocks, both read that case at 1.19 ms (host G there).
        placements = max(1, min(math.ceil(MIN_COPIES / reps), cfg.max_copy_bytes // max(reps * bytes_per_copy, 1)))
        # Every block takes every placement alike (a whole number of rotations), so that no block's median
        # depends on which placements it met. With 5 samples a block over 8 placements, the blocks of that
        # case read 1.09 or 1.21 ms by the run of slow placements they met, the share of slow blocks changed
        # with each measurement's allocations (1/8 to 1/2), and so did the Hodges-Lehmann estimate: +4.7%
        # against an update that met few slow ones, on an unchanged kernel (H200, 2026-11-28). Within the
        # budget: where whole rotations do not fit it, as many as do, else the samples it allows.
        up, down = placements * math.ceil(spb / placements), placements * (spb // placements)
        spb = up if up * min_blocks * per_block_ns <= budget_ns else (down or spb)
    return _Size(reps, spb, min_blocks, every, placements)


def _prepared(
    makers: dict[str, Callable[[int], Call]], timer: Timer, rng: random.Random, size: _Size
) -> dict[str, PreparedSample]:
    """Every side's sample, prepared (captured, on CUDA) in a random order and run once; with several
    placements, a rotation of samples on copies 0..reps-1, reps..2*reps-1, and so on."""
    order = list(makers)
    rng.shuffle(order)  # capture and allocation order: no side is always first
    reps = size.reps
    prepared: dict[str, PreparedSample] = {}
    for side in order:
        make = makers[side]
        members = [timer.prepare([make(j * reps + i) for i in range(reps)]) for j in range(size.placements)]
        prepared[side] = members[0] if len(members) == 1 else _Rotation(members)
    for side in order:
        for _ in range(size.placements):
            prepared[side]()  # one discarded sample each: first replays pay for lazy setup
    return prepared


class _Rotation:
    """Samples of one side on different input copies, taken in turn: each block sees several placements."""

    def __init__(self, members: list[PreparedSample]) -> None:
        self.members = members
        self.reps = members[0].reps
        self.mode = members[0].mode
        self._next = 0

    def __call__(self) -> SampleTime:
        member = self.members[self._next]
        self._next = (self._next + 1) % len(self.members)
        return member()


def first_member(sample: PreparedSample) -> PreparedSample:
    """The sample on input copies 0..reps-1: the one the integrity checks replay."""
    return sample.members[0] if isinstance(sample, _Rotation) else sample


@dataclass
class _Tally:
    """What a measurement's blocks have measured so far: each side's block medians, the capture group of
    each block, the variant's wall/device ratios, launch gaps and sample times, and the disturbances seen."""

    blocks: dict[str, list[float]]
    groups: list[int] = field(default_factory=list)
    wall_ratios: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    sample_times: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def seen(self, problem: str | None) -> None:
        if problem:
            self.notes[:] = distinct_notes(self.notes, [problem])

    def block(self, samples: dict[str, PreparedSample], rng: random.Random, size: _Size, n: int) -> None:
        """Block `n`: samples of every side, in a fresh random order each round; each side's median kept."""
        per_side: dict[str, list[float]] = {side: [] for side in self.blocks}
        for _ in range(size.samples_per_block):
            order = list(self.blocks)
            rng.shuffle(order)
            for side in order:
                s = samples[side]()
                per_side[side].append(s.device_ns)
                if side == "v" and s.device_ns > 0:
                    self.wall_ratios.append(s.wall_ns / s.device_ns)
                    self.gaps.append(s.gap_ns)
                    self.sample_times.append(s.device_ns * size.reps)
        for side in self.blocks:
            self.blocks[side].append(statistics.median(per_side[side]))
        self.groups.append(n // size.every if size.every else 0)

    def progress(self, n: int, spent_ns: float, cfg: MeasureConfig) -> Progress:
        """Where the measurement stands after block `n`. The display gets copies of the blocks, as the
        measurement goes on adding to them, and computes the widest interval only when it draws."""
        now = {side: list(v) for side, v in self.blocks.items()}
        widest = partial(_widest, now, list(self.groups), cfg)
        return Progress(n, spent_ns / 1e9, cfg.budget_s, cfg.target, widest)

    def measurement(
        self,
        cfg: MeasureConfig,
        size: _Size,
        stop_reason: str,
        elapsed_s: float,
        sample: PreparedSample,
        kind: str,
        outputs: dict[int, object],
        ab: bool,
    ) -> Measurement:
        members = list(sample.members) if isinstance(sample, _Rotation) else [sample]
        log_t, log_r = _intervals(self.blocks["v"], self.blocks.get("a"), cfg.confidence)
        return Measurement(
            variant_blocks=self.blocks["v"],
            against_blocks=self.blocks.get("a"),
            time=log_t.exp(),
            ratio=log_r.exp() if log_r is not None else None,
            log_time=log_t,
            log_ratio=log_r,
            stop_reason=stop_reason,
            reps=size.reps,
            samples_per_block=size.samples_per_block,
            # A rotation whose members did not all capture is timed partly in stream mode: it says so.
            mode=next((m.mode for m in members if m.mode != members[0].mode), getattr(sample, "mode", kind)),
            elapsed_s=elapsed_s,
            wall_ratio=statistics.median(self.wall_ratios) if self.wall_ratios else 1.0,
            notes=self.notes,
            base_blocks=self.blocks.get("b"),
            groups=self.groups if ab else None,
            gap_ns=statistics.median(self.gaps) if self.gaps else 0.0,
            sample_ns=statistics.median(self.sample_times) if self.sample_times else 0.0,
            sample=members[0],
            outputs=outputs,
            members=members,
        )


# The blocks a disturbed measurement still takes: enough for a median and a rough interval in the report.
# Timing on to the budget bought nothing: a fresh H100 update with a foreign matmul load on the GPU during its
# second process spent the full 5 s twice on every case, and the process ran past six minutes
# (benchmarks/results/timing_fixes_h100_2026-11-26, hosts H and I).
DISTURBED_BLOCKS = 3


def _stop_reason(tally: _Tally, size: _Size, cfg: MeasureConfig, n: int, spent_ns: float) -> str | None:
    """Why the measurement stops after `n` blocks and `spent_ns` of its time, or None to go on: "disturbed" once
    a block saw a disturbance (the caller re-measures or calls the case inconclusive, so more blocks are
    wasted time), "target" once every interval is narrow enough (after the minimum of blocks and time),
    "budget" once the budget is spent (after a few blocks at least)."""
    if tally.notes and n >= DISTURBED_BLOCKS:
        return "disturbed"
    if n >= size.min_blocks and spent_ns >= cfg.min_time_s * 1e9 and _narrow(tally.blocks, tally.groups, cfg):
        return "target"
    if spent_ns >= cfg.budget_s * 1e9 and n >= min(size.min_blocks, 6):
        return "budget"
    return None


def _narrow(blocks: dict[str, list[float]], groups: list[int], cfg: MeasureConfig) -> bool:
    """Every interval the verdict needs is under the target: time, ratio, and head/base."""
    return _widest(blocks, groups, cfg) <= cfg.target


def _widest(blocks: dict[str, list[float]], groups: list[int], cfg: MeasureConfig) -> float:
    """The widest relative half-width of the intervals the verdict needs (inf while one cannot be formed),
    on `cfg.target`'s scale: the head/base interval, when it has a rule of its own, counts as target * progress."""
    if len(blocks["v"]) < 2:
        return math.inf
    log_t, log_r = _intervals(blocks["v"], blocks.get("a"), cfg.confidence)
    widths = [relative_half_width(log_t)]
    if log_r is not None and (cfg.stop_on_ratio or "b" not in blocks):
        widths.append(relative_half_width(log_r))
    if "b" in blocks:
        ab = group_ratios(blocks["v"], blocks["b"], groups)
        if cfg.ab_progress is not None:
            widths.append(cfg.target * cfg.ab_progress(ab, statistics.median(blocks["v"])))
        else:
            widths.append(relative_half_width(log_interval(ab, cfg.confidence)) if len(ab) >= 2 else math.inf)
    return max(widths)


_SHARES = re.compile(r"\d+(?:\.\d+)?%")


def distinct_notes(kept: Sequence[str], more: Sequence[str]) -> list[str]:
    """`kept`, then each of `more` that says something new: a disturbance read again with other shares ("pid 844
    ... at 99% SM, 28% memory" and "... 29% memory") is the same one, said once."""
    out = list(kept)
    keys = {_SHARES.sub("", n) for n in out}
    for n in more:
        if _SHARES.sub("", n) not in keys:
            keys.add(_SHARES.sub("", n))
            out.append(n)
    return out


def pooled(first: Measurement, second: Measurement, confidence: float) -> Measurement:
    """Pools the blocks of a measurement and its fresh-order re-measurement into one."""
    v = first.variant_blocks + second.variant_blocks
    a = (
        first.against_blocks + second.against_blocks
        if first.against_blocks is not None and second.against_blocks is not None
        else None
    )
    b = groups = None
    if first.base_blocks is not None and second.base_blocks is not None:
        b = first.base_blocks + second.base_blocks
        offset = max(first.groups or [0]) + 1
        groups = (first.groups or []) + [g + offset for g in second.groups or []]
    log_t, log_r = _intervals(v, a, confidence)
    return Measurement(
        variant_blocks=v,
        against_blocks=a,
        time=log_t.exp(),
        ratio=log_r.exp() if log_r is not None else None,
        log_time=log_t,
        log_ratio=log_r,
        stop_reason=f"{first.stop_reason}+remeasured:{second.stop_reason}",
        reps=second.reps,
        samples_per_block=second.samples_per_block,
        mode=second.mode,
        elapsed_s=first.elapsed_s + second.elapsed_s,
        wall_ratio=max(first.wall_ratio, second.wall_ratio),
        notes=distinct_notes(first.notes, second.notes),
        base_blocks=b,
        groups=groups,
        gap_ns=max(first.gap_ns, second.gap_ns),
        sample_ns=second.sample_ns,
        sample=second.sample,
        outputs=second.outputs,
        members=second.members,
    )


# The eager call's timing: HOST_BLOCKS blocks per side, in a random order each, each block of as many calls as
# fill HOST_BLOCK_NS (at least HOST_MIN_CALLS, at most HOST_MAX_CALLS), the device synchronised before and
# after each block, so the block's wall time is what a user's loop of calls costs: the host's work, the
# launches and the device's; the block's size comes from one whole call of the slower side. 12 blocks: with 8
# every host gate was undecided at the run's family-wise confidence (H100, 2026-11-28); a pass now needs the
# gate's own 95% (verdict.host_gate), a failure still the family-wise one.
HOST_BLOCKS = 12
HOST_BLOCK_NS = 250_000.0
HOST_MIN_CALLS = 1
HOST_MAX_CALLS = 200
HOST_WARM_CALLS = 8


@dataclass(frozen=True)
class HostTime:
    """The eager call, host and device, per call: the variant's block times and `against`'s."""

    variant_blocks: list[float]
    against_blocks: list[float] | None
    calls_per_block: int

    @property
    def time(self) -> Interval:
        return log_interval(self.variant_blocks).exp()

    @property
    def ratio(self) -> Interval | None:
        if self.against_blocks is None:
            return None
        return log_interval([v / a for v, a in zip(self.variant_blocks, self.against_blocks, strict=True)]).exp()


def host_time(
    sides: Mapping[str, Sequence[Call]],
    sync: Callable[[], None],
    *,
    per_call_ns: float,
    clock: Clock = time.perf_counter_ns,
    rng: random.Random | None = None,
    blocks: int = HOST_BLOCKS,
) -> HostTime:
    """Times each side's calls as a user's loop makes them (`sides["v"]`, and `sides["a"]` if given: calls on
    the measurement's input copies, taken in turn), in interleaved blocks; `per_call_ns` (the device time per
    call) sizes the blocks. Graph replay measures the device alone; this measures what the host adds, so a
    wrapper that got slower (a `.item()`, a host-side shape check, an autotuner's launch path) is seen."""
    rng = rng or random.Random()
    times: dict[str, list[float]] = {side: [] for side in sides}
    single = per_call_ns
    # A few warm calls (caches, the allocator, lazy paths), then one timed: as many as fill a block on the device,
    # 2 to HOST_WARM_CALLS; eight of a 1-5 ms call were most of a large case's eager timing.
    warm = int(max(2, min(HOST_WARM_CALLS, math.ceil(HOST_BLOCK_NS / max(per_call_ns, 1.0)))))
    for calls in sides.values():
        for call in calls[:warm]:
            call()
        sync()
        t0 = clock()
        calls[0]()
        sync()
        single = max(single, float(clock() - t0))
    # The block's size from the slower side's whole call, host and device: sized on the device time alone, a
    # launch-bound call (a Triton kernel's 5 us on the device, 60-110 us on the host) made blocks of 200 calls and
    # the eager timing 30-40% of a small case's wall time (H200, 2026-11-28).
    n = int(max(HOST_MIN_CALLS, min(HOST_MAX_CALLS, math.ceil(HOST_BLOCK_NS / max(single, 1.0)))))
    for _ in range(blocks):
        order = list(sides)
        rng.shuffle(order)
        for side in order:
            calls = sides[side]
            sync()
            t0 = clock()
            for i in range(n):
                calls[i % len(calls)]()
            sync()
            times[side].append(float(clock() - t0) / n)
    return HostTime(times["v"], times.get("a"), n)


def make_timer(device: str, clock: Clock | None = None) -> Timer:
    """The timer for a device string ("cpu", "cuda", "cuda:1"); a clock only applies to the CPU timer."""
    if device.startswith("cuda"):
        if clock is not None:
            raise ValueError("an injected clock only drives the CPU timer; CUDA timing uses events")
        return CudaTimer(device)
    return CpuTimer(clock if clock is not None else time.perf_counter_ns)
