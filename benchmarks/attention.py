"""Attention variants against torch SDPA over the project's shape grid.

For every shape: check each variant against a float64 oracle (FlashAttention's bound), then time it
interleaved with SDPA's default backend and report median time, TFLOP/s, the paired ratio to SDPA's default
backend and to SDPA's fastest backend for that shape (which is not always the default), and which backends
those were. Ends with the geometric mean of triton_flash's ratios over the grid.

Timing uses the project's engine (``pytest_perfguard.measure.timing.measure``: CUDA-graph replays of N calls on
rotating input copies, events, L2 flushed before each replay, variant and reference in random order per
block, paired per-block ratios) when it imports; otherwise a built-in timer of the same shape (graph of 20
calls, >= 30 paired replays in random order, median). ``--sweep`` also times every Triton tile config of a
wider list on each shape, which is how ``kernels.triton_flash.CONFIGS`` was chosen.

    python benchmarks/attention.py                 # GPU grid
    python benchmarks/attention.py --quick         # CPU smoke run on tiny shapes
    python benchmarks/attention.py --json out.json --sweep
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import random
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._output import output_paths
from benchmarks._timing import EventTimer, capture, replay_times_ms, warm_up
from kernels import KERNELS
from kernels.reference import AttentionFn, attention_flops, math_attention
from kernels.sdpa import fastest_backend, sdpa, sdpa_backend
from kernels.triton_flash import triton_flash

Inputs = list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]

GRID: list[tuple[int, int, int]] = [  # (B, H, S); D, dtype and causal come from the options
    (1, 1, 128),
    (4, 8, 128),
    (8, 8, 128),
    (8, 8, 256),
    (16, 8, 512),
    (4, 16, 2048),
    (8, 16, 4096),
]
QUICK_GRID: list[tuple[int, int, int]] = [(1, 1, 16), (1, 2, 64), (2, 2, 128)]
# Tile configs tried by --sweep: (BLOCK_M, BLOCK_N, num_warps, num_stages) per variant of the kernel
# ("eager": rescale every tile; "lazy": lazy rescaling; "tma": tensor-descriptor loads, eager).
SWEEP: dict[str, dict[int, list[tuple[int, int, int, int]]]] = {
    "eager": {
        64: [(64, 64, 4, 3), (64, 64, 4, 4), (64, 64, 4, 2), (64, 32, 4, 4), (128, 64, 8, 3), (128, 128, 8, 3)],
        128: [(128, 64, 8, 3), (64, 64, 4, 3), (64, 32, 4, 3)],
    },
    "lazy": {
        64: [(64, 64, 4, 3), (64, 64, 4, 4), (64, 64, 4, 2), (64, 32, 4, 4), (128, 64, 8, 3), (128, 128, 8, 3)],
        128: [(128, 64, 8, 3), (64, 64, 4, 3), (64, 32, 4, 3)],
    },
    "tma": {64: [(64, 64, 4, 3)], 128: [(64, 64, 4, 3)]},
}
SDPA_BACKENDS = ("flash", "efficient", "cudnn", "math")
MATH_BACKEND_MAX_S = 512  # the math backend is never the fastest; past this S it only costs time


# ------------------------------------------------------------------------------------------ variants


@dataclass
class Entry:
    """A variant to run, and what it requires (``pytest_perfguard.Variant`` style: names or probes)."""

    fn: AttentionFn
    requires: Any = None


def load_variants(only: str | None = None) -> dict[str, Entry]:
    """Every kernel of ``kernels.KERNELS``, plus the math path; ``unavailable`` skips what cannot run here."""
    found = {name: Entry(fn) for name, fn in KERNELS.items()}
    found["math"] = Entry(math_attention)
    if only:
        wanted = only.split(",")
        found = {k: v for k, v in found.items() if k in wanted}
    return found


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def unavailable(entry: Entry, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> str | None:
    """The variant's declared requirements, its module's ``unavailable_reason()``, then one trial call."""
    if entry.requires is not None:
        try:
            from pytest_perfguard.research import unmet_requirement

            reason = unmet_requirement(entry.requires, str(q.device))
        except ImportError:
            reqs = entry.requires if isinstance(entry.requires, list | tuple) else [entry.requires]
            reason = next((r() for r in reqs if callable(r) and r()), None)
        if reason:
            return str(reason)
    module = sys.modules.get(getattr(entry.fn, "__module__", "") or "")
    probe = getattr(module, "unavailable_reason", None)
    if callable(probe):
        try:
            reason = probe()
        except Exception as exc:
            return f"unavailable_reason() raised {_first_line(exc)}"
        if reason:
            return str(reason)
    try:
        entry.fn(q, k, v, causal)
        if q.is_cuda:
            torch.cuda.synchronize()
    except Exception as exc:
        return _first_line(exc)
    return None


# ------------------------------------------------------------------------------------------ correctness


def oracle(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> tuple[torch.Tensor, float]:
    """float64 answer and the native-precision path's max error, one batch element at a time (memory)."""
    outs = []
    native_err = 0.0
    for b in range(q.shape[0]):
        qb, kb, vb = q[b : b + 1], k[b : b + 1], v[b : b + 1]
        ref = math_attention(qb.double(), kb.double(), vb.double(), causal)
        native = math_attention(qb, kb, vb, causal)
        native_err = max(native_err, (native.double() - ref).abs().max().item())
        outs.append(ref)
        del native
    return torch.cat(outs), native_err


EPS = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5}


def check(
    fn: AttentionFn,
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    causal: bool,
    ref: torch.Tensor,
    native_err: float,
) -> tuple[bool, float, float]:
    """(ok, max abs error, bound): FlashAttention's rule, 2x the native path's error plus a small epsilon."""
    q, k, v = inputs
    out = fn(q, k, v, causal)
    bound = 2 * native_err + EPS[q.dtype]
    if not isinstance(out, torch.Tensor) or out.shape != q.shape or out.dtype != q.dtype:
        return False, math.inf, bound
    if not torch.isfinite(out).all():
        return False, math.inf, bound
    err = (out.double() - ref).abs().max().item()
    return err <= bound, err, bound


# ------------------------------------------------------------------------------------------ timing


@dataclass
class Timed:
    """Per-call time of a variant and its paired ratio to the reference it was interleaved with."""

    time_s: float
    ratio: float
    ratio_lo: float | None = None
    ratio_hi: float | None = None
    method: str = ""
    notes: list[str] = field(default_factory=list)


class Timing:
    """Times a variant against a reference on rotating input copies, with the engine or the built-in timer."""

    def __init__(self, device: torch.device, calls: int, replays: int, budget_s: float, use_engine: bool) -> None:
        self.device = device
        self.calls = calls
        self.replays = replays
        self.budget_s = budget_s
        self.engine: Any = None
        if use_engine:
            try:
                from pytest_perfguard.research import make_timer
                from pytest_perfguard.research import timing as engine

                self.engine = engine
                self.timer = make_timer("cuda" if device.type == "cuda" else "cpu")
            except Exception as exc:
                print(f"note: timing engine not usable ({_first_line(exc)}); using the built-in timer")
                self.engine = None

    def pair(
        self, fn: AttentionFn, ref: AttentionFn, inputs: Inputs, causal: bool, budget_s: float | None = None
    ) -> Timed:
        budget = self.budget_s if budget_s is None else budget_s
        if self.engine is not None:
            try:
                return self._engine_pair(fn, ref, inputs, causal, budget)
            except Exception as exc:
                note = f"engine failed ({_first_line(exc)}); built-in timer used"
                timed = self._builtin_pair(fn, ref, inputs, causal)
                timed.notes.append(note)
                return timed
        return self._builtin_pair(fn, ref, inputs, causal)

    def _engine_pair(self, fn: AttentionFn, ref: AttentionFn, inputs: Inputs, causal: bool, budget: float) -> Timed:
        engine = self.engine
        cfg = engine.MeasureConfig(budget_s=budget, min_blocks=8, samples_per_block=5, max_reps=self.calls)

        def side(f: AttentionFn) -> Callable[[int], Callable[[], object]]:
            return lambda i: lambda: f(*inputs[i % len(inputs)], causal)

        m = engine.measure(side(fn), side(ref), self.timer, cfg, copies=self.calls)
        ratio = m.ratio
        notes = list(m.notes)
        if getattr(self.timer, "capture_errors", None):
            notes.append(f"graph capture failed: {self.timer.capture_errors[-1][:200]}")
            self.timer.capture_errors.clear()
        return Timed(
            time_s=m.time.estimate * 1e-9,
            ratio=ratio.estimate,
            ratio_lo=ratio.lo,
            ratio_hi=ratio.hi,
            method=f"engine:{m.mode}:{m.blocks}x{m.samples_per_block}x{m.reps}:{m.stop_reason}",
            notes=notes,
        )

    def _builtin_pair(self, fn: AttentionFn, ref: AttentionFn, inputs: Inputs, causal: bool) -> Timed:
        run_fn = self._prepare(fn, inputs, causal)
        run_ref = self._prepare(ref, inputs, causal)
        t_fn: list[float] = []
        t_ref: list[float] = []
        for _ in range(self.replays):
            order = [(run_fn, t_fn), (run_ref, t_ref)]
            random.shuffle(order)
            for run, sink in order:
                sink.append(run())
        ratios = sorted(a / b for a, b in zip(t_fn, t_ref, strict=True))
        return Timed(
            time_s=statistics.median(t_fn) / self.calls,
            ratio=statistics.median(ratios),
            ratio_lo=ratios[len(ratios) // 10],
            ratio_hi=ratios[-1 - len(ratios) // 10],
            method=f"builtin:{'cuda-graph' if self.device.type == 'cuda' else 'cpu'}:{self.replays}x{self.calls}",
        )

    def _prepare(self, fn: AttentionFn, inputs: Inputs, causal: bool) -> Callable[[], float]:
        """A callable timing one replay of ``calls`` calls (seconds); a CUDA graph where capture works."""
        calls = [(lambda i=i: fn(*inputs[i % len(inputs)], causal)) for i in range(self.calls)]
        for call in calls[:3]:
            call()
        if self.device.type != "cuda":

            def run_cpu() -> float:
                t0 = time.perf_counter()
                for call in calls:
                    call()
                return time.perf_counter() - t0

            return run_cpu
        warm_up(calls)
        timer = EventTimer()
        try:
            graph = capture(calls)
            return lambda: replay_times_ms(graph, 1, timer=timer)[0] * 1e-3
        except Exception:
            torch.cuda.synchronize()

            def run_stream() -> None:
                for call in calls:
                    call()

            return lambda: timer(run_stream) * 1e-3


# ------------------------------------------------------------------------------------------ the run


def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v > 0 and math.isfinite(v)]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def make_inputs(
    shape: tuple[int, int, int, int], dtype: torch.dtype, device: torch.device, copies: int, seed: int
) -> Inputs:
    gen = torch.Generator(device=device).manual_seed(seed)
    return [
        tuple(torch.randn(*shape, generator=gen, device=device, dtype=dtype) for _ in range(3))  # type: ignore[misc]
        for _ in range(copies)
    ]


def environment(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": dt.date.today().isoformat(),
        "device_type": device.type,
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception:
        info["triton"] = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            device=props.name,
            capability=f"sm_{props.major}{props.minor}",
            cuda=torch.version.cuda,
            cudnn=torch.backends.cudnn.version(),
            sms=props.multi_processor_count,
            l2_bytes=getattr(props, "L2_cache_size", None),
        )
    else:
        info.update(device=platform.processor() or platform.machine(), threads=torch.get_num_threads())
    return info


def fmt_us(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e6:.1f}"


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    dtype = getattr(torch, args.dtype) if device.type == "cuda" or args.dtype != "float16" else torch.float32
    if args.quick and device.type == "cpu":
        dtype = torch.float32
    grid = QUICK_GRID if args.quick else GRID
    if args.shapes:
        grid = [tuple(int(x) for x in item.split("x")) for item in args.shapes.split(",")]  # type: ignore[misc]
    causal = not args.no_causal
    d = args.head_dim
    variants = load_variants(args.variants)
    budget = min(args.budget, 0.5) if args.quick else args.budget
    timing = Timing(device, args.calls, args.replays, budget, use_engine=not args.builtin_timer)
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    report: dict[str, Any] = {
        "schema_version": 1,
        "environment": environment(device),
        "dtype": str(dtype).removeprefix("torch."),
        "head_dim": d,
        "causal": causal,
        "seed": seed,
        "method": ("engine" if timing.engine is not None else "builtin")
        + f"; {args.calls} calls per sample on rotating input copies; ratio = paired per-sample"
        " (engine: per-block) variant/SDPA-default; ratio to fastest = ratio to default x"
        " default/fastest (paired, same method)",
        "flops_convention": "4*B*H*S*S*D, halved for causal",
        "shapes": [],
    }
    print(f"# {report['environment']}")
    print(f"# dtype={report['dtype']} D={d} causal={causal} seed={seed} method: {report['method']}")
    for b, h, s in grid:
        shape = (b, h, s, d)
        flops = attention_flops(b, h, s, d, causal)
        inputs = make_inputs(shape, dtype, device, args.calls if device.type == "cuda" else 2, seed)
        q, k, v = inputs[0]
        row: dict[str, Any] = {"B": b, "H": h, "S": s, "D": d, "flops": flops, "variants": {}}
        row["sdpa_default_backend"] = sdpa_backend(q, k, v, causal)
        ref, native_err = oracle(q, k, v, causal) if args.check else (None, 0.0)
        row["native_max_abs_err"] = native_err if args.check else None

        # SDPA backends: each timed against the default; the fastest one is the second reference.
        backends = (
            tuple(n for n in SDPA_BACKENDS if n != "math" or s <= MATH_BACKEND_MAX_S)
            if device.type == "cuda"
            else ("cpu-flash", "math")
        )
        ratio_to_default: dict[str, float] = {}

        def time_backend(
            fn: AttentionFn, ratio_to_default: dict[str, float] = ratio_to_default, inputs: Inputs = inputs
        ) -> float:
            timed = timing.pair(fn, sdpa, inputs, causal)
            ratio_to_default[fn.__name__] = timed.ratio
            return timed.time_s * 1e3

        fb = fastest_backend(q, k, v, causal, time_ms=time_backend, backends=backends)
        by_name = {n: ratio_to_default[f"sdpa_{n.replace('-', '_')}"] for n in fb.times_ms}
        row["sdpa_backends"] = {
            n: {"time_us": fb.times_ms[n] * 1e3, "ratio_to_default": by_name[n]} for n in fb.times_ms
        }
        row["sdpa_unavailable"] = fb.unavailable
        fastest_ratio = min(by_name.values())  # fastest / default, paired
        row["sdpa_fastest_backend"] = fb.fastest if fastest_ratio < 1.0 else row["sdpa_default_backend"]
        fastest_ratio = min(fastest_ratio, 1.0)

        for name, variant in variants.items():
            fn = variant.fn
            entry: dict[str, Any] = {}
            row["variants"][name] = entry
            reason = unavailable(variant, q, k, v, causal)
            if reason is not None:
                entry["skipped"] = reason
                continue
            if args.check:
                assert ref is not None
                ok, err, bound = check(fn, inputs[0], causal, ref, native_err)
                entry.update(correct=ok, max_abs_err=err, bound=bound)
                if not ok:
                    entry["skipped"] = f"incorrect: max abs error {err:.3g} > bound {bound:.3g}"
                    continue
            try:
                timed = timing.pair(fn, sdpa, inputs, causal)
            except Exception as exc:
                entry["skipped"] = f"timing failed: {_first_line(exc)}"
                traceback.print_exc()
                continue
            entry.update(
                time_us=timed.time_s * 1e6,
                tflops=flops / timed.time_s / 1e12,
                ratio_default=timed.ratio,
                ratio_default_ci=[timed.ratio_lo, timed.ratio_hi],
                ratio_fastest=timed.ratio / fastest_ratio,
                method=timed.method,
            )
            if timed.notes:
                entry["notes"] = timed.notes
            if name == "triton_flash" and device.type == "cuda":
                from kernels.triton_flash import best_config, best_path

                entry["config"] = best_config(q, causal)
                entry["path"] = best_path(q, causal)

        if args.sweep and device.type == "cuda":
            row["triton_sweep"] = sweep_configs(d, inputs, causal, ref, native_err, timing, args)
        report["shapes"].append(row)
        print_shape(row)
        del inputs, ref
        if device.type == "cuda":
            torch.cuda.empty_cache()
        write_json(report, args)

    for key in ("ratio_default", "ratio_fastest"):
        ratios = [r["variants"].get("triton_flash", {}).get(key) for r in report["shapes"]]
        report.setdefault("triton_flash_geomean", {})[key] = geomean([x for x in ratios if x is not None])
    large = [r["variants"].get("triton_flash", {}).get("ratio_default") for r in report["shapes"] if r["S"] >= 2048]
    report["triton_flash_geomean"]["ratio_default_S>=2048"] = geomean([x for x in large if x is not None])
    print(f"\ntriton_flash geomean over the grid: {report['triton_flash_geomean']}")
    write_json(report, args)
    return report


CORRECTNESS_GRID: list[tuple[int, int, int, int, bool, str]] = [
    (b, 2, s, d, causal, dtype)
    for dtype in ("float16", "bfloat16")
    for d in (64, 128)
    for s in (1, 16, 113, 128, 239, 1023)
    for causal in (False, True)
    for b in (1, 2)
]


def correctness(args: argparse.Namespace) -> dict[str, Any]:
    """Every variant on the shapes that break kernels, against float64; no timing, no pytest needed."""
    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    variants = load_variants(args.variants)
    if device.type == "cuda" and "triton_flash" in variants:
        # Every kernel variant on every shape, whichever the autotuner would pick.
        def fixed(cfg: tuple[int, int, int, int], tma: bool, lazy: bool) -> AttentionFn:
            def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, c: bool) -> torch.Tensor:
                return triton_flash(q, k, v, c, config=cfg, tma=tma, lazy=lazy)

            return run

        requires = variants["triton_flash"].requires
        variants["triton_eager128"] = Entry(fixed((128, 64, 8, 3), False, False), requires)
        variants["triton_lazy64"] = Entry(fixed((64, 64, 4, 3), False, True), requires)
        if torch.cuda.get_device_capability()[0] >= 9:
            variants["triton_tma64"] = Entry(fixed((64, 64, 4, 3), True, False), requires)
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    results: list[dict[str, Any]] = []
    failures = 0
    for b, h, s, d, causal, dtype_name in CORRECTNESS_GRID:
        dtype = getattr(torch, dtype_name)
        ((q, k, v),) = make_inputs((b, h, s, d), dtype, device, 1, seed)
        ref, native_err = oracle(q, k, v, causal)
        row: dict[str, Any] = {
            "B": b,
            "H": h,
            "S": s,
            "D": d,
            "causal": causal,
            "dtype": dtype_name,
            "native_max_abs_err": native_err,
            "variants": {},
        }
        for name, variant in variants.items():
            reason = unavailable(variant, q, k, v, causal)
            if reason is not None:
                row["variants"][name] = {"skipped": reason}
                continue
            ok, err, bound = check(variant.fn, (q, k, v), causal, ref, native_err)
            failures += not ok
            row["variants"][name] = {"correct": ok, "max_abs_err": err, "bound": bound}
        results.append(row)
        cells = "  ".join(
            f"{n}={'skip' if 'skipped' in e else ('ok' if e['correct'] else 'FAIL')}"
            f"{'' if 'skipped' in e else format(e['max_abs_err'], '.2g')}"
            for n, e in row["variants"].items()
        )
        print(f"B{b}H{h}S{s}D{d} {'causal' if causal else 'full  '} {dtype_name:<8} native={native_err:.2g}  {cells}")
    print(f"correctness: {failures} failure(s) over {len(results)} shapes x {len(variants)} variants (seed {seed})")
    report = {
        "schema_version": 1,
        "environment": environment(device),
        "seed": seed,
        "failures": failures,
        "rule": "max abs error vs float64 <= 2 x native-precision math error + eps "
        + str({str(k).removeprefix("torch."): v for k, v in EPS.items()}),
        "correctness": results,
    }
    for path in output_paths("correctness.json"):
        path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return report


def sweep_configs(
    d: int,
    inputs: Inputs,
    causal: bool,
    ref: torch.Tensor | None,
    native_err: float,
    timing: Timing,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Time every Triton tile config of SWEEP (each load path) against SDPA's default backend."""
    sweep: dict[str, Any] = {}
    for path, table in SWEEP.items():
        for cfg in table.get(d, []):
            key = f"{path}:" + "x".join(map(str, cfg))

            def pinned(
                q: torch.Tensor,
                k: torch.Tensor,
                v: torch.Tensor,
                c: bool,
                cfg: tuple[int, int, int, int] = cfg,
                path: str = path,
            ) -> torch.Tensor:
                return triton_flash(q, k, v, c, config=cfg, tma=path == "tma", lazy=path == "lazy")

            try:
                if ref is not None:
                    ok, err, _ = check(pinned, inputs[0], causal, ref, native_err)
                    if not ok:
                        sweep[key] = {"error": f"incorrect ({err:.3g})"}
                        continue
                timed = timing.pair(pinned, sdpa, inputs, causal, budget_s=args.sweep_budget)
                sweep[key] = {"time_us": timed.time_s * 1e6, "ratio_default": timed.ratio}
            except Exception as exc:
                sweep[key] = {"error": _first_line(exc)}
    return sweep


def sweep_only(args: argparse.Namespace) -> dict[str, Any]:
    """Only the Triton config sweep over the grid (no SDPA backend search, no other variants)."""
    device = torch.device("cuda")
    timing = Timing(device, args.calls, args.replays, args.budget, use_engine=not args.builtin_timer)
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    grid = GRID
    if args.shapes:
        grid = [tuple(int(x) for x in item.split("x")) for item in args.shapes.split(",")]  # type: ignore[misc]
    dtype = getattr(torch, args.dtype)
    causal = not args.no_causal
    report: dict[str, Any] = {
        "schema_version": 1,
        "environment": environment(device),
        "seed": seed,
        "dtype": args.dtype,
        "head_dim": args.head_dim,
        "causal": causal,
        "sweep": [],
    }
    for b, h, s in grid:
        inputs = make_inputs((b, h, s, args.head_dim), dtype, device, args.calls, seed)
        q, k, v = inputs[0]
        ref, native_err = oracle(q, k, v, causal) if args.check else (None, 0.0)
        auto = timing.pair(triton_flash, sdpa, inputs, causal, budget_s=args.sweep_budget)
        from kernels.triton_flash import best_config, best_path

        row = {
            "B": b,
            "H": h,
            "S": s,
            "autotuned": {
                "config": best_config(q, causal),
                "path": best_path(q, causal),
                "time_us": auto.time_s * 1e6,
                "ratio_default": auto.ratio,
            },
            "configs": sweep_configs(args.head_dim, inputs, causal, ref, native_err, timing, args),
        }
        report["sweep"].append(row)
        ranked = sorted(
            (v.get("time_us", math.inf), k, v.get("ratio_default"), v.get("error", ""))
            for k, v in row["configs"].items()
        )
        print(
            f"\nB{b} H{h} S{s} D{args.head_dim}: autotuned {row['autotuned']['path']} "
            f"{row['autotuned']['config']} {auto.time_s * 1e6:.1f}us x{auto.ratio:.3f} of SDPA default"
        )
        print("  " + ", ".join(f"{k} {t:.1f}us x{r:.3f}" if r else f"{k} {e[:80]}" for t, k, r, e in ranked))
        del inputs, ref
        torch.cuda.empty_cache()
        for path in output_paths(f"sweep_d{args.head_dim}.json"):
            path.write_text(json.dumps(report, indent=2, sort_keys=True, default=str) + "\n")
    return report


def print_shape(row: dict[str, Any]) -> None:
    head = (
        f"\nB{row['B']} H{row['H']} S{row['S']} D{row['D']}  default={row['sdpa_default_backend']}"
        f"  fastest={row['sdpa_fastest_backend']}  backends: "
        + ", ".join(f"{n} {x['time_us']:.1f}us" for n, x in row["sdpa_backends"].items())
    )
    print(head)
    print(f"  {'variant':<22}{'median us':>11}{'TFLOP/s':>10}{'x default':>11}{'x fastest':>11}  notes")
    for name, e in row["variants"].items():
        if "skipped" in e:
            print(f"  {name:<22}{'skipped: ' + e['skipped']}")
            continue
        extra = f"cfg={e.get('path')}:{e['config']}" if e.get("config") else ""
        print(
            f"  {name:<22}{e['time_us']:>11.1f}{e['tflops']:>10.1f}{e['ratio_default']:>11.3f}"
            f"{e['ratio_fastest']:>11.3f}  {extra} {e['method']}"
        )
    if "triton_sweep" in row:
        ranked = sorted(((v.get("time_us", math.inf), k) for k, v in row["triton_sweep"].items()))
        print("  sweep (path:BMxBNxWxS: us): " + ", ".join(f"{k}: {t:.1f}" for t, k in ranked))


def write_json(report: dict[str, Any], args: argparse.Namespace) -> None:
    text = json.dumps(report, indent=2, sort_keys=True, default=str) + "\n"
    for path in output_paths("attention.json", args.json):
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny shapes (CPU smoke run)")
    p.add_argument("--cpu", action="store_true", help="run on CPU even if CUDA is available")
    p.add_argument(
        "--json",
        help="write the results as JSON here (also to $PERFGUARD_RESULTS_DIR/attention.json when set; "
        "default: benchmarks/out/attention.json)",
    )
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--no-causal", action="store_true")
    p.add_argument("--shapes", help="override the grid: BxHxS,BxHxS,...")
    p.add_argument("--variants", help="comma-separated subset of variant names")
    p.add_argument("--calls", type=int, default=20, help="calls per graph / per sample")
    p.add_argument("--replays", type=int, default=30, help="paired replays (built-in timer)")
    p.add_argument("--budget", type=float, default=2.0, help="seconds per measurement (engine)")
    p.add_argument("--builtin-timer", action="store_true", help="do not use pytest_perfguard.measure.timing")
    p.add_argument("--no-check", dest="check", action="store_false", help="skip the float64 correctness check")
    p.add_argument("--sweep", action="store_true", help="also time every Triton tile config in SWEEP")
    p.add_argument("--sweep-budget", type=float, default=0.6)
    p.add_argument("--sweep-only", action="store_true", help="only the Triton config sweep (GPU)")
    p.add_argument("--seed", type=int)
    p.add_argument(
        "--correctness",
        action="store_true",
        help="only check every variant on the correctness grid (S 1..1023, D 64/128, fp16/bf16)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.correctness:
        return 1 if correctness(args)["failures"] else 0
    if args.sweep_only:
        sweep_only(args)
        return 0
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
