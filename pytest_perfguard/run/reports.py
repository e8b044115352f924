"""Writing the run's reports (JSON, Markdown, HTML, JUnit properties) once, at the end of the run."""

from __future__ import annotations

import os
from typing import Any

from ..jsonio import JSONFileError
from ..record import CaseRecord, Status
from ..settings import shown
from .state import RunSummary, SessionState


def write_reports(state: SessionState, records: list[CaseRecord], timed: list[CaseRecord], out: RunSummary) -> None:
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
