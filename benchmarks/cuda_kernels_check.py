"""Device check of the CUDA attention kernels: build, resources, SASS, correctness, timing vs SDPA.

Run from the repository root on a machine with an NVIDIA GPU::

    python3 benchmarks/cuda_kernels_check.py [--quick] [--no-timing]

Correctness: each variant runs on fresh random inputs (seed printed) and is compared with the float64 math
path; the bound is FlashAttention's rule, max|err| <= 2 * max|err of torch's native-precision math path|
+ 1e-5, plus an allclose(atol=rtol=1e-2) backstop. The output memory is poisoned with NaN first (through
the caching allocator), so an element the kernel fails to write shows up as NaN.

Timing: CUDA events around the replay of a CUDA graph holding N calls (N = 20 for fast calls, fewer for
slow ones), median over 30 replays, divided by N; this is device time without host dispatch. SDPA is timed
the same way with its default dispatch (backend recorded) and each fused backend pinned.

The log and a JSON record are written to $PERFGUARD_RESULTS_DIR when set, else to benchmarks/out/.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import platform
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._output import output_paths
from benchmarks._timing import EventTimer, capture, replay_times_ms, warm_up
from kernels import cuda_ext
from kernels.reference import AttentionFn, attention_flops, math_attention

# (B, H, S, D, dtype, causal): the timing grid, then the correctness-only shapes.
TIMING_GRID: list[tuple[int, int, int, int, torch.dtype, bool]] = [
    (1, 1, 128, 64, torch.float16, True),
    (4, 8, 128, 64, torch.float16, True),
    (8, 8, 128, 64, torch.float16, True),
    (8, 8, 256, 64, torch.float16, True),
    (16, 8, 512, 64, torch.float16, True),
    (4, 16, 2048, 64, torch.float16, True),
    (8, 16, 4096, 64, torch.float16, True),
]
# Beyond the grid: few heads with a long sequence (where KV splitting pays) and head_dim 128 in bf16.
EXTRA_TIMING: list[tuple[int, int, int, int, torch.dtype, bool]] = [
    (1, 2, 8192, 64, torch.float16, True),
    (4, 16, 2048, 128, torch.bfloat16, True),
    (4, 16, 2048, 128, torch.bfloat16, False),
]
CORRECTNESS_SHAPES: list[tuple[int, int, int, int, torch.dtype, bool]] = [
    (1, 2, s, d, dt, c)
    for (d, dt) in ((128, torch.bfloat16), (64, torch.float16))
    for s in (113, 239, 1023, 2048)
    for c in (True, False)
]
QUICK_SHAPES = [(1, 2, 113, 128, torch.bfloat16, True), (1, 2, 239, 64, torch.float16, False)]


class Tee(io.TextIOBase):
    """Echo prints to stdout and keep them for the log file."""

    def __init__(self) -> None:
        self.buf = io.StringIO()

    def write(self, s: str) -> int:
        sys.__stdout__.write(s)
        self.buf.write(s)
        return len(s)

    def flush(self) -> None:
        sys.__stdout__.flush()


def _is_sticky(exc: BaseException) -> bool:
    """Errors that leave the CUDA context unusable: stop instead of reporting every later call as failed."""
    msg = str(exc).lower()
    return any(
        w in msg
        for w in (
            "illegal memory access",
            "illegal address",
            "misaligned address",
            "unspecified launch failure",
            "illegal instruction",
        )
    )


def variants() -> dict[str, AttentionFn]:
    """The four kernels, plus the split kernel with forced split counts (so the combine path is exercised
    even where the heuristic would pick one split)."""
    out: dict[str, AttentionFn] = dict(cuda_ext.VARIANTS)
    out["cuda_splitkv[n=3]"] = lambda q, k, v, c: cuda_ext.cuda_splitkv(q, k, v, c, num_splits=3)
    out["cuda_splitkv[n=max]"] = lambda q, k, v, c: cuda_ext.cuda_splitkv(q, k, v, c, num_splits=64)
    return out


def shape_name(shape: tuple[int, int, int, int, torch.dtype, bool]) -> str:
    B, H, S, D, dt, c = shape
    return f"B{B}H{H}S{S}D{D}-{str(dt).replace('torch.', '')}-{'causal' if c else 'full'}"


# --- correctness ----------------------------------------------------------------------------------------


def chunked_math(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, dtype: torch.dtype, max_bytes: int = 1 << 31
) -> torch.Tensor:
    """math_attention in ``dtype`` over head chunks, so the (S, S) scores of a big shape fit in memory."""
    B, H, S, D = q.shape
    qf, kf, vf = (t.reshape(B * H, 1, S, D) for t in (q, k, v))
    per_head = S * S * torch.finfo(dtype).bits // 8 * 3
    step = max(1, max_bytes // per_head)
    out = torch.empty(B * H, 1, S, D, dtype=dtype, device=q.device)
    for i in range(0, B * H, step):
        sl = slice(i, i + step)
        out[sl] = math_attention(qf[sl].to(dtype), kf[sl].to(dtype), vf[sl].to(dtype), causal)
    return out.reshape(B, H, S, D)


def poison_allocator(like: torch.Tensor, copies: int = 2) -> None:
    """Fill freed caching-allocator blocks of the output's size with NaN, so unwritten outputs read NaN."""
    blocks = [torch.full_like(like, float("nan")) for _ in range(copies)]
    del blocks


@dataclass
class CheckResult:
    variant: str
    shape: str
    ok: bool
    max_err: float
    native_max_err: float
    bound: float
    rel_fro: float
    native_rel_fro: float
    allclose: bool
    finite: bool
    inputs_unchanged: bool
    error: str | None = None
    splits: int | None = None


def check_shape(
    shape: tuple[int, int, int, int, torch.dtype, bool], fns: dict[str, AttentionFn], seed: int
) -> list[CheckResult]:
    B, H, S, D, dt, causal = shape
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=dt, generator=gen) for _ in range(3))
    copies = [t.clone() for t in (q, k, v)]
    ref = chunked_math(q, k, v, causal, torch.float64)
    native = chunked_math(q, k, v, causal, dt).double()
    ref_norm = ref.norm().item()
    native_err = (native - ref).abs().max().item()
    native_fro = (native - ref).norm().item() / ref_norm
    bound = 2 * native_err + 1e-5
    results = []
    for name, fn in fns.items():
        if name == "cuda_splitkv[n=max]" and B * H * S > (1 << 20):
            continue  # 64 fp32 partials of a large shape is gigabytes of workspace for no new coverage
        splits = None
        if name.startswith("cuda_splitkv"):
            req = {"cuda_splitkv": -1, "cuda_splitkv[n=3]": 3, "cuda_splitkv[n=max]": 64}[name]
            splits = cuda_ext.splitkv_num_splits(q, causal, req)
        try:
            poison_allocator(q)
            out = fn(q, k, v, causal)
            torch.cuda.synchronize()
        except Exception as exc:
            results.append(
                CheckResult(
                    name,
                    shape_name(shape),
                    False,
                    math.inf,
                    native_err,
                    bound,
                    math.inf,
                    native_fro,
                    False,
                    False,
                    True,
                    f"{type(exc).__name__}: {exc}",
                    splits,
                )
            )
            if _is_sticky(exc):
                raise
            continue
        od = out.double()
        finite = bool(torch.isfinite(od).all().item())
        err = (od - ref).abs().max().item() if finite else math.inf
        fro = (od - ref).norm().item() / ref_norm if finite else math.inf
        close = finite and bool(torch.allclose(od, ref, atol=1e-2, rtol=1e-2))
        unchanged = all(torch.equal(a, b) for a, b in zip((q, k, v), copies, strict=True))
        ok = (
            finite
            and err <= bound
            and close
            and unchanged
            and out.shape == q.shape
            and out.dtype == q.dtype
            and type(out) is torch.Tensor
        )
        results.append(
            CheckResult(
                name,
                shape_name(shape),
                ok,
                err,
                native_err,
                bound,
                fro,
                native_fro,
                close,
                finite,
                unchanged,
                None,
                splits,
            )
        )
        del out, od
    return results


# --- timing ---------------------------------------------------------------------------------------------


def time_graph(fn: Callable[[], Any], calls: int = 20, replays: int = 30) -> float:
    """Median device time of one call in ms: events around replays of a graph of ``calls`` calls."""
    fn()
    torch.cuda.synchronize()
    # Slow calls: fewer calls per graph and fewer replays, so the scalar kernel does not eat the budget.
    timer = EventTimer()
    one = timer(fn)
    if one > 2.0:
        calls = max(1, min(calls, int(20.0 / one)))
        replays = 5 if one < 50 else 3
    warm_up([fn, fn])
    g = capture([fn] * calls)
    g.replay()
    torch.cuda.synchronize()
    times = [t / calls for t in replay_times_ms(g, replays, timer=timer)]
    del g
    return statistics.median(times)


def sdpa_pinned(backend: Any) -> AttentionFn:
    from torch.nn.attention import sdpa_kernel

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return fn


def sdpa_default(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def default_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> str:
    try:
        from kernels.sdpa import sdpa_backend

        return sdpa_backend(q, k, v, causal)
    except Exception as exc:
        return f"unknown ({type(exc).__name__})"


@dataclass
class TimingRow:
    shape: str
    sdpa_backend: str
    times_ms: dict[str, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


def time_shape(shape: tuple[int, int, int, int, torch.dtype, bool], fns: dict[str, AttentionFn]) -> TimingRow:
    B, H, S, D, dt, causal = shape
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=dt) for _ in range(3))
    row = TimingRow(shape_name(shape), default_backend(q, k, v, causal))
    from torch.nn.attention import SDPBackend

    all_fns: dict[str, AttentionFn] = {"sdpa": sdpa_default}
    for label, member in (
        ("sdpa_flash", "FLASH_ATTENTION"),
        ("sdpa_cudnn", "CUDNN_ATTENTION"),
        ("sdpa_efficient", "EFFICIENT_ATTENTION"),
    ):
        if hasattr(SDPBackend, member):
            all_fns[label] = sdpa_pinned(getattr(SDPBackend, member))
    all_fns.update(fns)
    for name, fn in all_fns.items():
        try:
            row.times_ms[name] = time_graph(lambda fn=fn: fn(q, k, v, causal))
        except Exception as exc:
            row.errors[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            if _is_sticky(exc):
                raise
    return row


# --- resources and SASS ---------------------------------------------------------------------------------


def sass_summary(so: Path) -> dict[str, dict[str, int]]:
    """Per-kernel counts of HMMA (tensor-core MMA), LDSM (ldmatrix) and LDGSTS (cp.async) in the .so's SASS."""
    tool = shutil.which("cuobjdump")
    if tool is None:
        return {"error": {"cuobjdump not found": 1}}
    proc = subprocess.run([tool, "--dump-sass", str(so)], capture_output=True, text=True, timeout=300)
    counts: dict[str, dict[str, int]] = {}
    current = None
    arch = "?"
    for line in proc.stdout.splitlines():
        if m := re.search(r"arch = (sm_\d+\w*)", line):
            arch = m.group(1)
        if m := re.search(r"Function : (\S+)", line):
            current = f"{m.group(1)} [{arch}]"
            counts[current] = {"HMMA": 0, "LDSM": 0, "LDGSTS": 0, "instructions": 0}
            continue
        if current and re.search(r"/\*[0-9a-f]{4,}\*/", line):
            counts[current]["instructions"] += 1
            for op in ("HMMA", "LDSM", "LDGSTS"):
                if re.search(rf"\b{op}\b", line):
                    counts[current][op] += 1
    return counts


def demangle(names: list[str]) -> dict[str, str]:
    tool = shutil.which("cu++filt") or shutil.which("c++filt")
    if tool is None:
        return {n: n for n in names}
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    return dict(zip(names, out, strict=True)) if len(out) == len(names) else {n: n for n in names}


def fmt_table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows]
    return "\n".join([line, sep, *body])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="two small correctness shapes, no timing")
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()

    tee = Tee()
    sys.stdout = tee
    record: dict[str, Any] = {"schema_version": 1}
    try:
        rc = run(args, record)
    finally:
        sys.stdout = sys.__stdout__
        for path in output_paths("cuda_kernels_check.log"):
            path.write_text(tee.buf.getvalue())
        for path in output_paths("cuda_kernels_check.json"):
            path.write_text(json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")
    return rc


def run(args: argparse.Namespace, record: dict[str, Any]) -> int:
    seed = args.seed if args.seed is not None else secrets.randbits(31)
    reason = None
    if not torch.cuda.is_available():
        reason = "no CUDA device"
    props = torch.cuda.get_device_properties(0) if reason is None else None
    record.update(
        {
            "date": time.strftime("%Y-%m-%d"),
            "torch": torch.__version__,
            "torch_cuda": torch.version.cuda,
            "python": platform.python_version(),
            "device": props.name if props else None,
            "sm_count": props.multi_processor_count if props else None,
            "capability": f"{props.major}.{props.minor}" if props else None,
            "seed": seed,
            "method": "CUDA events around a CUDA graph of N calls (N=20, fewer if a call > 2 ms), "
            "median of 30 replays / N; inputs warm in L2 between replays",
        }
    )
    print(f"device: {record['device']}  torch {torch.__version__} (CUDA {torch.version.cuda})  seed {seed}")
    if reason:
        print(f"SKIP: {reason}")
        return 2

    # Build the extension while ptxas reports the standalone resources (sm_90) in parallel.
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(cuda_ext.CU_SOURCES)) as ex:
        reports: list[Future[cuda_ext.CompileReport]] = [
            ex.submit(cuda_ext.nvcc_compile_check, "sm_90", src) for src in cuda_ext.CU_SOURCES
        ]
        try:
            cuda_ext.load()
        except Exception as exc:
            print(f"BUILD FAILED: {cuda_ext.unavailable_reason()}\n{exc}")
            record["build_error"] = str(exc)[-4000:]
            return 1
        build_s = time.perf_counter() - t0
        print(f"extension built/loaded in {build_s:.1f}s: {cuda_ext.extension_path()}")
        record["build_seconds"] = build_s
        print("\n## ptxas -v (sm_90, standalone nvcc -O3)")
        record["ptxas"] = []
        for fut in reports:
            rep = fut.result()
            print(rep.table())
            record["ptxas"].append(
                {"source": rep.source.name, "arch": rep.arch, "ok": rep.ok, "kernels": [asdict(k) for k in rep.kernels]}
            )

    so = cuda_ext.extension_path()
    if so is not None:
        sass = sass_summary(so)
        names = demangle([n.split(" [")[0] for n in sass])
        print("\n## SASS (cuobjdump --dump-sass): HMMA / LDSM / LDGSTS per kernel")
        rows = []
        for key, c in sass.items():
            base, _, arch = key.partition(" [")
            pretty = names.get(base, base)
            rows.append(
                [
                    pretty[:90],
                    arch.rstrip("]"),
                    str(c.get("HMMA", 0)),
                    str(c.get("LDSM", 0)),
                    str(c.get("LDGSTS", 0)),
                    str(c.get("instructions", 0)),
                ]
            )
        print(fmt_table(["kernel", "arch", "HMMA", "LDSM", "LDGSTS", "instr"], rows))
        record["sass"] = {names.get(k.split(" [")[0], k) + " [" + k.partition(" [")[2]: v for k, v in sass.items()}
        wmma_hmma = [c.get("HMMA", 0) for k, c in sass.items() if "flash_fwd_kernel" in names.get(k.split(" [")[0], k)]
        print(f"tensor-core kernels with HMMA: {sum(1 for h in wmma_hmma if h > 0)}/{len(wmma_hmma)}")

    fns = variants()
    shapes = QUICK_SHAPES if args.quick else TIMING_GRID + EXTRA_TIMING + CORRECTNESS_SHAPES
    print(
        f"\n## correctness (float64 reference; bound = 2 * native fp16/bf16 math error + 1e-5; "
        f"allclose atol=rtol=1e-2; seed {seed})"
    )
    checks: list[CheckResult] = []
    for i, shape in enumerate(shapes):
        res = check_shape(shape, fns, seed + i)
        checks.extend(res)
        for r in res:
            flag = "ok  " if r.ok else "FAIL"
            extra = f" splits={r.splits}" if r.splits is not None else ""
            err = f" ERROR {r.error}" if r.error else ""
            print(
                f"{flag} {r.shape:<36} {r.variant:<20} max_err={r.max_err:.2e} (bound {r.bound:.2e}, "
                f"native {r.native_max_err:.2e}) rel_fro={r.rel_fro:.2e} (native {r.native_rel_fro:.2e})"
                f"{extra}{err}"
            )
    record["correctness"] = [asdict(r) for r in checks]
    n_fail = sum(not r.ok for r in checks)
    by_variant: dict[str, list[bool]] = {}
    for r in checks:
        by_variant.setdefault(r.variant, []).append(r.ok)
    print("\ncorrectness summary: " + ", ".join(f"{k} {sum(v)}/{len(v)}" for k, v in by_variant.items()))

    if args.quick or args.no_timing:
        return 1 if n_fail else 0

    print("\n## timing (ms per call; device time from CUDA-graph replay)")
    timing_fns = {k: v for k, v in fns.items() if k != "cuda_splitkv[n=max]"}
    rows_t: list[TimingRow] = []
    timed_shapes = TIMING_GRID + EXTRA_TIMING
    for shape in timed_shapes:
        row = time_shape(shape, timing_fns)
        rows_t.append(row)
        print(
            f"{row.shape}: "
            + ", ".join(f"{k}={v:.4f}" for k, v in row.times_ms.items())
            + (f" errors={row.errors}" if row.errors else "")
        )
    record["timing"] = [asdict(r) for r in rows_t]

    headers = [
        "shape",
        "SDPA backend",
        "SDPA ms",
        "best fused SDPA ms",
        *timing_fns.keys(),
        "wmma/SDPA",
        "wmma TFLOP/s",
        "splitkv/SDPA",
    ]
    table = []
    for shape, row in zip(timed_shapes, rows_t, strict=True):
        B, H, S, D, _, causal = shape
        t = row.times_ms
        best = min((v for k, v in t.items() if k.startswith("sdpa_")), default=math.nan)
        flops = attention_flops(B, H, S, D, causal)
        wm = t.get("cuda_wmma", math.nan)
        table.append(
            [
                row.shape,
                row.sdpa_backend,
                f"{t.get('sdpa', math.nan):.4f}",
                f"{best:.4f}",
                *(f"{t[k]:.4f}" if k in t else "err" for k in timing_fns),
                f"{wm / t.get('sdpa', math.nan):.2f}x",
                f"{flops / (wm * 1e-3) / 1e12:.1f}",
                f"{t.get('cuda_splitkv', math.nan) / t.get('sdpa', math.nan):.2f}x",
            ]
        )
    print()
    print(fmt_table(headers, table))
    record["table_markdown"] = fmt_table(headers, table)
    return 1 if n_fail else 0


if __name__ == "__main__":
    sys.exit(main())
