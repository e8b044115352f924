"""Does the reported time agree with Nsight Compute's gpu__time_duration for single-kernel variants?

Two modes:
  python benchmarks/ncu_check.py --launch     runs each (variant, shape) LAUNCHES times over 8 rotating
                                              input copies inside a profiler range: the program ncu profiles
  python benchmarks/ncu_check.py --compare    times the same cases with the engine in this process, runs
                                              ncu on --launch (clock control off, caches flushed, as the
                                              engine does), and prints both with their difference

A third column times each call alone after the GPU sat idle for 2 ms (caches flushed, events inside a
one-call graph). On an H200 it read 3-8 us above ncu on every case (a fixed cost of starting a graph on an
idle GPU, not the kernel), so it bounds nothing; it is kept so that the recorded run can be repeated.

The engine runs outside ncu: under ncu, even with profiling off, CUDA-graph replays ran 30-185% slower
(H200, 2026-11-21), so one process cannot serve both. Two processes can differ by a few percent on their
own (benchmarks/placement_probe.py), which is part of any difference printed here.
"""

from __future__ import annotations

import argparse
import csv
import io
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from tabulate import tabulate

CASES = [("triton_flash", (16, 8, 512, 64)), ("triton_flash", (4, 16, 2048, 64)), ("cuda_wmma", (16, 8, 512, 64)),
         ("cuda_wmma", (4, 16, 2048, 64)), ("cuda_tiled", (8, 8, 256, 64))]
LAUNCHES = 40


def _inputs(shape: tuple[int, int, int, int]) -> tuple[torch.Tensor, ...]:
    return tuple(torch.randn(*shape, device="cuda", dtype=torch.float16) for _ in range(3))


def launch() -> None:
    from kernels import VARIANTS

    for name, shape in CASES:
        copies = [_inputs(shape) for _ in range(8)]
        fn = VARIANTS[name].fn
        fn(*copies[0], True)  # build / JIT outside the profiled range
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        for i in range(LAUNCHES):
            fn(*copies[i % len(copies)], True)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()


def isolated_us(fn: Callable[..., torch.Tensor], copies: list[tuple[torch.Tensor, ...]], gap_s: float = 0.002) -> float:
    """Median time of single launches after an idle GPU: L2 flushed, the GPU left idle for gap_s, then one
    call in a one-call CUDA graph between two timing events recorded inside the graph (no host launch
    latency, but the graph's own start on an idle GPU is included)."""
    flush = torch.empty(2 * torch.cuda.get_device_properties(0).L2_cache_size, dtype=torch.uint8, device="cuda")
    graphs = []
    for q, k, v in copies:
        fn(q, k, v, True)
        start, end = torch.cuda.Event(enable_timing=True, external=True), torch.cuda.Event(enable_timing=True, external=True)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            start.record()
            fn(q, k, v, True)
            end.record()
        graphs.append((g, start, end))
    times = []
    for i in range(LAUNCHES):
        g, start, end = graphs[i % len(graphs)]
        flush.zero_()
        torch.cuda.synchronize()
        time.sleep(gap_s)
        g.replay()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def compare(cache_control: str = "all") -> int:
    from kernels import VARIANTS
    from pytest_perfguard.timing import CudaTimer, MeasureConfig, measure

    timer = CudaTimer()
    engine: dict[str, float] = {}
    isolated: dict[str, float] = {}
    for name, shape in CASES:
        copies = [_inputs(shape) for _ in range(8)]
        fn = VARIANTS[name].fn

        def call(i: int, fn=fn, copies=copies):
            q, k, v = copies[i % len(copies)]
            return lambda: fn(q, k, v, True)

        engine[f"{name} {shape}"] = measure(call, None, timer, MeasureConfig(min_time_s=0.3)).time.estimate / 1e3
        isolated[f"{name} {shape}"] = isolated_us(fn, copies)
    rows = _profile(cache_control)
    return _print(engine, isolated, rows, cache_control) if rows else 1


def _profile(cache_control: str = "all") -> list[dict[str, str]]:
    """Runs --launch under ncu; its CSV rows (empty after printing why, when ncu gave none)."""
    ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    cmd = [ncu, "--profile-from-start", "off", "--clock-control", "none", "--cache-control", cache_control,
           "--metrics", "gpu__time_duration.sum", "--csv", sys.executable, __file__, "--launch"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    rows = list(csv.DictReader(io.StringIO(proc.stdout[proc.stdout.find('"ID"'):])))
    if not rows:
        print("ncu produced no rows:\n", proc.stdout[-3000:], proc.stderr[-3000:])
    return rows


def _print(engine: dict[str, float], isolated: dict[str, float], rows: list[dict[str, str]], cache_control: str) -> int:
    # Rows come in launch order: LAUNCHES kernels per case (single-kernel variants).
    per_case: list[list[float]] = []
    to_us = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}
    values = [float(r["Metric Value"].replace(",", "")) * to_us.get(r["Metric Unit"], float("nan"))
              for r in rows if r.get("Metric Name") == "gpu__time_duration.sum"]
    units = {r["Metric Unit"] for r in rows if r.get("Metric Name") == "gpu__time_duration.sum"}
    for i in range(len(CASES)):
        per_case.append(values[i * LAUNCHES:(i + 1) * LAUNCHES])
    table = []
    for (name, shape), ncu_us in zip(CASES, per_case, strict=True):
        e = engine[f"{name} {shape}"]
        n = statistics.median(ncu_us) if ncu_us else float("nan")
        i = isolated[f"{name} {shape}"]
        table.append([name, "B{} H{} S{} D{}".format(*shape), f"{e:.2f}", f"{n:.2f}", f"{(e / n - 1) * 100:+.1f}%",
                      f"{i:.2f}", f"{(i / n - 1) * 100:+.1f}%"])
    props = torch.cuda.get_device_properties(0)
    print(f"device: {props.name}; torch {torch.__version__}; {time.strftime('%Y-%m-%d')}; ncu units {sorted(units)}; "
          f"{LAUNCHES} profiled launches per case on 8 rotating input copies; engine in this process, ncu in a child; "
          f"ncu --cache-control {cache_control}")
    print(tabulate(table, headers=["variant", "shape", "engine us", "ncu gpu__time_duration us (median)", "engine vs ncu",
                                   "isolated launch us", "isolated vs ncu"],
                   disable_numparse=True))
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--launch", action="store_true")
    ap.add_argument("--compare", action="store_true")
    ap.add_argument("--cache-control", default="all", choices=["all", "none"],
                    help="ncu's cache control: all (flush every cache before each profiled launch) or none")
    a = ap.parse_args()
    if a.launch:
        launch()
        raise SystemExit(0)
    raise SystemExit(compare(a.cache_control))
