"""Runs one perf item: requirements -> correctness -> measure -> judge -> record.

Each step fills in the item's `CaseRecord`; `Runner.run` appends it in one place and turns it into pass,
fail or skip in one place (`_conclude`). The runner reads the stored baseline but never writes it:
workers only produce records, and the controller (session.py) merges, writes and reports once.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import inspect
import math
import os
import random
import shutil
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from datetime import date
from typing import Any

import pytest
import torch

from ..judge import baseline as bl
from ..judge.stats import relative_half_width
from ..judge.verdict import Verdict, ab_gate, ab_progress, case_mde, decide, unpaired_gate
from ..locks import device_lock
from ..marker import VARIANT_ARG, PerfCase, Variant, unmet_requirement
from ..measure import integrity, peaks
from ..measure.correctness import CorrectnessReport, Inputs, Oracle, check
from ..measure.cpuwatch import CpuWatch
from ..measure.device import Disturbances, incomparable, lock_name, manual_seed
from ..measure.timing import Call, MeasureConfig, Measurement, Progress, Timer, Watch, make_timer, measure, pooled
from ..record import AbComparison, CaseRecord, Outcome, Status
from .ab import Twin, base_arguments
from .confirm import Confirmation, confirm_faster, confirm_move, confirm_regression
from .session import SessionState
from .watchdog import Deadline, deadline


def _normalize_inputs(value: Any, test_name: str) -> Inputs:
    if (
        isinstance(value, tuple)
        and len(value) == 2
        and isinstance(value[0], tuple | list)
        and isinstance(value[1], dict)
    ):
        return tuple(value[0]), dict(value[1])
    raise TypeError(
        f"{test_name} must return (args, kwargs), e.g. `return (q, k, v), {{'causal': True}}`; "
        f"got {type(value).__name__}"
    )


def describe_workload(inputs: Inputs) -> str:
    """Canonical text of what was computed: shapes, dtypes and plain arguments, never values."""
    args, kwargs = inputs

    def one(x: Any) -> str:
        if isinstance(x, torch.Tensor):
            return f"{str(x.dtype).replace('torch.', '')}[{','.join(map(str, x.shape))}]"
        return repr(x)

    parts = [one(a) for a in args] + [f"{k}={one(v)}" for k, v in sorted(kwargs.items())]
    return " ".join(parts)


def workload_hash(desc: str) -> str:
    return hashlib.sha256(desc.encode()).hexdigest()


def input_bytes(inputs: Inputs) -> int:
    args, kwargs = inputs
    tensors = [t for t in [*args, *kwargs.values()] if isinstance(t, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)


def _draw_seeds(n: int, fixed: int | None) -> list[int]:
    if fixed is not None:
        return [fixed + i for i in range(n)]
    sysrand = random.SystemRandom()
    return [sysrand.randrange(1, 2**31 - 1) for _ in range(n)]


def _count(what: str, fn: Callable[..., float] | None, params: dict[str, Any]) -> float | None:
    """The case's `flops` or `bytes` callable applied to the test parameters it names."""
    if fn is None:
        return None
    names = inspect.signature(fn).parameters
    try:
        return float(fn(**{k: params[k] for k in names if k in params}))
    except Exception as exc:
        raise TypeError(f"{what} callable failed with the test parameters {sorted(params)}: {exc}") from exc


def _max_ratio(trial: Trial) -> float | None:
    """The variant's own max_ratio, else its case's: the ratio gate that decides in every mode."""
    return trial.variant.max_ratio if trial.variant.max_ratio is not None else trial.case.max_ratio


def _flops(case: PerfCase, params: dict[str, Any]) -> float | None:
    return _count("flops", case.flops, params)


def _tensor_bytes(value: object) -> int:
    return value.numel() * value.element_size() if isinstance(value, torch.Tensor) else 0


def _display_params(item: pytest.Item) -> dict[str, Any]:
    callspec = getattr(item, "callspec", None)
    raw = dict(callspec.params) if callspec is not None else {}
    raw.pop(VARIANT_ARG, None)
    return {k: v if isinstance(v, int | float | str | bool) or v is None else repr(v) for k, v in raw.items()}


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


_STICKY = (
    "illegal memory access",
    "unspecified launch failure",
    "device-side assert",
    "misaligned address",
    "illegal instruction",
)


# The plugin's own frames, cut from the front of a variant's traceback so pytest shows the user's code first.
_OWN_FILES = os.path.dirname(os.path.abspath(__file__)) + os.sep


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


@dataclass
class Trial:
    """What the measure step works on: the case, its variant and a source of input copies."""

    case: PerfCase
    variant_name: str
    variant: Variant
    params: dict[str, Any]
    make_inputs: Callable[[int], Inputs]
    seeds: list[int]
    first: Inputs
    oracles: list[Oracle] = field(default_factory=list)  # the correctness gate's, for the timed-output check
    constants: list[integrity.Constant] = field(default_factory=list)  # inputs that hold one value

    def calls(self, fn: Callable[..., Any]) -> Callable[[int], Call]:
        """Input copy i -> a call of `fn` on it. Every side of a measurement shares the copies."""
        copies: dict[int, Inputs] = {0: self.first}
        base_seed = self.seeds[0] + 10_007

        def make(i: int) -> Call:
            if i not in copies:
                copies[i] = self.make_inputs(base_seed + i)
            args, kwargs = copies[i]
            return lambda: fn(*args, **kwargs)

        return make


class Runner:
    """The `perfguard_runner` fixture's value: runs the item it belongs to."""

    def __init__(self, state: SessionState, item: pytest.Item) -> None:
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

    # ------------------------------------------------------------------------------------------ frame

    def run(self, case: PerfCase, variant_name: str, factory: Callable[[], Any], params: dict[str, Any]) -> None:
        __tracebackhide__ = True
        record = CaseRecord(
            id=self.item.nodeid,
            test=getattr(self.item, "originalname", self.item.name),
            variant=variant_name,
            params=_display_params(self.item),
        )
        with deadline(self.state.settings.case_timeout, self.item.nodeid, lambda m: self._expire(record, m)) as clock:
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
        if self._deferred is None:  # else the batch concludes it after the session's last case
            self._conclude(record)

    def _conclude(self, record: CaseRecord) -> None:
        """The one place a record is kept and turned into the item's pass, fail or skip."""
        __tracebackhide__ = True
        self.state.records.append(record)
        if record.outcome is Outcome.FAILED and self._raised is not None:
            # pytest then shows where in the user's kernel it raised, in every --tb style; the table keeps
            # the short reason.
            raised, self._raised = _from_user_code(self._raised), None
            if hasattr(raised, "add_note"):  # Python 3.11+
                raised.add_note(f"perfguard: {self._failure}")
            raise raised
        if record.outcome is Outcome.FAILED:
            pytest.fail(self._failure or "; ".join(record.reasons), pytrace=False)
        if record.outcome in (Outcome.SKIPPED, Outcome.NOT_RUN):
            pytest.skip(record.reasons[0] if record.reasons else "skipped")

    def _fail(self, record: CaseRecord, message: str, verdict: Status | None = None) -> None:
        record.outcome = Outcome.FAILED
        if verdict is not None:
            record.verdict = verdict
        self._failure = message

    def _expire(self, record: CaseRecord, message: str) -> None:
        """The watchdog's exit path (another thread): the process ends right after this."""
        record.outcome, record.verdict, record.reasons = Outcome.FAILED, Status.TIMEOUT, [message]
        self.state.records.append(record)
        if self.state.on_timeout is not None:
            self.state.on_timeout(message, self.item)

    def _crashed(self, record: CaseRecord, exc: BaseException) -> None:
        reason = f"{self._stage} raised {type(exc).__name__}: {exc}"
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
        s = self.state.settings
        variant = case.variants[variant_name]
        self._stage = "requirements"
        if not self._runnable(record, variant):
            return

        def make_inputs(seed: int) -> Inputs:
            manual_seed(seed)
            return _normalize_inputs(factory(), record.test)

        seeds = _draw_seeds(case.seeds, s.seed)
        record.seeds = seeds
        first = make_inputs(seeds[0])
        record.workload_desc = describe_workload(first)
        record.workload = workload_hash(record.workload_desc)
        self._stage = "correctness check"
        checks: dict[str, float] = {}  # seconds per integrity check, outside the timed window
        probe = self._fallback_probe(variant) if s.enabled else None
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
        twin = self._twin(trial, record) if s.against else None
        self._stage = "integrity checks"
        flag = self._before_timing(trial, report, probe, checks)
        if flag:
            self._checks_spent(record, checks)
            self._flag(record, flag, [])
            return
        self._stage = "timing"
        timer = make_timer(s.device, case.clock)
        t0 = time.monotonic()
        m, verdict = self._measure_and_judge(trial, record, twin, timer)
        self.timing_s = time.monotonic() - t0
        self.state.timing_spent_s += self.timing_s
        self._record_timing(record, trial, m, verdict)
        self._stage = "integrity checks"
        flag = self._after_timing(trial, record, m, timer, checks)
        self._checks_spent(record, checks)
        if flag:
            self._flag(record, flag, verdict.notes)
            return
        self._confirm_and_conclude(record, trial, verdict)

    # ------------------------------------------------------------------------------------- integrity

    def _flag(self, record: CaseRecord, message: str, notes: list[str]) -> None:
        """A timing the guard cannot believe fails the case: never inconclusive, never faster, never a baseline."""
        record.reasons = [message]
        record.notes = [*record.notes, *notes]
        self._fail(record, f"{record.variant}: flagged: {message}", Status.FLAGGED)

    def _engine_bindings(self) -> dict[str, tuple[Any, Any]]:
        original = integrity.ORIGINAL_TIMERS
        return {
            f"{__name__}.{name}": (globals()[name], original[f"{Measurement.__module__}.{name}"])
            for name in ("measure", "make_timer", "pooled")
        }

    @contextlib.contextmanager
    def _check(self, checks: dict[str, float], name: str) -> Iterator[None]:
        """Adds the wall time of the block to `checks[name]`. On CUDA the block ends with a synchronise, so
        the device work a check queued is its own cost, not the next step's. Enter it inside the device
        lock: waiting for the lock is not a check's cost."""
        t0 = time.monotonic()
        try:
            yield
        finally:
            if self.state.kind == "cuda":
                torch.cuda.synchronize(torch.device(self.state.settings.device))
            checks[name] = checks.get(name, 0.0) + time.monotonic() - t0

    @staticmethod
    def _checks_spent(record: CaseRecord, checks: dict[str, float]) -> None:
        record.checks = {name: round(spent, 4) for name, spent in sorted(checks.items())}
        record.checks_s = round(sum(checks.values()), 4)

    def _fallback_probe(self, variant: Variant) -> integrity.ProfiledCall | None:
        """The profiler wrapped around the correctness gate's last call, for a variant that declares
        `not_kernels`."""
        if not variant.not_kernels:
            return None
        return integrity.ProfiledCall(torch.device(self.state.settings.device) if self.state.kind == "cuda" else None)

    def _before_timing(
        self,
        trial: Trial,
        report: CorrectnessReport,
        probe: integrity.ProfiledCall | None,
        checks: dict[str, float],
    ) -> str | None:
        """Checks that need no timing: a patched timer, a declared kernel that is not, constant inputs."""
        with self._check(checks, "patched timer"):
            patched = integrity.patched_timers(self._engine_bindings())
        if patched:
            return integrity.patched_message(patched)
        if probe is not None and probe.names is not None:
            # The profiled call is the gate's last; the check's cost is what the profiler added to it: that
            # call's time minus the gate's previous, unprofiled call (at least the profiler's own start, stop
            # and parse). With one seed there is no previous call, and the whole call counts.
            profiled = report.per_seed[-1].call_s
            plain = report.per_seed[-2].call_s if len(report.per_seed) > 1 else 0.0
            checks["silent fallback"] = max(probe.own_s, profiled - plain)
            fallback = integrity.forbidden_kernel(probe.names, trial.variant.not_kernels)
            if fallback:
                return fallback
        with self._lock(exclusive=False), self._check(checks, "degenerate input"):
            trial.constants = integrity.constant_inputs(trial.first)
        return None

    def _after_timing(
        self, trial: Trial, record: CaseRecord, m: Measurement, timer: Timer, checks: dict[str, float]
    ) -> str | None:
        """What was timed is what was checked; the events saw the work; the speed is physically possible;
        a constant input is not a shortcut."""
        with self._check(checks, "patched timer"):
            patched = integrity.patched_timers(self._engine_bindings())
        if patched:
            return integrity.patched_message(patched)
        s, case = self.state.settings, trial.case
        overrides = [case.tolerance, trial.variant.tolerance]

        def fresh() -> tuple[int, Inputs]:
            seed = _draw_seeds(1, s.seed + 7919 if s.seed is not None else None)[0]
            return seed, trial.make_inputs(seed)

        with self._lock(exclusive=True), self._check(checks, "timed outputs"):
            wrong = integrity.timed_outputs(
                m.outputs,
                m.sample,
                trial.first,
                case.reference,
                overrides,
                seed=trial.seeds[0],
                oracles=trial.oracles,
                fresh=fresh,
            )
        if wrong:
            return wrong
        forked = integrity.forked_work(getattr(m.sample, "capture_error", None))
        if forked:
            return forked
        if m.mode.startswith("cuda"):
            with self._lock(exclusive=True), self._check(checks, "unseen work"):
                overhead = timer.overhead_ns()
            hidden = integrity.unseen_work(m.gap_ns, m.sample_ns, overhead, m.reps)
            if hidden:
                return hidden
        with self._check(checks, "physics"):
            impossible = self._physics(record, trial, m)
        if impossible or not trial.constants:
            return impossible
        seed = _draw_seeds(1, s.seed + 104_729 if s.seed is not None else None)[0]
        assert m.sample is not None  # measure() always returns the variant's sample
        with self._lock(exclusive=True), self._check(checks, "degenerate input"):
            seen = integrity.degenerate_inputs(
                trial.variant.fn,
                trial.first,
                trial.constants,
                timer,
                m.sample,
                reps=m.reps,
                degenerate_ns=m.time.estimate,
                spent_ns=m.elapsed_s * 1e9,
                reference=case.reference,
                overrides=overrides,
                seed=seed,
            )
        if seen.note:
            record.notes.append(seen.note)
        return seen.flag

    def _physics(self, record: CaseRecord, trial: Trial, m: Measurement) -> str | None:
        """% of peak for the record, and the flag when a throughput exceeds the device's peak."""
        if self.state.kind != "cuda":
            record.notes.append("physics check: not on CPU (no peak table for a host)")
            return None
        device = torch.device(self.state.settings.device)
        name, peak = peaks.device_peak(device.index if device.index is not None else torch.cuda.current_device())
        if peak is None:
            record.notes.append(f"physics check skipped: no peak known for {name}")
            return None
        dtype = (record.correctness or {}).get("dtype", "")
        record.pct_peak_compute, record.pct_peak_bandwidth = (
            _finite(None if x is None else round(x, 2))
            for x in peaks.percent_of_peak(peak, tflops=record.tflops, gbps=record.gbps, dtype=dtype)
        )
        # Derived bytes count the output, which may still sit in L2 when the events stop: the bound uses the
        # inputs alone, read cold (the L2 is flushed before every sample). Given bytes are taken as given.
        given = trial.case.bytes is not None
        bound_bytes = record.bytes if given else float(input_bytes(trial.first))
        bound_gbps = bound_bytes / m.time.estimate if bound_bytes and m.time.estimate > 0 else None
        return peaks.impossible_speed(peak, tflops=record.tflops, gbps=bound_gbps)

    def _runnable(self, record: CaseRecord, variant: Variant) -> bool:
        s = self.state.settings
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
        record.correctness = report.to_json()
        record.correctness["dtype"] = report.dtype
        if not report.passed:
            record.reasons = [report.message]
            self._fail(record, f"{record.variant}: incorrect: {report.message}", Status.INCORRECT)
        return report

    def _twin(self, trial: Trial, record: CaseRecord) -> Twin:
        """The case at the base revision, checked: same workload, correct on the same inputs."""
        base = self.state.base
        assert base is not None
        self._stage = "pairing with the base revision"
        twin: Twin = base.twin(self.item, trial.variant_name)
        if not twin.ok:
            return twin
        assert twin.variant is not None
        args = base_arguments(twin.factory, trial.params)
        if isinstance(args, str):
            return Twin(Status.NOT_COMPARABLE, args)
        try:
            manual_seed(trial.seeds[0])
            desc = describe_workload(_normalize_inputs(twin.factory(**args), record.test))
        except Exception as exc:
            return Twin(Status.NO_BASE, f"no base: the base test's inputs raised {type(exc).__name__}: {exc}")
        if desc != record.workload_desc:
            return Twin(
                Status.NOT_COMPARABLE,
                f"not comparable: the workload differs at {base.rev} (head: {record.workload_desc}; base: {desc})",
            )
        case, variant = trial.case, twin.variant
        try:
            with self._lock(exclusive=False):
                report = check(
                    variant.fn, case.reference, trial.make_inputs, trial.seeds, [case.tolerance, variant.tolerance]
                )
        except Exception as exc:
            return Twin(Status.NO_BASE, f"no base: the base variant raised {type(exc).__name__}: {exc}")
        if not report.passed:
            return Twin(Status.NO_BASE, f"no base: base incorrect: {report.message}")
        return twin

    def _config(self) -> MeasureConfig:
        s = self.state.settings
        # On a GPU, blocks spread over at least 0.3 s (nvbench keeps 0.5 s): a few milliseconds of samples
        # see one clock state and give intervals far narrower than the run-to-run spread.
        min_time = min(0.3, s.case_budget / 2) if self.state.kind == "cuda" else 0.0
        return MeasureConfig(target=s.ci_target, budget_s=s.case_budget, min_time_s=min_time)

    def _measure_and_judge(
        self, trial: Trial, record: CaseRecord, twin: Twin | None, timer: Timer
    ) -> tuple[Measurement, Verdict]:
        """Measure, judge; a regressed or inconclusive case is measured once more in a fresh order and
        judged on all blocks together. A disturbed measurement is measured once more, in an update too:
        when the second is clean it is judged alone, else the case stays disturbed (inconclusive, never
        stored)."""
        s, case = self.state.settings, trial.case
        cfg = self._config()
        base = trial.calls(twin.variant.fn) if twin is not None and twin.variant is not None else None
        if base is not None:
            policy = self.state.policy()

            def progress(ratios: Sequence[float], time_ns: float) -> float:
                return ab_progress(
                    ratios, policy, s.ab_margin_for(time_ns), s.ab_detect_for(time_ns), s.ab_process_sd_for(time_ns)
                )

            # The A/B gate decides: measure until its MDE reaches its promise; the ratio to `against` is
            # reported, and need not narrow unless a max_ratio gate judges it.
            cfg = replace(cfg, ab_progress=progress, stop_on_ratio=_max_ratio(trial) is not None)
        watch = self._watch(case)
        against = trial.calls(case.against) if case.against is not None else None
        nbytes = input_bytes(trial.first)
        on_progress = self._on_progress()
        with self._lock(exclusive=True):
            m = measure(
                trial.calls(trial.variant.fn),
                against,
                timer,
                cfg,
                bytes_per_copy=nbytes,
                watch=watch,
                base=base,
                on_progress=on_progress,
            )
        if isinstance(watch, CpuWatch) and watch.unwatched:
            record.notes.append(watch.unwatched)
        record.env = self._env(case, trial.first)
        verdict = self._judge(trial, record, m, twin)
        disturbed = list(m.notes)
        if disturbed or (verdict.needs_remeasure and not s.update):
            with self._lock(exclusive=True):
                m2 = measure(
                    trial.calls(trial.variant.fn),
                    against,
                    timer,
                    cfg,
                    copies=m.reps,
                    bytes_per_copy=nbytes,
                    watch=watch,
                    base=base,
                    on_progress=on_progress,
                )
            if disturbed and not m2.notes:
                # The disturbance passed: the clean blocks alone are judged (and stored by an update).
                m, note = m2, "re-measured once: the first measurement was disturbed (" + "; ".join(disturbed) + ")"
            else:
                m, note = pooled(m, m2, cfg.confidence), "re-measured once in a fresh order (blocks pooled)"
            verdict = self._judge(trial, record, m, twin)
            verdict.notes.append(note)
        if verdict.disturbances:
            off = " (where the load is by design, --perfguard-no-cpu-watch)" if isinstance(watch, CpuWatch) else ""
            verdict.notes.append(
                f"disturbed {'in both measurements' if disturbed else 'in the re-measurement'}: inconclusive, "
                f"never a failure, and never stored as a baseline; time it on a quiet machine{off}"
            )
        return m, verdict

    def _watch(self, case: PerfCase) -> Watch | None:
        """What watches the machine while the case is timed: NVML on a GPU; on CPU the host's load, unless
        the case times on an injected clock (the host's load cannot move it) or the watch is turned off."""
        s = self.state.settings
        if self.state.kind == "cuda":
            return Disturbances.open(s.device)
        if case.clock is not None or not s.cpu_watch:
            return None
        return CpuWatch()

    def _stored(self) -> bl.BaselineEntry | None:
        baseline = self.state.baseline
        return baseline.cases.get(self.item.nodeid) if baseline is not None else None

    def _judge(self, trial: Trial, record: CaseRecord, m: Measurement, twin: Twin | None) -> Verdict:
        s = self.state.settings
        stored = self._stored()
        env = record.env or {}
        verdict = decide(
            m.variant_blocks,
            m.against_blocks,
            None if s.update else stored,
            workload=record.workload or "",
            env=env,
            policy=self.state.policy(),
            max_ratio=_max_ratio(trial),
            incomparable=incomparable(stored.env, env) if stored is not None else [],
            disturbances=m.notes,
        )
        if twin is not None:
            policy = self.state.policy()
            ratios = m.ab_ratios()
            gate = (
                ab_gate(ratios, policy, s.ab_margin_for(m.time.estimate), s.ab_process_sd_for(m.time.estimate))
                if twin.ok
                else unpaired_gate(twin.status or Status.NO_BASE, twin.reason)
            )
            verdict.gates.insert(0, gate)
            verdict.deciding = frozenset({"ab", "max_ratio"})
        return verdict

    def _record_timing(self, record: CaseRecord, trial: Trial, m: Measurement, verdict: Verdict) -> None:
        case = trial.case
        flops = _flops(case, trial.params)
        record.median_ns = m.time.estimate
        record.ci_ns = (m.time.lo, m.time.hi)
        record.ci_rel = _finite(relative_half_width(m.log_time))
        if m.ratio is not None:
            record.ratio, record.ratio_ci = m.ratio.estimate, (m.ratio.lo, m.ratio.hi)
        record.against = case.against_name if case.against is not None else None
        record.blocks, record.reps, record.samples_per_block = m.blocks, m.reps, m.samples_per_block
        record.mode, record.stop_reason = m.mode, m.stop_reason
        record.elapsed_s, record.wall_ratio = round(m.elapsed_s, 4), round(m.wall_ratio, 3)
        record.flops = flops
        record.tflops = (flops / (m.time.estimate * 1e-9) / 1e12) if flops else None
        nbytes = _count("bytes", case.bytes, trial.params)
        if nbytes is None:  # what the call must read and write at least: its inputs and its output
            nbytes = float(input_bytes(trial.first) + _tensor_bytes(m.outputs.get(0)))
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

    def _confirm_and_conclude(self, record: CaseRecord, trial: Trial, verdict: Verdict) -> None:
        """Confirm a regression (or an update's large move) in a fresh process, then set the outcome."""
        s = self.state.settings
        status = verdict.status
        stored = self._stored()
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
        elif (
            s.update
            and s.update_processes <= 1  # more processes are the check: session._process_samples
            and not verdict.disturbances  # never stored: nothing to confirm
            and stored is not None
            and stored.workload == record.workload
            and not incomparable(stored.env, record.env or {})
        ):
            assert record.median_ns is not None
            confirmation = confirm_move(self, stored, record.median_ns, verdict)
            record.baseline_hold = confirmation.hold_back or None
        self._settle(record, verdict, status, confirmation, variant_is_against=trial.variant.fn is trial.case.against)

    def conclude_deferred(self, confirmation: Confirmation) -> None:
        """The end of a case whose regression waited for the batch confirmation: settled with the batch's
        answer, kept, and turned into pass or fail (called by confirm.Batch in place of the call phase)."""
        __tracebackhide__ = True
        assert self._deferred is not None, "no regression of this case waits for a confirmation"
        (record, verdict, variant_is_against), self._deferred = self._deferred, None
        self._settle(record, verdict, confirmation.status, confirmation, variant_is_against=variant_is_against)
        self._conclude(record)

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

    def _env(self, case: PerfCase, inputs: Inputs) -> dict[str, str]:
        info = self.state.device_info
        env = {k: str(info.get(k)) for k in ("name", "capability", "torch", "triton", "cuda")}
        if case.against_backend is not None:
            try:
                env["against_backend"] = str(case.against_backend(*inputs[0], **inputs[1]))
            except Exception as exc:
                env["against_backend"] = f"unknown ({type(exc).__name__})"
        return env

    def fresh_process_timeout(self) -> float | None:
        s = self.state.settings
        return 2 * s.case_timeout + 120 if s.case_timeout else None

    @property
    def clock(self) -> Deadline:
        return self._clock

    # ------------------------------------------------------------------------------------------ progress

    def _on_progress(self) -> Callable[[Progress], None] | None:
        """The live progress line's per-block callback for this item (progress.py), or None."""
        show = self.state.progress
        return show(self.item.name) if show is not None else None
