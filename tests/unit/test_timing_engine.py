"""The measurement engine on a fake clock: when it stops, how it pairs, and what the verdict makes of it.

Fake kernels advance a fake nanosecond clock, so every figure here is deterministic. The last tests drive
them with real per-launch times recorded on an H200 (tests/data), so the verdict sees real GPU noise.
"""

from __future__ import annotations

import gc
import json
import lzma
import math
import random
import weakref
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_perfguard.judge.baseline import BaselineEntry
from pytest_perfguard.judge.stats import relative_half_width
from pytest_perfguard.judge.verdict import INCONCLUSIVE, PASS, REGRESSED, Policy, Verdict, ab_gate, ab_progress, decide
from pytest_perfguard.measure.timers import MIN_COPIES, CpuTimer, SampleTime
from pytest_perfguard.measure.timing import MeasureConfig, Measurement, choose_reps, measure, pooled

DATA = Path(__file__).resolve().parents[1] / "data" / "h200_attention_timing_samples.json.xz"
GPU_POLICY = Policy(margin=0.02, alpha=0.05, family_size=1, noise_floor=0.003, ratio_noise_floor=0.002)


class FakeClock:
    """Integer nanoseconds that only fake kernels move."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def kernel(clock: FakeClock, duration: Callable[[], float]) -> Callable[[int], Callable[[], object]]:
    """A variant factory as `measure` wants it: every call advances the clock by `duration()` ns."""

    def call() -> None:
        clock.now += round(duration())

    return lambda _i: call


def jitter(ns: float, rel_sd: float, seed: int) -> Callable[[], float]:
    rng = np.random.default_rng(seed)
    return lambda: ns * math.exp(rel_sd * rng.standard_normal())


# ---------------------------------------------------------------------------------------------- stopping


def test_stops_on_target_but_not_before_min_blocks() -> None:
    clock = FakeClock()
    cfg = MeasureConfig(target=0.01, budget_s=5.0, min_blocks=12)
    m = measure(
        kernel(clock, lambda: 10_000.0), kernel(clock, lambda: 5_000.0), CpuTimer(clock), cfg, rng=random.Random(0)
    )
    assert m.stop_reason == "target"
    assert m.blocks == cfg.min_blocks  # a zero-width interval at block 1 still waits for min_blocks
    assert m.time.estimate == pytest.approx(10_000.0)
    assert m.ratio is not None and m.ratio.estimate == pytest.approx(2.0)


def test_min_time_keeps_measuring_past_a_narrow_interval() -> None:
    """On a GPU the blocks must span some time (clock states), however narrow the interval gets early."""
    clock = FakeClock()
    cfg = MeasureConfig(target=0.01, budget_s=5.0, min_blocks=12, min_time_s=0.05)
    m = measure(
        kernel(clock, lambda: 10_000.0), kernel(clock, lambda: 5_000.0), CpuTimer(clock), cfg, rng=random.Random(0)
    )
    assert m.stop_reason == "target"
    assert m.elapsed_s >= cfg.min_time_s
    assert m.blocks > cfg.min_blocks


def test_stops_on_target_with_noise_and_the_interval_is_narrow() -> None:
    clock = FakeClock()
    cfg = MeasureConfig(target=0.01, budget_s=5.0)
    m = measure(
        kernel(clock, jitter(20_000.0, 0.05, 1)),
        kernel(clock, jitter(20_000.0, 0.05, 2)),
        CpuTimer(clock),
        cfg,
        rng=random.Random(1),
    )
    assert m.stop_reason == "target"
    assert m.blocks >= cfg.min_blocks
    assert relative_half_width(m.log_time) <= cfg.target
    assert m.log_ratio is not None and relative_half_width(m.log_ratio) <= cfg.target
    assert m.time.lo <= 20_000.0 * 1.01 and m.time.hi >= 20_000.0 * 0.99
    assert m.elapsed_s < cfg.budget_s


def test_stops_on_budget_when_noise_is_too_high() -> None:
    clock = FakeClock()
    cfg = MeasureConfig(target=0.001, budget_s=0.05, min_blocks=12)
    m = measure(kernel(clock, jitter(50_000.0, 0.5, 3)), None, CpuTimer(clock), cfg, rng=random.Random(3))
    assert m.stop_reason == "budget"
    assert m.blocks >= 6  # never judged on fewer blocks, even when the budget is spent
    assert m.elapsed_s >= cfg.budget_s
    assert relative_half_width(m.log_time) > cfg.target
    assert m.ratio is None and m.against_blocks is None


def test_stops_at_max_blocks() -> None:
    clock = FakeClock()
    cfg = MeasureConfig(target=1e-6, budget_s=100.0, min_blocks=6, max_blocks=20)
    m = measure(kernel(clock, jitter(10_000.0, 0.2, 4)), None, CpuTimer(clock), cfg, rng=random.Random(4))
    assert (m.stop_reason, m.blocks) == ("max_blocks", 20)


def test_a_disturbed_measurement_stops_after_a_few_blocks() -> None:
    # The caller re-measures a disturbed measurement or calls it inconclusive: timing on to the budget is waste.
    class Busy:
        def __init__(self, from_block: int) -> None:
            self.n, self.from_block = 0, from_block

        def start(self) -> None:
            pass

        def block(self) -> str | None:
            self.n += 1
            return "other compute processes on GPU 0 during timing" if self.n >= self.from_block else None

        def stop(self) -> list[str]:
            return []

    clock = FakeClock()
    cfg = MeasureConfig(target=1e-6, budget_s=100.0, min_blocks=6, max_blocks=200)
    m = measure(
        kernel(clock, jitter(10_000.0, 0.2, 4)), None, CpuTimer(clock), cfg, rng=random.Random(4), watch=Busy(5)
    )
    assert (m.stop_reason, m.blocks) == ("disturbed", 5)
    assert m.notes == ["other compute processes on GPU 0 during timing"]
    m = measure(
        kernel(clock, jitter(10_000.0, 0.2, 4)), None, CpuTimer(clock), cfg, rng=random.Random(4), watch=Busy(1)
    )
    assert (m.stop_reason, m.blocks) == ("disturbed", 3)  # still a median and a rough interval for the report
    m = measure(
        kernel(clock, jitter(10_000.0, 0.2, 4)), None, CpuTimer(clock), cfg, rng=random.Random(4), watch=Busy(999)
    )
    assert (m.stop_reason, m.blocks, m.notes) == ("max_blocks", 200, [])


# ----------------------------------------------------------------------------------------------- pairing


def placed(clock: FakeClock, ns: float, spread: float, seed: int) -> Callable[[int], Callable[[], object]]:
    """A call whose time depends on where it was placed: every new capture (a call made for a new sample)
    draws a new factor, as recaptured CUDA graphs move a kernel by more than its in-capture noise."""
    rng = random.Random(seed)

    def make(_i: int) -> Callable[[], object]:
        ns_here = ns * math.exp(spread * rng.gauss(0.0, 1.0))

        def call() -> None:
            clock.now += round(ns_here)

        return call

    return make


@pytest.mark.parametrize("stop_on_ratio", [True, False])
def test_with_a_base_only_the_intervals_that_decide_must_narrow(stop_on_ratio: bool) -> None:
    """Head and base identical; the reference moves 5% with every recapture (one call per sample at 300
    us, so one placement per sample). Its ratio interval narrows slowly; under the A/B gate that ratio
    decides nothing (without max_ratio), so it need not narrow."""
    clock = FakeClock()
    cfg = MeasureConfig(target=0.01, budget_s=100.0, max_blocks=60, stop_on_ratio=stop_on_ratio)
    m = measure(
        kernel(clock, lambda: 300_000.0),
        placed(clock, 300_000.0, 0.05, 7),
        CpuTimer(clock),
        cfg,
        rng=random.Random(8),
        base=kernel(clock, lambda: 300_000.0),
    )
    assert m.log_ratio is not None and m.ratio is not None  # reported either way
    assert m.ab_ratios() and all(r == pytest.approx(1.0) for r in m.ab_ratios())
    if stop_on_ratio:
        assert (m.stop_reason, m.blocks) == ("max_blocks", 60)
        assert relative_half_width(m.log_ratio) > cfg.target
    else:
        assert (m.stop_reason, m.blocks) == ("target", cfg.min_groups * cfg.recapture_every)
    # Without a base the ratio always counts: the plain run's ratio gate decides.
    plain = measure(
        kernel(clock, lambda: 300_000.0), placed(clock, 300_000.0, 0.05, 7), CpuTimer(clock), cfg, rng=random.Random(8)
    )
    assert plain.stop_reason == "target" and relative_half_width(plain.log_ratio or plain.log_time) <= cfg.target


def test_an_ab_measurement_runs_until_the_gate_can_keep_its_detection_promise() -> None:
    """Head and base both move 1% with every recapture (placement): the head/base interval reaches the 1% CI
    target early, when the gate's MDE is still far above +2%. With the gate's own rule the engine measures on
    until a +2% slowdown would fail the case 95% of the time, and the verdict reports that MDE."""
    policy = Policy(family_size=98, confirm=True)

    def run(cfg: MeasureConfig) -> Measurement:
        clock = FakeClock()
        return measure(
            placed(clock, 30_000.0, 0.01, 3),
            None,
            CpuTimer(clock),
            cfg,
            rng=random.Random(4),
            base=placed(clock, 30_000.0, 0.01, 5),
        )

    plain = run(MeasureConfig(target=0.01, budget_s=100.0, max_blocks=400))
    ab = run(
        MeasureConfig(
            target=0.01,
            budget_s=100.0,
            max_blocks=400,
            ab_progress=lambda ratios, _ns: ab_progress(ratios, policy, 0.01, 0.02),
        )
    )

    def mde(m: Measurement) -> float:
        gate_mde = ab_gate(m.ab_ratios(), policy, 0.01).mde
        assert gate_mde is not None
        return gate_mde

    assert plain.stop_reason == "target" and mde(plain) > 0.02
    assert ab.stop_reason == "target" and ab.blocks > plain.blocks and mde(ab) <= 0.02


def test_ab_progress_is_the_gates_mde_against_its_promise() -> None:
    rng = np.random.default_rng(2)
    policy = Policy(family_size=50, confirm=True)
    for n in (16, 64, 200):
        ratios = list(np.exp(rng.normal(0.0, 0.01, n)))
        mde = ab_gate(ratios, policy, 0.015).mde
        assert mde is not None
        assert ab_progress(ratios, policy, 0.015, 0.03) == pytest.approx((mde - 0.015) / 0.015)
        offset = ab_gate(ratios, policy, 0.015, 0.003).mde
        assert offset is not None and offset > mde
        assert ab_progress(ratios, policy, 0.015, 0.03, 0.003) == pytest.approx((offset - 0.015) / 0.015)
    assert ab_progress([1.0], policy, 0.01, 0.02) == math.inf
    assert ab_progress([1.0, 1.01, 0.99, 1.0], policy, 0.01, 0.02) == math.inf  # too few groups at 99.9%
    with pytest.raises(ValueError, match="must exceed the margin"):
        ab_progress([1.0, 1.01], policy, 0.02, 0.02)


def test_ratio_is_paired_per_block() -> None:
    """The device speed changes wildly between blocks; a variant exactly 2x its reference still reads 2.000."""
    clock = FakeClock()
    speed = [1.0]
    rng = random.Random(5)

    def next_block() -> None:
        speed[0] = rng.choice([0.5, 0.8, 1.0, 1.7, 3.0])

    cfg = MeasureConfig(target=0.01, budget_s=5.0, min_blocks=12, max_blocks=40)
    m = measure(
        kernel(clock, lambda: 2 * round(4_000 * speed[0])),
        kernel(clock, lambda: round(4_000 * speed[0])),
        CpuTimer(clock),
        cfg,
        rng=random.Random(6),
        on_block=next_block,
    )
    assert m.ratio is not None and m.log_ratio is not None
    assert f"{m.ratio.estimate:.3f}" == "2.000"
    assert relative_half_width(m.log_ratio) == pytest.approx(0.0, abs=1e-12)
    assert relative_half_width(m.log_time) > 0.10  # the time itself is all over the place
    assert m.stop_reason == "max_blocks"  # the time interval never gets narrow; the ratio is exact anyway


def test_sides_are_interleaved_in_random_order() -> None:
    clock = FakeClock()
    order: list[str] = []

    def side(name: str, ns: int) -> Callable[[int], Callable[[], object]]:
        def call() -> None:
            clock.now += ns
            order.append(name)

        return lambda _i: call

    cfg = MeasureConfig(target=0.5, budget_s=5.0, min_blocks=6, samples_per_block=5, min_sample_ns=1.0)
    measure(side("v", 1000), side("a", 1000), CpuTimer(clock), cfg, rng=random.Random(7))
    timed = order[6 + 6 + 2 :]  # after the warm-up (3 each), single-call probes (3 each) and discarded samples
    pairs = list(zip(timed[0::2], timed[1::2], strict=True))
    assert all(sorted(p) == ["a", "v"] for p in pairs)  # each sample slot times both sides once
    assert {p[0] for p in pairs} == {"v", "a"}  # in random order: neither side always goes first
    assert timed.count("v") == timed.count("a")


# ------------------------------------------------------------------------------------ samples and reps


def test_fast_calls_are_batched_into_reps() -> None:
    cfg = MeasureConfig()
    assert choose_reps(9_000.0, cfg, 0) == 23  # 200 us per sample
    assert choose_reps(100.0, cfg, 0) == cfg.max_reps
    assert choose_reps(9_000.0, cfg, bytes_per_copy=cfg.max_copy_bytes // 4) == 4  # memory caps the copies
    assert choose_reps(5e6, cfg, 0) == 1


@pytest.mark.parametrize(("call_ms", "expected_spb"), [(0.01, 5), (5.0, 5), (20.0, 2), (50.0, 1)])
def test_slow_calls_get_fewer_samples_per_block(call_ms: float, expected_spb: int) -> None:
    """min_blocks blocks of both sides should fit the budget: 1 s / (12 blocks * 2 sides * call)."""
    clock = FakeClock()
    ns = call_ms * 1e6
    cfg = MeasureConfig(target=0.5, budget_s=1.0, min_blocks=12)
    m = measure(kernel(clock, lambda: ns), kernel(clock, lambda: ns), CpuTimer(clock), cfg, rng=random.Random(8))
    assert m.samples_per_block == expected_spb
    if call_ms >= 5.0:
        assert m.reps == 1


class LaunchBoundTimer:
    """A CUDA-like timer on the fake clock: one launch on an idle queue reads the host's launch latency
    (as a freshly started machine's first process does), a replayed sample of n calls reads
    n * kernel + one replay's fixed cost."""

    kind = "cuda"

    def __init__(self, clock: FakeClock, launch_ns: float, replay_ns: float, workspace: int = 0) -> None:
        self.clock, self.launch_ns, self.replay_ns = clock, launch_ns, replay_ns
        self.workspace = workspace

    def prepare(self, calls: Sequence[Callable[[], object]]) -> Any:
        timer = self

        class Sample:
            mode, reps = "cuda-graph", len(calls)

            def __call__(self) -> SampleTime:
                t0 = timer.clock.now
                for call in calls:
                    call()
                timer.clock.now += int(timer.replay_ns)
                per = (timer.clock.now - t0) / len(calls)
                return SampleTime(per, per)

        return Sample()

    def now_ns(self) -> int:
        return self.clock.now

    def single_call_ns(self, call: Callable[[], object]) -> float:
        t0 = self.clock.now
        call()
        return max(float(self.clock.now - t0), self.launch_ns)

    def overhead_ns(self) -> float:
        return 0.0

    def call_bytes(self, call: Callable[[], object]) -> int:
        return self.workspace


def test_reps_come_from_replays_not_from_one_launch_on_an_idle_queue() -> None:
    """8 us kernel, 60 us launch latency, 7 us per replay: one launch would choose 4 calls a sample (each
    sample then reads 9.75 us a call, +22%); replays choose 25, and the per-call time is within 4%."""
    clock = FakeClock()
    timer = LaunchBoundTimer(clock, launch_ns=60_000.0, replay_ns=7_000.0)
    cfg = MeasureConfig(target=0.5, budget_s=1.0)
    assert choose_reps(60_000.0, cfg, 0) == 4
    m = measure(kernel(clock, lambda: 8_000.0), kernel(clock, lambda: 8_000.0), timer, cfg, rng=random.Random(3))
    assert m.reps >= 24  # three rounds: 4 -> 21 -> 24 -> 25
    assert m.time.estimate == pytest.approx(8_000.0, rel=0.04)
    cpu = measure(kernel(clock, lambda: 8_000.0), None, CpuTimer(clock), cfg, rng=random.Random(3))
    assert cpu.reps == 25  # a host timer has no launch latency to refine away


def test_a_launch_slower_than_a_whole_sample_does_not_choose_one_call() -> None:
    """A 6 us kernel whose launch on an idle queue read 250 us (a whole sample's length): one launch alone
    chose one call a sample, and that case read slower in some processes than in others. Replays still
    choose enough calls to fill a sample."""
    clock = FakeClock()
    timer = LaunchBoundTimer(clock, launch_ns=250_000.0, replay_ns=2_000.0)
    cfg = MeasureConfig(target=0.5, budget_s=1.0)
    assert choose_reps(250_000.0, cfg, 0) == 1
    m = measure(kernel(clock, lambda: 6_000.0), kernel(clock, lambda: 6_000.0), timer, cfg, rng=random.Random(4))
    assert m.reps >= 30
    assert m.time.estimate == pytest.approx(6_000.0, rel=0.02)


def placed_kernel(clock: FakeClock, fast_ns: float, slow_copies: set[int]) -> Callable[[int], Callable[[], object]]:
    """A kernel whose time depends on its input copy's placement: 9% slower on the copies in `slow_copies`."""

    def make(i: int) -> Callable[[], object]:
        ns = round(fast_ns * (1.09 if i in slow_copies else 1.0))

        def call() -> None:
            clock.now += ns

        return call

    return make


def test_a_long_kernel_is_timed_over_several_placements_not_the_first_one_alone() -> None:
    """A 1.1 ms kernel, one call a sample, whose copy 0 lies where it runs 9% slower (cuda_scalar at S2048
    causal on an H100). Timed on copy 0 alone, as the host timer still does, the process reads the slow
    speed; spread over MIN_COPIES copies, it reads the speed most placements give, and the sample the
    integrity checks replay is still copy 0's."""
    clock = FakeClock()
    timer = LaunchBoundTimer(clock, launch_ns=0.0, replay_ns=0.0)
    cfg = MeasureConfig(target=0.5, budget_s=1.0)
    used: set[int] = set()
    placed = placed_kernel(clock, 1_100_000.0, {0})

    def variant(i: int) -> Callable[[], object]:
        used.add(i)
        return placed(i)

    m = measure(variant, kernel(clock, lambda: 1_000_000.0), timer, cfg, rng=random.Random(5))
    assert m.reps == 1
    assert used == set(range(MIN_COPIES))
    assert m.time.estimate == pytest.approx(1_100_000.0, rel=0.001)
    assert m.sample is not None and m.sample.reps == 1
    cpu = measure(variant, None, CpuTimer(clock), cfg, rng=random.Random(5))
    assert cpu.time.estimate == pytest.approx(1_199_000.0, rel=0.001)  # a host timer keeps its one placement
    used.clear()  # an A/B run: head and base share their copies (the runner turns the spread off)
    ab = replace(cfg, spread_copies=False)
    measure(variant, kernel(clock, lambda: 1_000_000.0), timer, ab, rng=random.Random(5), base=placed)
    assert used == {0}
    used.clear()  # an update's A/A process keeps its absolute time: its recaptures reuse the same copies
    aa = measure(variant, kernel(clock, lambda: 1_000_000.0), timer, cfg, rng=random.Random(5), base=placed)
    assert used == set(range(MIN_COPIES))
    assert aa.time.estimate == pytest.approx(1_100_000.0, rel=0.001)


def test_every_block_takes_every_placement_so_the_estimate_does_not_follow_the_slow_ones() -> None:
    """cuda_scalar S2048 causal on a fresh H200 (2026-11-28): 1.09 ms on most placements, 1.21 ms on some.
    With 5 samples a block over 8 placements, a block's median depended on the run of placements it met; one
    measurement with three slow placements in a row read a slow block in three of eight and a Hodges-Lehmann
    estimate +4.7% above an update whose processes met fewer, on an unchanged kernel. With every placement
    in every block, the blocks read alike and the estimate is the speed most placements give, whichever of
    them are slow."""
    clock = FakeClock()
    timer = LaunchBoundTimer(clock, launch_ns=0.0, replay_ns=0.0)
    cfg = MeasureConfig(target=0.5, budget_s=1.0)
    estimates = []
    for slow in (set(), {1}, {0, 1, 3}, {2, 3, 4}, {0, 2, 4}):
        m = measure(placed_kernel(clock, 1_090_000.0, slow), None, timer, cfg, rng=random.Random(6))
        assert m.samples_per_block % MIN_COPIES == 0
        assert max(m.variant_blocks) == pytest.approx(min(m.variant_blocks), rel=1e-6), slow  # blocks alike
        estimates.append(m.time.estimate)
    assert max(estimates) == pytest.approx(1_090_000.0, rel=1e-6)


def test_whole_rotations_a_block_stay_within_the_case_budget() -> None:
    """A slow kernel on a slow GPU: the budget allows four samples a block of a 1 ms call over 8 placements.
    Whole rotations (8 a block) would take twice the budget; the block keeps the four it allows."""
    clock = FakeClock()
    timer = LaunchBoundTimer(clock, launch_ns=0.0, replay_ns=0.0)
    cfg = MeasureConfig(target=0.5, budget_s=0.05)
    m = measure(placed_kernel(clock, 1_000_000.0, set()), None, timer, cfg, rng=random.Random(6))
    assert m.reps == 1 and m.samples_per_block == 4


def test_a_call_whose_workspace_fills_the_copy_budget_keeps_one_placement() -> None:
    """torch_hybrid at S4096: 192 MB of inputs, and each captured call keeps 8 GB of scores in its graph's
    pool. Counted by its inputs it got five placements per side, and three sides of those ran an H100 out of
    memory; counted with its workspace it keeps one."""
    clock = FakeClock()
    cfg = MeasureConfig(target=0.5, budget_s=1.0)
    used: set[int] = set()

    def variant(i: int) -> Callable[[], object]:
        used.add(i)
        return kernel(clock, lambda: 2_000_000.0)(i)

    for workspace, copies in ((0, 5), (8 << 30, 1)):
        used.clear()
        timer = LaunchBoundTimer(clock, launch_ns=0.0, replay_ns=0.0, workspace=workspace)
        m = measure(variant, None, timer, cfg, rng=random.Random(5), bytes_per_copy=192 << 20)
        assert (m.reps, len(used)) == (1, copies), workspace


class _Output:
    """A call's output; on CUDA it would hold its graph's memory pool."""

    def __init__(self, generation: int) -> None:
        self.generation = generation


def test_a_recapture_lets_go_of_the_old_captures_outputs() -> None:
    """Under A/B every `recapture_every` blocks all sides are prepared anew. A CUDA graph's memory pool lives
    while any tensor from it does, so the outputs the engine keeps for the integrity checks must go with their
    graphs: kept, they held an H100 full at torch_hybrid S4096 (4 GiB of scores a graph)."""
    clock = FakeClock()
    live: weakref.WeakSet[_Output] = weakref.WeakSet()
    generation = 0
    old_alive: list[int] = []

    def variant(i: int) -> Callable[[], object]:
        nonlocal generation
        if i == 0:  # a new set of captures begins (the first is the sizing warm-up's)
            generation += 1
            gc.collect()
            old_alive.append(sum(1 for o in live if o.generation < generation))
        made = generation

        def call() -> object:
            clock.now += 300_000
            out = _Output(made)
            live.add(out)
            return out

        return call

    cfg = MeasureConfig(target=0.001, budget_s=0.5, min_blocks=8)
    m = measure(variant, None, CpuTimer(clock), cfg, rng=random.Random(3), base=kernel(clock, lambda: 300_000.0))
    assert m.blocks >= 6 and generation >= 4  # the warm-up, the first captures, and recaptures
    # The first captures may find the warm-up's outputs; every recapture finds none of the old ones.
    assert old_alive[2:] == [0] * (generation - 2)


def test_copies_override_reps_and_pooling_keeps_all_blocks() -> None:
    clock = FakeClock()
    cfg = MeasureConfig(target=0.01, budget_s=5.0)
    a = measure(kernel(clock, jitter(9_000.0, 0.01, 9)), None, CpuTimer(clock), cfg, rng=random.Random(9))
    b = measure(
        kernel(clock, jitter(9_000.0, 0.01, 10)), None, CpuTimer(clock), cfg, copies=a.reps, rng=random.Random(10)
    )
    assert b.reps == a.reps == 23
    p = pooled(a, b, cfg.confidence)
    assert p.blocks == a.blocks + b.blocks
    assert p.stop_reason == "target+remeasured:target"
    assert p.elapsed_s == pytest.approx(a.elapsed_s + b.elapsed_s)


# ----------------------------------------------------------------------------- verdicts on H200 noise


class RecordedKernels:
    """Fake variant and reference whose durations are resampled from recorded H200 launches.

    At every engine block both sides move to a random recorded block (the recorded blocks of the kernels
    alternate in time, so drift is shared); each call draws one of that block's launches. The cold first
    launch of each recorded block is left out, as the engine's warm-up stands for it.
    """

    def __init__(self, case: str, kernel_name: str, seed: int, slowdown: float = 0.0) -> None:
        raw = json.loads(lzma.decompress(DATA.read_bytes()))
        self.pool = np.asarray(raw["cases"][case][kernel_name], dtype=np.float64)[:, 1:] * 1e3
        self.rng = np.random.default_rng(seed)
        self.factor = 1.0 + slowdown
        self.clock = FakeClock()
        self.disturb_at: int | None = None
        self.blocks_seen = 0
        self.next_block()

    def next_block(self) -> str | None:
        self.row = self.pool[int(self.rng.integers(self.pool.shape[0]))]
        self.blocks_seen += 1
        if self.disturb_at is not None and self.blocks_seen == self.disturb_at:
            return "SM clock throttled (thermal) during block"
        return None

    def side(self, factor: float) -> Callable[[int], Callable[[], object]]:
        def call() -> None:
            self.clock.now += round(self.row[int(self.rng.integers(self.row.size))] * factor)

        return lambda _i: call

    def measure(self, cfg: MeasureConfig, copies: int | None = None) -> Measurement:
        return measure(
            self.side(self.factor),
            self.side(1.0),
            CpuTimer(self.clock),
            cfg,
            copies=copies,
            rng=random.Random(int(self.rng.integers(2**32))),
            on_block=self.next_block,
        )


CASE = "B16_H8_S512_D64_fp16_causal"
CFG = MeasureConfig(target=0.01, budget_s=5.0)


def stored_entry(m: Measurement) -> BaselineEntry:
    """What an update run stores for this measurement (as the session builds it)."""
    assert m.ratio is not None
    return BaselineEntry(
        case_id="tests/perf::case",
        workload="w" * 64,
        workload_desc="simulated",
        env={},
        median_ns=m.time.estimate,
        ci_ns=(m.time.lo, m.time.hi),
        ratio=m.ratio.estimate,
        ratio_ci=(m.ratio.lo, m.ratio.hi),
        noise=0.003,
        runs=1,
        blocks=m.blocks,
        updated="2026-11-21",
    )


def judge(fake: RecordedKernels, stored: BaselineEntry) -> tuple[Verdict, Measurement]:
    """decide() plus the runner's rule: regressed or inconclusive is re-measured once and judged pooled."""

    def verdict(m: Measurement) -> Verdict:
        return decide(
            m.variant_blocks,
            m.against_blocks,
            stored,
            workload="w" * 64,
            policy=GPU_POLICY,
            max_ratio=None,
            incomparable=[],
            disturbances=m.notes,
        )

    m = fake.measure(CFG)
    v = verdict(m)
    if v.needs_remeasure:
        m = pooled(m, fake.measure(CFG, copies=m.reps), CFG.confidence)
        v = verdict(m)
    return v, m


@pytest.fixture(scope="module")
def baseline() -> BaselineEntry:
    return stored_entry(RecordedKernels(CASE, "sdpa_l2flush", seed=100).measure(CFG))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_a_rerun_on_h200_noise_passes(baseline: BaselineEntry, seed: int) -> None:
    v, m = judge(RecordedKernels(CASE, "sdpa_l2flush", seed=seed), baseline)
    assert v.status == PASS, [g.reason for g in v.gates]
    assert {g.name for g in v.gates} == {"baseline", "ratio"}
    assert m.stop_reason == "target"


@pytest.mark.parametrize("seed", [4, 5])
def test_ten_percent_slower_on_h200_noise_is_regressed(baseline: BaselineEntry, seed: int) -> None:
    v, _ = judge(RecordedKernels(CASE, "sdpa_l2flush", seed=seed, slowdown=0.10), baseline)
    assert v.status == REGRESSED
    gates = {g.name: g for g in v.gates}
    assert gates["baseline"].status == REGRESSED and gates["ratio"].status == REGRESSED
    assert gates["baseline"].estimate == pytest.approx(1.10, abs=0.01)
    assert "beyond the 2.0% margin" in gates["baseline"].reason


def test_a_disturbance_makes_a_slowdown_inconclusive_not_regressed(baseline: BaselineEntry) -> None:
    fake = RecordedKernels(CASE, "sdpa_l2flush", seed=6, slowdown=0.10)
    fake.disturb_at = 5
    v, m = judge(fake, baseline)
    assert m.notes == ["SM clock throttled (thermal) during block"]
    assert any(g.status == REGRESSED for g in v.gates)  # the numbers still say slower ...
    assert v.status == INCONCLUSIVE  # ... but a disturbed measurement never fails the build
    assert v.disturbances == m.notes
