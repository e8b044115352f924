"""The run's state, and the controller's end of a run: merge, write the baseline once, write reports once.

`finish` runs in the single process of a plain run, or in the xdist controller, never in a worker. Nothing
here raises into pytest's summary hooks: problems become messages and a non-zero exit status.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from . import baseline as bl
from .device import fingerprint
from .jsonio import JSONFileError
from .record import CaseRecord, Outcome, Status
from .settings import Settings, shown
from .verdict import Policy

if TYPE_CHECKING:
    from .ab import BaseTree
    from .timing import Progress

# Between-run noise floors (sd of ln time across processes), measured per device kind: see
# benchmarks/results/README.md. CPU: a shared 2-core machine moved absolute times by tens of percent.
NOISE_FLOOR = {"cuda": 0.005, "cpu": 0.05}
RATIO_NOISE_FLOOR = {"cuda": 0.005, "cpu": 0.05}

# Verdicts of a timed case that compared it with nothing.
UNCOMPARED = (Status.NO_BASELINE, Status.NOT_COMPARABLE, Status.NO_BASE, Status.NEW)


@dataclass
class SessionState:
    """Per-process run state (kept in config.stash)."""

    settings: Settings
    device_info: dict[str, Any]
    baseline: bl.BaselineFile | None = None
    family_size: int = 1
    records: list[CaseRecord] = field(default_factory=list)
    timing_spent_s: float = 0.0
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

    @property
    def kind(self) -> str:
        return "cuda" if self.settings.device.startswith("cuda") else "cpu"

    @property
    def noise_floor(self) -> float:
        return NOISE_FLOOR[self.kind]

    def policy(self) -> Policy:
        from .confirm import in_child

        return Policy(
            margin=self.settings.margin,
            alpha=self.settings.alpha,
            family_size=self.family_size,
            noise_floor=self.noise_floor,
            ratio_noise_floor=RATIO_NOISE_FLOOR[self.kind],
            confirm=self.settings.confirm and not in_child(),  # as confirm.confirm_regression decides
        )


def make_state(settings: Settings, rootdir: Path | None = None) -> SessionState:
    state = SessionState(settings=settings, device_info=fingerprint(settings.device))
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
    return state.settings.baseline_dir / f"{state.device_info['slug']}.json"


def entry_of(r: CaseRecord, noise: float) -> bl.BaselineEntry:
    """The baseline entry an update run makes of a timed record."""
    assert r.median_ns is not None and r.ci_ns is not None and r.workload is not None
    return bl.BaselineEntry(
        case_id=r.id,
        workload=r.workload,
        workload_desc=r.workload_desc or "",
        env={k: str(v) for k, v in (r.env or {}).items()},
        median_ns=float(r.median_ns),
        ci_ns=(float(r.ci_ns[0]), float(r.ci_ns[1])),
        ratio=float(r.ratio) if r.ratio is not None else None,
        ratio_ci=(float(r.ratio_ci[0]), float(r.ratio_ci[1])) if r.ratio_ci else None,
        noise=noise,
        runs=1,
        blocks=int(r.blocks or 0),
        updated=str(r.updated or date.today().isoformat()),
    )


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
        skipped = [r for r in records if r.outcome in (Outcome.SKIPPED, Outcome.NOT_RUN)]
        why = "; ".join(sorted({(r.reasons or ["?"])[0] for r in skipped}))[:500]
        out.errors.append(
            "perfguard: no perf case was timed"
            + (f" ({len(skipped)} skipped: {why})" if skipped else " (no @perf_case test was collected)")
            + ". A perf run that measures nothing must not pass."
        )
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
        if state.baseline is not None and state.baseline.exists and collected_ids is not None:
            stale = bl.stale_entries(state.baseline, collected_ids)
            if stale:
                out.messages.append(
                    f"perfguard: {len(stale)} stored case(s) in {shown(baseline_file(state))} "
                    "were not collected in this "
                    "run (stale if the whole suite ran); remove them with --perfguard-update-baseline --perfguard-prune"
                )
    warmup = warmup_line(state.warmups)
    if warmup:
        out.messages.append(warmup)
    _write_reports(state, records, timed, out)
    return out


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
    gate = "ab" if s.against else "baseline"
    not_compared: Counter[str] = Counter()
    for r in timed:
        g = r.gate(gate)
        status = Status(g["status"]) if g is not None else Status.NO_BASELINE
        if status in UNCOMPARED:
            not_compared["new (no baseline entry)" if status is Status.NO_BASELINE else str(status)] += 1
    compared = len(timed) - sum(not_compared.values())
    line = f"perfguard: {compared} of {len(timed)} timed case(s) compared with the {against}"
    if not_compared:
        line += "; not compared: " + ", ".join(f"{n} {why}" for why, n in sorted(not_compared.items()))
    out.messages.append(line)
    if compared or not s.enabled:
        return
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
    from .report import results_document, write_results

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
    if s.json is not None:
        try:
            write_results(s.json, doc)
            out.messages.append(f"perfguard: results written to {shown(s.json)}")
        except (JSONFileError, OSError, ValueError) as exc:
            out.errors.append(f"perfguard: could not write results to {s.json}: {exc}")
    if s.html is not None:
        from .html_report import ReportDependencyError, write_html  # plotting only when a report is asked for

        try:
            write_html(s.html, doc)
            out.messages.append(f"perfguard: HTML report written to {shown(s.html)}")
        except (ReportDependencyError, JSONFileError, OSError, ValueError) as exc:
            out.errors.append(f"perfguard: could not write the HTML report {s.html}: {exc}")
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary and s.enabled:
        from .markdown_report import markdown_summary

        try:
            with open(step_summary, "a", encoding="utf-8") as fh:
                fh.write(markdown_summary(doc, notes=out.messages))
        except OSError as exc:
            out.errors.append(f"perfguard: could not append to GITHUB_STEP_SUMMARY ({step_summary}): {exc}")


def run_info(state: SessionState) -> dict[str, Any]:
    """What the run compared and at which revision: shown in reports."""
    from .gitrev import head_sha

    info: dict[str, Any] = {"git_sha": head_sha(state.rootdir)}
    if state.warmups:
        info["warmup"] = state.warmups
    if state.settings.against:
        info["against"] = state.settings.against
        base = state.base
        if base is not None:
            info["base_sha"] = base.sha
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
    entries = {r.id: entry_of(r, state.noise_floor) for r in good}
    if not _baseline_folder(state, out):
        return
    try:
        summary = bl.update_baseline(
            path,
            state.device_info,
            entries,
            noise_floor=state.noise_floor,
            change_threshold=s.margin,
            noise_k=bl.NOISE_K,
        )
    except (bl.BaselineError, OSError, ValueError) as exc:
        out.errors.append(f"perfguard: baseline not written: {exc}")
        return
    out.messages.append(
        f"perfguard: baseline {shown(path)}: {len(summary.added)} added, {len(summary.updated)} updated "
        f"(between-run noise folded in), {len(summary.reset)} reset (workload, environment or time changed by more "
        f"than the case's threshold, at least the {s.margin:.0%} margin: a new kernel, whose noise is measured "
        f"afresh), {summary.kept} kept"
    )
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
