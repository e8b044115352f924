"""Bytes per case per commit of the history file: 100 cases x 10,000 commits, written as CI would.

Each commit is one run added through ``History.add_run`` (one transaction, as `perfguard history add`
does), with summaries shaped like the H200 suite's: times 5 us - 5 ms, CIs of +-0.1..1%, block noise
0.1..5%, an MDE, a ratio to the reference with its CI, a verdict, and an environment that changes every
1,000 commits (a torch upgrade). Prints a table; the file goes to a temporary folder unless --keep.

    python benchmarks/history_size.py                 # 100 x 10,000, about 2 minutes
    python benchmarks/history_size.py --commits 1000  # quicker
"""

from __future__ import annotations

import argparse
import hashlib
import math
import tempfile
import time
from pathlib import Path

import numpy as np

from pytest_perfguard.research import CaseSummary, find_changes, open_history

GITHUB_FILE_LIMIT = 100 * 1024 * 1024
VERDICTS = ("pass", "pass", "pass", "pass", "inconclusive", "faster", "regressed")


def summaries(rng: np.random.Generator, base: np.ndarray, commit: int) -> list[CaseSummary]:
    """One run's summaries for every case."""
    env = {"name": "NVIDIA H200", "driver": "580.159.04", "torch": f"2.{11 + commit // 1000}.0+cu130"}
    out = []
    for number, centre in enumerate(base):
        est = float(centre * math.exp(rng.normal(0, 0.004)))
        half = float(rng.uniform(0.001, 0.01))
        ratio = float(rng.uniform(0.5, 8.0))
        out.append(
            CaseSummary(
                case="tests/perf/test_attention.py::test_attention_grid"
                f"[variant{number % 7}-B8-H8-S{128 * (number + 1)}]",
                estimate_ns=est,
                ci_ns=(est * math.exp(-half), est * math.exp(half * 1.1)),
                noise=float(rng.uniform(0.001, 0.05)),
                mde=float(rng.uniform(0.02, 0.08)),
                ratio=ratio,
                ratio_ci=(ratio * math.exp(-half), ratio * math.exp(half)),
                verdict=VERDICTS[int(rng.integers(len(VERDICTS)))],
                env={**env, "case.against_backend": ("flash", "cudnn", "efficient")[number % 3]},
            )
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=100)
    parser.add_argument("--commits", type=int, default=10_000)
    parser.add_argument("--keep", type=Path, help="write the history here instead of a temporary folder")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    base = np.exp(rng.uniform(math.log(5e3), math.log(5e6), args.cases))
    with tempfile.TemporaryDirectory() as tmp:
        path = args.keep or Path(tmp) / "history.sqlite"
        t0 = time.perf_counter()
        with open_history(path, create=True) as history:
            for commit in range(args.commits):
                digest = hashlib.sha256(f"run {commit}".encode()).digest()[:16]
                sha = hashlib.sha1(f"commit {commit}".encode()).hexdigest()
                history.add_run(summaries(rng, base, commit), digest, sha, 1_700_000_000 + 600 * commit, source="bench")
        add_s = time.perf_counter() - t0
        size = path.stat().st_size
        with open_history(path) as history:
            name = history.case_names()[0]
            t0 = time.perf_counter()
            points = history.series(name)
            read_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        changes = find_changes(points)
        changes_s = time.perf_counter() - t0
    rows = [
        ("cases x commits", f"{args.cases} x {args.commits:,}"),
        (
            "file size",
            f"{size / 1e6:.1f} MB ({size / GITHUB_FILE_LIMIT * 100:.0f}% of GitHub's 100 MiB limit)",
        ),
        ("bytes per case per commit", f"{size / (args.cases * args.commits):.1f}"),
        (
            "adding all runs (one transaction each)",
            f"{add_s:.1f} s ({add_s / args.commits * 1e3:.1f} ms per run)",
        ),
        ("reading one case's series", f"{read_s:.2f} s ({len(points):,} points)"),
        (
            "change points of that case",
            f"{changes_s:.2f} s ({len(changes)} found; the series has no planted step)",
        ),
    ]
    print("| measure | value |\n|---|---|")
    for key, value in rows:
        print(f"| {key} | {value} |")


if __name__ == "__main__":
    main()
