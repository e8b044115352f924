"""Each case's head/base ratio per process, with and without the input-copy rotation (benchmarks/ab_rotation.sh):
the geometric mean of the A/B gate's group ratios per run, then per arm the largest offset from 1 and the
spread between processes (SD of the log ratios).

    python benchmarks/ab_rotation_table.py OUT [--tablefmt github]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from pathlib import Path

from tabulate import tabulate


def process_ratios(path: Path) -> dict[str, tuple[float, str]]:
    """case id -> (geometric mean head/base of its groups, verdict) in one results file."""
    out = {}
    for r in json.loads(path.read_text())["results"]:
        groups = (r.get("ab") or {}).get("group_ratios") or []
        if groups:
            out[r["id"].split("::")[-1]] = (math.exp(statistics.fmean(math.log(g) for g in groups)), r["verdict"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--tablefmt", default="simple")
    args = ap.parse_args()
    arms: dict[str, list[dict[str, tuple[float, str]]]] = {"off": [], "on": []}
    for path in sorted(args.out.glob("*.json")):
        m = re.fullmatch(r"(off|on)_(\d+)\.json", path.name)
        if m:
            arms[m.group(1)].append(process_ratios(path))
    cases = sorted({c for runs in arms.values() for run in runs for c in run})
    rows, spread = [], {"off": [], "on": []}
    for case in cases:
        row: list[object] = [case]
        for arm, runs in arms.items():
            logs = [math.log(run[case][0]) for run in runs if case in run]
            bad = sum(run[case][1] == "regressed" for run in runs if case in run)
            row.append(" ".join(f"{100 * (math.exp(x) - 1):+.1f}" for x in logs))
            sd = statistics.stdev(logs) if len(logs) > 1 else float("nan")
            spread[arm].append(sd)
            row += [f"{100 * max((abs(x) for x in logs), default=float('nan')):.2f}", f"{100 * sd:.2f}", bad]
        rows.append(row)
    head = ["case", "off: head/base % per process", "max |off| %", "SD %", "regressed"]
    head += ["on: head/base % per process", "max |off| %", "SD %", "regressed"]
    print(tabulate(rows, head, tablefmt=args.tablefmt))
    for arm, sds in spread.items():
        ok = [s for s in sds if not math.isnan(s)]
        if ok:
            print(f"{arm}: median SD between processes {100 * statistics.median(ok):.2f}% over {len(ok)} cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
