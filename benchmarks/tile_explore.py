"""Candidate tilings of the two tensor-core kernels on the grid's large shapes, timed against SDPA.

Each candidate is first checked against float32 math attention on a small shape (causal and not, S = 239
and 1024), then timed with the project's engine interleaved with SDPA's default backend (paired per-block
ratios) on the large shapes. Prints one table and writes
tile_explore_<against>.json to $PERFGUARD_RESULTS_DIR when set, else to benchmarks/out/.

* triton_flash: (BLOCK_M, BLOCK_N, warps, stages) with pointer loads or tensor-descriptor loads ("tma").
  "split" (exponentials on the FMA pipes) was tried and removed: benchmarks/results/h200_2026-11-21, section 11.
* cuda_wmma: the kernel body of kernels/cuda/flash_mma.cuh instantiated with other tile configurations
  (warps, m-tiles per warp, BLOCK_N, CTAs per SM), built here with ptxas' resource report.

    PYTHONPATH=. python benchmarks/tile_explore.py [--budget 1.0] [--shapes 4x16x2048,8x16x4096]

``--shipped`` times only the variants as shipped (kernels.KERNELS' triton_flash and cuda_wmma);
``--against flash`` pairs them with SDPA pinned to one backend instead of its default dispatch (on an
H100/H200 the default is cuDNN; on an L4, sm_89, torch's dispatcher puts flash first).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tabulate import tabulate

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._output import output_paths  # noqa: E402
from benchmarks.attention import Timing  # noqa: E402
from kernels import KERNELS  # noqa: E402
from kernels.reference import AttentionFn  # noqa: E402
from kernels.sdpa import make_sdpa, sdpa  # noqa: E402
from kernels.triton_flash import triton_flash  # noqa: E402

TRITON: list[tuple[str, tuple[int, int, int, int], dict[str, bool]]] = [
    ("ptr", (64, 64, 4, 3), {}),
    ("ptr", (64, 64, 4, 4), {}),
    ("ptr", (128, 64, 8, 3), {}),
    ("ptr", (128, 128, 8, 3), {}),
    ("ptr", (128, 128, 8, 2), {}),
    ("tma", (64, 64, 4, 3), {"tma": True}),
    ("tma", (128, 128, 8, 3), {"tma": True}),
]

# Cfg<D, warps, m-tiles per warp, BLOCK_N, min CTAs per SM> of flash_mma.cuh; the first is the shipped one.
CUDA_CFGS: list[tuple[int, int, int, int]] = [
    (4, 2, 64, 2),
    (8, 1, 64, 2),
    (8, 2, 64, 1),
    (4, 1, 128, 2),
    (8, 1, 128, 1),
    (8, 1, 128, 2),
    (4, 2, 32, 2),
    (4, 1, 64, 4),
]

_CUDA_SRC = r"""
#include <torch/types.h>
#include <c10/cuda/CUDAStream.h>
#include "flash_mma.cuh"
using namespace pg::flash;
template <typename C>
void go(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor o, bool causal) {
  const int BH = q.size(0) * q.size(1), S = q.size(2);
  auto p = make_params<__half>(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), BH, S, 64);
  cudaStream_t st = c10::cuda::getCurrentCUDAStream().stream();
  cudaError_t e = causal ? launch_flash<__half, C, true, false>(p, 1, st)
                         : launch_flash<__half, C, false, false>(p, 1, st);
  TORCH_CHECK(e == cudaSuccess, cudaGetErrorString(e));
}
void run_cfg(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor o, bool causal, int64_t cfg) {
  switch (cfg) {
CASES
    default: TORCH_CHECK(false, "no such cfg");
  }
}
"""


def build_cuda() -> Any:
    from torch.utils.cpp_extension import load_inline

    cases = "\n".join(
        f"    case {i}: go<Cfg<64, {w}, {mt}, {bn}, {mb}>>(q, k, v, o, causal); return;"
        for i, (w, mt, bn, mb) in enumerate(CUDA_CFGS)
    )
    major, minor = torch.cuda.get_device_capability()
    return load_inline(
        name="tile_explore_cuda",
        cpp_sources="#include <torch/extension.h>\nvoid run_cfg(torch::Tensor q, "
        "torch::Tensor k, torch::Tensor v, torch::Tensor o, bool causal, int64_t cfg);",
        cuda_sources=_CUDA_SRC.replace("CASES", cases),
        functions=["run_cfg"],
        extra_include_paths=[str(ROOT / "kernels" / "cuda")],
        extra_cuda_cflags=[
            "-O3",
            "-std=c++17",
            f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}",
            "-Xptxas=-v",
        ],
        verbose=True,
    )


def max_err(fn: AttentionFn) -> float:
    """Worst |fn - float32 math| over small causal and non-causal shapes, relative to SDPA-fp16's own error."""
    worst = 0.0
    g = torch.Generator(device="cuda").manual_seed(7)
    for s in (239, 1024):
        for causal in (True, False):
            q, k, v = (torch.randn(2, 3, s, 64, device="cuda", dtype=torch.float16, generator=g) for _ in range(3))
            ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
            own = (sdpa(q, k, v, causal).float() - ref).abs().max().item()
            err = (fn(q, k, v, causal).float() - ref).abs().max().item()
            worst = max(worst, err / max(own, 1e-6))
    return worst


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=1.0)
    ap.add_argument("--shapes", default="4x16x2048,8x16x4096")
    ap.add_argument("--no-cuda", action="store_true")
    ap.add_argument("--shipped", action="store_true", help="only triton_flash and cuda_wmma as shipped")
    ap.add_argument("--against", default=None, help="SDPA backend to pair with (default: its default dispatch)")
    args = ap.parse_args()
    ref = make_sdpa(args.against)
    timing = Timing(torch.device("cuda"), calls=8, replays=30, budget_s=args.budget, use_engine=True)
    candidates: list[tuple[str, AttentionFn]] = []
    if args.shipped:
        candidates = [(name, KERNELS[name]) for name in ("triton_flash", "cuda_wmma")]
    for path, cfg, kw in [] if args.shipped else TRITON:

        def tfn(
            q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, c: bool, cfg: Any = cfg, kw: Any = kw
        ) -> torch.Tensor:
            return triton_flash(q, k, v, c, config=cfg, **kw)

        candidates.append((f"triton {path} " + "x".join(map(str, cfg)), tfn))
    if not args.no_cuda and not args.shipped:
        t0 = time.time()
        ext = build_cuda()
        print(f"cuda build {time.time() - t0:.0f} s")
        for i, (w, mt, bn, mb) in enumerate(CUDA_CFGS):

            def cfn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, c: bool, i: int = i) -> torch.Tensor:
                o = torch.empty_like(q)
                ext.run_cfg(q, k, v, o, c, i)
                return o

            candidates.append((f"cuda w{w} mt{mt} bn{bn} mb{mb}", cfn))
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    rows: list[list[Any]] = []
    doc: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "results": [],
    }
    for name, fn in candidates:
        try:
            err = max_err(fn)
        except Exception as exc:
            rows.append([name, "error", str(exc).splitlines()[0][:80]])
            continue
        row: list[Any] = [name, f"{err:.2f}"]
        for b, h, s in shapes:
            inputs = [
                tuple(torch.randn(b, h, s, 64, device="cuda", dtype=torch.float16) for _ in range(3)) for _ in range(8)
            ]
            try:
                t = timing.pair(fn, ref, inputs, True)
                row.append(f"{t.time_s * 1e6:.1f} us x{t.ratio:.3f} [{t.ratio_lo:.3f},{t.ratio_hi:.3f}]")
                doc["results"].append(
                    {
                        "candidate": name,
                        "shape": [b, h, s, 64],
                        "err_vs_sdpa_err": err,
                        "time_us": t.time_s * 1e6,
                        "ratio": t.ratio,
                        "ratio_ci": [t.ratio_lo, t.ratio_hi],
                        "against": args.against or "default",
                        "method": t.method,
                    }
                )
            except Exception as exc:
                row.append("error: " + str(exc).splitlines()[0][:60])
            del inputs
        rows.append(row)
        print(" | ".join(map(str, row)), flush=True)
    print(
        f"device {doc['device']}; torch {doc['torch']}; {doc['date']}; D=64 fp16 causal; engine-paired ratio to "
        f"SDPA {args.against or 'default'}; err = max|err| vs fp32 math / SDPA-fp16's own"
    )
    print(
        tabulate(rows, headers=["candidate", "err", *[f"B{b} H{h} S{s}" for b, h, s in shapes]], disable_numparse=True)
    )
    for path in output_paths(f"tile_explore_{args.against or 'default'}.json"):
        path.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
