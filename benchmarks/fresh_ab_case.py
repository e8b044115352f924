"""A fresh runner's first A/B case: one CUDA case against HEAD with empty build and cache folders, so the
run builds the tree's and the base revision's extensions inside it, as a wiped runner's first job does
(no confirmation: the case's seconds are what is measured; its verdict is one process's, no A/A evidence).
Runs it for this checkout and for a git revision's (``--revision``, checked out in a temporary worktree),
alternating (each first in every other round), ``--rounds`` of each, each run a fresh process; prints every
run's wall and case seconds and the median of each (`PYTHONPATH=. python -m benchmarks.fresh_ab_case
--revision REV`; needs a CUDA GPU and nvcc). Both checkouts run against their own HEAD: commit the tree
first, or its run compares other code.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tabulate import tabulate

from benchmarks._plugin import plugin_args

ROOT = Path(__file__).resolve().parents[1]
CASE = "test_attention_grid and cuda_scalar and B1-H1-S128"


def run_once(checkout: Path, case: str) -> dict[str, object]:
    """One cold A/A run of ``case`` in ``checkout``: wall seconds, the case's own seconds, its verdict."""
    with tempfile.TemporaryDirectory(prefix="perfguard-fresh-") as folder:
        scratch = Path(folder)
        env = {
            **os.environ,
            "TORCH_EXTENSIONS_DIR": str(scratch / "ext"),
            "PERFGUARD_CACHE_DIR": str(scratch / "cache"),
            "PYTHONPATH": str(checkout),
        }
        results = scratch / "results.json"
        command = [
            sys.executable, "-m", "pytest", "tests/perf", "-k", case, *plugin_args(), "-p", "no:cacheprovider",
            "-n", "0", "-q", "--perfguard", "--perfguard-against", "HEAD",
            "--perfguard-no-confirm", f"--perfguard-json={results}", f"--perfguard-baseline-dir={scratch / 'bl'}",
        ]  # fmt: skip
        started, start = time.time(), time.perf_counter()
        proc = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - start
        if proc.returncode not in (0, 1) or not results.exists():  # 1: the case failed, its verdict is a result
            tail = proc.stdout[-3000:] + proc.stderr[-2000:]
            raise SystemExit(f"the run in {checkout} failed ({proc.returncode}):\n{tail}")
        (record,) = json.loads(results.read_text())["results"]
    return {
        "wall_s": wall, "case_s": record["case_s"], "verdict": record["verdict"], "rc": proc.returncode,
        "started": round(started, 1),  # epoch seconds, to line the run up with a memory or clock trace
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--revision", required=True, help="the git revision to run beside this checkout")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("-k", dest="case", default=CASE, help="the one case (a pytest -k expression)")
    parser.add_argument("--json", type=Path, help="also write every run here")
    args = parser.parse_args()
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True)
    with tempfile.TemporaryDirectory(prefix="perfguard-rev-") as folder:
        other = Path(folder) / "checkout"
        worktree = ["git", "-C", str(ROOT), "worktree"]
        subprocess.run([*worktree, "add", "-q", "--detach", str(other), args.revision], check=True)
        try:
            runs = []
            for n in range(args.rounds):
                pair = [(f"tree ({head.stdout.strip()})", ROOT), (args.revision, other)]
                for name, checkout in pair if n % 2 == 0 else pair[::-1]:  # each goes first in every other round
                    runs.append({"round": n + 1, "checkout": name, **run_once(checkout, args.case)})
                    print(json.dumps(runs[-1]), flush=True)
        finally:
            subprocess.run([*worktree, "remove", "--force", str(other)], check=False)
    print(tabulate(runs, headers="keys", floatfmt=".1f"))
    for name in dict.fromkeys(r["checkout"] for r in runs):
        mine = [r for r in runs if r["checkout"] == name]
        wall = statistics.median(float(r["wall_s"]) for r in mine)
        case = statistics.median(float(r["case_s"]) for r in mine)
        print(f"{name}: median wall {wall:.1f} s, median first case {case:.1f} s over {len(mine)} runs")
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
