"""The multi-process baseline update: the processes an entry is measured in, outliers and make-ups, what is
stored and what is said about it. Runs in the controller's end of run (session.finish)."""

from __future__ import annotations

import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..judge import baseline as bl
from ..judge import storage
from ..judge.policy import (
    NOISE_K,
    RATIO_NOISE_FLOOR,
    WIDE_INTERVAL,
    WIDE_MARGIN,
    discord_limit,
    discordant,
    log_spread,
    medians_threshold,
    outlier_process,
    prior_spread,
    too_wide,
    verifiable_limit,
)
from ..record import CaseRecord, Gate, Outcome, Status
from ..settings import Settings, shown
from .samples import entry_of, sample_of
from .state import RunSummary, SessionState, baseline_file, device_id, gpu_id


def recordable(r: CaseRecord) -> bool:
    return r.timed and r.outcome is Outcome.PASSED and not r.disturbances and not r.baseline_hold


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


def update(state: SessionState, timed: list[CaseRecord], collected_ids: set[str] | None, out: RunSummary) -> None:
    s = state.settings
    path = baseline_file(state)
    good = [r for r in timed if recordable(r)]
    held = [r.id for r in timed if r.baseline_hold]
    bad = [r.id for r in timed if not recordable(r) and not r.baseline_hold]
    if not _baseline_folder(state, out):
        return
    sampled = process_samples(state, good, out)
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
        summary = storage.update_baseline(
            path,
            state.device_info,
            entries,
            noise_floor=state.noise_floor,
            change_threshold=None if s.join else s.margin,
            noise_k=NOISE_K,
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
    return r is not None and r.median_ns is not None and r.ci_ns is not None and (recordable(r) or _compared_only(r))


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


def process_samples(
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
    weights = {r.id: r.elapsed_s or 1.0 for r in good}
    fresh = FreshProcesses(state, out, *_aa_settings(state), weights=weights, samples=samples)
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
    fresh: FreshProcesses,
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
class FreshProcesses:
    """An update's fresh processes. They time each case against its twin at HEAD too (A/A, for the A/B
    gate's offset) while that works; ``aa`` is None, and ``no_aa`` says why, once it does not. Where the run's
    workers timed on several GPUs (``state.fresh_devices``), each round of cases is split over them, one
    fresh process on each GPU at once, the parts balanced by ``weights`` (each case's timing seconds in the
    first process, elapsed_s: its whole time there would count one-time costs, such as a worker's first
    case of a CUDA extension, 26-30 s on an H100): a host's every GPU serves the update as it served the
    run. Each case goes first to a GPU none of its ``samples`` so far was measured on: a guard on that host
    judges it on any of them, and GPUs of one model differ in time (verdict._unseen_device)."""

    state: SessionState
    out: RunSummary
    aa: Settings | None
    no_aa: str
    weights: dict[str, float] = field(default_factory=dict)
    samples: dict[str, list[bl.ProcessSample]] = field(default_factory=dict)

    def run(self, order: list[str], what: str) -> dict[str, CaseRecord] | None:
        """One fresh process over these cases, in this order (or one per GPU, each over its part of them, in
        this order): their records, or None (with an error)."""
        seen = {case_id: {x.device for x in self.samples.get(case_id, ())} for case_id in order}
        devices = self.state.fresh_devices
        parts = split_cases(order, self.weights, devices, seen, [gpu_id(d) for d in devices])
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
    order: list[str],
    weights: dict[str, float],
    devices: Sequence[str],
    seen: dict[str, set[str]] | None = None,
    names: Sequence[str] | None = None,
) -> list[tuple[str | None, list[str]]]:
    """These cases over these devices, each part in the given order: the longest case first to the device
    with the least work so far (weights: seconds; 1 where unknown) among those it has not been measured on
    (``seen``: each case's devices, by ``names``, one per device; all of them where it has been on every
    one). One part, on no device of its own, where there are fewer than two devices; a device left without
    cases gets no part."""
    if len(devices) < 2:
        return [(None, list(order))]
    names = list(names) if names is not None else list(devices)
    load = dict.fromkeys(range(len(devices)), 0.0)
    home: dict[str, int] = {}
    for case_id in sorted(order, key=lambda c: -weights.get(c, 1.0)):
        been = (seen or {}).get(case_id, set())
        new = [g for g in load if names[g] not in been] or list(load)
        home[case_id] = gpu = min(new, key=lambda g: (load[g], g))
        load[gpu] += weights.get(case_id, 1.0)
    parts = [(dev, [c for c in order if home[c] == g]) for g, dev in enumerate(devices)]
    return [(dev, ids) for dev, ids in parts if ids]


def _further_processes(
    fresh: FreshProcesses,
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
    fresh: FreshProcesses,
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
    fresh: FreshProcesses,
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
        fitted = storage.read_baseline(path).ab_offset()
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
        written = storage.read_baseline(path)
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
        current = storage.read_baseline(path)
    except bl.BaselineError as exc:
        out.errors.append(str(exc))
        return
    stale = storage.stale_entries(current, collected_ids)
    if stale and state.settings.prune:
        try:
            gone = storage.remove_cases(path, set(stale))
        except (bl.BaselineError, OSError) as exc:
            out.errors.append(f"perfguard: stale cases not pruned: {exc}")
            return
        out.messages.append(f"perfguard: pruned {len(gone)} stale case(s) from {shown(path)}")
    elif stale:
        out.messages.append(
            f"perfguard: {len(stale)} stale case(s) stored but not collected: {', '.join(stale[:5])}"
            f"{' ...' if len(stale) > 5 else ''}; remove them with --perfguard-update-baseline --perfguard-prune"
        )
