"""The eager call as a user makes it: host and device, synchronised per block, beside the reference's."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..judge.stats import Interval, log_interval
from .timers import Call, Clock

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
    # 2 to HOST_WARM_CALLS, not eight of a millisecond call (the eager timing of cases >= 200 us: median 3.3% of
    # their wall time with eight, 2.9% with this; two fresh H200 hosts, 2026-11-28).
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
