"""What the events of a graph replay read with and without a hold on the stream (GPU).

Without a hold, the start event fires on an idle device as soon as it is recorded, and the graph's work waits
for the host to launch the replay: each call of a sample of `reps` calls reads launch latency / reps too slow.
With a hold (a spin kernel enqueued before the start event, as the plugin's engine now does) the host launches
while the device spins. For a few small attention cases, graphs of several sizes are replayed in alternation
with and without the hold (the L2 flushed before each replay), and the table prints the median time per call of
each, their difference, and the host's time to launch one replay.

    python benchmarks/launch_hold.py [--replays 200] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import torch
from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._output import output_paths
from benchmarks._timing import EventTimer, capture, warm_up
from kernels import KERNELS

CASES = [  # variant, B, H, S, D, causal
    ("sdpa", 1, 1, 128, 64, False),
    ("sdpa", 8, 8, 128, 64, False),
    ("triton_flash", 1, 1, 239, 64, False),
    ("torch_hybrid", 1, 1, 239, 64, False),
]
REPS = (3, 16, 64)
HOLD_CYCLES = 40_000


def _replays(
    graph: torch.cuda.CUDAGraph, flush: torch.Tensor, timers: dict[str, EventTimer], n: int, reps: int
) -> tuple[dict[str, list[float]], list[float]]:
    """`n` replays each way, alternating: time per call (us) by timer name, and the host's launch times (us)."""
    times: dict[str, list[float]] = {name: [] for name in timers}
    launches: list[float] = []

    def launch() -> None:
        t0 = time.perf_counter_ns()
        graph.replay()
        launches.append((time.perf_counter_ns() - t0) / 1e3)

    for _ in range(n):
        for name, timer in timers.items():
            flush.zero_()
            torch.cuda.synchronize()
            times[name].append(timer(launch) * 1e3 / reps)
    return times, launches


def _graph(name: str, shape: tuple[int, int, int, int], causal: bool, reps: int) -> torch.cuda.CUDAGraph:
    fn = KERNELS[name]
    qkv = [[torch.randn(*shape, device="cuda", dtype=torch.float16) for _ in range(3)] for _ in range(reps)]
    calls = [partial(fn, q, k, v, causal) for q, k, v in qkv]
    warm_up(calls)
    return capture(calls)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replays", type=int, default=200)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("launch_hold: needs a CUDA GPU")
        return 2
    flush = torch.empty(64 << 20, dtype=torch.int8, device="cuda")
    timers = {"bare": EventTimer(), "held": EventTimer(HOLD_CYCLES)}
    rows, raw = [], []
    for name, b, h, s, d, causal in CASES:
        for reps in REPS:
            graph = _graph(name, (b, h, s, d), causal, reps)
            times, launches = _replays(graph, flush, timers, args.replays, reps)
            m_bare, m_held = statistics.median(times["bare"]), statistics.median(times["held"])
            shape = f"B{b} H{h} S{s} D{d}" + (" causal" if causal else "")
            rows.append(
                [
                    name,
                    shape,
                    reps,
                    f"{m_bare:.2f}",
                    f"{m_held:.2f}",
                    f"{100 * (m_bare / m_held - 1):+.1f}%",
                    f"{statistics.median(launches):.1f}",
                ]
            )
            raw.append({"variant": name, "shape": shape, "reps": reps, **times, "launch_us": launches})
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}; {args.replays} replays each way, alternating")
    headers = ["variant", "shape", "reps", "no hold us/call", "hold us/call", "no hold reads", "launch us (host)"]
    print(tabulate(rows, headers=headers))
    for path in output_paths("launch_hold.json", args.json):
        path.write_text(json.dumps(raw))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
