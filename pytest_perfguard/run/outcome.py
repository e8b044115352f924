"""The end of a guard run in words: what was compared, decided and left unverified, each with why."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

from ..judge import baseline as bl
from ..judge.policy import (
    MACHINE_MOVED_SHARE,
    MDE_MARGINS,
    NOISE_K,
    allowance,
    decision,
    judged_margin,
)
from ..judge.reference import MACHINE_MOVED
from ..judge.verdict import UNCHECKED_FASTER
from ..record import CaseRecord, Outcome, Status
from ..settings import shown
from .state import UNCOMPARED, UNJUDGED, RunSummary, SessionState, baseline_file


def nothing_timed(records: list[CaseRecord]) -> str:
    """Why a perf run timed no case: what its cases did instead (failed before a measurement finished,
    skipped), or that no @perf_case test was collected."""
    skipped = [r for r in records if r.outcome in (Outcome.SKIPPED, Outcome.NOT_RUN)]
    failed = [r for r in records if r.outcome is Outcome.FAILED]
    parts = []
    if failed:
        kinds = Counter(str(r.verdict or "error") for r in failed)
        parts.append(
            f"{len(failed)} failed before a measurement finished ("
            + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
            + ")"
        )
    if skipped:
        why = "; ".join(sorted({(r.reasons or ["?"])[0] for r in skipped}))[:500]
        parts.append(f"{len(skipped)} skipped: {why}")
    what = "; ".join(parts) if parts else "no @perf_case test was collected"
    return f"perfguard: no perf case was timed ({what}). A perf run that measures nothing must not pass."


def disturbed_line(timed: list[CaseRecord], *, update: bool) -> str:
    """The cases whose measurement stayed disturbed (runner: a disturbed one is re-measured once), with the
    first one's numbers; empty when there were none. Their verdicts are the machine's, not the code's."""
    hit = [r for r in timed if r.disturbances]
    if not hit:
        return ""
    ids = ", ".join(r.id for r in hit[:5]) + (" ..." if len(hit) > 5 else "")
    return (
        f"perfguard: {len(hit)} timed case(s) stayed disturbed while timed (re-measured once): inconclusive"
        + (", not stored" if update else "")
        + f" ({ids}); {hit[0].id}: {hit[0].disturbances[0]}"
    )


WARMUP_NAMES = {"profiler_s": "torch.profiler's first session", "device_peak_s": "the device's peaks (NVML)"}


def warmup_line(warmups: list[dict[str, float]]) -> str:
    """What the checks' one-time warm-up cost, per process; empty when there was none."""
    keys = sorted({k for w in warmups for k in w})
    if not keys:
        return ""
    parts = []
    for key in keys:
        each = [w[key] for w in warmups if key in w]
        spent = ", ".join(f"{x:.2f}" for x in each)
        parts.append(f"{WARMUP_NAMES.get(key, key)} {spent} s")
    per = f" in each of {len(warmups)} processes" if len(warmups) > 1 else ""
    return f"perfguard: one-time warm-up of the checks{per}, before the first case and in no case's checks: " + (
        "; ".join(parts)
    )


def compared(state: SessionState, timed: list[CaseRecord], out: RunSummary) -> None:
    """One line on what was compared with what; a run that compared nothing fails under CI."""
    s = state.settings
    against = "base revision" if s.against else "baseline"
    not_compared = _not_compared(timed, "ab" if s.against else "baseline")
    compared = len(timed) - sum(not_compared.values())
    line = f"perfguard: {compared} of {len(timed)} timed case(s) compared with the {against}"
    if not_compared:
        line += "; not compared: " + ", ".join(f"{n} {why}" for why, n in sorted(not_compared.items()))
    out.messages.append(line)
    alone = [] if s.against else moved_alone(timed)
    if alone:
        out.errors.append(
            f"perfguard: {len(alone)} case(s) excused by 'the reference moved' while the run's other cases' "
            "references did not move with it: the reference moved alone, beside these cases, which is no "
            "machine's doing; flagged: " + "; ".join(alone[:5]) + (" ..." if len(alone) > 5 else "")
        )
    moved_or_unchecked = _unchecked_faster_line(timed) if s.against else _moved_line(timed)
    for extra in (_thin_line(state, timed), batch_line(timed), moved_or_unchecked):
        if extra:
            out.messages.append(extra)
    if compared or not s.enabled or all(r.verdict in UNJUDGED for r in timed):
        return  # cases that failed on their own are not a missing baseline: their failures say why
    if set(not_compared) - {"new (no baseline entry)", str(Status.NEW), str(Status.NO_BASE)}:
        return  # something was stored that could not judge them (not comparable): unverified, decided says so
    _nothing_compared(state, out)


def _not_compared(timed: list[CaseRecord], gate: str) -> Counter[str]:
    """Why the timed cases that were not compared were not, counted: a verdict before any comparison, or
    the deciding gate's (``gate``) status that compared with nothing."""
    not_compared: Counter[str] = Counter()
    for r in timed:
        if r.verdict in UNJUDGED:
            not_compared[str(r.verdict)] += 1
            continue
        g = r.gate(gate)
        status = g.status if g is not None else Status.NO_BASELINE
        if status in UNCOMPARED:
            not_compared["new (no baseline entry)" if status is Status.NO_BASELINE else str(status)] += 1
    return not_compared


def _unchecked_faster_line(timed: list[CaseRecord]) -> str:
    """The A/B "faster" verdicts whose case holds no stored A/A reading (UNCHECKED_FASTER), counted where the
    summary and the pull-request comment show them, which print no case's reason; empty when there are none."""
    unchecked = [
        r for r in timed if r.verdict is Status.FASTER and (g := r.gate("ab")) and g.reason.endswith(UNCHECKED_FASTER)
    ]
    if not unchecked:
        return ""
    return (
        f'perfguard: {len(unchecked)} "faster" verdict(s) rest on no stored A/A reading of their case: two loaded '
        "copies of one kernel can differ for every process (cuda_scalar's read up to 5.4% apart on H200s), "
        "which a fresh process does not rule out; pytest --perfguard-update-baseline on a clean git checkout "
        "stores the readings that do"
    )


def _thin_line(state: SessionState, timed: list[CaseRecord]) -> str:
    """The timed cases whose stored entry rests on one process; empty when there are none (or under A/B)."""
    stored = state.baseline.cases if state.baseline is not None and not state.settings.against else {}
    thin = [r.id for r in timed if (e := stored.get(r.id)) is not None and e.runs < 2]
    if not thin:
        return ""
    return (
        f"perfguard: {len(thin)} stored case(s) rest on one process, a thin baseline: their between-process "
        f"spread is unknown, so their threshold falls back to {NOISE_K:g}x the stored noise; record a sample of "
        "several processes with pytest --perfguard-update-baseline"
    )


def judged_margin_of(state: SessionState, r: CaseRecord) -> float:
    """The margin the case was judged at (policy.judged_margin; an update stores no entry widened past twice
    a quiet one, policy.verifiable_limit), else the set margin."""
    s = state.settings
    fallback = s.ab_margin_for(r.median_ns or 0.0) if s.against else s.margin
    return judged_margin([(g.name, g.threshold) for g in r.gates], fallback)


_WAITED = re.compile(r"waited ([\d.]+) s for the disturbance to end .*: (it (?:had not )?ended)$")


def why_unverified(r: CaseRecord, margin: float, stored: bl.BaselineEntry | None = None) -> str:
    """One short reason a case ended unverified; for a pass past the MDE ceiling, the stored processes'
    spread where that is what sets it (a process-level mode of the kernel: more blocks do not move it)."""
    from ..report.terminal import shorten, weak_pass

    if r.verdict not in (Status.INCONCLUSIVE, Status.NOT_COMPARABLE, Status.NO_BASE) and r.mde is not None:
        spread = (
            f"; the baseline's {stored.runs} processes differ by {math.expm1(stored.noise):.1%} (sd), which more "
            "blocks here cannot narrow"
            if stored is not None and stored.runs >= 2 and stored.noise > 0
            else ""
        )
        return f"{weak_pass(r.mde)}, more than {MDE_MARGINS:g}x the {margin:.1%} margin it was judged at{spread}"
    if r.disturbances:
        waited = next((m for n in r.notes if (m := _WAITED.match(n))), None)
        wait = f"; waited {waited[1]} s for it to end: {waited[2]}" if waited else ""
        return "disturbed while timed: " + shorten(r.disturbances[0], 160) + wait
    reason = next((x for x in r.reasons if x), str(r.verdict))
    return shorten(reason, 220)


def decided(state: SessionState, timed: list[CaseRecord], out: RunSummary) -> None:
    """Each timed case's decision (policy.decision), the counts, and the unverified cases named: under CI
    more of them than --perfguard-allow-unverified fail the run; elsewhere they are a warning. A green run
    means "measured, and no regression"; a case the guard could not decide is not green."""
    for r in timed:
        r.decision = decision(
            str(r.verdict) if r.verdict is not None else None,
            r.outcome is Outcome.FAILED,
            r.timed,
            r.mde,
            judged_margin_of(state, r),
        )
    s = state.settings
    counts = Counter(r.decision for r in timed)
    line = (
        f"perfguard: {len(timed)} timed case(s): {counts['pass']} pass, {counts['fail']} fail, "
        f"{counts['unverified']} unverified"
    )
    if counts["new"]:
        line += f", {counts['new']} new (nothing stored to compare with)"
    out.messages.append(line)
    unverified = [r for r in timed if r.decision == "unverified"]
    if not unverified:
        return
    allowed = allowance(s.allow_unverified, len(timed))
    entries = state.baseline.cases if state.baseline is not None and not s.update else {}
    shown_ids = "\n".join(
        f"  {r.id}: {why_unverified(r, judged_margin_of(state, r), entries.get(r.id))}" for r in unverified[:20]
    ) + (f"\n  ... and {len(unverified) - 20} more" if len(unverified) > 20 else "")
    advice = (
        "measure on a quiet machine; record the baseline on this runner (pytest --perfguard-update-baseline); "
        "or compare head and base in one process, which cancels the machine (--perfguard-against origin/main)"
    )
    text = f"perfguard: {len(unverified)} case(s) unverified: the guard could not rule out a regression:\n{shown_ids}"
    if state.role.ci and len(unverified) > allowed:
        out.errors.append(
            f"{text}\nUnder CI an unverified case is not a pass: this fails the run ({allowed} allowed by "
            f"--perfguard-allow-unverified={s.allow_unverified}). To fix: {advice}"
        )
    else:
        where = f"within the {allowed} allowed" if state.role.ci else "a warning here; under CI they fail the run"
        out.messages.append(f"{text}\n({where}.) To decide them: {advice}")


def moved_alone(timed: list[CaseRecord]) -> list[str]:
    """The cases whose time gate the machine was said to excuse (reference.machine_moved) although the other
    cases' references did not move with theirs: the median move of the others, in the same direction, is
    under a quarter of the case's own. A machine that moved moves every case's reference; a reference that
    moved beside one case only was moved by that case. Each as 'id (reference +x%, the others' median +y%)'."""
    out = []
    for r in timed:
        g = r.gate("baseline")
        if g is None or MACHINE_MOVED not in g.reason or r.reference_move is None:
            continue
        others = sorted(x.reference_move for x in timed if x is not r and x.reference_move is not None)
        if len(others) < 2:
            continue  # too few cases to tell a machine from a case
        median = others[len(others) // 2]
        own = r.reference_move
        if own * median <= 0 or abs(median) < abs(own) / 4:
            out.append(f"{r.id} (reference {math.expm1(own):+.1%}, the others' median {math.expm1(median):+.1%})")
    return out


def _moved_line(timed: list[CaseRecord]) -> str:
    """The timed cases whose time gate the machine made not comparable (reference.machine_moved); empty when
    there are none."""
    moved = [r for r in timed if (g := r.gate("baseline")) is not None and MACHINE_MOVED in g.reason]
    if not moved:
        return ""
    many = len(moved) > MACHINE_MOVED_SHARE * len(timed)
    return (
        f"perfguard: in {len(moved)} of {len(timed)} timed case(s) the reference moved past the threshold with "
        "the case: the machine, not the code, moved; their time gates are not comparable and their ratio "
        "gates decided"
        + (
            f". That is more than {MACHINE_MOVED_SHARE:.0%} of the cases: compare on like machines, or record the "
            "baseline on this one"
            if many
            else ""
        )
    )


def _nothing_compared(state: SessionState, out: RunSummary) -> None:
    """A run that compared no timed case with anything: where it looked and how to fix it; an error under
    CI, unless allowed, since a guard that compares nothing guards nothing."""
    s = state.settings
    if s.against:
        where = f"the base revision {s.against}"
        fix = "check the revision and the case ids (the reasons above say why each case has no base)"
    else:
        path = baseline_file(state)
        exists = state.baseline is not None and state.baseline.exists
        where = f"{shown(path)} ({'it holds none of the selected cases' if exists else 'no such file'})"
        fix = "record one on this runner with: pytest --perfguard-update-baseline (and the same selection)"
    text = f"perfguard: no timed case was compared with anything: looked in {where}; {fix}"
    if s.allow_missing:
        out.messages.append(text + " (allowed by --perfguard-allow-missing)")
    elif state.role.ci:
        out.errors.append(text + ". Under CI this fails the run; --perfguard-allow-missing allows it")
    else:
        out.messages.append(text + ". This passes locally but fails under CI")


def batch_line(records: Sequence[CaseRecord]) -> str:
    """The summary's account of batched confirmations; empty when there were none."""
    batched = [r for r in records if r.confirmation is not None and r.confirmation.batch]
    if not batched:
        return ""
    counts: dict[str, int] = {}
    for r in batched:
        key = str(r.verdict)
        if r.verdict is Status.REGRESSED:
            confirmed = r.confirmation is not None and r.confirmation.verdict is Status.REGRESSED
            key += " (confirmed)" if confirmed else " (not confirmed: see the case's notes)"
        counts[key] = counts.get(key, 0) + 1
    parts = ", ".join(f"{n} {what}" for what, n in sorted(counts.items()))
    return (
        f"perfguard: {len(batched)} regression(s) past the single confirmations (--perfguard-confirm-max) were "
        f"confirmed together in one fresh process per session or xdist worker: {parts}"
    )
