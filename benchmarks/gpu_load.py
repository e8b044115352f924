"""A foreign load on a GPU: half-precision matmuls back to back until killed or `--seconds` pass, as another
job on a shared runner would run. `benchmarks/fresh_hosts_gpu.sh poison` starts it during one process of a
baseline update, which must then be re-measured or kept out of the baseline, never stored slow.

    python benchmarks/gpu_load.py [--device cuda:0] [--size 8192] [--seconds 0]
"""

from __future__ import annotations

import argparse
import signal
import sys
import time

import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--size", type=int, default=8192, help="square matrices of this size")
    ap.add_argument("--seconds", type=float, default=0.0, help="stop after this long (0: when killed)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_load: no CUDA device", file=sys.stderr)
        return 2
    stop = False

    def on_term(_signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    a = torch.randn(args.size, args.size, device=args.device, dtype=torch.float16)
    b = torch.randn_like(a)
    t0, n = time.monotonic(), 0
    while not stop and (args.seconds <= 0 or time.monotonic() - t0 < args.seconds):
        for _ in range(10):
            a @ b
        torch.cuda.synchronize(args.device)
        n += 10
    spent = time.monotonic() - t0
    print(f"gpu_load: {n} matmuls of {args.size}^2 in {spent:.1f} s, {2 * args.size**3 * n / spent / 1e12:.0f} TFLOP/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
