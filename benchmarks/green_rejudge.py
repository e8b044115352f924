"""Re-judges recorded guard runs (benchmarks/green_gpu.sh's results files) under the decision rules of this
checkout: each record's block medians through `verdict.decide` against the baseline the run read, and the
case's decision (pass / unverified) as the session makes it, without a GPU.

    python benchmarks/green_rejudge.py BASELINE.json RESULTS.json [RESULTS.json ...] [--plant 0.10]

Prints, per run, the live decision counts beside the re-judged ones, each re-judged unverified case with its
margin and MDE, and with --plant X how many non-reference cases a slowdown of X on the variant's blocks (the
reference's unchanged) makes "regressed" before any confirmation, and the margin of each that it does not.
Not replayed: the re-measurement (a record's blocks are already pooled where the live run re-measured it),
the host gate (left out of the re-judged decision), disturbances and the fresh-process confirmation.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_perfguard.research import policy as pl
from pytest_perfguard.research import read_baseline
from pytest_perfguard.research import verdict as vd


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("baseline", type=Path)
    ap.add_argument("results", type=Path, nargs="+")
    ap.add_argument("--plant", type=float, default=None)
    ap.add_argument("--margin", type=float, default=0.05)
    args = ap.parse_args()
    bf = read_baseline(args.baseline)
    sampled = [e for e in bf.cases.values() if e.runs >= 2]
    floor = pl.NOISE_FLOOR["cuda"]
    for path in args.results:
        doc = json.loads(path.read_text())
        records = [r for r in doc["results"] if r.get("variant_blocks")]
        policy = vd.Policy(
            margin=args.margin,
            family_size=len(records),
            noise_floor=floor,
            ratio_noise_floor=pl.RATIO_NOISE_FLOOR["cuda"],
            confirm=True,
            prior_spread=pl.prior_spread([e.noise for e in sampled]),
            prior_ratio_spread=pl.prior_spread([e.ratio_noise for e in sampled]),
        )
        live, now = Counter(r["decision"] for r in records), Counter()
        said, missed, caught, planted = [], [], 0, 0
        for r in records:
            stored = bf.cases.get(r["id"])
            against = r.get("against_blocks") or None
            kw = {"workload": r["workload"], "policy": policy, "max_ratio": None, "incomparable": []}
            v = vd.decide(r["variant_blocks"], against, stored, **kw)
            itself = r["variant"] == r.get("against")
            mde = vd.case_mde(v.gates, variant_is_against=itself)
            margin = pl.judged_margin([(g.name, g.threshold) for g in v.gates], args.margin)
            decision = pl.decision(str(v.status), False, True, mde, margin)
            now[decision] += 1
            if decision == "unverified":
                said.append(f"  {r['id'].split('::')[-1]}: {v.status}, margin {margin:.1%}, MDE {mde or 0:.1%}")
            if args.plant is not None and not itself and stored is not None:
                slower = [x * (1 + args.plant) for x in r["variant_blocks"]]
                p = vd.decide(slower, against, stored, **kw)
                planted += 1
                if p.status is vd.REGRESSED:
                    caught += 1
                else:
                    missed.append(f"  {r['id'].split('::')[-1]}: {p.status}, margin {margin:.1%}")
        print(f"{path.name}: live {dict(sorted(live.items()))}; re-judged {dict(sorted(now.items()))}")
        print("\n".join(said))
        if args.plant is not None:
            print(f"  planted +{args.plant:.0%}: {caught} of {planted} non-reference cases regressed")
            print("\n".join(missed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
