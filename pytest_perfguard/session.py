"""The controller's end of a run: merge worker results, write the baseline once, write reports once.

Runs in the single process of a plain run, or in the xdist controller, never in a worker. Nothing here
raises into pytest's summary hooks: problems become messages and a non-zero exit status.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

from . import baseline as bl
from .report import markdown, results_document, write_results
from .results_io import ResultsError
from .runner import SessionState


@dataclass
class Outcome:
    messages: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def baseline_file(state: SessionState) -> Path:
    return state.settings.baseline_dir / f"{state.device_info['slug']}.json"


def _entry(r: dict[str, Any], noise: float) -> bl.BaselineEntry:
    ratio_ci = r.get("ratio_ci")
    return bl.BaselineEntry(
        case_id=r["id"],
        workload=r["workload"],
        workload_desc=r["workload_desc"],
        env={k: str(v) for k, v in (r.get("env") or {}).items()},
        median_ns=float(r["median_ns"]),
        ci_ns=(float(r["ci_ns"][0]), float(r["ci_ns"][1])),
        ratio=float(r["ratio"]) if r.get("ratio") is not None else None,
        ratio_ci=(float(ratio_ci[0]), float(ratio_ci[1])) if ratio_ci else None,
        noise=noise,
        runs=1,
        blocks=int(r["blocks"]),
        updated=str(r.get("updated") or date.today().isoformat()),
    )


def _recordable(r: dict[str, Any]) -> bool:
    return (
        r.get("median_ns") is not None
        and r.get("outcome") == "passed"
        and not r.get("disturbances")
        and not r.get("baseline_hold")
    )


def finish(state: SessionState, records: list[dict[str, Any]], *, collected_ids: set[str] | None) -> Outcome:
    """Decide the run-level outcome and write files. `records` are all processes' records, merged."""
    s = state.settings
    out = Outcome()
    timed = [r for r in records if r.get("median_ns") is not None]
    if s.enabled and not timed:
        skipped = [r for r in records if r.get("outcome") in ("skipped", "not run")]
        why = "; ".join(sorted({str((r.get("reasons") or ["?"])[0]) for r in skipped}))[:500]
        out.errors.append(
            "perfguard: no perf case was timed"
            + (f" ({len(skipped)} skipped: {why})" if skipped else " (no @perf_case test was collected)")
            + ". A perf run that measures nothing must not pass."
        )
    # A sticky CUDA error marks its case's record (runner._crashed), in any process of the session.
    poisoned_by = sorted({str(r["id"]) for r in records if r.get("sticky")})
    if s.update and timed:
        if poisoned_by:
            out.errors.append(
                "perfguard: no baseline written: the CUDA context was poisoned during this session "
                f"(by {', '.join(poisoned_by)})"
            )
        else:
            _update(state, records, timed, collected_ids, out)
    elif s.enabled and state.baseline is not None and state.baseline.exists and collected_ids is not None:
        stale = bl.stale_entries(state.baseline, collected_ids)
        if stale:
            out.messages.append(
                f"perfguard: {len(stale)} stored case(s) in {baseline_file(state)} were not collected in this run "
                f"(stale if the whole suite ran); remove them with --perfguard-update-baseline --perfguard-prune"
            )
    for r in timed:
        if r.get("verdict") == "inconclusive":
            out.messages.append(f"perfguard: inconclusive: {r['id']}: " + "; ".join(str(x) for x in r.get("reasons") or []))
    summary = {
        "cases": len(records),
        "timed": len(timed),
        "regressed": sum(1 for r in timed if r.get("verdict") == "regressed"),
        "inconclusive": sum(1 for r in timed if r.get("verdict") == "inconclusive"),
        "incorrect": sum(1 for r in records if r.get("verdict") == "incorrect"),
        "family_size": state.family_size,
        "margin": s.margin,
        "errors": out.errors,
    }
    if s.json_path is not None:
        try:
            write_results(s.json_path, results_document(records, state.device_info, summary))
            out.messages.append(f"perfguard: results written to {s.json_path}")
        except (ResultsError, bl.BaselineError, OSError, ValueError) as exc:
            out.errors.append(f"perfguard: could not write results to {s.json_path}: {exc}")
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary and s.enabled:
        try:
            with open(step_summary, "a", encoding="utf-8") as fh:
                fh.write(markdown(records, state.device_info, out.errors + out.messages))
        except OSError as exc:
            out.errors.append(f"perfguard: could not append to GITHUB_STEP_SUMMARY ({step_summary}): {exc}")
    return out


def _update(
    state: SessionState,
    records: list[dict[str, Any]],
    timed: list[dict[str, Any]],
    collected_ids: set[str] | None,
    out: Outcome,
) -> None:
    s = state.settings
    path = baseline_file(state)
    good = [r for r in timed if _recordable(r)]
    held = [r["id"] for r in timed if r.get("baseline_hold")]
    bad = [r["id"] for r in timed if not _recordable(r) and not r.get("baseline_hold")]
    entries = {r["id"]: _entry(r, state.noise_floor) for r in good}
    if not s.baseline_dir.is_dir():
        out.errors.append(
            f"perfguard: baseline folder {s.baseline_dir} does not exist; create it (mkdir -p {s.baseline_dir}) "
            "or point --perfguard-baseline-dir at an existing folder. Nothing was written."
        )
        return
    try:
        summary = bl.update_baseline(
            path, state.device_info, entries, noise_floor=state.noise_floor, change_threshold=s.margin,
            noise_k=bl.NOISE_K,
        )
    except (bl.BaselineError, OSError, ValueError) as exc:
        out.errors.append(f"perfguard: baseline not written: {exc}")
        return
    out.messages.append(
        f"perfguard: baseline {path}: {len(summary.added)} added, {len(summary.updated)} updated "
        f"(between-run noise folded in), {len(summary.reset)} reset (workload, environment or time changed by more "
        f"than the case's threshold, at least the {s.margin:.0%} margin: a new kernel, whose noise is measured afresh), "
        f"{summary.kept} kept"
    )
    if bad:
        out.messages.append(f"perfguard: {len(bad)} timed case(s) not recorded (failed or disturbed): {', '.join(bad[:5])}")
    if held:
        out.messages.append(
            f"perfguard: {len(held)} case(s) not folded in: they moved past the margin in this process only "
            f"(a fresh process agreed with the stored time): {', '.join(held[:5])}{' ...' if len(held) > 5 else ''}"
        )
    if collected_ids is not None:
        try:
            current = bl.read_baseline(path)
        except bl.BaselineError as exc:
            out.errors.append(str(exc))
            return
        stale = bl.stale_entries(current, collected_ids)
        if stale and s.prune:
            try:
                gone = bl.remove_cases(path, set(stale))
            except (bl.BaselineError, OSError) as exc:
                out.errors.append(f"perfguard: stale cases not pruned: {exc}")
                return
            out.messages.append(f"perfguard: pruned {len(gone)} stale case(s) from {path}")
        elif stale:
            out.messages.append(
                f"perfguard: {len(stale)} stale case(s) stored but not collected: {', '.join(stale[:5])}"
                f"{' ...' if len(stale) > 5 else ''}; remove them with --perfguard-update-baseline --perfguard-prune"
            )
