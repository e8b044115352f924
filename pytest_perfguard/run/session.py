"""The controller's end of a run: decide it, write the baseline once (update.py), say what was decided
(outcome.py), write the reports once (reports.py). The run's state is in state.py.

`finish` runs in the single process of a plain run, or in the xdist controller, never in a worker. Nothing
here raises into pytest's summary hooks: problems become messages and a non-zero exit status.
"""

from __future__ import annotations

from ..judge import storage
from ..record import CaseRecord
from ..settings import shown
from .outcome import compared, decided, disturbed_line, nothing_timed, warmup_line
from .reports import write_reports
from .state import RunSummary, SessionState, baseline_file
from .update import update


def finish(state: SessionState, records: list[CaseRecord], *, collected_ids: set[str] | None) -> RunSummary:
    """Decide the run-level outcome and write files. `records` are all processes' records, merged."""
    s = state.settings
    out = RunSummary()
    timed = [r for r in records if r.timed]
    if s.enabled and not timed:
        out.errors.append(nothing_timed(records))
    # A sticky CUDA error marks its case's record (Runner._crashed), in any process of the session.
    poisoned_by = sorted({r.id for r in records if r.sticky})
    if s.update and timed:
        if poisoned_by:
            out.errors.append(
                "perfguard: no baseline written: the CUDA context was poisoned during this session "
                f"(by {', '.join(poisoned_by)})"
            )
        else:
            update(state, timed, collected_ids, out)
    elif s.enabled and timed:
        compared(state, timed, out)
        decided(state, timed, out)
        if state.baseline is not None and state.baseline.exists and collected_ids is not None:
            stale = storage.stale_entries(state.baseline, collected_ids)
            if stale:
                out.messages.append(
                    f"perfguard: {len(stale)} stored case(s) in {shown(baseline_file(state))} "
                    "were not collected in this "
                    "run (stale if the whole suite ran); remove them with --perfguard-update-baseline --perfguard-prune"
                )
    # In a guard the unverified cases' summary (decided) names each disturbed case already.
    disturbed = disturbed_line(timed, update=s.update) if s.update else ""
    if disturbed:
        out.messages.append(disturbed)
    warmup = warmup_line(state.warmups)
    if warmup:
        out.messages.append(warmup)
    write_reports(state, records, timed, out)
    return out
