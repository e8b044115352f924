"""Compares the verdicts of benchmarks/same_verdicts_gpu.sh's runs: per pair (this tree's guard N, the earlier
tree's guard N, against the same baseline on the same host), how many cases got the same decision, and each
case that did not, with both reasons.

    python benchmarks/same_verdicts.py OUT      # OUT holds head/ and before/ (raw/ or raw.tar.xz each)
    python benchmarks/same_verdicts.py OUT head/guard2=before/guard2 head/guard2=head/guard3 ...

With pairs given, those are compared instead (a pair of one tree's runs shows what the noise alone moves).
"""

from __future__ import annotations

import json
import sys
import tarfile
from collections import Counter
from pathlib import Path
from typing import Any

from tabulate import tabulate


def _runs(folder: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """Each run's records by case id, from the results JSON the run wrote (raw/NAME.json)."""
    raw = folder / "raw"
    if not raw.exists() and (folder / "raw.tar.xz").exists():
        with tarfile.open(folder / "raw.tar.xz") as tar:
            tar.extractall(folder, filter="data")
    return {p.stem: {r["id"]: r for r in json.loads(p.read_text())["results"]} for p in sorted(raw.glob("guard*.json"))}


def _decision(r: dict[str, Any] | None) -> str:
    return "-" if r is None else f"{r.get('decision') or '-'} ({r['verdict']})"


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/out/same_verdicts")
    runs = {tree: _runs(out / tree) for tree in ("head", "before")}
    pairs = [tuple(arg.split("=")) for arg in sys.argv[2:]] or [
        (f"head/{n}", f"before/{n}") for n in sorted(set(runs["head"]) & set(runs["before"]))
    ]
    rows, differ = [], []
    for left, right in pairs:
        name = f"{left} = {right}"
        a, b = (runs[x.split("/")[0]][x.split("/")[1]] for x in (left, right))
        ids = sorted(set(a) | set(b))
        same = [i for i in ids if _decision(a.get(i)) == _decision(b.get(i))]
        counts = Counter(_decision(a.get(i)) for i in ids)
        rows.append([name, len(ids), len(same), ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))])
        for i in ids:
            if _decision(a.get(i)) != _decision(b.get(i)):
                reasons = ["; ".join((x or {}).get("reasons") or [])[:200] for x in (a.get(i), b.get(i))]
                differ.append([name, i, _decision(a.get(i)), _decision(b.get(i)), *reasons])
    print(tabulate(rows, headers=["pair", "cases", "same decision", "the first run's decisions"]))
    if differ:
        print()
        print(tabulate(differ, headers=["pair", "case", "first", "second", "first reason", "second reason"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
