"""The CUDA-graph timer shared by the benchmark scripts.

Warm up on a side stream (graph capture requires it), capture a list of calls into one CUDA graph, and time
each replay between two CUDA events, optionally zeroing a buffer before it (outside the timed window) to
flush the L2. This is device time of back-to-back calls with no host dispatch. The plugin's own engine,
``pytest_perfguard.measure.timing``, does the same and adds the interleaving and statistics; these scripts want the
bare replay times.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

Call = Callable[[], object]


def warm_up(calls: Sequence[Call]) -> None:
    """Run ``calls`` on a side stream and wait for them, as a graph capture that follows needs."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()


def capture(calls: Sequence[Call]) -> torch.cuda.CUDAGraph:
    """One CUDA graph holding ``calls`` in order (warm them up first)."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    torch.cuda.synchronize()
    return graph


class EventTimer:
    """Device time, in milliseconds, of what a callable enqueues, between two CUDA events.

    ``hold_cycles`` > 0 enqueues a spin kernel before the start event, so the host launches the work while the
    device is busy and the events leave its launch latency out (the plugin's engine does the same)."""

    def __init__(self, hold_cycles: int = 0) -> None:
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)
        self.hold_cycles = hold_cycles

    def __call__(self, enqueue: Call) -> float:
        if self.hold_cycles:
            torch.cuda._sleep(self.hold_cycles)
        self.start.record()
        enqueue()
        self.end.record()
        self.end.synchronize()
        return float(self.start.elapsed_time(self.end))


def replay_times_ms(
    graph: torch.cuda.CUDAGraph, replays: int, flush: torch.Tensor | None = None, timer: EventTimer | None = None
) -> list[float]:
    """Milliseconds of each of ``replays`` replays of ``graph``; ``flush`` is zeroed before each one."""
    timer = timer or EventTimer()
    times = []
    for _ in range(replays):
        if flush is not None:
            flush.zero_()
        times.append(timer(graph.replay))
    return times
