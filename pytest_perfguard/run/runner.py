"""Runs one perf item: requirements -> correctness -> measure -> judge -> record.

The steps take the case's values and return their own (the correctness report, the twin, `timed.Timed`,
the checks' flags and findings, the verdict, the confirmation); the runner alone writes them into the
item's `CaseRecord`, keeps it in one place (`_conclude`) and returns how the item ends (`Ending`): the
pytest outcome is made from that outside the steps (ending.end_item). The runner reads the stored
baseline but never writes it: workers only produce records, and the controller (session.py) merges,
writes and reports once.
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from datetime import date
from typing import Any

import torch

from ..judge.baseline import BaselineEntry
from ..judge.stats import relative_half_width
from ..judge.verdict import Verdict, case_mde
from ..locks import device_lock
from ..marker import PerfCase, Variant, unmet_requirement
from ..measure import integrity, torchstate
from ..measure.correctness import CorrectnessReport, Inputs, check
from ..measure.device import incomparable, lock_name, manual_seed
from ..measure.hosttime import HostTime
from ..measure.timing import Measurement, Progress
from ..record import AbComparison, CaseRecord, Outcome, Status
from .caseitem import CaseItem
from .checks import IntegrityChecks, capture_error
from .confirm import Confirmation, confirm_faster, confirm_move, confirm_regression
from .ending import Ending
from .state import SessionState
from .timed import TimedStep, engine_bindings, note_unchecked_faster, timer_for
from .watchdog import Deadline, deadline, doing, snapshot
from .workload import (
    Trial,
    count,
    describe_workload,
    draw_seeds,
    finite,
    input_bytes,
    normalize_inputs,
    tensor_bytes,
    workload_hash,
)

_STICKY = (
    "illegal memory access",
    "unspecified launch failure",
    "device-side assert",
    "misaligned address",
    "illegal instruction",
)


# The plugin's own frames (the whole package's: the runner's steps call measure/'s), cut from the front of a
# variant's traceback so pytest shows the user's code first.
_OWN_FILES = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _from_user_code(exc: BaseException) -> BaseException:
    """`exc` with the plugin's leading frames dropped from its traceback (all kept when nothing else is left)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(_OWN_FILES):
        tb = tb.tb_next
    return exc if tb is None else exc.with_traceback(tb)


def _is_sticky_cuda_error(exc: BaseException) -> bool:
    return any(marker in str(exc) for marker in _STICKY)


def gpu_diagnostics() -> str:
    parts = [f"torch {torch.__version__}", f"torch.version.cuda={torch.version.cuda}"]
    parts.append(f"torch.cuda.is_available()={torch.cuda.is_available()}")
    parts.append(f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}")
    parts.append(f"nvidia-smi {'found' if shutil.which('nvidia-smi') else 'not found'}")
    parts.append(f"nvcc {'found' if shutil.which('nvcc') else 'not found'}")
    return "Diagnostics: " + ", ".join(parts)


class Runner:
    """The `perfguard_runner` fixture's value: runs the item it belongs to."""

    def __init__(self, state: SessionState, item: CaseItem) -> None:
        self.state = state
        self.item = item
        self._clock: Deadline = Deadline(0.0)
        self._stage = "setup"
        self._failure = ""  # the pytest failure message, when the record's outcome is FAILED
        self._raised: BaseException | None = None  # what a step raised: the item fails with its traceback
        self._waited_s = 0.0  # time spent waiting for the device lock, left out of the case's time
        self.timing_s = 0.0  # what measuring the case took (the session's timing budget counts the same)
        # A regression past the single confirmations: the record, verdict and whether the variant is the
        # reference, concluded when the batch has confirmed it (confirm.Batch, conclude_deferred).
        self._deferred: tuple[CaseRecord, Verdict, bool] | None = None
        self._base_unmet: str | None = None  # the base twin's unmet requirement (A/B runs), read when pairing
        # The timed step while it runs (what it found goes into the record of a case that raises or times out
        # in it), and its blocks: a timeout says whether they were still ending or a call never returned.
        self._step: TimedStep | None = None
        self._ending = threading.Lock()  # a timeout keeps a copy of the record; then this thread keeps nothing
        self._expired = False  # (`_expire`, `_conclude`)
        self._block: tuple[int, float, float] | None = None  # blocks ended, when the first and last did
        self._timing_t0 = 0.0

    # ------------------------------------------------------------------------------------------ frame

    def run(
        self, case: PerfCase, variant_name: str, factory: Callable[[], Any], params: dict[str, Any]
    ) -> Ending | None:
        """The case's steps, its record kept, and how its item ends; None while its regression waits for the
        batch confirmation, which ends it after the session's last case (`conclude_deferred`)."""
        record = CaseRecord(
            id=self.item.nodeid, test=self.item.test, variant=variant_name, params=dict(self.item.params)
        )
        timeout = self.state.settings.case_timeout
        with deadline(timeout, self.item.nodeid, lambda m: self._expire(record, m), self._where) as clock:
            self._clock = clock
            t0 = time.monotonic()
            try:
                with self.on_device():
                    self._steps(record, case, variant_name, factory, params)
            except Exception as exc:
                self._crashed(record, exc)
            if record.outcome is not Outcome.SKIPPED:
                confirming = record.confirmation.elapsed_s if record.confirmation is not None else 0.0
                record.case_s = round(time.monotonic() - t0 - self._waited_s - confirming, 4)
        return self._conclude(record) if self._deferred is None else None

    def _conclude(self, record: CaseRecord) -> Ending:
        """The one place a record is kept, and how the item ends (pass, fail or skip: ending.end_item makes
        pytest's outcome of it)."""
        with self._ending:
            expired = self._expired
            if not expired:
                self.state.records.append(record)
        if expired:  # the watchdog kept the case's timeout and is ending the process: nothing may follow it
            threading.Event().wait()
        if record.outcome is Outcome.FAILED and self._raised is not None:
            # pytest then shows where in the user's kernel it raised, in every --tb style; the table keeps
            # the short reason.
            raised, self._raised = _from_user_code(self._raised), None
            if hasattr(raised, "add_note"):  # Python 3.11+
                raised.add_note(f"perfguard: {self._failure}")
            return Ending(raised=raised)
        if record.outcome is Outcome.FAILED:
            return Ending(failure=self._failure or "; ".join(record.reasons))
        if record.outcome in (Outcome.SKIPPED, Outcome.NOT_RUN):
            return Ending(skipped=record.reasons[0] if record.reasons else "skipped")
        return Ending()

    def _fail(self, record: CaseRecord, message: str, verdict: Status | None = None) -> None:
        record.outcome = Outcome.FAILED
        if verdict is not None:
            record.verdict = verdict
        self._failure = message

    def _where(self) -> str:
        """What the case was doing when its deadline passed, for the timeout's message (the watchdog's thread)."""
        measuring = self._step is not None and self._step.measuring
        return doing(self._stage, self._timing_t0, self._block, measuring, time.monotonic())

    def _keep_found(self, record: CaseRecord) -> None:
        """What the timed step had found when the case raised or timed out in it: its environment and notes."""
        step = self._step
        if step is None:
            return
        # a timeout right as the step returned may find them kept already: once each
        record.env = record.env if record.env is not None else step.env
        record.notes = [*record.notes, *(n for n in step.notes if n not in record.notes)]

    def _expire(self, record: CaseRecord, message: str) -> None:
        """The watchdog's exit path (another thread): the process ends right after this. The case's thread may
        still be running (a measurement that was still taking blocks) and writing `record`: what is kept is a
        copy of it as it stands, and that thread keeps nothing after it (`_conclude`)."""
        with self._ending:
            self._expired = True
            ended = snapshot(record)
        self._keep_found(ended)
        ended.outcome, ended.verdict, ended.reasons = Outcome.FAILED, Status.TIMEOUT, [message]
        self.state.records.append(ended)
        if self.state.on_timeout is not None:
            self.state.on_timeout(message, self.item)

    def _crashed(self, record: CaseRecord, exc: BaseException) -> None:
        reason = f"{self._stage} raised {type(exc).__name__}: {exc}"
        self._keep_found(record)
        # The traceback is kept to fail the item with (and pytest keeps the last one in sys.last_traceback):
        # its frames' locals are the case's inputs, graphs and outputs, gigabytes of GPU memory that the next
        # cases would run out of (two S4096 cases on an H100 did). The lines are kept, the locals dropped.
        traceback.clear_frames(exc.__traceback__)
        if isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower():
            # Release what the failed case held so the next cases run on a clean allocator.
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            reason = f"CUDA out of memory in {self._stage} (inputs {record.workload_desc or '?'}): {exc}"
        record.reasons = [reason]
        self._fail(record, f"{record.variant}: {reason}", Status.ERROR)
        self._raised = exc
        if _is_sticky_cuda_error(exc):
            # Every later CUDA call in this process fails: the remaining GPU cases are reported as not run,
            # never as regressions, and no baseline is written from this session.
            self.state.poisoned_by = record.id
            record.sticky = True

    @contextlib.contextmanager
    def on_device(self) -> Iterator[None]:
        """The case's device made current for every step. Streams, graph captures, events and launches
        that take the current device (Triton's, a bare torch.cuda.synchronize()) would otherwise run on
        cuda:0 while the tensors live on the worker's own GPU."""
        if self.state.kind != "cuda" or self.state.poisoned_by:
            yield  # a poisoned context refuses every CUDA call: the case reports itself not run
            return
        # torch.cuda.device, not set_device: switching back never creates a context on the other GPU.
        guard = torch.cuda.device(torch.device(self.state.settings.device))
        guard.__enter__()  # type: ignore[no-untyped-call]
        try:
            yield
        finally:
            with contextlib.suppress(RuntimeError):  # a poisoned context may refuse the switch back
                guard.__exit__(None, None, None)

    def _lock(self, *, exclusive: bool) -> AbstractContextManager[None]:
        name = lock_name(self.state.settings.device)
        return device_lock(name, exclusive=exclusive, while_waiting=self._waiting)

    @contextlib.contextmanager
    def _waiting(self) -> Iterator[None]:
        """Around a wait for the device lock: the watchdog's clock pauses, and the wait is not the case's time."""
        t0 = time.monotonic()
        try:
            with self._clock.paused():
                yield
        finally:
            self._waited_s += time.monotonic() - t0

    # ------------------------------------------------------------------------------------------ steps

    def _steps(
        self, record: CaseRecord, case: PerfCase, variant_name: str, factory: Callable[[], Any], params: dict[str, Any]
    ) -> None:
        """Requirements, inputs, the correctness gate; then, under --perfguard, the timed steps."""
        s = self.state.settings
        variant = case.variants[variant_name]
        guard = self._torch_guard(record)
        self._stage = "requirements"
        if not self._runnable(record, variant):
            return

        def make_inputs(seed: int) -> Inputs:
            manual_seed(seed)
            return normalize_inputs(factory(), record.test)

        seeds = draw_seeds(case.seeds, s.seed)
        record.seeds = seeds
        self._stage = "making the inputs (the test's body)"
        first = make_inputs(seeds[0])
        record.workload_desc = describe_workload(first)
        record.workload = workload_hash(record.workload_desc)
        self._stage = "correctness check"
        checks = IntegrityChecks(s, self.state.kind, self._lock, engine_bindings)
        probe = checks.probe(variant) if s.enabled else None
        with guard.phase("the correctness calls"):
            report = self._correctness(record, case, variant, make_inputs, seeds, first, probe)
        if not report.passed:
            return
        if not s.enabled:
            record.outcome, record.verdict = Outcome.PASSED, Status.CORRECT
            return
        if s.total_budget and self.state.timing_spent_s >= s.total_budget:
            record.outcome, record.verdict = Outcome.PASSED, Status.INCONCLUSIVE
            record.reasons = [f"not timed: total budget {s.total_budget:g}s spent"]
            if s.strict:
                self._fail(record, record.reasons[0])
            return
        trial = Trial(case, variant_name, variant, params, make_inputs, seeds, first, report.oracles)
        self._timed_steps(record, trial, report, checks, probe, guard)

    def _timed_steps(
        self,
        record: CaseRecord,
        trial: Trial,
        report: CorrectnessReport,
        checks: IntegrityChecks,
        probe: integrity.ProfiledCall | None,
        guard: torchstate.Guard,
    ) -> None:
        """Pair with the base revision, check, time and judge, check again, confirm: the case's verdict."""
        s = self.state.settings
        step = self._step = TimedStep(self.state, self.item, self._lock, self._on_progress())
        twin = None
        if s.against:
            self._stage = "pairing with the base revision"
            twin = step.pair(trial, record.test, record.workload_desc, self._base_unmet)
        self._stage = "integrity checks"
        flag = guard.message() or checks.before_timing(trial, report, probe)
        if flag:
            self._keep_checks(record, checks)
            self._flag(record, flag, [])
            return
        self._stage, self._timing_t0 = "timing", time.monotonic()
        timer = timer_for(s.device, trial.case.clock)
        t0 = time.monotonic()
        with guard.phase("the timed calls"):
            timed = step.measure_and_judge(trial, record.workload or "", twin, timer)
        m, verdict = timed.m, timed.verdict
        record.notes.extend(timed.notes)
        record.env, record.device = timed.env, step.device
        self._step = None  # what it found is in the record now
        self.timing_s = time.monotonic() - t0
        self.state.timing_spent_s += self.timing_s
        if step.host_s:
            checks.spent["eager call"] = step.host_s
        self._record_timing(record, trial, m, step.host)
        self._stage = "integrity checks"
        with guard.phase("the integrity checks' calls"):
            flag = guard.message() or checks.after_timing(trial, record, m, timer)
        record.notes.extend(checks.timed_notes)
        record.pct_peak_compute, record.pct_peak_bandwidth = checks.pct_peak
        flag = flag or guard.message() or verdict.flag
        if checks.disturbances and not flag:
            # A check the machine kept from deciding (the memo check's rounds): the case decides nothing.
            verdict.disturbances.extend(checks.disturbances)
            verdict.notes.append("a check could not decide on a disturbed machine: inconclusive, never stored")
        record.reference_move = verdict.reference_move
        self._keep_checks(record, checks)
        if flag:
            self._flag(record, flag, verdict.notes)
            return
        self._confirm_and_conclude(record, trial, verdict, step.stored())

    def _record_timing(self, record: CaseRecord, trial: Trial, m: Measurement, host: HostTime | None) -> None:
        """The measurement's figures in the record: time, ratio, throughput, blocks, the A/B pairing."""
        case = trial.case
        flops = trial.flops
        record.median_ns = m.time.estimate
        record.ci_ns = (m.time.lo, m.time.hi)
        record.ci_rel = finite(relative_half_width(m.log_time))
        if m.ratio is not None:
            record.ratio, record.ratio_ci = m.ratio.estimate, (m.ratio.lo, m.ratio.hi)
        record.against = case.against_name if case.against is not None else None
        record.blocks, record.reps, record.samples_per_block = m.blocks, m.reps, m.samples_per_block
        record.mode, record.stop_reason = m.mode, m.stop_reason
        record.capture_error = capture_error(m)
        if record.capture_error and m.mode == "cuda-stream":
            record.notes.append(
                "timed without a CUDA graph: the variant's calls could not be captured "
                f"({record.capture_error[:200]}), so its timed calls were launched from Python, host code and "
                "all; a stored figure taken by graph replay is not comparable"
            )
        if host is not None:
            record.host_ns, record.host_ci = host.time.estimate, (host.time.lo, host.time.hi)
            if (r := host.ratio) is not None:
                record.host_ratio, record.host_ratio_ci = r.estimate, (r.lo, r.hi)
        record.elapsed_s, record.wall_ratio = round(m.elapsed_s, 4), round(m.wall_ratio, 3)
        record.flops = flops
        record.tflops = (flops / (m.time.estimate * 1e-9) / 1e12) if flops else None
        nbytes = count("bytes", case.bytes, trial.params)
        if nbytes is None:  # what the call must read and write at least: its inputs and its output
            nbytes = float(input_bytes(trial.first) + tensor_bytes(m.outputs.get(0)))
        record.bytes = nbytes
        record.gbps = nbytes / m.time.estimate if nbytes and m.time.estimate > 0 else None
        record.variant_blocks = [round(x, 3) for x in m.variant_blocks]
        record.against_blocks = [round(x, 3) for x in m.against_blocks] if m.against_blocks else None
        if m.base_blocks is not None:
            record.base_blocks = [round(x, 3) for x in m.base_blocks]
            base = self.state.base
            record.ab = AbComparison(
                against=base.rev if base is not None else None,
                sha=base.sha if base is not None else None,
                group_ratios=[round(x, 6) for x in m.ab_ratios()],
                groups=m.groups,
            )
        record.updated = date.today().isoformat()
        record.outcome = Outcome.PASSED

    @staticmethod
    def _keep_checks(record: CaseRecord, checks: IntegrityChecks) -> None:
        """What the integrity checks saw that passed, and the seconds each took, in the record."""
        record.notes = [*record.notes, *checks.notes]
        checks.notes = []
        record.checks = checks.seconds()
        record.checks_s = round(sum(checks.spent.values()), 4)

    def _torch_guard(self, record: CaseRecord) -> torchstate.Guard:
        """The guard of torch's process-wide switches for this case: what changed since the session started,
        outside any case (an import, a fixture), is put back now and said in the case's notes."""
        device = torch.device(self.state.settings.device) if self.state.kind == "cuda" else None
        start = self.state.torch_state if self.state.torch_state is not None else torchstate.snapshot(device)
        guard = torchstate.Guard(start, device)
        outside = guard.outside()
        if outside:
            record.notes.append(
                "torch's global state had changed since the session started, outside any case (at an import or "
                f"in a fixture): {'; '.join(outside)}; put back before this case, whose reference is timed in "
                "the session's state"
            )
        return guard

    def _flag(self, record: CaseRecord, message: str, notes: list[str]) -> None:
        """A timing the guard cannot believe fails the case: never inconclusive, never faster, never a baseline."""
        record.reasons = [message]
        record.notes = [*record.notes, *notes]
        self._fail(record, f"{record.variant}: flagged: {message}", Status.FLAGGED)

    def _runnable(self, record: CaseRecord, variant: Variant) -> bool:
        s = self.state.settings
        with self._base_requirements_beside(record.variant):
            reason = unmet_requirement(variant.requires, s.device)
        if reason:
            record.reasons = [reason]
            if s.require_gpu and not torch.cuda.is_available():
                self._fail(record, f"--perfguard-require-gpu: {reason}. {gpu_diagnostics()}")
            return False
        if self.state.poisoned_by:
            record.outcome = Outcome.NOT_RUN
            record.reasons = [f"not run: CUDA context poisoned by {self.state.poisoned_by}"]
            return False
        return True

    @contextlib.contextmanager
    def _base_requirements_beside(self, variant_name: str) -> Iterator[None]:
        """In an A/B run, the base twin's requirements are evaluated in a thread while the head's are.

        A requirement may build what the variant needs on first use (kernels/cuda_ext.py compiles its
        extension there); the base revision's copy is a second build of its own. Side by side, a fresh
        runner's first case waits for the longer build, not for both one after the other. The thread makes
        the case's device current, as every step of a case does; its answer is read when the case is paired
        (an unmet base requirement is "no base", with its reason). The twin is looked up here, in the
        calling thread: importing the base module swaps modules process-wide (ab.py) and must not overlap
        anything else.
        """
        base = self.state.base
        self._base_unmet = None
        twin = base.twin(self.item, variant_name) if base is not None and not self.state.poisoned_by else None
        if twin is None or not twin.ok or twin.variant is None or twin.variant.requires is None:
            yield
            return
        requires, device = twin.variant.requires, self.state.settings.device
        on_cuda = self.state.kind == "cuda"
        answer: list[str | None] = []

        def check_base() -> None:
            try:
                with torch.cuda.device(torch.device(device)) if on_cuda else contextlib.nullcontext():
                    answer.append(unmet_requirement(requires, device))
            except Exception as exc:  # the string requirements' checks; callables' raises are reasons already
                answer.append(f"its requirement check raised {type(exc).__name__}: {exc}")

        thread = threading.Thread(target=check_base, name="perfguard-base-requirements", daemon=True)
        thread.start()
        yield  # what the head's check raises (an interrupt) leaves without waiting for the base's build
        thread.join()
        self._base_unmet = answer[0] if answer else "its requirement check ended without an answer"

    def _correctness(
        self,
        record: CaseRecord,
        case: PerfCase,
        variant: Variant,
        make_inputs: Callable[[int], Inputs],
        seeds: Sequence[int],
        first: Inputs,
        probe: integrity.ProfiledCall | None = None,
    ) -> CorrectnessReport:
        # Under --perfguard the first two seeds' oracles are kept for the timed-output check.
        keep = 2 if self.state.settings.enabled else 0
        with self._lock(exclusive=False):
            report = check(
                variant.fn,
                case.reference,
                make_inputs,
                seeds,
                [case.tolerance, variant.tolerance],
                keep=keep,
                around_last=probe,
            )
        floats = [t for t in [*first[0], *first[1].values()] if isinstance(t, torch.Tensor) and t.is_floating_point()]
        report.dtype = str(floats[0].dtype).replace("torch.", "") if floats else ""
        record.correctness = report.summary()
        if not report.passed:
            record.reasons = [report.message]
            self._fail(record, f"{record.variant}: incorrect: {report.message}", Status.INCORRECT)
        return report

    def _confirm_and_conclude(
        self, record: CaseRecord, trial: Trial, verdict: Verdict, stored: BaselineEntry | None
    ) -> None:
        """Confirm a regression (or an update's large move) in a fresh process, then set the outcome."""
        s = self.state.settings
        status = verdict.status
        confirmation: Confirmation | None = None
        if status is Status.REGRESSED and not s.update:
            confirmation = confirm_regression(self, verdict)
            if confirmation.deferred:  # past the single confirmations: the batch settles it (confirm.Batch)
                self._deferred = (record, verdict, trial.variant.fn is trial.case.against)
                return
            status = confirmation.status
        elif status is Status.FASTER and not s.update and "ab" in (verdict.deciding or ()):
            confirmation = confirm_faster(self, verdict)
            status = confirmation.status
            if status is Status.FASTER and not self.state.role.child:
                note_unchecked_faster(verdict, stored, s.ab_case_offset)
        elif (
            s.update
            and s.update_processes <= 1  # more processes are the check: update.process_samples
            and not verdict.disturbances  # never stored: nothing to confirm
            and stored is not None
            and stored.workload == record.workload
            and not incomparable(stored.env, record.env or {})
        ):
            assert record.median_ns is not None
            confirmation = confirm_move(self, stored, record.median_ns, verdict)
            record.baseline_hold = confirmation.hold_back or None
        self._settle(record, verdict, status, confirmation, variant_is_against=trial.variant.fn is trial.case.against)

    def conclude_deferred(self, confirmation: Confirmation) -> Ending:
        """The end of a case whose regression waited for the batch confirmation: settled with the batch's
        answer, kept, and how its item ends (confirm.Batch ends it in place of the call phase)."""
        assert self._deferred is not None, "no regression of this case waits for a confirmation"
        (record, verdict, variant_is_against), self._deferred = self._deferred, None
        self._settle(record, verdict, confirmation.status, confirmation, variant_is_against=variant_is_against)
        return self._conclude(record)

    def _settle(
        self,
        record: CaseRecord,
        verdict: Verdict,
        status: Status,
        confirmation: Confirmation | None,
        *,
        variant_is_against: bool,
    ) -> None:
        """The judged record: gates, notes and verdict, and the failure of a regression (or under --strict)."""
        s = self.state.settings
        record.gates = [replace(g) for g in verdict.gates]  # copies: the record keeps what was judged
        record.mde = case_mde(verdict.deciding_gates(), variant_is_against=variant_is_against)
        record.notes, record.disturbances = [*record.notes, *verdict.notes], verdict.disturbances
        record.verdict = status
        record.reasons = verdict.disturbances + [g.reason for g in verdict.gates if g.reason] + verdict.notes
        if confirmation is not None and confirmation.info is not None:
            record.confirmation = confirmation.info
        failing = [g for g in verdict.deciding_gates() if g.status is Status.REGRESSED]
        if s.update:
            failing = [g for g in failing if g.name == "max_ratio"]
        if failing and status is Status.REGRESSED:
            note = confirmation.note if confirmation is not None else ""
            reasons = [g.reason for g in failing] + ([note] if note else [])
            self._fail(record, f"{record.variant}: performance regression: " + "; ".join(reasons))
        elif (
            s.strict
            and not s.update
            and status in (Status.INCONCLUSIVE, Status.NO_BASELINE, Status.NOT_COMPARABLE, Status.NO_BASE, Status.NEW)
        ):
            hint = "" if status is Status.INCONCLUSIVE else " Record one with --perfguard-update-baseline."
            self._fail(record, f"--perfguard-strict ({status}): " + "; ".join(record.reasons) + hint)

    # ------------------------------------------------------------------------------------------ helpers

    def fresh_process_timeout(self) -> float | None:
        s = self.state.settings
        return 2 * s.case_timeout + 120 if s.case_timeout else None

    @property
    def clock(self) -> Deadline:
        return self._clock

    # ------------------------------------------------------------------------------------------ progress

    def _on_progress(self) -> Callable[[Progress], None]:
        """Each block of the case's measurements: its count kept for a timeout's message (`_where`), and the
        live progress line drawn (progress.py) where there is one."""
        show = self.state.progress
        line = show(self.item.name) if show is not None else None

        def on_block(p: Progress) -> None:
            now = time.monotonic()
            first = now if p.blocks == 1 or self._block is None else self._block[1]  # each measurement anew
            self._block = (p.blocks, first, now)
            if line is not None:
                line(p)

        return on_block
