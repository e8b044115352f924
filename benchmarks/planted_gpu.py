"""Detection power on a real GPU: planted slowdowns judged against the baseline recorded in earlier processes.

A planted variant runs the real kernel and then a calibrated spin (`torch.cuda._sleep`) worth +2, +3, +5
or +10% of the kernel's stored time, on the same stream, inside the same CUDA graph. Each trial measures
it with the plugin's engine (the same configuration the suite uses), judges it with the plugin's `decide`
against the stored baseline (re-measuring once when the first verdict is not a pass, as the runner does),
and counts "regressed" verdicts. +0% is the A/A control.

Usage: python benchmarks/planted_gpu.py [--trials 6] [--margin 0.05] [--json PATH]   (needs a CUDA GPU)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from tabulate import tabulate

from kernels import VARIANTS, sdpa
from pytest_perfguard import verdict as vd
from pytest_perfguard.baseline import read_baseline
from pytest_perfguard.runner import NOISE_FLOOR, RATIO_NOISE_FLOOR
from pytest_perfguard.timing import CudaTimer, MeasureConfig, measure, pooled

CASES = [("sdpa", (8, 8, 128, 64)), ("triton_flash", (16, 8, 512, 64)), ("cuda_wmma", (4, 16, 2048, 64)),
         ("torch_hybrid", (8, 8, 256, 64))]
PLANTS = [0.0, 0.02, 0.03, 0.05, 0.10]


def ns_per_cycle() -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1_000_000)
    start.record()
    torch.cuda._sleep(20_000_000)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e6 / 20_000_000


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--margin", type=float, default=0.05)
    ap.add_argument("--baseline", type=Path, default=Path(".ci/baselines/nvidia-h200.json"))
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    base = read_baseline(args.baseline)
    timer = CudaTimer()
    cfg = MeasureConfig(target=0.01, budget_s=5.0, min_time_s=0.3)
    policy = vd.Policy(margin=args.margin, family_size=98, noise_floor=NOISE_FLOOR["cuda"],
                       ratio_noise_floor=RATIO_NOISE_FLOOR["cuda"])
    cyc = ns_per_cycle()
    rows, out = [], []
    for name, (B, H, S, D) in CASES:
        case_id = f"tests/perf/test_attention.py::test_attention_grid[{name}-B{B}-H{H}-S{S}]"
        stored = base.cases[case_id]
        fn = VARIANTS[name].fn
        copies = [tuple(torch.randn(B, H, S, D, device="cuda", dtype=torch.float16) for _ in range(3)) for _ in range(8)]
        for plant in PLANTS:
            cycles = int(stored.median_ns * plant / cyc)

            def variant(i: int, fn=fn, cycles=cycles, copies=copies):
                q, k, v = copies[i % len(copies)]

                def call():
                    out = fn(q, k, v, True)
                    if cycles:
                        torch.cuda._sleep(cycles)
                    return out
                return call

            def against(i: int, copies=copies):
                q, k, v = copies[i % len(copies)]
                return lambda: sdpa(q, k, v, True)

            verdicts, secs = [], []
            for trial in range(args.trials):
                t0 = time.perf_counter()
                rng = random.Random(trial)
                m = measure(variant, against, timer, cfg, rng=rng)
                judge = vd.decide(m.variant_blocks, m.against_blocks, stored, workload=stored.workload, env=stored.env,
                                  policy=policy, max_ratio=None, incomparable=[])
                if judge.needs_remeasure:
                    m = pooled(m, measure(variant, against, timer, cfg, copies=m.reps, rng=rng), cfg.confidence)
                    judge = vd.decide(m.variant_blocks, m.against_blocks, stored, workload=stored.workload,
                                      env=stored.env, policy=policy, max_ratio=None, incomparable=[])
                verdicts.append(judge.status)
                secs.append(time.perf_counter() - t0)
            caught = sum(1 for v in verdicts if v == vd.REGRESSED)
            rows.append([name, f"B{B} H{H} S{S}", f"+{plant:.0%}", f"{caught}/{len(verdicts)}",
                         sum(1 for v in verdicts if v == vd.INCONCLUSIVE), f"{sorted(secs)[len(secs) // 2]:.2f}"])
            out.append({"case": case_id, "plant": plant, "verdicts": verdicts, "seconds": secs})
    props = torch.cuda.get_device_properties(0)
    print(f"device: {props.name}; torch {torch.__version__}; {time.strftime('%Y-%m-%d')}; margin {args.margin:.0%}; "
          f"baseline {args.baseline}; {args.trials} trials per row; spin {cyc:.3f} ns/cycle")
    print(tabulate(rows, headers=["variant", "shape", "planted", "regressed", "inconclusive", "median s/verdict"],
                   disable_numparse=True))
    doc = {"device": props.name, "torch": torch.__version__, "margin": args.margin, "rows": out}
    for path in [args.json, Path(os.environ["PERFGUARD_RESULTS_DIR"]) / "planted.json" if os.environ.get("PERFGUARD_RESULTS_DIR") else None]:
        if path is not None:
            path.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
