"""Does a kernel's time depend on the process it runs in? One case, many placements, many processes.

Times a variant (default `triton_flash` at B8 H8 S128 D64 fp16 causal, about 4-7 us on an H200) with CUDA-graph
replay of `--reps` calls (default 20), the L2 flushed before each replay, median of 40 replays. In each fresh
process, ten trials each allocate new inputs (after a pad of random size, keeping earlier ones alive, so every
trial has its own placement) and capture a new graph. Prints one row per process: its trials in ns.

This is the measurement behind the guard's fresh-process confirmation (pytest_perfguard/run/confirm.py):
if a process-bound state moves a kernel's time, only a new process can tell it from a code change.

Usage: python benchmarks/placement_probe.py [--processes 12] [--variant NAME --shape B,H,S,D [--no-causal]
       --reps N]   (needs a CUDA GPU; cuda_* variants build their extension)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one_process(seed: int, variant: str, shape: tuple[int, ...], causal: bool, calls: int) -> list[int]:
    import torch

    sys.path.insert(0, str(ROOT))
    from benchmarks._timing import capture, replay_times_ms, warm_up
    from kernels import KERNELS

    fn = KERNELS[variant]

    torch.manual_seed(seed)
    keep: list[object] = []

    def timed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, reps: int = calls, n: int = 40) -> float:
        def f() -> object:
            return fn(q, k, v, causal)

        f()
        torch.cuda.synchronize()
        warm_up([f] * 3)
        graph = capture([f] * reps)
        flush = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")  # after the graph, as recorded
        return statistics.median(t * 1e6 / reps for t in replay_times_ms(graph, n, flush))

    times = []
    for _ in range(10):
        keep.append(torch.empty(int(torch.randint(1, 4096, ()).item()) * 4096, dtype=torch.uint8, device="cuda"))
        q, k, v = (torch.randn(*shape, device="cuda", dtype=torch.float16) for _ in range(3))
        keep.append((q, k, v))
        times.append(round(timed(q, k, v)))
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=12)
    ap.add_argument("--variant", default="triton_flash")
    ap.add_argument("--shape", default="8,8,128,64", help="B,H,S,D")
    ap.add_argument("--no-causal", dest="causal", action="store_false")
    ap.add_argument("--reps", type=int, default=20, help="calls per graph replay")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        shape = tuple(int(x) for x in args.shape.split(","))
        print(json.dumps(one_process(args.child, args.variant, shape, args.causal, args.reps)))
        return 0
    from tabulate import tabulate

    rows = []
    for i in range(args.processes):
        out = subprocess.run(
            [sys.executable, __file__, *sys.argv[1:], "--child", str(i + 1)],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        t = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append([i + 1, *t, f"{t[0] / statistics.median(t[1:]) - 1:+.1%}"])
    print(f"{args.variant} {args.shape} causal={args.causal}, {args.reps} calls per replay")
    print(tabulate(rows, headers=["process", *(f"trial {j} ns" for j in range(1, 11)), "trial 1 vs rest"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
