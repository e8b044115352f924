"""Runs one perf item: requirement -> correctness -> measurement -> verdict -> result record.

Data flows one way. The runner reads the stored baseline but never writes it: workers only produce
JSON-able records, and the controller (session.py) merges, writes and reports once.
"""

from __future__ import annotations

import hashlib
import math
import random
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import pytest
import torch

from . import baseline as bl
from .confirm import MAX_PER_SESSION, in_child, run_fresh
from .correctness import CorrectnessReport, Inputs, check
from .device import Disturbances, fingerprint, incomparable
from .locks import device_lock
from .marker import VARIANT_ARG, PerfCase, unmet_requirement
from .stats import relative_half_width
from .timing import MeasureConfig, Measurement, make_timer, measure, pooled
from .verdict import (
    DEFAULT_MARGIN,
    INCONCLUSIVE,
    NO_BASELINE,
    NOT_COMPARABLE,
    PASS,
    REGRESSED,
    Policy,
    Verdict,
    case_mde,
    decide,
)
from .watchdog import Deadline, deadline

# Between-run noise floors (sd of ln time across processes). CPU: a shared 2-core machine moved absolute
# times by tens of percent between processes, so absolute CPU time is a weak signal.
# On one H200 (2026-11-21), 98 cases over 4 fresh processes: sd of ln(time) median 0.4%, p90 1.3%, max
# 3.8% (Triton autotuning picking different configs per process); of ln(ratio) median 0.7%, p90 1.8%.
# The floor covers the typical case; the baseline's own folded noise covers the rest (record it with
# several update runs).
NOISE_FLOOR = {"cuda": 0.005, "cpu": 0.05}
RATIO_NOISE_FLOOR = {"cuda": 0.005, "cpu": 0.05}


@dataclass
class Settings:
    enabled: bool = False
    update: bool = False
    prune: bool = False
    baseline_dir: Path = Path(".ci/baselines")
    margin: float = DEFAULT_MARGIN
    ci_target: float = 0.01
    case_budget: float = 5.0
    total_budget: float = 0.0  # 0: no limit
    json_path: Path | None = None
    strict: bool = False
    require_gpu: bool = False
    seed: int | None = None
    device: str = "cpu"
    alpha: float = 0.05
    case_timeout: float = 900.0  # 0: none
    confirm: bool = True  # re-run a regressed case in a fresh process before failing on it


@dataclass
class SessionState:
    """Per-process run state (kept in config.stash)."""

    settings: Settings
    device_info: dict[str, Any]
    baseline: bl.BaselineFile | None = None
    family_size: int = 1
    records: list[dict[str, Any]] = field(default_factory=list)
    timing_spent_s: float = 0.0
    poisoned_by: str | None = None
    confirmations: int = 0
    on_timeout: Callable[[str, pytest.Item], None] | None = None  # set by the plugin: flush results before the exit

    @property
    def kind(self) -> str:
        return "cuda" if self.settings.device.startswith("cuda") else "cpu"

    @property
    def noise_floor(self) -> float:
        return NOISE_FLOOR[self.kind]

    def policy(self) -> Policy:
        return Policy(
            margin=self.settings.margin,
            alpha=self.settings.alpha,
            family_size=self.family_size,
            noise_floor=self.noise_floor,
            ratio_noise_floor=RATIO_NOISE_FLOOR[self.kind],
            confirm=self.settings.confirm and not in_child(),  # as Runner._confirm decides
        )


def _normalize_inputs(value: Any, test_name: str) -> Inputs:
    if (
        isinstance(value, tuple)
        and len(value) == 2
        and isinstance(value[0], tuple | list)
        and isinstance(value[1], dict)
    ):
        return tuple(value[0]), dict(value[1])
    raise TypeError(
        f"{test_name} must return (args, kwargs), e.g. `return (q, k, v), {{'causal': True}}`; got {type(value).__name__}"
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


def _bytes(inputs: Inputs) -> int:
    args, kwargs = inputs
    return sum(t.numel() * t.element_size() for t in [*args, *kwargs.values()] if isinstance(t, torch.Tensor))


def _draw_seeds(n: int, fixed: int | None) -> list[int]:
    if fixed is not None:
        return [fixed + i for i in range(n)]
    sysrand = random.SystemRandom()
    return [sysrand.randrange(1, 2**31 - 1) for _ in range(n)]


def _flops(case: PerfCase, params: dict[str, Any]) -> float | None:
    if case.flops is None:
        return None
    import inspect

    names = inspect.signature(case.flops).parameters
    try:
        return float(case.flops(**{k: params[k] for k in names if k in params}))
    except Exception as exc:
        raise TypeError(f"flops callable failed with the test parameters {sorted(params)}: {exc}") from exc


def _display_params(item: pytest.Item) -> dict[str, Any]:
    callspec = getattr(item, "callspec", None)
    raw = dict(callspec.params) if callspec is not None else {}
    raw.pop(VARIANT_ARG, None)
    return {k: v if isinstance(v, int | float | str | bool) or v is None else repr(v) for k, v in raw.items()}


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


class Runner:
    """The `perfguard_runner` fixture's value: runs the item it belongs to."""

    def __init__(self, state: SessionState, item: pytest.Item) -> None:
        self.state = state
        self.item = item
        self._clock: Deadline = Deadline(0.0)

    def run(self, case: PerfCase, variant_name: str, factory: Callable[[], Any], params: dict[str, Any]) -> None:
        s = self.state.settings

        def expire(message: str) -> None:
            self.state.records.append(
                {
                    "id": self.item.nodeid,
                    "test": getattr(self.item, "originalname", self.item.name),
                    "variant": variant_name,
                    "params": _display_params(self.item),
                    "outcome": "failed",
                    "verdict": "timeout",
                    "reasons": [message],
                }
            )
            if self.state.on_timeout is not None:
                self.state.on_timeout(message, self.item)

        with deadline(s.case_timeout, self.item.nodeid, expire) as clock:
            self._clock = clock
            self._run(case, variant_name, factory, params)

    def _lock(self, *, exclusive: bool) -> AbstractContextManager[None]:
        return device_lock(self.state.settings.device, exclusive=exclusive, while_waiting=self._clock.paused)

    def _run(self, case: PerfCase, variant_name: str, factory: Callable[[], Any], params: dict[str, Any]) -> None:
        state, s = self.state, self.state.settings
        variant = case.variants[variant_name]
        record: dict[str, Any] = {
            "id": self.item.nodeid,
            "test": getattr(self.item, "originalname", self.item.name),
            "variant": variant_name,
            "params": _display_params(self.item),
            "outcome": "skipped",
        }
        reason = unmet_requirement(variant.requires, s.device)
        if reason:
            record["reasons"] = [reason]
            state.records.append(record)
            if s.require_gpu and not torch.cuda.is_available():
                pytest.fail(f"--perfguard-require-gpu: {reason}. {gpu_diagnostics()}", pytrace=False)
            pytest.skip(reason)
        if state.poisoned_by:
            record["outcome"] = "not run"
            record["reasons"] = [f"not run: CUDA context poisoned by {state.poisoned_by}"]
            state.records.append(record)
            pytest.skip(record["reasons"][0])

        def make_inputs(seed: int) -> Inputs:
            torch.manual_seed(seed)
            return _normalize_inputs(factory(), record["test"])

        seeds = _draw_seeds(case.seeds, s.seed)
        record["seeds"] = seeds
        first = make_inputs(seeds[0])
        desc = describe_workload(first)
        record.update(workload=workload_hash(desc), workload_desc=desc)
        crash: str | None = None
        try:
            with self._lock(exclusive=False):
                report = check(variant.fn, case.reference, make_inputs, seeds, [case.tolerance, variant.tolerance])
        except Exception as exc:
            crash = self._crashed(record, exc, "correctness check")
        if crash is not None:
            pytest.fail(f"{variant_name}: {crash}", pytrace=False)
        record["correctness"] = report.to_json()
        floats = [t for t in [*first[0], *first[1].values()] if isinstance(t, torch.Tensor) and t.is_floating_point()]
        report.dtype = str(floats[0].dtype).replace("torch.", "") if floats else ""
        record["correctness"]["dtype"] = report.dtype
        if not report.passed:
            record["outcome"] = "failed"
            record["verdict"] = "incorrect"
            record["reasons"] = [report.message]
            state.records.append(record)
            pytest.fail(f"{variant_name}: incorrect: {report.message}", pytrace=False)
        if not s.enabled:
            record["outcome"] = "passed"
            record["verdict"] = "correct"
            state.records.append(record)
            return
        if s.total_budget and state.timing_spent_s >= s.total_budget:
            record.update(outcome="passed", verdict=INCONCLUSIVE, reasons=[f"not timed: total budget {s.total_budget:g}s spent"])
            state.records.append(record)
            if s.strict:
                pytest.fail(record["reasons"][0], pytrace=False)
            return
        try:
            self._time_and_judge(case, variant_name, first, make_inputs, seeds, params, record, report)
        except Exception as exc:
            if isinstance(exc, pytest.fail.Exception | pytest.skip.Exception):
                raise
            crash = self._crashed(record, exc, "timing")
        if crash is not None:
            pytest.fail(f"{variant_name}: {crash}", pytrace=False)

    def _crashed(self, record: dict[str, Any], exc: BaseException, stage: str) -> str:
        reason = f"{stage} raised {type(exc).__name__}: {exc}"
        if isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower():
            # Release what the failed case held so the next cases run on a clean allocator.
            import gc

            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            reason = f"CUDA out of memory in {stage} (inputs {record.get('workload_desc', '?')}): {exc}"
        record.update(outcome="failed", verdict="error", reasons=[reason])
        self.state.records.append(record)
        if _is_sticky_cuda_error(exc):
            # Every later CUDA call in this process fails: the remaining GPU cases are reported as not run,
            # never as regressions, and no baseline is written from this session.
            self.state.poisoned_by = record["id"]
            record["sticky"] = True
        return reason

    def _time_and_judge(
        self,
        case: PerfCase,
        variant_name: str,
        first: Inputs,
        make_inputs: Callable[[int], Inputs],
        seeds: Sequence[int],
        params: dict[str, Any],
        record: dict[str, Any],
        report: CorrectnessReport,
    ) -> None:
        state, s = self.state, self.state.settings
        variant = case.variants[variant_name]
        copies: dict[int, Inputs] = {0: first}
        base_seed = seeds[0] + 10_007

        def inputs_for(i: int) -> Inputs:
            if i not in copies:
                copies[i] = make_inputs(base_seed + i)
            return copies[i]

        def call_of(fn: Callable[..., Any]) -> Callable[[int], Callable[[], object]]:
            def make(i: int) -> Callable[[], object]:
                args, kwargs = inputs_for(i)
                return lambda: fn(*args, **kwargs)

            return make

        against = call_of(case.against) if case.against is not None else None
        # On a GPU, blocks spread over at least 0.3 s (nvbench keeps 0.5 s): a few milliseconds of samples
        # see one clock state and give intervals far narrower than the run-to-run spread.
        min_time = min(0.3, s.case_budget / 2) if state.kind == "cuda" else 0.0
        cfg = MeasureConfig(target=s.ci_target, budget_s=s.case_budget, min_time_s=min_time)
        timer = make_timer(s.device, case.clock)
        monitor = Disturbances.open(s.device)
        on_block = monitor.check if monitor is not None else None
        t0 = time.monotonic()
        with self._lock(exclusive=True):
            m = measure(call_of(variant.fn), against, timer, cfg, bytes_per_copy=_bytes(first), on_block=on_block)
        env = self._env(case, first)
        stored = state.baseline.cases.get(self.item.nodeid) if state.baseline is not None else None
        max_ratio = variant.max_ratio if variant.max_ratio is not None else case.max_ratio
        policy = state.policy()
        why_not = incomparable(stored.env, env) if stored is not None else []

        def judge(meas: Measurement) -> Verdict:
            return decide(
                meas.variant_blocks,
                meas.against_blocks,
                None if s.update else stored,
                workload=record["workload"],
                env=env,
                policy=policy,
                max_ratio=max_ratio,
                incomparable=why_not,
                disturbances=meas.notes,
            )

        verdict = judge(m)
        if verdict.needs_remeasure and not s.update:
            # Re-measure once, in a fresh random order, and decide on all blocks together.
            with self._lock(exclusive=True):
                m2 = measure(call_of(variant.fn), against, timer, cfg, copies=m.reps, bytes_per_copy=_bytes(first), on_block=on_block)
            m = pooled(m, m2, cfg.confidence)
            verdict = judge(m)
            verdict.notes.append("re-measured once in a fresh order (blocks pooled)")
        state.timing_spent_s += time.monotonic() - t0
        if m.wall_ratio > 1.5 and m.mode.startswith("cuda") and m.time.estimate * m.reps > 1e6:
            verdict.disturbances.append(
                f"wall-clock time is {m.wall_ratio:.1f}x the CUDA-event time: work outside the timed stream, or host work"
            )
        flops = _flops(case, params)
        status = verdict.status
        confirmation: dict[str, Any] | None = None
        confirm_note = ""
        if status == REGRESSED and not s.update:
            status, confirmation, confirm_note = self._confirm(verdict)
        hold_back = ""
        if s.update and stored is not None and not why_not and stored.workload == record["workload"]:
            hold_back, confirmation = self._confirm_move(stored, m.time.estimate, verdict, policy.delta(stored.noise))
        record.update(
            env=env,
            median_ns=m.time.estimate,
            ci_ns=[m.time.lo, m.time.hi],
            ci_rel=_finite(relative_half_width(m.log_time)),
            ratio=m.ratio.estimate if m.ratio else None,
            ratio_ci=[m.ratio.lo, m.ratio.hi] if m.ratio else None,
            against=case.against_name if case.against is not None else None,
            blocks=m.blocks,
            reps=m.reps,
            samples_per_block=m.samples_per_block,
            mode=m.mode,
            stop_reason=m.stop_reason,
            elapsed_s=round(m.elapsed_s, 4),
            wall_ratio=round(m.wall_ratio, 3),
            flops=flops,
            tflops=(flops / (m.time.estimate * 1e-9) / 1e12) if flops else None,
            gates=[g.to_json() for g in verdict.gates],
            mde=case_mde(verdict.gates, variant_is_against=variant.fn is case.against),
            notes=verdict.notes,
            disturbances=verdict.disturbances,
            verdict=status,
            reasons=[g.reason for g in verdict.gates if g.reason] + verdict.disturbances + verdict.notes,
            variant_blocks=[round(x, 3) for x in m.variant_blocks],
            against_blocks=[round(x, 3) for x in m.against_blocks] if m.against_blocks else None,
            outcome="passed",
            updated=date.today().isoformat(),
        )
        if confirmation is not None:
            record["confirmation"] = confirmation
        if hold_back:
            record["baseline_hold"] = hold_back
        failing = [g for g in verdict.gates if g.status == REGRESSED]
        if s.update:
            failing = [g for g in failing if g.name == "max_ratio"]
        if failing and status == REGRESSED:
            record["outcome"] = "failed"
            state.records.append(record)
            reasons = [g.reason for g in failing] + ([confirm_note] if confirm_note else [])
            pytest.fail(f"{variant_name}: performance regression: " + "; ".join(reasons), pytrace=False)
        if s.strict and not s.update and status in (INCONCLUSIVE, NO_BASELINE, NOT_COMPARABLE):
            record["outcome"] = "failed"
            state.records.append(record)
            hint = "" if status == INCONCLUSIVE else " Record one with --perfguard-update-baseline."
            pytest.fail(f"--perfguard-strict ({status}): " + "; ".join(record["reasons"]) + hint, pytrace=False)
        state.records.append(record)

    def _fresh(self) -> tuple[dict[str, Any] | str, dict[str, Any]] | None:
        """This case run alone in a fresh process (see confirm.py), within the session's cap: None once
        the cap is reached; else the child's record (or why there is none) and what to keep of it in this
        record's "confirmation"."""
        state, s = self.state, self.state.settings
        if state.confirmations >= MAX_PER_SESSION:
            return None
        state.confirmations += 1
        timeout = 2 * s.case_timeout + 120 if s.case_timeout else None
        t0 = time.monotonic()
        with self._clock.paused():  # the fresh process has its own deadline
            child = run_fresh(self.item, s, timeout)
        spent = round(time.monotonic() - t0, 1)
        if isinstance(child, str):
            return child, {"error": child, "elapsed_s": spent}
        info = {k: child.get(k) for k in ("verdict", "median_ns", "ci_ns", "ratio", "gates", "reasons")}
        info["elapsed_s"] = spent
        return child, info

    def _confirm(self, verdict: Verdict) -> tuple[str, dict[str, Any] | None, str]:
        """Re-run a regressed case in a fresh process (see confirm.py): the verdict stays "regressed" only
        if it regresses there too; a regression seen in one process alone becomes inconclusive. When no
        confirmation can be had, the regression stands. Returns the status, what the fresh process
        measured, and the note (also added to the verdict's notes)."""
        if not self.state.settings.confirm or in_child():
            return REGRESSED, None, ""

        def note(text: str, first: bool = False) -> str:
            verdict.notes.insert(0 if first else len(verdict.notes), text)
            return text

        fresh = self._fresh()
        if fresh is None:
            return REGRESSED, None, note(f"not confirmed in a fresh process: {MAX_PER_SESSION} confirmations already run")
        child, info = fresh
        if isinstance(child, str):
            return REGRESSED, info, note(f"confirmation failed, the regression stands: {child}")
        first = next((g.reason for g in verdict.gates if g.status == REGRESSED and g.reason), "regressed")
        again = next((g.get("reason") for g in child.get("gates") or [] if g.get("status") == REGRESSED), None)
        if child.get("verdict") == REGRESSED:
            return REGRESSED, info, note(f"confirmed in a fresh process: {again or 'regressed'}")
        shown = next((g.get("reason") for g in child.get("gates") or [] if g.get("gate") == "baseline"), None)
        text = (
            f"not confirmed: {first} in this process, but {child.get('verdict')} in a fresh one"
            + (f" ({shown})" if shown else "")
            + ": a process-dependent time, not judged"
        )
        return INCONCLUSIVE, info, note(text, first=True)

    def _confirm_move(
        self, stored: bl.BaselineEntry, median_ns: float, verdict: Verdict, limit: float
    ) -> tuple[str, dict[str, Any] | None]:
        """An update run whose time moved past the case's threshold (``limit``, the guard's own delta) from
        the stored centre would restart the case's entry (a changed kernel: see baseline.merge_entry). A slow
        or fast process can do that on its own, and would throw away the runs the centre was made of. So the
        case is measured against the stored entry in a fresh process: if it passes there, this run was the
        process, not the kernel, and it is held back from the baseline (the reason is returned); otherwise
        the change stands and the entry restarts.
        """
        moved = math.log(median_ns / stored.median_ns)
        if abs(moved) <= math.log1p(limit) or not self.state.settings.confirm or in_child():
            return "", None
        here = f"{math.expm1(moved) * 100:+.1f}%"
        fresh = self._fresh()
        if fresh is None:
            verdict.notes.append(
                f"moved {here} from the stored time; not checked in a fresh process ({MAX_PER_SESSION} confirmations "
                "already run): its entry restarts as a changed kernel"
            )
            return "", None
        child, info = fresh
        if isinstance(child, str):
            verdict.notes.append(f"moved {here}; the fresh-process check failed ({child}): its entry restarts")
            return "", info
        there = child.get("median_ns")
        there_txt = f"{(float(there) / stored.median_ns - 1) * 100:+.1f}%" if there else "?"
        if child.get("verdict") == PASS:  # within the same threshold of the stored time, in a fresh process
            why = (
                f"moved {here} from the stored time in this process but {there_txt} (pass) in a fresh one: the "
                f"process, not the kernel; this run is not folded into the baseline (its {stored.runs} run(s) kept)"
            )
            verdict.notes.insert(0, why)
            return why, info
        verdict.notes.append(
            f"moved {here} from the stored time here and {there_txt} ({child.get('verdict')}) in a fresh process: "
            "a changed kernel, its entry restarts"
        )
        return "", info

    def _env(self, case: PerfCase, inputs: Inputs) -> dict[str, str]:
        info = self.state.device_info
        env = {k: str(info.get(k)) for k in ("name", "capability", "torch", "triton", "cuda")}
        probe = getattr(case.against, "perfguard_backend", None)
        if callable(probe):
            try:
                env["against_backend"] = str(probe(*inputs[0], **inputs[1]))
            except Exception as exc:
                env["against_backend"] = f"unknown ({type(exc).__name__})"
        return env


def _is_sticky_cuda_error(exc: BaseException) -> bool:
    text = str(exc)
    return any(
        marker in text
        for marker in ("illegal memory access", "unspecified launch failure", "device-side assert", "misaligned address", "illegal instruction")
    )


def gpu_diagnostics() -> str:
    parts = [f"torch {torch.__version__}", f"torch.version.cuda={torch.version.cuda}"]
    parts.append(f"torch.cuda.is_available()={torch.cuda.is_available()}")
    import os
    import shutil

    parts.append(f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}")
    parts.append(f"nvidia-smi {'found' if shutil.which('nvidia-smi') else 'not found'}")
    parts.append(f"nvcc {'found' if shutil.which('nvcc') else 'not found'}")
    return "Diagnostics: " + ", ".join(parts)


def make_state(settings: Settings) -> SessionState:
    return SessionState(settings=settings, device_info=fingerprint(settings.device))
