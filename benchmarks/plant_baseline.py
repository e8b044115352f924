"""Planted regressions through the whole plugin: a baseline copy that makes every case read x slower.

  python benchmarks/plant_baseline.py write BASELINE.json OUTDIR X
      writes OUTDIR/<same name> with every stored process sample's time divided by 1 + X, and its SDPA ratio too,
      except for a variant timed against itself (sdpa against sdpa), whose own slowdown would move both
      sides of its ratio. A guard run against OUTDIR (--perfguard-baseline-dir OUTDIR) then sees each
      kernel X slower than stored, and judges it as it would a real regression: both gates, re-measurement,
      the fresh-process confirmation (the first ten; after that the regressions stand unconfirmed).
  python benchmarks/plant_baseline.py summarize RESULTS.json X
      prints, per variant, how many cases the run judged regressed, and each case it missed with its MDE.

Unlike benchmarks/planted_gpu.py, no kernel runs slower: the stored side moves. What it tests is the
verdict pipeline on real measurements against a real baseline, every case of the suite in one run.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from dataclasses import replace
from pathlib import Path

from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_perfguard.research import BaselineEntry, BaselineFile, read_baseline, write_baseline


def write(src: Path, out_dir: Path, x: float, self_variant: str = "sdpa") -> Path:
    bf = read_baseline(src)
    scale = 1.0 / (1.0 + x)
    for case_id, e in bf.cases.items():
        # Items are named <test>[<variant>-<shape>]; the self-timed variant keeps its ratio.
        moves_ratio = e.ratio is not None and f"[{self_variant}-" not in case_id
        samples = [
            replace(
                x,
                median_ns=x.median_ns * scale,
                ci_ns=(x.ci_ns[0] * scale, x.ci_ns[1] * scale),
                ratio=x.ratio * scale if moves_ratio and x.ratio is not None else x.ratio,
            )
            for x in e.samples
        ]
        bf.cases[case_id] = BaselineEntry.from_samples(
            case_id,
            samples,
            workload=e.workload,
            workload_desc=e.workload_desc,
            env=e.env,
            updated=e.updated,
            noise=e.noise,
            unstable=e.unstable,
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    planted = BaselineFile(path=out_dir / src.name, exists=False, device=bf.device, cases=bf.cases)
    write_baseline(planted)  # validated and written as the plugin writes its own
    return planted.path


def summarize(results: Path, x: float) -> int:
    doc = json.loads(results.read_text())
    per: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    missed = []
    for r in doc["results"]:
        notes = r.get("notes") or []
        verdict = r.get("verdict") or r.get("outcome") or "?"  # skipped variants carry no verdict
        if verdict == "regressed":
            # "confirmed in a fresh process: ..." or "not confirmed in a fresh process: 10 confirmations already run"
            kind = "confirmed" if any(n.startswith("confirmed in a fresh process") for n in notes) else "unconfirmed"
        else:
            kind = verdict
            est = {g["gate"]: g.get("estimate") for g in r.get("gates", [])}
            missed.append(
                [
                    r["id"].split("::")[-1],
                    verdict,
                    _pct(est.get("baseline")),
                    _pct(est.get("ratio")),
                    _pct(None if r.get("mde") is None else 1 + r["mde"]),
                ]
            )
        per[r.get("variant") or "?"][kind] += 1
    if not per:
        print(f"{results}: no results")
        return 1
    kinds = ["confirmed", "unconfirmed", "inconclusive", "pass", "faster"]
    kinds += sorted({k for c in per.values() for k in c} - set(kinds))  # skipped, incorrect, timeout, ...
    rows = [
        [v, sum(c.values()), sum(c[k] for k in ("confirmed", "unconfirmed")), *(c[k] for k in kinds)]
        for v, c in sorted(per.items())
    ]
    total = [sum(r[i] for r in rows) for i in range(1, len(rows[0]))]
    print(
        f"planted +{x * 100:g}% on every case ({results.name}; device {doc['device'].get('name')}, "
        f"torch {doc['device'].get('torch')}, margin {doc['summary'].get('margin')})"
    )
    print(tabulate([*rows, ["all", *total]], headers=["variant", "cases", "regressed", *kinds], disable_numparse=True))
    if missed:
        print("\nnot regressed (the plant missed):")
        print(
            tabulate(
                missed,
                headers=["case", "verdict", "time vs baseline", "ratio vs baseline", "MDE (95%)"],
                disable_numparse=True,
            )
        )
    return 0


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{(v - 1) * 100:+.1f}%"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("baseline", type=Path)
    w.add_argument("out_dir", type=Path)
    w.add_argument("x", type=float)
    w.add_argument("--self-variant", default="sdpa", help="the variant timed against itself (its ratio stays)")
    s = sub.add_parser("summarize")
    s.add_argument("results", type=Path)
    s.add_argument("x", type=float)
    a = ap.parse_args(argv)
    if a.cmd == "write":
        print(write(a.baseline, a.out_dir, a.x, a.self_variant))
        return 0
    return summarize(a.results, a.x)


if __name__ == "__main__":
    sys.exit(main())
