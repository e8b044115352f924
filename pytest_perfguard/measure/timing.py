"""The adaptive, interleaved measurement engine (its timers are in timers.py).

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

from ..judge.stats import Interval, log_interval, relative_half_width
from .timers import MIN_COPIES, Call, PreparedSample, SampleTime, Timer, Watch

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
        """Where the measurement stands after block `n`. The display computes the widest interval only when
        it draws, on the first `n` blocks (blocks are only appended): nothing is copied for a block it skips."""
        return Progress(n, spent_ns / 1e9, cfg.budget_s, cfg.target, partial(_widest_of, self, n, cfg))

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


def _widest_of(tally: _Tally, n: int, cfg: MeasureConfig) -> float:
    """`_widest` on a measurement's first `n` blocks."""
    return _widest({side: v[:n] for side, v in tally.blocks.items()}, tally.groups[:n], cfg)


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
