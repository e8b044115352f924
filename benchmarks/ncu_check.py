"""Does the reported time agree with Nsight Compute's gpu__time_duration for single-kernel variants?

Three modes:
  python benchmarks/ncu_check.py --launch     runs each (variant, shape) LAUNCHES times over 8 rotating
                                              input copies inside a profiler range: the program ncu profiles
  python benchmarks/ncu_check.py --compare    times the same cases with the engine in this process, runs
                                              ncu on --launch (clock control off, caches flushed, as the
                                              engine does), and prints both with their difference
  python benchmarks/ncu_check.py --sweep 8,16,32,64
                                              single launches against graphs of back-to-back calls, both
                                              profiled by ncu (below); ignores --warm-calls and --graph

A third column times each call alone after the GPU sat idle for 2 ms (caches flushed, events inside a
one-call graph). It includes the fixed cost of starting a graph on an idle GPU, not the kernel, so it bounds
nothing; it is kept so that the recorded run can be repeated.

Clocks: ncu also reads each launch's cycle count and SM clock (gpc__cycles_elapsed), and NVML samples the
SM clock every millisecond while the engine measures (a thread beside the engine, which did not move its
figures). "ncu cycles at the engine clock" divides ncu's cycles by NVML's clock; that column shows that
NVML does not report the clock a kernel runs at. The sweep below compares clocks with ncu's own counter. --warm-calls
N runs the variant N times back to back, unprofiled, before each
profiled launch (the GPU busy until ncu takes over). --graph N profiles CUDA graphs of N back-to-back calls as
one workload each (ncu --graph-profiling graph): ncu then times the calls as the engine runs them, with no
idle GPU between calls, and its figures are divided by N. A graph carries a fixed start-up cost under ncu, so --sweep
8,16,32,64 profiles several sizes and takes the slope over N: the time,
cycles and clock of one more back-to-back call, set against a single serialised launch.

The engine runs outside ncu: under ncu, even with profiling off, CUDA-graph replays run far slower, so one
process cannot serve both. Two processes can differ by a few percent on their own
(benchmarks/placement_probe.py), which is part of any difference printed here.
Measured results: benchmarks/results/h200_2026-11-21/README.md, sections 5, 10 and 13.
"""

from __future__ import annotations

import argparse
import csv
import io
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from tabulate import tabulate

CASES = [
    ("triton_flash", (16, 8, 512, 64)),
    ("triton_flash", (4, 16, 2048, 64)),
    ("cuda_wmma", (16, 8, 512, 64)),
    ("cuda_wmma", (4, 16, 2048, 64)),
    ("cuda_tiled", (8, 8, 256, 64)),
]
LAUNCHES = 40
METRICS = ("gpu__time_duration.sum", "gpc__cycles_elapsed.max", "gpc__cycles_elapsed.avg.per_second")


def _inputs(shape: tuple[int, int, int, int]) -> tuple[torch.Tensor, ...]:
    return tuple(torch.randn(*shape, device="cuda", dtype=torch.float16) for _ in range(3))


def launch(warm_calls: int = 0, graph_calls: int = 0) -> None:
    from kernels import KERNELS

    cudart = torch.cuda.cudart()
    for name, shape in CASES:
        copies = [_inputs(shape) for _ in range(8)]
        fn = KERNELS[name]
        fn(*copies[0], True)  # build / JIT outside the profiled range
        torch.cuda.synchronize()
        if graph_calls:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for j in range(graph_calls):
                    fn(*copies[j % len(copies)], True)
            g.replay()
            torch.cuda.synchronize()
            cudart.cudaProfilerStart()
            for _ in range(LAUNCHES):
                g.replay()
            torch.cuda.synchronize()
            cudart.cudaProfilerStop()
            continue
        if not warm_calls:
            cudart.cudaProfilerStart()
        for i in range(LAUNCHES):
            if warm_calls:  # a busy GPU, unprofiled, right before each profiled launch
                for j in range(warm_calls):
                    fn(*copies[(i + j + 1) % len(copies)], True)
                cudart.cudaProfilerStart()
            fn(*copies[i % len(copies)], True)
            if warm_calls:
                cudart.cudaProfilerStop()
        torch.cuda.synchronize()
        if not warm_calls:
            cudart.cudaProfilerStop()


class SmClock:
    """NVML's current SM clock of CUDA device 0, sampled every millisecond on a thread while `with` is open
    (no samples where pynvml is missing; the plugin's own NVML access and GPU lookup)."""

    def __init__(self) -> None:
        from pytest_perfguard.research import nvml, nvml_handle

        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nv = nvml()
        self._handle = (
            None if self._nv is None else nvml_handle(self._nv, str(torch.cuda.get_device_properties(0).uuid))
        )
        self.available = self._handle is not None

    def read(self) -> int | None:
        if not self.available:
            return None
        try:
            return int(self._nv.nvmlDeviceGetClockInfo(self._handle, self._nv.NVML_CLOCK_SM))
        except Exception:
            return None

    def _run(self) -> None:
        while not self._stop.is_set():
            if (mhz := self.read()) is not None:
                self.samples.append(mhz)
            time.sleep(0.001)

    def __enter__(self) -> SmClock:
        self.samples, self._stop = [], threading.Event()
        if self.available:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def median(self) -> float:
        return statistics.median(self.samples) if self.samples else float("nan")


def isolated_us(fn: Callable[..., torch.Tensor], copies: list[tuple[torch.Tensor, ...]], gap_s: float = 0.002) -> float:
    """Median time of single launches after an idle GPU: L2 flushed, the GPU left idle for gap_s, then one
    call in a one-call CUDA graph between two timing events recorded inside the graph (no host launch
    latency, but the graph's own start on an idle GPU is included)."""
    flush = torch.empty(2 * torch.cuda.get_device_properties(0).L2_cache_size, dtype=torch.uint8, device="cuda")
    graphs = []
    for q, k, v in copies:
        fn(q, k, v, True)
        start, end = (
            torch.cuda.Event(enable_timing=True, external=True),
            torch.cuda.Event(enable_timing=True, external=True),
        )
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


def _engine() -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """Per case: the engine's time (us), NVML's median SM clock while it measured (MHz), and the isolated
    launch time (us)."""
    from kernels import KERNELS
    from pytest_perfguard.research import CudaTimer, MeasureConfig, measure

    timer = CudaTimer()
    clock = SmClock()
    engine: dict[str, float] = {}
    engine_mhz: dict[str, float] = {}
    isolated: dict[str, float] = {}
    for name, shape in CASES:
        copies = [_inputs(shape) for _ in range(8)]
        fn = KERNELS[name]

        def call(i: int, fn=fn, copies=copies):
            q, k, v = copies[i % len(copies)]
            return lambda: fn(q, k, v, True)

        with clock:
            engine[f"{name} {shape}"] = measure(call, None, timer, MeasureConfig(min_time_s=0.3)).time.estimate / 1e3
        engine_mhz[f"{name} {shape}"] = clock.median()
        isolated[f"{name} {shape}"] = isolated_us(fn, copies)
    return engine, engine_mhz, isolated


def compare(cache_control: str = "all", warm_calls: int = 0, graph_calls: int = 0) -> int:
    engine, engine_mhz, isolated = _engine()
    rows = _profile(cache_control, warm_calls, graph_calls)
    return _print(engine, engine_mhz, isolated, rows, cache_control, warm_calls, graph_calls) if rows else 1


def _slope(xs: list[int], ys: list[float]) -> float:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def sweep(cache_control: str, sizes: list[int]) -> int:
    """Single launches against back-to-back calls, both timed by ncu: graphs of N calls for each N in
    sizes, each profiled as one workload. The slope of a graph's duration and cycles over N is the cost of
    one more back-to-back call, free of the graph's fixed start-up; cycles over time is the SM clock the
    calls ran at. If the engine differs from a single launch only because the clock differs, the engine
    agrees with the back-to-back slope and the cycles per call stay the same. The last columns put a single
    launch's cycles at the clock of the longest graphs: the single launch's work at the back-to-back clock.
    (Under ncu a graph's start-up cost varies from graph to graph, so the slopes scatter by a few percent;
    the clocks do not.)"""
    engine, _, _ = _engine()
    single = _profile(cache_control)
    graphs = {n: _profile(cache_control, graph_calls=n) for n in sizes}
    if not single or not all(graphs.values()):
        return 1
    s_dur, s_cyc, s_rate = (_per_case(single, m) for m in METRICS)
    g = {n: [_per_case(rows, m) for m in METRICS] for n, rows in graphs.items()}
    table, per_n = [], []
    for k, (name, shape) in enumerate(CASES):
        e = engine[f"{name} {shape}"]
        t1, c1, f1 = _median(s_dur[k]) * 1e6, _median(s_cyc[k]), _median(s_rate[k]) / 1e6
        tb = _slope(sizes, [_median(g[n][0][k]) * 1e6 for n in sizes])
        cb = _slope(sizes, [_median(g[n][1][k]) for n in sizes])
        fb = cb / tb
        f_long = _median(g[max(sizes)][2][k]) / 1e6  # the clock of the longest graphs: least start-up in it
        adjusted = c1 / f_long
        per_n.append(
            [name, "B{} H{} S{} D{}".format(*shape)]
            + [
                f"{_median(g[n][0][k]) * 1e6 / n:.2f} us, {_median(g[n][1][k]) / n / 1e3:.1f} kc, "
                f"{_median(g[n][2][k]) / 1e6:.0f} MHz"
                for n in sizes
            ]
        )
        table.append(
            [
                name,
                "B{} H{} S{} D{}".format(*shape),
                f"{e:.2f}",
                f"{t1:.2f}",
                f"{c1 / 1e3:.1f}",
                f"{f1:.0f}",
                f"{tb:.2f}",
                f"{cb / 1e3:.1f}",
                f"{fb:.0f}",
                f"{(e / t1 - 1) * 100:+.1f}%",
                f"{(e / tb - 1) * 100:+.1f}%",
                f"{(cb / c1 - 1) * 100:+.1f}%",
                f"{(fb / f1 - 1) * 100:+.1f}%",
                f"{f_long:.0f}",
                f"{adjusted:.2f}",
                f"{(e / adjusted - 1) * 100:+.1f}%",
            ]
        )
    props = torch.cuda.get_device_properties(0)
    print(
        f"device: {props.name}; torch {torch.__version__}; {time.strftime('%Y-%m-%d')}; ncu --cache-control "
        f"{cache_control} --clock-control none; single: median of {LAUNCHES} serialised launches; back-to-back: "
        f"least-squares slope over graphs of {sizes} calls (median of {LAUNCHES} graphs each), profiled whole"
    )
    print(
        tabulate(
            table,
            headers=[
                "variant",
                "shape",
                "engine us",
                "single us",
                "single kcycles",
                "single MHz",
                "back-to-back us/call",
                "back-to-back kcycles/call",
                "back-to-back MHz",
                "engine vs single",
                "engine vs back-to-back",
                "cycles b2b vs single",
                "clock b2b vs single",
                f"MHz in graphs of {max(sizes)}",
                "single cycles at that clock us",
                "engine vs that",
            ],
            disable_numparse=True,
        )
    )
    print("per graph size: median over graphs of (duration, cycles) / N, and the graph's mean SM clock")
    print(tabulate(per_n, headers=["variant", "shape", *(f"N={n}" for n in sizes)], disable_numparse=True))
    return 0


def _profile(cache_control: str = "all", warm_calls: int = 0, graph_calls: int = 0) -> list[dict[str, str]]:
    """Runs --launch under ncu; its CSV rows (empty after printing why, when ncu gave none)."""
    ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    cmd = [
        ncu,
        "--profile-from-start",
        "off",
        "--clock-control",
        "none",
        "--cache-control",
        cache_control,
        "--metrics",
        ",".join(METRICS),
        "--csv",
        sys.executable,
        __file__,
        "--launch",
        "--warm-calls",
        str(warm_calls),
        "--graph",
        str(graph_calls),
    ]
    if graph_calls:
        cmd[1:1] = ["--graph-profiling", "graph"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    rows = list(csv.DictReader(io.StringIO(proc.stdout[proc.stdout.find('"ID"') :])))
    if not rows:
        print("ncu produced no rows:\n", proc.stdout[-3000:], proc.stderr[-3000:])
    return rows


_PREFIX = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "k": 1e3, "m": 1e-3, "u": 1e-6, "n": 1e-9}
_TIME = {"second": 1.0, "s": 1.0, "msecond": 1e-3, "ms": 1e-3, "usecond": 1e-6, "us": 1e-6, "nsecond": 1e-9, "ns": 1e-9}


def _base(value: str, unit: str) -> float:
    """An ncu CSV value in base units: seconds, cycles, or cycles (Hz) per second; ncu scales units
    (ns, Kcycle, cycle/nsecond, Ghz) to the value's size."""
    v = float(value.replace(",", ""))
    u = unit.strip()
    if u in _TIME:
        return v * _TIME[u]
    if u.lower().endswith("hz"):
        return v * _PREFIX.get(u[:-2].upper() if len(u) > 2 else "", float("nan"))
    if "/" in u:
        num, den = u.split("/", 1)
        return _base(str(v), num) / _TIME.get(den, float("nan"))
    if u.endswith("cycle"):
        return v * _PREFIX.get(u[:-5], float("nan"))
    return float("nan")


def _per_case(rows: list[dict[str, str]], metric: str) -> list[list[float]]:
    # Rows come in launch order: LAUNCHES kernels per case (single-kernel variants).
    values = [_base(r["Metric Value"], r["Metric Unit"]) for r in rows if r.get("Metric Name") == metric]
    return [values[i * LAUNCHES : (i + 1) * LAUNCHES] for i in range(len(CASES))]


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _print(
    engine: dict[str, float],
    engine_mhz: dict[str, float],
    isolated: dict[str, float],
    rows: list[dict[str, str]],
    cache_control: str,
    warm_calls: int,
    graph_calls: int,
) -> int:
    duration, cycles, rate = (_per_case(rows, m) for m in METRICS)
    per_call = graph_calls or 1  # a graph's figures cover graph_calls calls
    units = sorted({f"{r['Metric Name']}: {r['Metric Unit']}" for r in rows if r.get("Metric Name") in METRICS})
    table = []
    for k, (name, shape) in enumerate(CASES):
        key = f"{name} {shape}"
        e, mhz, i = engine[key], engine_mhz[key], isolated[key]
        n = _median(duration[k]) * 1e6 / per_call
        n_mhz = _median(rate[k]) / 1e6
        n_cycles = _median(cycles[k]) / per_call
        at_engine_clock = n_cycles / mhz if mhz == mhz else float("nan")  # cycles / MHz = us
        table.append(
            [
                name,
                "B{} H{} S{} D{}".format(*shape),
                f"{e:.2f}",
                f"{n:.2f}",
                f"{(e / n - 1) * 100:+.1f}%",
                f"{mhz:.0f}",
                f"{n_mhz:.0f}",
                f"{n_cycles / 1e3:.1f}",
                f"{at_engine_clock:.2f}",
                f"{(e / at_engine_clock - 1) * 100:+.1f}%",
                f"{i:.2f}",
                f"{(i / n - 1) * 100:+.1f}%",
            ]
        )
    props = torch.cuda.get_device_properties(0)
    print(
        f"device: {props.name}; torch {torch.__version__}; {time.strftime('%Y-%m-%d')}; ncu units {units}; "
        f"{LAUNCHES} profiled launches per case on 8 rotating input copies; engine in this process, ncu in a child; "
        f"ncu --cache-control {cache_control}; {warm_calls} unprofiled back-to-back calls before each profiled one; "
        + (
            f"ncu profiles graphs of {graph_calls} back-to-back calls (figures per call)"
            if graph_calls
            else "ncu profiles single launches"
        )
    )
    print(
        tabulate(
            table,
            headers=[
                "variant",
                "shape",
                "engine us",
                "ncu gpu__time_duration us (median)",
                "engine vs ncu",
                "engine SM MHz (NVML median)",
                "ncu SM MHz (median)",
                "ncu kcycles (median)",
                "ncu cycles at engine clock us",
                "engine vs that",
                "isolated launch us",
                "isolated vs ncu",
            ],
            disable_numparse=True,
        )
    )
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--launch", action="store_true")
    ap.add_argument("--compare", action="store_true")
    ap.add_argument(
        "--cache-control",
        default="all",
        choices=["all", "none"],
        help="ncu's cache control: all (flush every cache before each profiled launch) or none",
    )
    ap.add_argument(
        "--warm-calls",
        type=int,
        default=0,
        help="unprofiled back-to-back calls before each profiled launch (0: none, as before)",
    )
    ap.add_argument(
        "--graph",
        type=int,
        default=0,
        metavar="N",
        help="profile CUDA graphs of N back-to-back calls as one workload each (0: single launches)",
    )
    ap.add_argument(
        "--sweep",
        default="",
        metavar="N,N,...",
        help="compare single launches with back-to-back calls: graphs of these sizes, profiled whole",
    )
    a = ap.parse_args()
    if a.sweep:
        try:
            sizes = sorted({int(n) for n in a.sweep.split(",") if n.strip()})
        except ValueError:
            ap.error(f"--sweep takes graph sizes like 8,16,32,64, not {a.sweep!r}")
        if len(sizes) < 2 or sizes[0] < 1:
            ap.error("--sweep needs at least two different graph sizes, each at least 1 (a slope needs two points)")
        raise SystemExit(sweep(a.cache_control, sizes))
    if a.launch:
        launch(a.warm_calls, a.graph)
        raise SystemExit(0)
    raise SystemExit(compare(a.cache_control, a.warm_calls, a.graph))
