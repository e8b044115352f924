"""Does the timing engine read what the kernel takes? A GPU check of the CUDA path, printed as a table.

For SDPA at the seeds' shapes it compares four readings of the same call:
  per-launch   CUDA events around one launch on an idle queue (what the seeds did: the host's launch latency)
  do_bench     triton.testing.do_bench median (events around batches, L2 cleared)
  engine       pytest_perfguard's engine: CUDA graph of `reps` calls, L2 flushed before each replay
  engine A/A   the engine again in the same process (the spread between the two is within-run noise)
and the engine's CI half-width, blocks, stop reason, time spent and the wall-clock / event ratio.
Also times a deliberately multi-kernel variant (matmul + softmax + matmul) the same ways.

Usage: python benchmarks/timing_check.py [--json PATH]   (needs a CUDA GPU)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from tabulate import tabulate

from benchmarks._output import output_paths
from benchmarks._timing import EventTimer
from kernels.reference import math_attention
from kernels.sdpa import sdpa, sdpa_backend
from pytest_perfguard.research import CudaTimer, MeasureConfig, measure

SHAPES = [(1, 1, 128, 64), (8, 8, 128, 64), (16, 8, 512, 64), (4, 16, 2048, 64)]


def per_launch_us(fn, n: int = 200) -> float:
    """Median of n launches, each timed alone between two events on an idle queue."""
    timer = EventTimer()
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        times.append(timer(fn) * 1e3)
    return statistics.median(times)


def do_bench_us(fn) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")) * 1e3


def engine(fn_of, timer: CudaTimer) -> dict:
    t0 = time.perf_counter()
    m = measure(fn_of, None, timer, MeasureConfig(target=0.005, budget_s=3.0))
    return {
        "us": m.time.estimate / 1e3,
        "ci_pct": (max(m.time.hi - m.time.estimate, m.time.estimate - m.time.lo) / m.time.estimate) * 100,
        "blocks": m.blocks,
        "reps": m.reps,
        "stop": m.stop_reason,
        "mode": m.mode,
        "wall_ratio": m.wall_ratio,
        "spent_s": time.perf_counter() - t0,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    timer = CudaTimer(dev)
    rows, out = [], []
    for B, H, S, D in SHAPES:
        copies = [tuple(torch.randn(B, H, S, D, device=dev, dtype=torch.float16) for _ in range(3)) for _ in range(64)]
        for name, fn in (("sdpa", sdpa), ("torch_hybrid(math fp16)", math_attention)):
            if name != "sdpa" and S > 512:
                continue

            def fn_of(i: int, fn=fn, copies=copies):
                q, k, v = copies[i % len(copies)]
                return lambda: fn(q, k, v, True)

            first = fn_of(0)
            for _ in range(10):
                first()
            torch.cuda.synchronize()
            pl = per_launch_us(first)
            db = do_bench_us(first)
            e1 = engine(fn_of, timer)
            e2 = engine(fn_of, timer)
            backend = sdpa_backend(*copies[0], True) if name == "sdpa" else "-"
            row = {
                "shape": f"B{B} H{H} S{S} D{D}",
                "variant": name,
                "backend": backend,
                "per_launch_us": pl,
                "do_bench_us": db,
                "engine_us": e1["us"],
                "engine_aa_us": e2["us"],
                "engine": e1,
                "engine_aa": e2,
            }
            out.append(row)
            rows.append(
                [
                    row["shape"],
                    name,
                    backend,
                    f"{pl:.2f}",
                    f"{db:.2f}",
                    f"{e1['us']:.2f} ±{e1['ci_pct']:.2f}%",
                    f"{e2['us']:.2f} ±{e2['ci_pct']:.2f}%",
                    f"{(e2['us'] / e1['us'] - 1) * 100:+.2f}%",
                    f"{e1['blocks']}x{e1['reps']} {e1['stop']}",
                    f"{e1['spent_s']:.2f}",
                    f"{e1['wall_ratio']:.2f}",
                    e1["mode"],
                ]
            )
    print(
        f"device: {props.name}, sm {props.major}.{props.minor}, {props.multi_processor_count} SMs, "
        f"L2 {props.L2_cache_size >> 20} MiB; torch {torch.__version__}; {time.strftime('%Y-%m-%d')}"
    )
    print(
        tabulate(
            rows,
            headers=[
                "shape",
                "variant",
                "sdpa backend",
                "per-launch us",
                "do_bench us",
                "engine us ±CI",
                "engine A/A us ±CI",
                "A/A diff",
                "blocks x reps, stop",
                "time s",
                "wall/event",
                "mode",
            ],
            disable_numparse=True,
        )
    )
    doc = {"device": props.name, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "rows": out}
    for path in output_paths("timing_check.json", args.json):
        path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
