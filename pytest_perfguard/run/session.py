"""The run's state, and the controller's end of a run: merge, write the baseline once, write reports once.

`finish` runs in the single process of a plain run, or in the xdist controller, never in a worker. Nothing
here raises into pytest's summary hooks: problems become messages and a non-zero exit status.
"""

from __future__ import annotations

import math
import os
import re
import statistics
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ..jsonio import JSONFileError
from ..judge import baseline as bl
from ..judge.policy import (
    MACHINE_MOVED_SHARE,
    MDE_MARGINS,
    NOISE_K,
    WIDE_INTERVAL,
    WIDE_MARGIN,
    allowance,
    decision,
    discord_limit,
    discordant,
    judged_margin,
    log_spread,
    medians_threshold,
    outlier_process,
    prior_spread,
    too_wide,
    verifiable_limit,
)
from ..judge.policy import NOISE_FLOOR as NOISE_FLOOR  # re-exported: the floors live with every other rule
from ..judge.policy import RATIO_NOISE_FLOOR as RATIO_NOISE_FLOOR
from ..judge.verdict import MACHINE_MOVED, UNCHECKED_FASTER, Policy
from ..measure.visible import cpu_model, cuda_gpus, device_index
from ..record import CaseRecord, Gate, Outcome, Status
from ..settings import Settings, shown

if TYPE_CHECKING:
    from ..measure.timing import Progress
    from ..measure.torchstate import Snapshot
    from .ab import BaseTree


# Verdicts of a timed case that compared it with nothing.
UNCOMPARED = (Status.NO_BASELINE, Status.NOT_COMPARABLE, Status.NO_BASE, Status.NEW)
# Verdicts of a timed case that failed before any comparison: a timing the guard did not believe, a crash
# after timing. They are counted as what they are, never as a case without a baseline entry.
UNJUDGED = (Status.FLAGGED, Status.ERROR, Status.INCORRECT, Status.TIMEOUT)


@dataclass
class SessionState:
    """Per-process run state (kept in config.stash)."""

    settings: Settings
    # the device dictionary (measure.device.fingerprint); None until first read (`device_info`): an xdist
    # controller takes its first worker's (xdist.node_down), so that it never waits for torch
    fingerprint: dict[str, Any] | None = None
    baseline: bl.BaselineFile | None = None
    family_size: int = 1
    records: list[CaseRecord] = field(default_factory=list)
    timing_spent_s: float = 0.0
    deciding_spent_s: float = 0.0  # seconds spent measuring undecided cases again (timed._decide_more)
    poisoned_by: str | None = None
    confirmations: int = 0
    on_timeout: Callable[[str, pytest.Item], None] | None = None  # set by the plugin: flush results before the exit
    base: BaseTree | None = None  # the base revision's tree under --perfguard-against
    rootdir: Path = field(default_factory=Path.cwd)
    # set by the plugin: case name -> the live progress line's per-block callback (progress.py), or None
    progress: Callable[[str], Callable[[Progress], None] | None] | None = None
    # The checks' one-time costs, paid before the first case (integrity.warm_up): one entry per process
    # that ran cases (the controller gathers its workers'), reported once and never in a case's checks_s.
    warmups: list[dict[str, float]] = field(default_factory=list)
    # set by the plugin in the process that writes the baseline: starts one fresh process on these case ids,
    # in this order, with these settings, and returns what waits for it: their records (or why there are
    # none). An update's further processes.
    fresh_cases: Callable[[list[str], Settings], Callable[[], dict[str, CaseRecord] | str]] | None = None
    # set by the plugin in an xdist controller whose workers time on several GPUs: the devices an update's
    # further processes spread over, one fresh process on each at a time (xdist.update_devices)
    fresh_devices: list[str] = field(default_factory=list)
    # torch's process-wide switches as the session started (measure/torchstate.py): every case is timed in
    # this state; taken at configure time, before any test module is imported
    torch_state: Snapshot | None = None
    _prior: tuple[int, tuple[float, float]] | None = field(default=None, repr=False)  # cache of `prior`

    @property
    def kind(self) -> str:
        return "cuda" if self.settings.device.startswith("cuda") else "cpu"

    @property
    def device_info(self) -> dict[str, Any]:
        if self.fingerprint is None:
            from ..measure.device import fingerprint

            self.fingerprint = fingerprint(self.settings.device)
        return self.fingerprint

    @property
    def slug(self) -> str:
        """The name of this device's baseline file, without importing torch (measure/visible.py)."""
        if self.fingerprint is not None:
            return str(self.fingerprint["slug"])
        if self.kind == "cpu":
            return "cpu-" + bl.device_slug(cpu_model())
        gpus, index = cuda_gpus(), device_index(self.settings.device)
        return bl.device_slug(gpus[index].name) if index < len(gpus) else str(self.device_info["slug"])

    @property
    def noise_floor(self) -> float:
        return NOISE_FLOOR[self.kind]

    def policy(self) -> Policy:
        from .cleanup import in_child

        return Policy(
            margin=self.settings.margin,
            alpha=self.settings.alpha,
            family_size=self.family_size,
            noise_floor=self.noise_floor,
            ratio_noise_floor=RATIO_NOISE_FLOOR[self.kind],
            confirm=self.settings.confirm and not in_child(),  # as confirm.confirm_regression decides
            prior_spread=self.prior[0],
            prior_ratio_spread=self.prior[1],
        )

    @property
    def prior(self) -> tuple[float, float]:
        """The baseline file's typical between-process spreads of time and ratio (policy.prior_spread)."""
        key = id(self.baseline)
        if self._prior is None or self._prior[0] != key:
            cases = self.baseline.cases.values() if self.baseline is not None else ()
            entries = [e for e in cases if e.runs >= 2]
            spreads = (prior_spread([e.noise for e in entries]), prior_spread([e.ratio_noise for e in entries]))
            self._prior = (key, spreads)
        return self._prior[1]


def make_state(settings: Settings, rootdir: Path | None = None, *, runs_cases: bool = True) -> SessionState:
    """The process's state. A process that runs no case (an xdist controller) reads its device's fingerprint
    later (`SessionState.device_info`)."""
    state = SessionState(settings=settings)
    if runs_cases:
        state.device_info  # noqa: B018 (read now: a case's timing must not pay for it)
        if settings.enabled:  # before any test module is imported: the state every case is timed in
            from ..measure import torchstate

            state.torch_state = torchstate.snapshot()
    if rootdir is not None:
        state.rootdir = rootdir
    return state


@dataclass
class RunSummary:
    """What the end of a run says: messages, and errors that fail the run."""

    messages: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def baseline_file(state: SessionState) -> Path:
    """The baseline file of this run's device (absolute: see settings.py on relative paths)."""
    return state.settings.baseline_dir / f"{state.slug}.json"


def aa_reading(r: CaseRecord) -> tuple[float, tuple[float, float]] | None:
    """The head/base ratio and its 95% interval of a record timed against its own twin at HEAD (an update's
    A/A process); None for a record without one (no base revision, or no usable twin)."""
    gate = r.gate("ab")
    if gate is None or gate.estimate is None or gate.ci is None:
        return None
    (lo, hi), est = gate.ci, gate.estimate
    return (est, (lo, hi)) if 0 < lo <= est <= hi < math.inf else None


def sample_of(r: CaseRecord, device: str = "") -> bl.ProcessSample:
    """What one process measured of a case, as a baseline entry keeps it (with its A/A reading, if any)."""
    assert r.median_ns is not None and r.ci_ns is not None
    ratio = float(r.ratio) if r.ratio is not None else None
    aa = aa_reading(r)
    return bl.ProcessSample(
        median_ns=float(r.median_ns),
        ci_ns=(min(float(r.ci_ns[0]), float(r.median_ns)), max(float(r.ci_ns[1]), float(r.median_ns))),
        ratio=ratio,
        against_ns=float(r.median_ns) / ratio if ratio else None,
        device=device,
        date=str(r.updated or date.today().isoformat()),
        blocks=int(r.blocks or 0),
        host_ns=r.host_ns,
        host_ratio=r.host_ratio,
        aa_ratio=aa[0] if aa is not None else None,
        aa_ci=aa[1] if aa is not None else None,
    )


def entry_of(
    r: CaseRecord, noise: float, samples: list[bl.ProcessSample] | None = None, unstable: bool = False
) -> bl.BaselineEntry:
    """The baseline entry an update makes of a timed record and the samples of its processes (by default
    the record's own process alone)."""
    assert r.median_ns is not None and r.ci_ns is not None and r.workload is not None
    return bl.BaselineEntry.from_samples(
        r.id,
        samples if samples else [sample_of(r)],
        workload=r.workload,
        workload_desc=r.workload_desc or "",
        env={k: str(v) for k, v in (r.env or {}).items()},
        updated=str(r.updated or date.today().isoformat()),
        noise=noise,
        unstable=unstable,
    )


def device_id(state: SessionState) -> str:
    """What a process sample names its device by: the GPU's UUID, or the host's CPU model."""
    if state.kind == "cuda":
        gpus, index = cuda_gpus(), device_index(state.settings.device)
        return gpus[index].uuid if index < len(gpus) else state.settings.device
    return cpu_model()


def _recordable(r: CaseRecord) -> bool:
    return r.timed and r.outcome is Outcome.PASSED and not r.disturbances and not r.baseline_hold


def under_ci() -> bool:
    return any(os.environ.get(k, "").strip().lower() not in ("", "0", "false") for k in ("CI", "GITHUB_ACTIONS"))


def finish(state: SessionState, records: list[CaseRecord], *, collected_ids: set[str] | None) -> RunSummary:
    """Decide the run-level outcome and write files. `records` are all processes' records, merged."""
    s = state.settings
    out = RunSummary()
    timed = [r for r in records if r.timed]
    if s.enabled and not timed:
        out.errors.append(_nothing_timed(records))
    # A sticky CUDA error marks its case's record (Runner._crashed), in any process of the session.
    poisoned_by = sorted({r.id for r in records if r.sticky})
    if s.update and timed:
        if poisoned_by:
            out.errors.append(
                "perfguard: no baseline written: the CUDA context was poisoned during this session "
                f"(by {', '.join(poisoned_by)})"
            )
        else:
            _update(state, timed, collected_ids, out)
    elif s.enabled and timed:
        _compared(state, timed, out)
        _decided(state, timed, out)
        if state.baseline is not None and state.baseline.exists and collected_ids is not None:
            stale = bl.stale_entries(state.baseline, collected_ids)
            if stale:
                out.messages.append(
                    f"perfguard: {len(stale)} stored case(s) in {shown(baseline_file(state))} "
                    "were not collected in this "
                    "run (stale if the whole suite ran); remove them with --perfguard-update-baseline --perfguard-prune"
                )
    # In a guard the unverified cases' summary (_decided) names each disturbed case already.
    disturbed = disturbed_line(timed, update=s.update) if s.update else ""
    if disturbed:
        out.messages.append(disturbed)
    warmup = warmup_line(state.warmups)
    if warmup:
        out.messages.append(warmup)
    _write_reports(state, records, timed, out)
    return out


def _nothing_timed(records: list[CaseRecord]) -> str:
    """Why a perf run timed no case: what its cases did instead (failed before timing, skipped), or that no
    @perf_case test was collected."""
    skipped = [r for r in records if r.outcome in (Outcome.SKIPPED, Outcome.NOT_RUN)]
    failed = [r for r in records if r.outcome is Outcome.FAILED]
    parts = []
    if failed:
        kinds = Counter(str(r.verdict or "error") for r in failed)
        parts.append(
            f"{len(failed)} failed before timing (" + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) + ")"
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


def _compared(state: SessionState, timed: list[CaseRecord], out: RunSummary) -> None:
    """One line on what was compared with what; a run that compared nothing fails under CI."""
    s = state.settings
    against = "base revision" if s.against else "baseline"
    not_compared = _not_compared(timed, "ab" if s.against else "baseline")
    compared = len(timed) - sum(not_compared.values())
    line = f"perfguard: {compared} of {len(timed)} timed case(s) compared with the {against}"
    if not_compared:
        line += "; not compared: " + ", ".join(f"{n} {why}" for why, n in sorted(not_compared.items()))
    out.messages.append(line)
    alone = [] if s.against else _moved_alone(timed)
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
        return  # something was stored that could not judge them (not comparable): unverified, _decided says so
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


def _judged_margin(state: SessionState, r: CaseRecord) -> float:
    """The margin the case was judged at (policy.judged_margin; an update stores no entry widened past twice
    a quiet one, policy.verifiable_limit), else the set margin."""
    s = state.settings
    fallback = s.ab_margin_for(r.median_ns or 0.0) if s.against else s.margin
    return judged_margin([(g.name, g.threshold) for g in r.gates], fallback)


_WAITED = re.compile(r"waited ([\d.]+) s for the disturbance to end .*: (it (?:had not )?ended)$")


def _why_unverified(r: CaseRecord, margin: float, stored: bl.BaselineEntry | None = None) -> str:
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


def _decided(state: SessionState, timed: list[CaseRecord], out: RunSummary) -> None:
    """Each timed case's decision (policy.decision), the counts, and the unverified cases named: under CI
    more of them than --perfguard-allow-unverified fail the run; elsewhere they are a warning. A green run
    means "measured, and no regression"; a case the guard could not decide is not green."""
    for r in timed:
        r.decision = decision(
            str(r.verdict) if r.verdict is not None else None,
            r.outcome is Outcome.FAILED,
            r.timed,
            r.mde,
            _judged_margin(state, r),
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
        f"  {r.id}: {_why_unverified(r, _judged_margin(state, r), entries.get(r.id))}" for r in unverified[:20]
    ) + (f"\n  ... and {len(unverified) - 20} more" if len(unverified) > 20 else "")
    advice = (
        "measure on a quiet machine; record the baseline on this runner (pytest --perfguard-update-baseline); "
        "or compare head and base in one process, which cancels the machine (--perfguard-against origin/main)"
    )
    text = f"perfguard: {len(unverified)} case(s) unverified: the guard could not rule out a regression:\n{shown_ids}"
    if under_ci() and len(unverified) > allowed:
        out.errors.append(
            f"{text}\nUnder CI an unverified case is not a pass: this fails the run ({allowed} allowed by "
            f"--perfguard-allow-unverified={s.allow_unverified}). To fix: {advice}"
        )
    else:
        where = f"within the {allowed} allowed" if under_ci() else "a warning here; under CI they fail the run"
        out.messages.append(f"{text}\n({where}.) To decide them: {advice}")


def _moved_alone(timed: list[CaseRecord]) -> list[str]:
    """The cases whose time gate the machine was said to excuse (verdict._machine_moved) although the other
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
    """The timed cases whose time gate the machine made not comparable (verdict._machine_moved); empty when
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
    elif under_ci():
        out.errors.append(text + ". Under CI this fails the run; --perfguard-allow-missing allows it")
    else:
        out.messages.append(text + ". This passes locally but fails under CI")


def _write_reports(state: SessionState, records: list[CaseRecord], timed: list[CaseRecord], out: RunSummary) -> None:
    from ..report.html import ReportDependencyError
    from ..report.results import results_document
    from ..report.writers import asked

    s = state.settings
    summary = {
        "cases": len(records),
        "timed": len(timed),
        "regressed": sum(1 for r in timed if r.verdict is Status.REGRESSED),
        "inconclusive": sum(1 for r in timed if r.verdict is Status.INCONCLUSIVE),
        "incorrect": sum(1 for r in records if r.verdict is Status.INCORRECT),
        "family_size": state.family_size,
        "margin": s.margin,
        "errors": out.errors,
    }
    doc = results_document(records, state.device_info, summary, run_info(state))
    for writer, path in asked(s):
        try:
            writer.write(path, doc)
            out.messages.append(f"perfguard: {writer.title} written to {shown(path)}")
        except (ReportDependencyError, JSONFileError, OSError, ValueError) as exc:
            out.errors.append(f"perfguard: {writer.failed.format(path=path)}: {exc}")
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary and s.enabled:
        from ..report.markdown import markdown_summary

        try:
            with open(step_summary, "a", encoding="utf-8") as fh:
                fh.write(markdown_summary(doc, notes=out.messages))
        except OSError as exc:
            out.errors.append(f"perfguard: could not append to GITHUB_STEP_SUMMARY ({step_summary}): {exc}")


def run_info(state: SessionState) -> dict[str, Any]:
    """What the run compared and at which revision: shown in reports."""
    from ..gitrev import head_sha, tree_digest

    info: dict[str, Any] = {"git_sha": head_sha(state.rootdir)}
    dirty = tree_digest(state.rootdir) if info["git_sha"] else None
    if dirty:
        # the code measured is the commit plus these changes: compare and history never file it as the commit
        info["git_dirty"] = dirty
    if state.warmups:
        info["warmup"] = state.warmups
    if state.settings.against:
        info["against"] = state.settings.against
        base = state.base
        if base is not None:
            info["base_sha"] = base.sha
            if base.offsets is not None:
                large, small = base.offsets
                info["ab_process_sd"] = {"large": large.to_json(), "small": small.to_json()}
    return info


def _baseline_folder(state: SessionState, out: RunSummary) -> bool:
    """The baseline folder exists, or is created: the default always, an explicit one when its parent
    exists. Says what it did; False (with the error) when it cannot be made."""
    folder = state.settings.baseline_dir
    if folder.is_dir():
        return True
    explicit = "baseline_dir" in state.settings.explicit
    if explicit and not folder.parent.is_dir():
        out.errors.append(
            f"perfguard: baseline folder {shown(folder)} cannot be created: its parent {folder.parent} does not exist. "
            "Create it, or point --perfguard-baseline-dir at an existing folder. Nothing was written."
        )
        return False
    try:
        folder.mkdir(parents=not explicit, exist_ok=True)
    except OSError as exc:
        out.errors.append(f"perfguard: cannot create baseline folder {folder}: {exc}. Nothing was written.")
        return False
    out.messages.append(f"perfguard: created the baseline folder {shown(folder)}")
    return True


def _update(state: SessionState, timed: list[CaseRecord], collected_ids: set[str] | None, out: RunSummary) -> None:
    s = state.settings
    path = baseline_file(state)
    good = [r for r in timed if _recordable(r)]
    held = [r.id for r in timed if r.baseline_hold]
    bad = [r.id for r in timed if not _recordable(r) and not r.baseline_hold]
    if not _baseline_folder(state, out):
        return
    sampled = _process_samples(state, good, out)
    if sampled is None:
        return
    samples, unverifiable = sampled
    entries = {
        r.id: entry_of(r, state.noise_floor, samples[r.id])
        for r in good
        if samples.get(r.id) and r.id not in unverifiable
    }
    if unverifiable:
        out.messages.append(_unverifiable_line(unverifiable))
    if not entries and (unverifiable or bad):
        out.errors.append(_nothing_stored(len(timed), len(unverifiable), len(bad), len(held)))
        return
    try:
        summary = bl.update_baseline(
            path,
            state.device_info,
            entries,
            noise_floor=state.noise_floor,
            change_threshold=None if s.join else s.margin,
            noise_k=bl.NOISE_K,
        )
    except (bl.BaselineError, OSError, ValueError) as exc:
        out.errors.append(f"perfguard: baseline not written: {exc}")
        return
    processes = max(1, s.update_processes)
    out.messages.append(
        f"perfguard: baseline {shown(path)}: {len(summary.added)} added, {len(summary.updated)} updated "
        f"(this update's processes joined the stored ones), {len(summary.reset)} reset (workload, environment or "
        f"time changed by more than the case's threshold, at least the {s.margin:.0%} margin: a new kernel, "
        f"whose spread is measured afresh), {summary.kept} kept; each case measured in {processes} process(es)"
        + (f"; {len(unverifiable)} unverifiable, not stored (see above)" if unverifiable else "")
    )
    if summary.added or summary.updated or summary.reset:
        out.messages.append(
            f"perfguard: the baseline is part of the project: commit it (git add {shown(path.parent)}/), "
            "so that CI guards against what this update measured"
        )
    _say_wide_entries(state, path, [r.id for r in good], out)
    _say_ab_offset(path, out)
    if bad:
        out.messages.append(
            f"perfguard: {len(bad)} timed case(s) not recorded (failed or disturbed): {', '.join(bad[:5])}"
        )
    if held:
        out.messages.append(
            f"perfguard: {len(held)} case(s) not folded in: they moved past the margin in this process only "
            f"(a fresh process agreed with the stored time): {', '.join(held[:5])}{' ...' if len(held) > 5 else ''}"
        )
    if collected_ids is not None:
        _prune_or_report_stale(state, path, collected_ids, out)


def _nothing_stored(timed: int, unverifiable: int, bad: int, held: int) -> str:
    """Why an update that timed cases stored none of them: an update that records nothing must not pass."""
    why = (
        f"{unverifiable} unverifiable: their processes disagreed" if unverifiable else "",
        f"{bad} failed or disturbed" if bad else "",
        f"{held} held at the stored time" if held else "",
    )
    return (
        f"perfguard: no baseline entry written: none of the {timed} timed case(s) could be stored ("
        + ", ".join(part for part in why if part)
        + "). An update that records nothing must not pass: record them on a quiet machine"
    )


def _usable(r: CaseRecord | None) -> bool:
    """A record an update's further process made that gives the case a sample: timed, undisturbed, and
    passed, or failed only on a comparison (_compared_only)."""
    return r is not None and r.median_ns is not None and r.ci_ns is not None and (_recordable(r) or _compared_only(r))


# The gates that compare a measurement with other figures (the stored baseline, its ratio, the twin at a base
# revision), not the case with its own limit (max_ratio).
_COMPARISONS = frozenset({"baseline", "ratio", "ab"})


def _compared_only(r: CaseRecord) -> bool:
    """A record of an update's further process that failed on comparisons alone. Those processes run as
    guards: against the stored baseline, which a kernel the update is recording anew has left (a slowdown
    that is being accepted, or a second speed with --perfguard-join), and in A/A processes against its twin
    at HEAD, where two loaded copies of one code read apart (what the offset fit is to learn). Its time is as
    good as any other process's; dropping it would leave the update with the first process alone."""
    if not (r.timed and r.outcome is Outcome.FAILED and r.verdict is Status.REGRESSED and not r.disturbances):
        return False
    regressed = {g.name for g in r.gates if g.status is Status.REGRESSED}
    return bool(regressed) and regressed <= _COMPARISONS


def _aa_settings(state: SessionState) -> tuple[Settings | None, str]:
    """The settings of an update's A/A processes (each variant timed against its twin at HEAD), or None and
    why there are none."""
    s = state.settings
    if not s.ab_offset_fit:
        return None, "turned off (--perfguard-no-ab-offset-fit)"
    from .ab import aa_base

    sha, why = aa_base(state.rootdir, s.baseline_dir, keep_days=s.cache_days)
    return (replace(s, against=sha), "") if sha is not None else (None, why)


def _process_samples(
    state: SessionState, good: list[CaseRecord], out: RunSummary
) -> tuple[dict[str, list[bl.ProcessSample]], dict[str, str]] | None:
    """Every recordable case measured in ``update_processes`` processes: this one, then fresh ones, in
    reverse and forward order by turns, so that a slow first process or a drifting machine cannot bias one
    case. One process whose median sits apart from the others (policy.outlier_process) is dropped and
    replaced by a make-up process. A case whose processes still disagree (policy.discordant), or whose
    spread is too wide to judge a regression of the margin by (policy.too_wide), is measured once more, all
    such cases together in one fresh process; then it keeps every process but one outlier, and is stored only
    where a gate can still judge it. Returns the samples per case and the unverifiable cases (each with why);
    None (with an error) when a process could not be run at all."""
    s = state.settings
    dev = device_id(state)
    samples = {r.id: [sample_of(r, dev)] for r in good}
    widths = {r.id: [r.ci_rel or 0.0] for r in good}
    if not good or s.update_processes <= 1 or state.fresh_cases is None:
        return samples, {}
    ids = [r.id for r in good]
    fresh = _FreshProcesses(state, out, *_aa_settings(state), weights={r.id: r.elapsed_s or 1.0 for r in good})
    missing = _further_processes(fresh, ids, samples, widths, dev)
    if missing:
        missing = _make_up(fresh, missing, samples, widths, dev)
    if missing is None:
        return None
    # The median in-run width, not the widest: a poisoned process's own wide interval must not widen the
    # limit that is to find it.
    limits = {c: discord_limit(s.margin, state.noise_floor, [statistics.median(widths[c])]) for c in ids}
    dropped = _drop_outliers(samples, limits)
    if dropped and _replace_outliers(fresh, dropped, samples, widths, dev) is None:
        return None
    agreed = [samples[c] for c in ids if not discordant(_times(samples[c]), limits[c])]
    prior = (
        prior_spread([log_spread(_times(got)) for got in agreed]),
        prior_spread([log_spread(ratios) for got in agreed if (ratios := _ratios(got))]),
    )
    floors = (state.noise_floor, RATIO_NOISE_FLOOR[state.kind])
    odd = [
        c
        for c in ids
        if discordant(_times(samples[c]), limits[c]) or not _verifiable(samples[c], s.margin, floors, prior)
    ]
    unverifiable = _remeasure_discordant(fresh, odd, dropped, samples, limits, dev, prior) if odd else {}
    if unverifiable is None:
        return None
    if missing:
        out.messages.append(
            f"perfguard: {len(missing)} case(s) were not recorded by every process (failed or disturbed there); "
            f"they keep the samples they have: {', '.join(sorted(missing)[:5])}{' ...' if len(missing) > 5 else ''}"
        )
    if fresh.no_aa:
        out.messages.append(
            f"perfguard: no A/A readings for the A/B gate's per-process offset in this update: {fresh.no_aa}. A/B "
            "runs count what earlier readings in the baseline file fit, else the built-in H100 value"
        )
    return samples, unverifiable


def _times(got: list[bl.ProcessSample]) -> list[float]:
    return [x.median_ns for x in got]


def _drop_outliers(samples: dict[str, list[bl.ProcessSample]], limits: dict[str, float]) -> dict[str, bl.ProcessSample]:
    """Each case's one process whose median sits apart from the others (policy.outlier_process), taken out
    of its samples: the dropped sample per case."""
    dropped = {}
    for case_id, got in samples.items():
        one = outlier_process(_times(got), limits[case_id])
        if one is not None:
            dropped[case_id] = got.pop(one)
    return dropped


def _replace_outliers(
    fresh: _FreshProcesses,
    dropped: dict[str, bl.ProcessSample],
    samples: dict[str, list[bl.ProcessSample]],
    widths: dict[str, list[float]],
    dev: str,
) -> bool | None:
    """The cases that lost an outlier process, measured in one make-up process, so that they keep as many
    processes as the others; says which and how far off each was. None when the process failed."""
    order = [case_id for case_id in samples if case_id in dropped]
    got = fresh.run(order, "make-up process for the cases whose process read apart from the others")
    if got is None:
        return None
    _add_samples(got, order, samples, widths, dev)
    apart = [
        f"{case_id} ({dropped[case_id].median_ns / statistics.median(_times(samples[case_id])):.2f}x the others)"
        for case_id in order
    ]
    fresh.out.messages.append(
        f"perfguard: {len(order)} case(s) had one process median apart from the others: it was dropped and "
        f"measured again in a make-up process: {', '.join(apart[:5])}{' ...' if len(apart) > 5 else ''}"
    )
    return True


@dataclass
class _FreshProcesses:
    """An update's fresh processes. They time each case against its twin at HEAD too (A/A, for the A/B
    gate's offset) while that works; ``aa`` is None, and ``no_aa`` says why, once it does not. Where the run's
    workers timed on several GPUs (``state.fresh_devices``), each round of cases is split over them, one
    fresh process on each GPU at once, the parts balanced by ``weights`` (each case's timing seconds in the
    first process, elapsed_s: its whole time there would count one-time costs, such as a worker's first
    case of a CUDA extension, 26-30 s on an H100): a host's every GPU serves the update as it served the
    run."""

    state: SessionState
    out: RunSummary
    aa: Settings | None
    no_aa: str
    weights: dict[str, float] = field(default_factory=dict)

    def run(self, order: list[str], what: str) -> dict[str, CaseRecord] | None:
        """One fresh process over these cases, in this order (or one per GPU, each over its part of them, in
        this order): their records, or None (with an error)."""
        parts = split_cases(order, self.weights, self.state.fresh_devices)
        where = "" if len(parts) == 1 else " in parallel: " + ", ".join(f"{len(ids)} on {dev}" for dev, ids in parts)
        print(f"perfguard: {what}: {len(order)} case(s){where}", file=sys.stderr, flush=True)
        got = self._parts(parts, self.aa or self.state.settings)
        failed = [why for why in got if isinstance(why, str)]
        if failed and self.aa is not None:
            # The A/A side must never cost the baseline: the parts that failed run again as plain processes,
            # and so do the later processes.
            self.aa = None
            self.no_aa = f"the {what} failed with A/A against HEAD ({failed[0]}); it and the later ones ran without"
            redo = [part for part, why in zip(parts, got, strict=True) if isinstance(why, str)]
            again = iter(self._parts(redo, self.state.settings))
            got = [next(again) if isinstance(why, str) else why for why in got]
            failed = [why for why in got if isinstance(why, str)]
        if failed:
            self.out.errors.append(f"perfguard: no baseline written: the {what} failed: {'; '.join(failed)}")
            return None
        return {case_id: rec for records in got if not isinstance(records, str) for case_id, rec in records.items()}

    def _parts(
        self, parts: list[tuple[str | None, list[str]]], settings: Settings
    ) -> list[dict[str, CaseRecord] | str]:
        """Each part in its own fresh process, on its device (None: the settings' own), all at once: every
        process is started, then each is waited for."""
        fresh_cases = self.state.fresh_cases
        assert fresh_cases is not None
        waits = [fresh_cases(ids, settings if dev is None else replace(settings, device=dev)) for dev, ids in parts]
        return [wait() for wait in waits]


def split_cases(
    order: list[str], weights: dict[str, float], devices: Sequence[str]
) -> list[tuple[str | None, list[str]]]:
    """These cases over these devices, each part in the given order: the longest case first to the device
    with the least work so far (weights: seconds; 1 where unknown). One part, on no device of its own, where
    there are fewer than two devices or cases; a device left without cases gets no part."""
    if len(devices) < 2 or len(order) < 2:
        return [(None, list(order))]
    load = dict.fromkeys(range(len(devices)), 0.0)
    home: dict[str, int] = {}
    for case_id in sorted(order, key=lambda c: -weights.get(c, 1.0)):
        home[case_id] = gpu = min(load, key=lambda g: (load[g], g))
        load[gpu] += weights.get(case_id, 1.0)
    parts = [(dev, [c for c in order if home[c] == g]) for g, dev in enumerate(devices)]
    return [(dev, ids) for dev, ids in parts if ids]


def _further_processes(
    fresh: _FreshProcesses,
    ids: list[str],
    samples: dict[str, list[bl.ProcessSample]],
    widths: dict[str, list[float]],
    dev: str,
) -> set[str] | None:
    """The update's processes after this one, in reverse and forward order by turns; each adds its sample
    and in-run width to a case it recorded. The ids some process did not record; None when one failed."""
    n_processes = fresh.state.settings.update_processes
    missing: set[str] = set()
    for n in range(n_processes - 1):
        order = ids[::-1] if n % 2 == 0 else ids
        direction = "reverse" if n % 2 == 0 else "forward"
        got = fresh.run(order, f"update process {n + 2} of {n_processes} ({direction} order)")
        if got is None:
            return None
        missing |= _add_samples(got, ids, samples, widths, dev)
    return missing


def _add_samples(
    got: dict[str, CaseRecord],
    ids: list[str],
    samples: dict[str, list[bl.ProcessSample]],
    widths: dict[str, list[float]],
    dev: str,
) -> set[str]:
    """One fresh process's records added to the cases they give a sample (_usable): its median and its in-run
    width. The ids it did not record."""
    missing = set()
    for case_id in ids:
        rec = got.get(case_id)
        if rec is not None and _usable(rec):
            samples[case_id].append(sample_of(rec, dev))
            widths[case_id].append(rec.ci_rel or 0.0)
        else:
            missing.add(case_id)
    return missing


def _make_up(
    fresh: _FreshProcesses,
    missing: set[str],
    samples: dict[str, list[bl.ProcessSample]],
    widths: dict[str, list[float]],
    dev: str,
) -> set[str] | None:
    """The cases some further process did not record (disturbed or failed there), measured in one more fresh
    process, so that a foreign load during one process costs its cases one sample, not their third. The ids
    still short of a sample from every process; None when the process failed."""
    order = [case_id for case_id in samples if case_id in missing]
    got = fresh.run(order, "make-up process for the cases a process did not record")
    if got is None:
        return None
    _add_samples(got, order, samples, widths, dev)
    want = fresh.state.settings.update_processes
    return {case_id for case_id in order if len(samples[case_id]) < want}


def _remeasure_discordant(
    fresh: _FreshProcesses,
    odd: list[str],
    dropped: dict[str, bl.ProcessSample],
    samples: dict[str, list[bl.ProcessSample]],
    limits: dict[str, float],
    dev: str,
    prior: tuple[float, float],
) -> dict[str, str] | None:
    """The cases whose processes disagreed (``odd``), measured once more in one fresh process. Each then has
    every process it was measured in (an outlier dropped before comes back: its make-up disagreed too), less
    the one outlier among them, if one is; it is unverifiable, and not stored, where no gate could judge a
    regression of the margin by the spread of those (_verifiable). The unverifiable cases, each with why;
    None when the process failed."""
    got = fresh.run(odd, "re-measurement of the cases whose processes disagreed")
    if got is None:
        return None
    margin, floors = fresh.state.settings.margin, (fresh.state.noise_floor, RATIO_NOISE_FLOOR[fresh.state.kind])
    unverifiable: dict[str, str] = {}
    agreed = 0
    for case_id in odd:
        every = [*samples[case_id], *([dropped[case_id]] if case_id in dropped else [])]
        rec = got.get(case_id)
        if rec is not None and _usable(rec):
            every.append(sample_of(rec, dev))
        one = outlier_process(_times(every), limits[case_id])
        kept = [x for i, x in enumerate(every) if i != one]
        if not _verifiable(kept, margin, floors, prior):
            unverifiable[case_id] = _unverifiable_why(kept, margin, floors, prior)
            continue
        samples[case_id] = kept
        agreed += not discordant(_times(kept), limits[case_id])
    fresh.out.messages.append(
        f"perfguard: {len(odd)} case(s) had processes that disagreed, or a spread too wide to judge by; measured "
        f"once more, {agreed} agreed (an odd process dropped), {len(odd) - agreed - len(unverifiable)} kept "
        f"their processes and the spread they show (their margins are below), and {len(unverifiable)} stayed "
        "unverifiable"
    )
    return unverifiable


def _ratios(got: list[bl.ProcessSample]) -> list[float]:
    """The processes' ratios to the reference; [] unless every process has one."""
    ratios = [x.ratio for x in got if x.ratio is not None]
    return ratios if len(ratios) == len(got) else []


def _gate_thresholds(
    got: list[bl.ProcessSample], margin: float, floors: tuple[float, float], prior: tuple[float, float]
) -> list[tuple[float, int, float]]:
    """The threshold each gate would judge an entry of these processes at (the time's, and the ratio's where
    there is a reference), with its processes and its noise floor. The ratio counts apart: on a freshly
    started H100 (2026-11-26) cuda_wmma's S128 cases read 4.7, 4.7, 5.3 and 5.3 us in four processes, SDPA
    beside them moving alike, and their ratios within 1%. The prediction bound of the spread alone: the
    margin the guard adds so that one process can see twice it (policy.detectable_margin) is said with the
    stored margins, and one past WIDE_MARGIN is warned of there."""
    gates = []
    for values, floor, typical in ((_times(got), floors[0], prior[0]), (_ratios(got), floors[1], prior[1])):
        if values:
            gates.append((medians_threshold(margin, values, floor, typical), len(values), floor))
    return gates


def _verifiable(
    got: list[bl.ProcessSample], margin: float, floors: tuple[float, float], prior: tuple[float, float]
) -> bool:
    """Whether some gate could judge a regression of the margin against an entry of these processes: a case
    fails on any gate that regressed, so the narrower one is what catches it (policy.too_wide)."""
    return any(not too_wide(t, k, margin, floor) for t, k, floor in _gate_thresholds(got, margin, floors, prior))


def _unverifiable_why(
    got: list[bl.ProcessSample], margin: float, floors: tuple[float, float], prior: tuple[float, float]
) -> str:
    """Why an entry of these processes is not stored, in numbers, and what to do."""
    times = _times(got)
    threshold, k, floor = min(_gate_thresholds(got, margin, floors, prior))
    shown_times = ", ".join(f"{t / 1e3:.3g}" for t in times)
    return (
        f"unverifiable: its processes disagree by {max(times) / min(times) - 1:.0%} ({shown_times} us): the margin "
        f"used would be {threshold:.1%}, past the {verifiable_limit(margin, k, floor):.1%} that can judge a "
        f"regression of the {margin:.0%} margin; record it on a quiet machine"
    )


def _unverifiable_line(unverifiable: dict[str, str]) -> str:
    """The cases an update could not verify, each with why; a stored entry of theirs stays as it was."""
    listed = "; ".join(f"{case_id}: {why}" for case_id, why in sorted(unverifiable.items())[:5])
    return f"perfguard: {len(unverifiable)} case(s) not stored (a stored entry of theirs stays as it was): {listed}" + (
        " ..." if len(unverifiable) > 5 else ""
    )


def _say_ab_offset(path: Path, out: RunSummary) -> None:
    """What the baseline file's A/A readings now fit the A/B gate's per-process offset to, per size class."""
    try:
        fitted = bl.read_baseline(path).ab_offset()
    except bl.BaselineError:
        return
    if fitted is not None:
        out.messages.append(
            f"perfguard: the A/B gate's per-process offset on this device model, from the A/A readings in "
            f"{shown(path)}: {fitted.describe()}; --perfguard-against runs on it count that"
        )


def _say_wide_entries(state: SessionState, path: Path, ids: list[str], out: RunSummary) -> None:
    """The margin the guard will judge the stored cases at, where it is not the setting (their between-run
    noise widens it), in the guard's own words (report.terminal.margin_lines, from the gates' thresholds as
    verdict.decide sets them); and a warning of those stored with a very wide interval or margin: later
    verdicts on them are mostly inconclusive or blind, and nothing else would tell the user why."""
    from ..report.terminal import margin_lines

    try:
        written = bl.read_baseline(path)
    except bl.BaselineError:
        return
    # The guard's policy: its typical spreads are the file's as written now, not as this run read it.
    policy, margin = replace(state, baseline=written, _prior=None).policy(), state.settings.margin
    gated: list[CaseRecord] = []
    wide: list[tuple[float, str, float, float]] = []
    for case_id in ids:
        entry = written.cases.get(case_id)
        if entry is None or entry.median_ns <= 0:
            continue
        used = [policy.baseline_delta(entry)]
        if entry.ratio is not None:
            used.append(policy.ratio_baseline_delta(entry))
        gates = [
            Gate(name, Status.PASS, threshold=1.0 + t) for name, t in zip(("baseline", "ratio"), used, strict=False)
        ]
        gated.append(CaseRecord(id=case_id, gates=gates))
        half = max(entry.median_ns - entry.ci_ns[0], entry.ci_ns[1] - entry.median_ns) / entry.median_ns
        if half > WIDE_INTERVAL or min(used) > WIDE_MARGIN:
            wide.append((max(half, min(used)), case_id, half, min(used)))
    lines = margin_lines(gated, margin, width=10**6)
    if lines:
        out.messages.append(f"perfguard: the guard will judge the {len(gated)} stored case(s) at: {lines[0]}")
    if wide:
        wide.sort(reverse=True)
        listed = ", ".join(f"{case_id} (±{half:.0%}, margin used {used:.1%})" for _, case_id, half, used in wide[:5])
        out.messages.append(
            f"perfguard: warning: {len(wide)} case(s) stored with an interval wider than ±{WIDE_INTERVAL:.0%} or a "
            f"margin wider than {WIDE_MARGIN:.0%}: their verdicts will mostly be inconclusive, and only a slowdown "
            f"larger than that can fail them: {listed}{' ...' if len(wide) > 5 else ''}; re-record them on a quiet "
            "machine or with a longer --perfguard-case-budget"
        )


def _prune_or_report_stale(state: SessionState, path: Path, collected_ids: set[str], out: RunSummary) -> None:
    try:
        current = bl.read_baseline(path)
    except bl.BaselineError as exc:
        out.errors.append(str(exc))
        return
    stale = bl.stale_entries(current, collected_ids)
    if stale and state.settings.prune:
        try:
            gone = bl.remove_cases(path, set(stale))
        except (bl.BaselineError, OSError) as exc:
            out.errors.append(f"perfguard: stale cases not pruned: {exc}")
            return
        out.messages.append(f"perfguard: pruned {len(gone)} stale case(s) from {shown(path)}")
    elif stale:
        out.messages.append(
            f"perfguard: {len(stale)} stale case(s) stored but not collected: {', '.join(stale[:5])}"
            f"{' ...' if len(stale) > 5 else ''}; remove them with --perfguard-update-baseline --perfguard-prune"
        )


# ------------------------------------------------------------------------------------------ stash


@dataclass
class Merged:
    """What the controller gathers from every process of the run."""

    records: list[CaseRecord] = field(default_factory=list)
    collected: set[str] = field(default_factory=set)
    deselected: bool = False
    notes: list[str] = field(default_factory=list)
    sent: int = 0  # a worker: how many of its records have travelled to the controller
    final: list[CaseRecord] = field(default_factory=list)


STATE = pytest.StashKey[SessionState]()
MERGED = pytest.StashKey[Merged]()
SUMMARY = pytest.StashKey[RunSummary]()


def state_of(config: pytest.Config) -> SessionState:
    return config.stash[STATE]


def is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


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
