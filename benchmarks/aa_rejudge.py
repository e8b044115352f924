"""Re-judges recorded A/A guard runs at several margins: how often would the guard have cried wolf?

Each results file holds every case's block medians, so the plugin's own `decide` can be re-run on them
against the baseline they were judged against, with other margins and noise factors, without a GPU.
Every case in an A/A run is unchanged code, so every "regressed" verdict is a false alarm.

Usage: python benchmarks/aa_rejudge.py BASELINE.json RESULTS.json [RESULTS.json ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tabulate import tabulate

from pytest_perfguard import verdict as vd
from pytest_perfguard.baseline import read_baseline
from pytest_perfguard.runner import NOISE_FLOOR, RATIO_NOISE_FLOOR


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("baseline", type=Path)
    ap.add_argument("results", type=Path, nargs="+")
    ap.add_argument("--margins", default="0.02,0.03,0.04,0.05,0.06")
    args = ap.parse_args()
    base = read_baseline(args.baseline)
    runs = [json.loads(p.read_text())["results"] for p in args.results]
    rows = []
    for margin in [float(m) for m in args.margins.split(",")]:
        counts = {vd.REGRESSED: 0, vd.INCONCLUSIVE: 0, vd.PASS: 0, vd.FASTER: 0}
        total = 0
        for results in runs:
            timed = [r for r in results if r.get("variant_blocks")]
            policy = vd.Policy(margin=margin, family_size=len(timed), noise_floor=NOISE_FLOOR["cuda"],
                               ratio_noise_floor=RATIO_NOISE_FLOOR["cuda"])
            for r in timed:
                stored = base.cases.get(r["id"])
                if stored is None:
                    continue
                v = vd.decide(r["variant_blocks"], r.get("against_blocks"), stored, workload=r["workload"],
                              env=r["env"], policy=policy, max_ratio=None, incomparable=[])
                counts[v.status] = counts.get(v.status, 0) + 1
                total += 1
        rows.append([f"{margin:.0%}", total, counts[vd.REGRESSED], f"{counts[vd.REGRESSED] / max(total, 1):.2%}",
                     counts[vd.INCONCLUSIVE], counts[vd.PASS] + counts[vd.FASTER]])
    print(tabulate(rows, headers=["margin", "case verdicts", "false alarms", "rate", "inconclusive", "pass"],
                   disable_numparse=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
