"""A cold build of the CUDA extension (kernels/cuda_ext.py), as a fresh runner's first run pays it, for this
tree and for the kernels of a git revision (``--against``, default HEAD): each build in a fresh interpreter
and an empty TORCH_EXTENSIONS_DIR, the two alternating, ``--rounds`` of each. Prints each build's seconds and
the median of each (`PYTHONPATH=. python -m benchmarks.build_time --against REV`; needs a CUDA GPU and nvcc).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = """
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from kernels import cuda_ext
assert cuda_ext.__file__.startswith(sys.argv[1]), cuda_ext.__file__
import torch
torch.cuda.init()
start = time.perf_counter()
cuda_ext.load()
print(json.dumps({"s": time.perf_counter() - start, "cpus": len(os.sched_getaffinity(0))}))
"""


def build_once(root: Path) -> dict[str, float]:
    """One cold build of the extension whose sources are under ``root``/kernels."""
    with tempfile.TemporaryDirectory(prefix="perfguard-build-") as folder:
        env = {**os.environ, "TORCH_EXTENSIONS_DIR": folder, "PYTHONPATH": str(root)}
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, str(root)], env=env, capture_output=True, text=True, check=False
        )
    if proc.returncode != 0:
        raise SystemExit(f"the build under {root} failed:\n{proc.stderr[-3000:]}")
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def extract_kernels(rev: str, into: Path) -> None:
    """``kernels/`` as it is at ``rev``, written under ``into``."""
    data = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "kernels"], capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(data.stdout)) as tar:
        tar.extractall(into, filter="data")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default="HEAD", help="the git revision whose kernels/ to build beside the tree")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="perfguard-build-rev-") as rev_root:
        extract_kernels(args.against, Path(rev_root))
        roots = {"tree": ROOT, args.against: Path(rev_root)}
        seconds: dict[str, list[float]] = {name: [] for name in roots}
        cpus = 0.0
        for round_ in range(args.rounds):
            names = list(roots) if round_ % 2 else list(roots)[::-1]
            for name in names:
                result = build_once(roots[name])
                cpus = result["cpus"]
                seconds[name].append(result["s"])
                print(f"round {round_ + 1} {name:>12}: {result['s']:6.1f} s", flush=True)
    print(f"\n{'kernels':>12}  {'median':>7}  cold builds (s), {cpus:.0f} CPUs")
    for name, values in seconds.items():
        print(f"{name:>12}  {statistics.median(values):7.1f}  {', '.join(f'{v:.1f}' for v in values)}")


if __name__ == "__main__":
    main()
