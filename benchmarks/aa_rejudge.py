"""Re-judges recorded A/A guard runs: how often would the guard cry wolf, and what could it catch?

Each results file holds every case's block medians, so the plugin's own `decide` can be re-run on them
against the baseline they were judged against, with other margins, without a GPU. Every case in an A/A
run is unchanged code, so every "regressed" verdict is a false alarm (the first table).

Detection power on the same real between-run noise (`--shifts`): every recorded case is judged again with
its variant blocks multiplied by 1 + shift (the SDPA blocks unchanged, so the in-run ratio moves too), a
planted slowdown on top of the GPU's own process-to-process drift. The fresh-process confirmation is
modelled by pairing guard run i with run i+1 (cyclically): a regression counts as confirmed only if the
same case also regresses in the next run, judged as the plugin's fresh process judges it (alone, so with
a family of one case). Not replayed: the runner's re-measure once (a record's blocks are pooled only where
the live run re-measured it), and the cap of 10 confirmations per session (each case is its own trial).

Can any margin catch +3% with no false alarm (`--target`)? A verdict is "regressed"
when the lower bound L of its decision interval (ln measured/baseline, minus the half-width) exceeds the
threshold tau = ln(1 + margin), in either gate; a planted shift adds exactly ln(1 + shift) to L. So no
false alarm in N verdicts needs tau >= the largest A/A L, and catching the target in 95% of verdicts
needs tau < ln(1 + target) + the 5% quantile of L. If the first exceeds the second, no threshold does both.

Usage: python benchmarks/aa_rejudge.py BASELINE.json RESULTS.json [RESULTS.json ...]
           [--margins 0.02,...] [--shifts 0.02,0.03,0.05,0.10 | --shifts ""] [--case-margins 0.05,0.03]
           [--target 0.03] [--fa-verdicts 1000] [--tablefmt simple|github]
With `--shifts ""` only the false-alarm table is printed. Machine B's campaign (19 runs) takes about three
minutes on a CPU; `decide` is called for every verdict of the power table. Only records that carry their
block lists are re-judged, each in its live run's family (`summary.family_size`), so a results file cut to
the blocks of a few cases (benchmarks/results/h200_2026-11-21/raw.tar.xz) gives those cases' rows.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
from tabulate import tabulate

from pytest_perfguard.research import NOISE_FLOOR, RATIO_NOISE_FLOOR, BaselineEntry, log_interval, read_baseline
from pytest_perfguard.research import verdict as vd

TARGET_RATE = 0.95  # "caught in >= 95% of trials"
FINE_GRID = [k / 200 for k in range(1, 31)]  # 0.5% .. 15%


@dataclass(frozen=True)
class Record:
    """One recorded case verdict of one guard run (one process)."""

    run: int
    case: str
    family: int  # timed cases in its run (summary.family_size): the Bonferroni family the live verdict used
    blocks: tuple[float, ...]
    against: tuple[float, ...] | None
    workload: str
    env: dict[str, str]
    stored: BaselineEntry
    pooled: bool  # re-measured live: its blocks are both measurements pooled


@dataclass(frozen=True)
class Scores:
    """Log-scale figures of one record as `decide` computes them, before any shift.

    estimate: the baseline gate's ln(measured / baseline); lower: per gate, the decision interval's lower
    bound. A shift by s adds ln(1 + s) to every one of them.
    """

    estimate: float
    lower: dict[str, float]
    point: dict[str, float]


def policy(margin: float, family: int) -> vd.Policy:
    return vd.Policy(
        margin=margin,
        family_size=family,
        noise_floor=NOISE_FLOOR["cuda"],
        ratio_noise_floor=RATIO_NOISE_FLOOR["cuda"],
    )


def load(baseline: Path, results: Sequence[Path]) -> tuple[list[list[Record]], int]:
    """Records per run, and how many timed records had no stored entry (skipped, as in the live run)."""
    base = read_baseline(baseline)
    runs: list[list[Record]] = []
    missing = 0
    for i, path in enumerate(results):
        doc = json.loads(path.read_text())
        timed = [r for r in doc["results"] if r.get("variant_blocks")]
        # The live run's family; a file cut to the block lists of a few cases keeps it in its summary.
        family = int(doc.get("summary", {}).get("family_size") or len(timed))
        run: list[Record] = []
        for r in timed:
            stored = base.cases.get(r["id"])
            if stored is None:
                missing += 1
                continue
            against = r.get("against_blocks")
            run.append(
                Record(
                    run=i,
                    case=r["id"],
                    family=family,
                    blocks=tuple(r["variant_blocks"]),
                    against=tuple(against) if against else None,
                    workload=r["workload"],
                    env=r["env"],
                    stored=stored,
                    pooled=any("re-measured" in n for n in r.get("notes") or []),
                )
            )
        runs.append(run)
    return runs, missing


def judge(rec: Record, shift: float, margin: float, family: int) -> vd.Verdict:
    """The plugin's verdict on the record's blocks with the variant slowed by `shift`."""
    factor = 1.0 + shift
    return vd.decide(
        [b * factor for b in rec.blocks],
        rec.against,
        rec.stored,
        workload=rec.workload,
        policy=policy(margin, family),
        max_ratio=None,
        incomparable=[],
    )


def scores(rec: Record, family: int) -> Scores:
    """The decision intervals as `decide` builds them (`verdict.decision_interval`), so that the fine
    shift grid and the threshold argument need no `decide` call per shift; `power_table` checks the two
    against each other on every verdict it judges."""
    st = rec.stored
    if st.workload != rec.workload:
        return Scores(math.nan, {}, {})  # not comparable: never regressed
    conf = policy(vd.DEFAULT_MARGIN, family).decision_confidence
    dec = vd.decision_interval(log_interval(rec.blocks, conf), st.median_ns, st.ci_ns)
    lower = {"baseline": dec.lo}
    point = {"baseline": dec.estimate}
    if rec.against is not None and st.ratio is not None:
        ratios = [v / a for v, a in zip(rec.blocks, rec.against, strict=True)]
        dec_r = vd.decision_interval(log_interval(ratios, conf), st.ratio, st.ratio_ci)
        lower["ratio"] = dec_r.lo
        point["ratio"] = dec_r.estimate
    return Scores(dec.estimate, lower, point)


def excess(sc: Scores, stored: BaselineEntry, margin: float) -> float:
    """How far the record is above its regression threshold (log scale); regressed at shift s iff
    excess + ln(1 + s) > 0."""
    pol = policy(margin, 1)
    taus = {"baseline": math.log1p(pol.delta(stored.noise)), "ratio": math.log1p(pol.ratio_delta(stored.noise))}
    return max((lo - taus[g] for g, lo in sc.lower.items()), default=-math.inf)


def partner(runs: list[list[Record]], rec: Record) -> Record | None:
    """The same case in the next run (cyclically): the fresh process that confirms a regression."""
    if len(runs) < 2:
        return None
    nxt = runs[(rec.run + 1) % len(runs)]
    return next((r for r in nxt if r.case == rec.case), None)


def short(case_id: str) -> str:
    return case_id.split("[", 1)[1].rstrip("]") if "[" in case_id else case_id


def pct(x: float) -> str:
    """A log-scale figure as a per-cent change."""
    return f"{math.expm1(x) * 100:+.2f}%" if math.isfinite(x) else "-"


def cell(k: int, n: int) -> str:
    return f"{k} ({k / n:.1%})" if n else "-"


def needed(n: int) -> int:
    """Verdicts out of n that must be caught for a rate of at least TARGET_RATE."""
    return -(-round(TARGET_RATE * 100) * n // 100)


def false_alarm_table(runs: list[list[Record]], margins: Sequence[float], fmt: str) -> None:
    rows = []
    for margin in margins:
        counts = {vd.REGRESSED: 0, vd.INCONCLUSIVE: 0, vd.PASS: 0, vd.FASTER: 0}
        total = 0
        for rec in (r for run in runs for r in run):
            v = judge(rec, 0.0, margin, rec.family)
            counts[v.status] = counts.get(v.status, 0) + 1
            total += 1
        rows.append(
            [
                f"{margin:.0%}",
                total,
                counts[vd.REGRESSED],
                f"{counts[vd.REGRESSED] / max(total, 1):.2%}",
                counts[vd.INCONCLUSIVE],
                counts[vd.PASS] + counts[vd.FASTER],
            ]
        )
    print(
        tabulate(
            rows,
            headers=["margin", "case verdicts", "false alarms", "rate", "inconclusive", "pass"],
            tablefmt=fmt,
            disable_numparse=True,
        )
    )


def power_table(
    runs: list[list[Record]],
    margins: Sequence[float],
    shifts: Sequence[float],
    single: dict[tuple[int, str], Scores],
    child: dict[tuple[int, str], Scores],
    fmt: str,
) -> None:
    """Every verdict judged by `decide`, single and confirmed, at every margin and shift."""
    records = [r for run in runs for r in run]
    checked = 0

    def regressed(rec: Record, shift: float, margin: float, fresh: bool) -> bool:
        nonlocal checked
        family = 1 if fresh else rec.family
        got = judge(rec, shift, margin, family).status == vd.REGRESSED
        sc = (child if fresh else single)[rec.run, rec.case]
        if got != (excess(sc, rec.stored, margin) + math.log1p(shift) > 0):
            raise SystemExit(
                f"score rule disagrees with decide: {rec.case} run {rec.run} shift {shift} margin {margin}"
            )
        checked += 1
        return got

    headers = ["margin", "verdicts", "false alarms single", "confirmed"]
    for s in shifts:
        headers += [f"+{s:.0%} caught single", "confirmed"]
    rows = []
    for margin in margins:
        row: list[Any] = [f"{margin:.0%}", len(records)]
        for s in [0.0, *shifts]:
            k_single = k_conf = 0
            for rec in records:
                if not regressed(rec, s, margin, fresh=False):
                    continue
                k_single += 1
                nxt = partner(runs, rec)
                if nxt is None or regressed(nxt, s, margin, fresh=True):
                    k_conf += 1  # no partner: the regression stands, as when the plugin cannot confirm
            row += [cell(k_single, len(records)), cell(k_conf, len(records)) if len(runs) > 1 else "-"]
        rows.append(row)
    print(tabulate(rows, headers=headers, tablefmt=fmt, disable_numparse=True))
    print(f"(the score rule used below agreed with decide on all {checked} of these verdicts)")


def smallest_caught(excesses: Sequence[float]) -> float:
    """Smallest shift of the fine grid caught in at least TARGET_RATE of the given verdicts (inf: none)."""
    need = needed(len(excesses))
    return next((s for s in FINE_GRID if sum(x + math.log1p(s) > 0 for x in excesses) >= need), math.inf)


def shift_cell(s: float) -> str:
    return f"{s:.1%}" if math.isfinite(s) else f">{FINE_GRID[-1]:.0%}"


def window(lower: Sequence[float], target: float) -> tuple[float, float, float]:
    """(tau needed for no false alarm, tau needed to catch `target` in TARGET_RATE, their gap): the
    window is open when the gap is positive. Quantiles are order statistics: the (1 - 1/N) quantile is
    the largest of the N, the 5% quantile the value with at most 5% of the N below it."""
    xs = sorted(lower)
    no_fa = xs[-1]
    catch = math.log1p(target) + xs[len(xs) - needed(len(xs))]
    return no_fa, catch, catch - no_fa


def window_cells(lower: Sequence[float], target: float) -> list[str]:
    no_fa, catch, gap = window(lower, target)
    return [pct(no_fa), pct(catch), f"{'open' if gap > 0 else 'empty'} ({gap * 100:+.2f} pts)"]


def best_per_case(groups: dict[str, list[float]], target: float) -> str:
    """+target caught when each case's threshold sits at its own largest A/A figure: the most any
    per-case threshold could catch with no false alarm here (tuned on the very data it is judged on)."""
    n = sum(len(v) for v in groups.values())
    k = sum(sum(x + math.log1p(target) > max(v) for x in v) for v in groups.values())
    return cell(k, n)


def top(sc: Scores) -> float:
    return max(sc.lower.values(), default=-math.inf)


def top_point(sc: Scores) -> float:
    return max(sc.point.values(), default=-math.inf)


def case_tables(
    runs: list[list[Record]],
    case_margins: Sequence[float],
    target: float,
    fa_verdicts: int,
    single: dict[tuple[int, str], Scores],
    child: dict[tuple[int, str], Scores],
    fmt: str,
) -> None:
    records = [r for run in runs for r in run]
    confirming = len(runs) > 1

    def confirmed(rec: Record, f: Callable[[Scores, BaselineEntry], float]) -> float:
        """A confirmed regression needs both: the smaller of the two figures decides. With no partner
        the regression stands, as in the plugin when no confirmation can be had."""
        nxt = partner(runs, rec)
        own = f(single[rec.run, rec.case], rec.stored)
        return own if nxt is None else min(own, f(child[nxt.run, nxt.case], nxt.stored))

    by_case: dict[str, list[Record]] = {}
    for rec in records:
        by_case.setdefault(rec.case, []).append(rec)

    # Per case: A/A spread and the smallest shift caught in >= 95% of its runs.
    headers = ["case", "runs", "A/A min", "p5", "p50", "p99", "max"]
    for m in case_margins:
        headers += [f"threshold at {m:.0%}", f"smallest caught at {m:.0%} single", "confirmed"]
    rows = []
    found: dict[float, list[float]] = {m: [] for m in case_margins}
    for case, recs in sorted(by_case.items()):
        est = np.array([single[r.run, r.case].estimate for r in recs])
        row: list[Any] = [short(case), len(recs)]
        row += [pct(float(est.min()))] + [pct(float(np.percentile(est, q))) for q in (5, 50, 99)]
        row += [pct(float(est.max()))]
        for m in case_margins:

            def over(sc: Scores, st: BaselineEntry, margin: float = m) -> float:
                return excess(sc, st, margin)

            tau = math.log1p(policy(m, 1).delta(recs[0].stored.noise))
            first = smallest_caught([over(single[r.run, r.case], r.stored) for r in recs])
            both = smallest_caught([confirmed(r, over) for r in recs])
            found[m].append(both)
            row += [pct(tau), shift_cell(first), shift_cell(both) if confirming else "-"]
        rows.append(row)
    print(f"Per case: A/A time vs baseline (the gate's estimate), and the smallest shift on a {FINE_GRID[0]:.1%} grid")
    print(f"caught in >= {TARGET_RATE:.0%} of its runs (confirmed: in run i and, alone, in run i+1)")
    print(tabulate(rows, headers=headers, tablefmt=fmt, disable_numparse=True))
    if confirming:
        for m, got in found.items():
            parts = [f"<= {s:.0%}: {sum(g <= s + 1e-9 for g in got)}" for s in (0.03, 0.05, 0.10)]
            print(f"cases whose smallest confirmed catch at {m:.0%} is " + ", ".join(parts) + f" (of {len(got)})")
    print()

    # The threshold argument, pooled and per case, free of any margin.
    est = np.array([single[r.run, r.case].estimate for r in records])
    hw = np.array([top_point(single[r.run, r.case]) - top(single[r.run, r.case]) for r in records])
    print(
        f"A/A e = ln(measured/baseline), time gate, {len(records)} verdicts: "
        + ", ".join(f"p{q:g} {pct(float(np.percentile(est, q)))}" for q in (1, 5, 50, 95, 99))
        + f", max {pct(float(est.max()))}; decision half-width (larger gate) median {float(np.median(hw)) * 100:.2f}%,"
        f" p95 {float(np.percentile(hw, 95)) * 100:.2f}%"
    )
    print(
        f'Can one threshold tau give "0 false alarms" and "+{target:.0%} caught in >= {TARGET_RATE:.0%}"? Regressed'
        " iff L > tau, L = the larger gate's decision lower bound (e minus the half-width), or the point"
    )
    print(
        f"estimate e itself (as if measured without error); a +{target:.0%} slowdown adds ln({1 + target:g}) to L."
        f" 0 FA needs tau >= the largest A/A L; +{target:.0%} in {TARGET_RATE:.0%} needs tau < ln({1 + target:g})"
        " + the 5% quantile of L. Window: the second minus the first, in points of ln."
    )
    kinds: list[tuple[str, Callable[[Scores, BaselineEntry], float], bool]] = [
        ("single, decision interval", lambda sc, st: top(sc), False),
        ("confirmed, decision interval", lambda sc, st: top(sc), True),
        ("single, point estimate", lambda sc, st: top_point(sc), False),
        ("confirmed, point estimate", lambda sc, st: top_point(sc), True),
    ]
    rows = []
    groups: dict[str, dict[str, list[float]]] = {}
    for name, f, conf in kinds:
        if conf and not confirming:
            continue
        xs = [confirmed(r, f) if conf else f(single[r.run, r.case], r.stored) for r in records]
        groups[name] = {}
        for r, x in zip(records, xs, strict=True):
            groups[name].setdefault(r.case, []).append(x)
        rows.append([name, len(xs), *window_cells(xs, target), best_per_case(groups[name], target)])
    print(
        tabulate(
            rows,
            headers=[
                "pooled",
                "N",
                "0 FA needs tau >=",
                f"+{target:.0%} in {TARGET_RATE:.0%} needs tau <",
                "window",
                f"per-case thresholds fitted in-sample (optimistic): +{target:.0%} caught",
            ],
            tablefmt=fmt,
            disable_numparse=True,
        )
    )
    rows = []
    n_open = {"single": 0, "confirmed": 0}
    for case, xs in sorted(groups["single, decision interval"].items()):
        a = window_cells(xs, target)
        b = window_cells(groups["confirmed, decision interval"][case], target) if confirming else ["-", "-", "-"]
        n_open["single"] += a[2].startswith("open")
        n_open["confirmed"] += b[2].startswith("open")
        rows.append([short(case), len(xs), *a, *b, f"{float(np.std(xs, ddof=1)) * 100:.2f}%"])
    print(
        f"Per case, decision interval (each case's own runs; >= {TARGET_RATE:.0%} of {len(runs)} runs is"
        f" {needed(len(runs))} of them):"
    )
    print(
        tabulate(
            rows,
            headers=[
                "case",
                "runs",
                "0 FA needs tau >=",
                f"+{target:.0%} needs tau <",
                "window single",
                "confirmed: tau >=",
                "tau <",
                "window confirmed",
                "sd of L",
            ],
            tablefmt=fmt,
            disable_numparse=True,
        )
    )
    print(
        f"cases with an open window: single {n_open['single']} of {len(rows)}, confirmed {n_open['confirmed']} of"
        f" {len(rows)}. In-sample: the largest of {len(runs)} runs sits near their {len(runs)}/{len(runs) + 1} quantile"
        f" (a new run exceeds it with probability 1/{len(runs) + 1}), far below the 1 - 1/N one: an empty window"
        " is conclusive, an open one is not."
    )
    # Out of sample, for a case whose L is Gaussian with between-run sd s: 0 FA in N verdicts needs tau at
    # z(1 - 1/N) sd above its mean, catching the target in 95% needs tau z(0.95) sd below mean + ln(1 + target).
    # Confirmed, with independent processes: each side at z(1 - 1/sqrt N) and z(sqrt 0.95).
    z = NormalDist().inv_cdf
    limit_single = math.log1p(target) / (z(1 - 1 / fa_verdicts) + z(TARGET_RATE))
    limit_conf = math.log1p(target) / (z(1 - 1 / math.sqrt(fa_verdicts)) + z(math.sqrt(TARGET_RATE)))
    sds = [float(np.std(xs, ddof=1)) for xs in groups["single, decision interval"].values()]
    print(
        f"Gaussian per-case model, 0 FA in {fa_verdicts} verdicts: a window needs sd of L below"
        f" {limit_single * 100:.2f}% (single) or {limit_conf * 100:.2f}% (confirmed, independent processes);"
        f" cases below: {sum(x < limit_single for x in sds)} and {sum(x < limit_conf for x in sds)} of {len(sds)};"
        f" sd of L median {float(np.median(sds)) * 100:.2f}%, max {max(sds) * 100:.2f}%."
    )


def floats(text: str) -> list[float]:
    return [float(m) for m in text.split(",") if m.strip()]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("baseline", type=Path)
    ap.add_argument("results", type=Path, nargs="+")
    ap.add_argument("--margins", default="0.02,0.03,0.04,0.05,0.06")
    ap.add_argument(
        "--shifts", default="0.02,0.03,0.05,0.10", help='planted slowdowns; "" for the false-alarm table only'
    )
    ap.add_argument("--case-margins", default="0.05,0.03", help="margins of the per-case table")
    ap.add_argument("--target", type=float, default=0.03, help="slowdown of the feasibility argument")
    ap.add_argument("--fa-verdicts", type=int, default=1000, help="N of the goal: 0 false alarms in N verdicts")
    ap.add_argument("--tablefmt", default="simple", help="tabulate format (github for Markdown)")
    args = ap.parse_args()
    runs, missing = load(args.baseline, args.results)
    margins = floats(args.margins)
    fmt = str(args.tablefmt)
    false_alarm_table(runs, margins, fmt)
    shifts = floats(args.shifts)
    if not shifts:
        return 0
    records = [r for run in runs for r in run]
    single = {(r.run, r.case): scores(r, r.family) for r in records}
    child = {(r.run, r.case): scores(r, 1) for r in records}
    print()
    print(
        f"{len(runs)} guard runs, {len(records)} case verdicts ({missing} without a stored entry, skipped); "
        f"{sum(r.pooled for r in records)} recorded re-measured (blocks pooled), the rest one measurement each."
    )
    print("Planted slowdowns: variant blocks x (1 + shift). Single: the run's own verdict. Confirmed: regressed in")
    print("run i and, judged alone (a family of one case), in run i+1 (cyclically), as the fresh-process check.")
    power_table(runs, margins, shifts, single, child, fmt)
    print()
    case_tables(runs, floats(args.case_margins), args.target, args.fa_verdicts, single, child, fmt)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
