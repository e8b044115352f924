"""Confirm a regression in a fresh process before failing the build on it.

A measured slowdown can belong to the process rather than to the code: what the process did before (a
small Triton kernel ran several per cent faster on each fresh process's first inputs and graph than on any
later ones; see benchmarks/results/README.md) moves a few-microsecond kernel reproducibly within that
process. The in-process re-measurement cannot see past such a state; a new process can. So a case that is
still "regressed" after re-measurement is run once more, alone, in a fresh Python process with the same
settings and baseline, and fails the build only if it regresses there too. The same check keeps an update
run whose time moved past the case's threshold from restarting an entry on a process's whim.

A fresh process costs a start (torch, the plugin, the device's warm-up), so a session starts at most
`confirm_max` of them for one case each. The regressions past that wait (`Batch`): their items' reports are
held, and after the session's last case they are confirmed together in one more fresh process, settled by
the same rules, and only then reported, so that the terminal, junit, the xdist controller and the results
file all see the final verdict. Each xdist worker batches its own. Against a stored baseline, a regression
the fresh process does not repeat is judged on both processes together (policy.mean_threshold).

A slowdown can also belong to what ran before the case: an autotune cache keyed wrongly hands a case the
configuration another shape tuned (+57% and +62% on an H100, in the suite only). Alone, a fresh process
cannot repeat that, yet a user's CI runs the whole suite, where it lives. So a regression that the fresh
process does not repeat is run once more in a fresh process after the cases that preceded it here, in this
process's own order (context.py's `RunOrder`; an xdist worker's own, not the collection's), and fails the case
if it regresses there ("only after ..."). The replay is a bounded tail (`CONTEXT_CASES`, `CONTEXT_S`): a
slowdown that needs an earlier case than that is not seen by it (tests/test_context_confirm.py). The fresh
processes themselves are started by fresh.py.
"""

from __future__ import annotations

import math
import time
from collections.abc import Generator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

import pytest

# How pytest-rerunfailures runs an item without logging its reports, and which exceptions pytest lets through.
from _pytest.runner import get_reraise_exceptions, runtestprotocol

from ..judge.policy import BATCH_TIME_FACTOR, CONFIRM_PROCESSES, process_mean, within_together
from ..judge.verdict import Verdict
from ..marker import MARK_NAME
from ..record import CaseRecord, Confirmed, Gate, Status
from . import xdist as xd
from .context import RUN_ORDER, Context, RunOrder, aside, cases_text, replay_in_context, unmeasured, unrepeated
from .ending import Ending, end_item
from .fresh import confirmed_of, run_fresh, say, start_fresh_cases
from .role import role_of

if TYPE_CHECKING:
    from ..judge.baseline import BaselineEntry
    from .caseitem import CaseItem
    from .state import SessionState
    from .watchdog import Deadline


class CaseRun(Protocol):
    """What a confirmation needs of the runner of the case it confirms."""

    item: CaseItem
    state: SessionState

    timing_s: float  # what measuring the case took in this process (a batch's bound is made of these)

    @property
    def clock(self) -> Deadline: ...

    def fresh_process_timeout(self) -> float | None: ...

    def conclude_deferred(self, confirmation: Confirmation) -> Ending: ...


@dataclass
class Confirmation:
    status: Status
    info: Confirmed | None = None  # what the fresh process measured, kept in the record
    note: str = ""  # added to the verdict's notes
    hold_back: str = ""  # an update run not to fold into the baseline, and why
    deferred: bool = False  # past the single confirmations: the batch settles it (Batch)


def _fresh(run: CaseRun) -> tuple[CaseRecord | str, Confirmed] | None:
    """The case run alone in a fresh process, within the session's cap: None once the cap is reached; else
    the child's record (or why there is none) and what to keep of it in this record's "confirmation"."""
    state = run.state
    if state.confirmations >= state.settings.confirm_max:
        return None
    state.confirmations += 1
    t0 = time.monotonic()
    with run.clock.paused(), aside(run.item.config):  # the fresh process has its own deadline
        child = run_fresh(run.item, state.settings, run.fresh_process_timeout())
    return child, confirmed_of(child, round(time.monotonic() - t0, 1))


REGRESSED_TAIL = ": a process-dependent time, not judged"


def confirm_regression(run: CaseRun, verdict: Verdict) -> Confirmation:
    """The verdict stays "regressed" only if the case regresses in a fresh process too; a regression seen in
    one process alone becomes inconclusive (or passes, judged on both processes together against a stored
    sample). Past the single confirmations it waits for the batch (`Batch`); when no confirmation can be
    had, the regression stands."""
    if not run.state.settings.confirm or run.state.role.child:
        return Confirmation(Status.REGRESSED)
    return _reconfirm(run, verdict, Status.REGRESSED, ("ab", "baseline"), REGRESSED_TAIL)


def confirm_faster(run: CaseRun, verdict: Verdict) -> Confirmation:
    """A/B only: "faster than the base revision" is a claim a pull request shows, and a process can make it
    alone. Two separately loaded copies of the same code can differ by a few percent for a whole process
    (cuda_scalar on H100s, benchmarks/results/ab_2026-11-23: up to 4.7%, stable within the process), which
    read as "faster" in 7 of 588 A/A verdicts. So the speed-up is checked in a fresh process: confirmed,
    it stands; "pass" there, the case passes (slower in neither process, faster in one only); anything else
    is inconclusive. Without a confirmation (off, the cap reached, a failed child) the verdict stands."""
    if not run.state.settings.confirm or run.state.role.child:
        return Confirmation(Status.FASTER)
    return _reconfirm(run, verdict, Status.FASTER, ("ab",), ": a process-dependent time")


def _reconfirm(run: CaseRun, verdict: Verdict, claim: Status, shown_gates: tuple[str, ...], tail: str) -> Confirmation:
    """`claim` (regressed or faster) stands if the fresh process makes it too, or if no fresh process can be
    had. Otherwise the case is inconclusive, or passes where a speed-up meets a pass. A regression past the
    session's single confirmations waits for the batch, when its item runs under the batch's protocol."""
    fresh = _fresh(run)
    if fresh is None:
        if claim is Status.REGRESSED and _waits(run, verdict):
            return Confirmation(claim, deferred=True)
        cap = run.state.settings.confirm_max
        return _noted(verdict, claim, None, f"not confirmed in a fresh process: {cap} confirmations already run")
    child, info = fresh
    context = _in_context(run, child) if claim is Status.REGRESSED else None
    return settle(run, verdict, claim, child, info, shown_gates, tail, context=context)


def _noted(verdict: Verdict, status: Status, info: Confirmed | None, text: str, first: bool = False) -> Confirmation:
    verdict.notes.insert(0 if first else len(verdict.notes), text)
    return Confirmation(status, info, text)


def settle(
    run: CaseRun,
    verdict: Verdict,
    claim: Status,
    child: CaseRecord | str,
    info: Confirmed | None,
    shown_gates: tuple[str, ...] = ("ab", "baseline"),
    tail: str = REGRESSED_TAIL,
    batch: str = "",
    context: Context | None = None,
) -> Confirmation:
    """`claim` judged with what the fresh process made of the case (its record, or why there is none): the
    one rule of a single confirmation and of a batch's (``batch`` names the batch, in the notes). A
    regression that the fresh process did not repeat, but that a replay after the cases that preceded it
    here (``context``) did, stands: the slowdown is the suite's, and the suite is what CI runs."""
    within = f" ({batch})" if batch else ""
    if isinstance(child, str):
        what = "the regression" if claim is Status.REGRESSED else "the verdict"
        return _noted(verdict, claim, info, f"confirmation failed{within}, {what} stands: {child}")
    first = next((g.reason for g in verdict.gates if g.status is claim and g.reason), str(claim))
    again = next((g.reason for g in child.gates if g.status is claim), None)
    if child.verdict is claim:
        return _noted(verdict, claim, info, f"confirmed in a fresh process{within}: {again or claim}")
    after = ""
    if context is not None:
        if context.reproduced:
            assert isinstance(context.child, CaseRecord)
            there = next((g.reason for g in context.child.gates if g.status is claim), None)
            text = (
                f"confirmed in a fresh process{within} only after {cases_text(context.after)}, as in this process "
                f"(alone it read {child.verdict}): {there or claim}"
            )
            return _noted(verdict, claim, context.kept(info), text)
        after, info = f"; {context.said()}", context.added_to(info)
    shown = next((g.reason for g in child.gates if g.name in shown_gates), None)
    text = (
        f"not confirmed: {first} in this process, but {child.verdict} in a fresh one"
        + (f" ({shown})" if shown else "")
        + (f", {batch}" if batch else "")
        + tail
        + after
    )
    if claim is Status.REGRESSED:
        together = _two_processes(run, verdict, child)
        if together is not None and together[0] is not None:
            return _noted(verdict, together[0], info, f"not confirmed{within}: {together[1]}{after}", first=True)
        if together is not None:
            text += f"; {together[1]}"
    passed = claim is Status.FASTER and child.verdict is Status.PASS
    return _noted(verdict, Status.PASS if passed else Status.INCONCLUSIVE, info, text, first=True)


_GATE_WORDS = {"baseline": "time vs baseline", "ratio": "ratio vs baseline ratio"}


def _two_processes(run: CaseRun, verdict: Verdict, child: CaseRecord) -> tuple[Status | None, str] | None:
    """A stored-baseline regression that the fresh process did not repeat, judged on both processes: each
    deciding time or ratio gate that did not pass here passes if the mean of its two readings is within the
    threshold for a mean of two processes (policy.mean_threshold). The case's status with those gates passed
    (None when one is beyond its threshold), and both readings and the mean of each for the notes. None
    where the rule does not apply: under the A/B gate (its own rule), against an entry of fewer than two
    processes (no spread) or an unstable one, a regression of another gate (max_ratio), or a fresh reading
    that is missing, disturbed or not comparable."""
    state = run.state
    stored = state.baseline.cases.get(run.item.nodeid) if state.baseline is not None else None
    if state.settings.against or stored is None or stored.runs < 2 or stored.unstable:
        return None
    if not child.timed or child.disturbances:
        return None
    said: list[str] = []
    passed: list[Gate] = []
    for gate in verdict.deciding_gates():
        if gate.status in (Status.PASS, Status.FASTER, Status.NOT_COMPARABLE):
            continue  # a time gate the machine moved is not judged: the ratio gate decides
        if gate.name not in _GATE_WORDS:
            if gate.status is Status.REGRESSED:
                return None
            continue  # an inconclusive max_ratio keeps the case inconclusive
        there = child.gate(gate.name)
        if gate.estimate is None or there is None or there.estimate is None:
            return None
        if there.status is Status.NOT_COMPARABLE:
            return None
        limit = _mean_limit(run, stored, gate)
        readings = [gate.estimate, there.estimate]
        ok = within_together(readings, limit)
        if ok:
            passed.append(gate)
        said.append(
            f"{_GATE_WORDS[gate.name]} {_pct(readings[0])} in this process, {_pct(readings[1])} in a fresh one; "
            f"the two processes' mean {_pct(process_mean(readings))} is {'within' if ok else 'beyond'} the "
            f"{limit * 100:.1f}% threshold"
        )
    if not said:
        return None
    if len(passed) < len(said):
        return None, "; ".join(said)
    gates = [replace(g, status=Status.PASS) if any(g is p for p in passed) else g for g in verdict.gates]
    return Verdict(gates=gates, deciding=verdict.deciding).status, "; ".join(said)


def _mean_limit(run: CaseRun, stored: BaselineEntry, gate: Gate) -> float:
    """The threshold of a mean of two processes for this gate: the spread, floor and file prior its own
    threshold is made of (verdict.Policy.stored_threshold)."""
    return run.state.policy().stored_threshold(stored, gate.name, CONFIRM_PROCESSES)


def _pct(ratio: float) -> str:
    return f"{(ratio - 1) * 100:+.1f}%"


def confirm_move(run: CaseRun, stored: BaselineEntry, median_ns: float, verdict: Verdict) -> Confirmation:
    """An update run whose time moved past the case's threshold from the stored centre would restart the
    case's entry (a changed kernel: see update_rules.merge_entry). A slow or fast process can do that on its
    own, and would throw away the runs the centre was made of. So the case is measured against the stored
    entry in a fresh process: if it passes there, this run was the process, not the kernel, and it is held
    back from the baseline; otherwise the change stands and the entry restarts."""
    limit = run.state.policy().baseline_delta(stored)
    moved = math.log(median_ns / stored.median_ns)
    status = verdict.status
    if abs(moved) <= math.log1p(limit) or not run.state.settings.confirm or run.state.role.child:
        return Confirmation(status)
    here = f"{math.expm1(moved) * 100:+.1f}%"
    fresh = _fresh(run)
    if fresh is None:
        verdict.notes.append(
            f"moved {here} from the stored time; not checked in a fresh process ({run.state.settings.confirm_max} "
            "confirmations already run): its entry restarts as a changed kernel"
        )
        return Confirmation(status)
    child, info = fresh
    if isinstance(child, str):
        verdict.notes.append(f"moved {here}; the fresh-process check failed ({child}): its entry restarts")
        return Confirmation(status, info)
    there = child.median_ns
    there_txt = f"{(there / stored.median_ns - 1) * 100:+.1f}%" if there else "?"
    if child.verdict is Status.PASS:  # within the same threshold of the stored time, in a fresh process
        why = (
            f"moved {here} from the stored time in this process but {there_txt} (pass) in a fresh one: the "
            f"process, not the kernel; this run is not folded into the baseline (its {stored.runs} run(s) kept)"
        )
        verdict.notes.insert(0, why)
        return Confirmation(status, info, hold_back=why)
    verdict.notes.append(
        f"moved {here} from the stored time here and {there_txt} ({child.verdict}) in a fresh process: "
        "a changed kernel, its entry restarts"
    )
    return Confirmation(status, info)


def _in_context(run: CaseRun, child: CaseRecord | str) -> Context | None:
    """A single confirmation's regression that its fresh process did not repeat, replayed after the cases
    that preceded it here; None when it was repeated (or not measured), or nothing ran before it."""
    order = run.item.config.stash.get(RUN_ORDER, None)
    if order is None or not unrepeated(child):
        return None
    with run.clock.paused(), order.aside():
        got = replay_in_context(run.item.config, order, {run.item.nodeid: run.timing_s}, run.state.settings)
    return got.get(run.item.nodeid)


# ------------------------------------------------------------------------------------------ the batch


@dataclass
class _Waiting:
    """A regression waiting for the batch: its case's run and verdict, and its item's reports, held."""

    run: CaseRun
    verdict: Verdict
    item: pytest.Item  # the pytest item its reports are made and logged for
    reports: list[pytest.TestReport] = field(default_factory=list)


class Batch:
    """The regressions past a session's single confirmations, confirmed together in one fresh process after
    the session's last case: one start for many cases, settled by the rules of a single confirmation.

    A pytest plugin. Once the single confirmations are spent, each perf item runs under this protocol, which
    runs it without logging its reports (as pytest-rerunfailures does): an item that did not regress is
    logged at once; one that did keeps its reports until the batch has settled it, then its call report is
    made again from the final verdict (pass, inconclusive or the failure), and all are logged, so that every
    reporter sees the final verdict once. The batch runs when the run loop ends (in each xdist worker, its
    own); a worker that must leave (a poisoned CUDA context) runs it first. A run that stops early, or times
    out, reports the waiting regressions as standing, unconfirmed, and says why."""

    def __init__(self, config: pytest.Config, state: SessionState) -> None:
        self.config = config
        self.state = state
        self.running: pytest.Item | None = None  # the item under this protocol now: only its regression can wait
        self.waiting: dict[str, _Waiting] = {}

    @classmethod
    def install(cls, config: pytest.Config, state: SessionState) -> None:
        """The batch of a session that confirms regressions (not of a fresh process, nor of an update)."""
        s = state.settings
        if not s.enabled or s.update or not s.confirm or state.role.child:
            return
        batch = cls(config, state)
        config.stash[BATCH] = batch
        config.pluginmanager.register(batch, "perfguard-batch")
        # The order of this process's items, which a regression not repeated alone is replayed after.
        config.stash[RUN_ORDER] = order = RunOrder()
        config.pluginmanager.register(order, "perfguard-run-order")

    def take(self, run: CaseRun, verdict: Verdict) -> bool:
        """Hold this regression for the batch: True when its item runs under this protocol."""
        if self.running is None or run.item.nodeid != self.running.nodeid:
            return False
        self.waiting[run.item.nodeid] = _Waiting(run, verdict, self.running)
        return True

    def _holds(self, item: pytest.Item) -> bool:
        """Past the single confirmations a perf item runs under this protocol, where its regression can wait."""
        state = self.state
        return (
            item.get_closest_marker(MARK_NAME) is not None
            and state.confirmations >= state.settings.confirm_max
            and not state.poisoned_by
            and xd.late_reports(item.config)
        )

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
        if not self._holds(item):
            return None
        item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        self.running = item
        try:
            reports = runtestprotocol(item, log=False, nextitem=nextitem)
        finally:
            self.running = None
        held = self.waiting.get(item.nodeid)
        if held is None:
            _log(item, reports)
        else:
            held.reports = reports
        if self.state.poisoned_by == item.nodeid and role_of(self.config).worker:
            self.settle()  # the worker leaves after this item (xdist_support.exit_if_poisoned)
        return True

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Generator[None, object, object]:
        try:
            result = yield
        except BaseException:
            self.abandon("the run stopped before the batch confirmation")
            raise
        self.settle()
        return result

    def settle(self) -> None:
        """Confirm the waiting regressions in one fresh process, then conclude and report each."""
        waiting = list(self.waiting.values())
        self.waiting.clear()
        if not waiting:
            return
        try:
            answers = self._confirm(waiting)
        except BaseException:
            self.waiting = {w.run.item.nodeid: w for w in waiting}
            self.abandon("the batch confirmation was interrupted")
            raise
        for w in waiting:
            self._conclude(w, answers[w.run.item.nodeid])

    def abandon(self, why: str, *, log: bool = True) -> None:
        """Conclude the waiting regressions without the batch: each stands, saying why. ``log``: report them
        too (not on the way out of a timed-out process, whose records travel with its timeout)."""
        waiting = list(self.waiting.values())
        self.waiting.clear()
        info = Confirmed(error=why, elapsed_s=0.0, batch=len(waiting))
        for w in waiting:
            text = f"not confirmed in a fresh process: {why}; the regression stands"
            self._conclude(w, _noted(w.verdict, Status.REGRESSED, replace(info), text), log=log)

    def _confirm(self, waiting: Sequence[_Waiting]) -> dict[str, Confirmation]:
        """The batch's fresh process, and each waiting case settled with what it made of the case."""
        s = self.state.settings
        ids = [w.run.item.nodeid for w in waiting]
        n, cap = len(ids), s.confirm_max
        bound = BATCH_TIME_FACTOR * math.fsum(w.run.timing_s for w in waiting) + s.case_budget
        timeout = 2 * s.case_timeout * n + bound + 120 if s.case_timeout else None
        say(
            self.config,
            f"perfguard: confirming {n} regression(s) together in one fresh process (past the {cap} single "
            f"confirmations; at most {bound:.0f} s of measurement)",
        )
        t0 = time.monotonic()
        got = start_fresh_cases(self.config, ids, s, timeout, total_budget=bound, alone=True).result()
        spent = round(time.monotonic() - t0, 1)
        where = f"one batch of {n} past the {cap} single confirmations"
        children = {
            case_id: got if isinstance(got, str) else got.get(case_id, "the fresh process did not run this case")
            for case_id in ids
        }
        # The regressions it did not repeat, replayed after what preceded each here: one more process.
        order = self.config.stash.get(RUN_ORDER, None)
        not_repeated = {w.run.item.nodeid: w.run.timing_s for w in waiting if unrepeated(children[w.run.item.nodeid])}
        contexts = replay_in_context(self.config, order, not_repeated, s) if order is not None and not_repeated else {}
        answers: dict[str, Confirmation] = {}
        for w in waiting:
            case_id = w.run.item.nodeid
            child = children[case_id]
            info = replace(confirmed_of(child, spent), batch=n)
            if isinstance(child, CaseRecord) and unmeasured(child):
                text = (
                    f"not confirmed in a fresh process ({where}): the batch's bound of {bound:.0f} s of measurement "
                    f"({BATCH_TIME_FACTOR:g}x what its cases took here, plus one case's budget) was spent before "
                    "this case; the regression stands"
                )
                answers[case_id] = _noted(w.verdict, Status.REGRESSED, info, text)
            else:
                context = contexts.get(case_id)
                answers[case_id] = settle(w.run, w.verdict, Status.REGRESSED, child, info, batch=where, context=context)
        return answers

    def _conclude(self, w: _Waiting, confirmation: Confirmation, *, log: bool = True) -> None:
        """The case's end with its confirmation, made in place of its call phase; then its reports logged,
        the call report made again from that end."""
        item = w.item
        call = pytest.CallInfo.from_call(
            lambda: end_item(w.run.conclude_deferred(confirmation)),
            when="call",
            reraise=get_reraise_exceptions(self.config),
        )
        if not log:
            return
        with _fixtures_cleared(item):
            report: pytest.TestReport = item.ihook.pytest_runtest_makereport(item=item, call=call)
        first = next((r for r in w.reports if r.when == "call"), None)
        if first is not None:  # the call's own duration and output, not the conclusion's
            report.duration, report.start, report.stop = first.duration, first.start, first.stop
            report.sections = list(first.sections)
        reports = [report if r is first else r for r in w.reports] if first is not None else [report]
        with xd.reporting_as(item):
            _log(item, reports)


BATCH = pytest.StashKey[Batch]()


@contextmanager
def _fixtures_cleared(item: pytest.Item) -> Iterator[None]:
    """Around a report made after the item's protocol ended. pytest sets a function's `funcargs` to None at
    that end, and plugins that read them while a report is made (pytest-benchmark: `item.funcargs.get(...)`)
    would crash the session: they see an empty mapping meanwhile, the fixtures being torn down."""
    if not hasattr(item, "funcargs") or item.funcargs is not None:
        yield
        return
    item.funcargs = {}
    try:
        yield
    finally:
        item.funcargs = None


def _waits(run: CaseRun, verdict: Verdict) -> bool:
    """Hand the regression to the session's batch: True when its item runs under the batch's protocol."""
    batch = run.item.config.stash.get(BATCH, None)
    return batch is not None and batch.take(run, verdict)


def abandon_batch(config: pytest.Config, why: str) -> None:
    """The process is ending (a hung case): the waiting regressions stand unconfirmed, their records kept."""
    batch = config.stash.get(BATCH, None)
    if batch is not None:
        batch.abandon(why, log=False)


def _log(item: pytest.Item, reports: Sequence[pytest.TestReport]) -> None:
    for report in reports:
        item.ihook.pytest_runtest_logreport(report=report)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
