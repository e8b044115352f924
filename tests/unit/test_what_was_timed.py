"""The judgement side of "what was timed is what was checked": the timing mode is part of the workload, the
eager call's host cost has a gate of its own, and a reference that moved beyond belief flags the case."""

from __future__ import annotations

import math
import random

from pytest_perfguard.judge import baseline as bl
from pytest_perfguard.judge import reference
from pytest_perfguard.judge import verdict as vd
from pytest_perfguard.judge.policy import HOST_MARGIN, REFERENCE_BAND
from pytest_perfguard.measure import hosttime, timing
from pytest_perfguard.measure.device import CUDA_TIMING, incomparable
from pytest_perfguard.record import CaseRecord, Gate, Status
from pytest_perfguard.run import outcome

ENV = {"name": "NVIDIA H100", "torch": "2.13.0", "timing": CUDA_TIMING}


def _entry(host_ratio: float | None = 2.0, against: float = 1000.0) -> bl.BaselineEntry:
    samples = [
        bl.ProcessSample(t, (t * 0.99, t * 1.01), 1.0, against_ns=against, host_ns=3 * t, host_ratio=host_ratio)
        for t in (1000.0, 1004.0, 996.0)
    ]
    return bl.BaselineEntry.from_samples(
        "c", samples, workload="w", workload_desc="w", env={**ENV, "mode": "cuda-graph"}, updated="2026-11-27"
    )


def test_a_variant_that_stops_capturing_is_another_workload_not_a_speed_up() -> None:
    assert incomparable({**ENV, "mode": "cuda-graph"}, {**ENV, "mode": "cuda-stream"}) == [
        "timed by CUDA graph replay \u2192 stream launches (graph capture failed)"
    ]
    # an entry from before the key was a graph replay wherever it carries the timing key
    assert incomparable(ENV, {**ENV, "mode": "cuda-stream"}) != []
    assert incomparable(ENV, {**ENV, "mode": "cuda-graph"}) == []


def _blocks(centre: float, n: int = 12, sd: float = 0.01, seed: int = 1) -> list[float]:
    rng = random.Random(seed)
    return [centre * math.exp(rng.gauss(0.0, sd)) for _ in range(n)]


def test_the_host_gate_fails_a_slower_wrapper_and_passes_host_noise() -> None:
    entry, policy = _entry(host_ratio=2.0), vd.Policy()
    against = _blocks(10_000.0, seed=2)
    same = vd.host_gate(_blocks(20_000.0 * 1.1), against, entry, policy)  # 10% host drift: inside the margin
    assert same is not None and same.status is Status.PASS, same
    slow = vd.host_gate(_blocks(20_000.0 * (1 + 2 * HOST_MARGIN)), against, entry, policy)
    assert slow is not None and slow.status is Status.REGRESSED
    assert slow.reason.startswith("host time per eager call vs baseline +")
    assert vd.host_gate(_blocks(20_000.0), against, _entry(host_ratio=None), policy) is None  # nothing stored


def test_one_preempted_block_leaves_the_host_gate_decided() -> None:
    # At the run's 99.9% a 12-block interval reaches the slowest block; a pass needs only the gate's own 95%,
    # a failure still needs the 99.9% (the variant that gets past: one that is slower in fewer than a third of
    # its blocks, which the median ignores as it ignores a preempted block).
    entry, policy = _entry(host_ratio=2.0), vd.Policy(family_size=98)
    against = _blocks(10_000.0, seed=2)
    blocks = _blocks(20_000.0 * 1.1)
    blocks[5] = 20_000.0 * 3.0 * (1 + HOST_MARGIN)
    gate = vd.host_gate(blocks, against, entry, policy)
    assert gate is not None and gate.status is Status.PASS, gate
    slow = [b * (1 + 2 * HOST_MARGIN) for b in blocks]
    slow_gate = vd.host_gate(slow, against, entry, policy)
    assert slow_gate is not None and slow_gate.status is Status.REGRESSED, slow_gate


def test_the_eager_blocks_are_sized_on_the_whole_call_not_the_device_time() -> None:
    # A launch-bound call: 1 us on the device, 100 us on the host. Sized on the device time the blocks held
    # HOST_MAX_CALLS calls each; sized on the whole call they hold HOST_BLOCK_NS of it.
    now = [0]

    def clock() -> int:
        return now[0]

    def call(cost: int):  # type: ignore[no-untyped-def]
        def run() -> None:
            now[0] += cost

        return run

    host = hosttime.host_time(
        {"v": [call(100_000)] * 4, "a": [call(50_000)] * 4}, lambda: None, per_call_ns=1_000.0, clock=clock
    )
    assert host.calls_per_block == math.ceil(hosttime.HOST_BLOCK_NS / 100_000)
    assert len(host.variant_blocks) == hosttime.HOST_BLOCKS
    assert host.ratio is not None and host.ratio.estimate == 2.0


def test_a_reference_that_moved_beyond_the_band_flags_the_case() -> None:
    entry = _entry(against=1000.0)
    far = 1000.0 * (1 + 2 * REFERENCE_BAND)
    v = vd.decide(
        _blocks(3000.0), _blocks(far, seed=3), entry, workload="w", policy=vd.Policy(), max_ratio=None, incomparable=[]
    )
    assert v.flag is not None and v.flag.startswith("reference moved beyond belief: the reference timed beside")
    assert v.reference_move is not None and v.reference_move > math.log1p(REFERENCE_BAND)
    near = vd.decide(
        _blocks(1100.0),
        _blocks(1100.0, seed=4),
        entry,
        workload="w",
        policy=vd.Policy(),
        max_ratio=None,
        incomparable=[],
    )
    assert near.flag is None and near.reference_move is not None


def _moved(case_id: str, move: float | None, excused: bool) -> CaseRecord:
    reason = f"not comparable: ...; {reference.MACHINE_MOVED} +30.0% too" if excused else "time vs baseline +0.1%"
    return CaseRecord(
        id=case_id,
        median_ns=1000.0,
        reference_move=None if move is None else math.log1p(move),
        gates=[Gate("baseline", Status.NOT_COMPARABLE if excused else Status.PASS, reason=reason)],
    )


def test_a_reference_that_moved_alone_is_named_and_one_the_run_shares_is_not() -> None:
    alone = [_moved("a", 0.6, True), _moved("b", 0.01, False), _moved("c", -0.01, False), _moved("d", 0.02, False)]
    assert outcome.moved_alone(alone) == ["a (reference +60.0%, the others' median +1.0%)"]
    shared = [_moved("a", 0.6, True), _moved("b", 0.5, True), _moved("c", 0.55, False), _moved("d", 0.4, False)]
    assert outcome.moved_alone(shared) == []


def test_a_disturbance_read_again_with_other_shares_is_said_once() -> None:
    a = "GPU 0 shared with pid 844 (python: gpu_load.py) at 99% SM, 28% memory while timed"
    b = "GPU 0 shared with pid 844 (python: gpu_load.py) at 99% SM, 29% memory while timed"
    other = "GPU 0 shared with pid 900 (python: train.py) at 40% SM, 10% memory while timed"
    assert timing.distinct_notes([a], [b, other, other]) == [a, other]
