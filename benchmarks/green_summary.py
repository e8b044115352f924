"""Summarises benchmarks/green_gpu.sh's raw output: per run, its exit status, the pass / fail / unverified /
new counts, every case that was not a pass with its reason, and what the added checks and the eager timing
cost, by case size (the record's checks_s and case_s).

    python benchmarks/green_summary.py OUT [BASELINE.json ...]   # OUT holds raw/ (or raw.tar.xz), marks.txt

Given baseline files, it says for each which devices its entries' process samples were measured on, and how
many cases have samples from one device, two, ...; and per run, how many cases were left unverified for
running on a GPU none of their entry's processes ran on.
"""

from __future__ import annotations

import json
import sys
import tarfile
from collections import Counter
from pathlib import Path
from typing import Any


def _docs(out: Path) -> dict[str, dict[str, Any]]:
    raw = out / "raw"
    if not raw.exists() and (out / "raw.tar.xz").exists():
        with tarfile.open(out / "raw.tar.xz") as tar:
            tar.extractall(out, filter="data")
    return {p.stem: json.loads(p.read_text()) for p in sorted(raw.glob("*.json")) if p.stem != "baselines"}


def _size(r: dict[str, Any]) -> str:
    t = r.get("median_ns") or 0.0
    return "< 20 us" if t < 20e3 else "20-200 us" if t < 200e3 else ">= 200 us"


UNSEEN = "not one the baseline's processes ran on"  # in the reason of such a case (judge/verdict.py)


def _sample_devices(path: Path) -> None:
    cases = json.loads(path.read_text())["cases"]
    per_device = Counter(s["device"][:12] or "?" for e in cases.values() for s in e["samples"])
    spread = Counter(len({s["device"] for s in e["samples"]}) for e in cases.values())
    print(
        f"{path.name}: {len(cases)} cases; samples by device: " + ", ".join(f"{d} {n}" for d, n in per_device.items())
    )
    print(
        "  cases by how many devices their samples came from: "
        + ", ".join(f"{k}: {v}" for k, v in sorted(spread.items()))
    )


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/out/green_gpu")
    for baseline in sys.argv[2:]:
        _sample_devices(Path(baseline))
    marks = (out / "marks.txt").read_text().splitlines() if (out / "marks.txt").exists() else []
    for line in marks:
        print(line)
    cost: dict[str, list[float]] = {}
    for name, doc in _docs(out).items():
        rs = [r for r in doc.get("results", []) if r.get("median_ns") is not None]
        counts = Counter(r.get("decision") or "-" for r in rs)
        unseen = sum(any(UNSEEN in why for why in r.get("reasons") or []) for r in rs)
        print(f"\n{name}: {len(rs)} timed; " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        print(f"  judged on a GPU none of the entry's processes ran on (left unverified): {unseen}")
        for r in rs:
            if r.get("decision") not in ("pass", None) or r.get("outcome") == "failed":
                why = "; ".join(r.get("reasons") or [])[:240]
                print(f"  {r.get('decision')} {r['verdict']}: {r['id']}: {why}")
            checks = r.get("checks") or {}
            added = sum(v for k, v in checks.items() if k in ("every timed copy", "seen values", "eager call"))
            if r.get("case_s"):
                cost.setdefault(_size(r), []).append(100.0 * added / r["case_s"])
    print(
        "\nthe added checks (every timed copy, seen values) and the eager timing, % of the case's wall time, by size:"
    )
    for size, shares in sorted(cost.items()):
        shares.sort()
        print(f"  {size:10} {len(shares):4} cases: median {shares[len(shares) // 2]:.1f}%, max {shares[-1]:.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
