"""The timed step of one case: its twin at the base revision paired and checked, the measurement (once more
when it regressed, was inconclusive or was disturbed) and the gates judged. It takes the case's values and
returns its own (`Timed`); the runner writes them into the record. What the measurement means is judge/'s;
how it is taken is measure/timing.py's.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from ..judge import baseline as bl
from ..judge.policy import case_offset, could_hide, judged_margin
from ..judge.verdict import (
    STRADDLES,
    UNCHECKED_FASTER,
    Verdict,
    ab_gate,
    ab_progress,
    case_mde,
    decide,
    host_gate,
    unpaired_gate,
)
from ..measure import hosttime, integrity, timers, timing
from ..measure.correctness import check
from ..measure.cpuwatch import CpuWatch
from ..measure.device import CUDA_TIMING, Disturbances, incomparable, manual_seed
from ..measure.hosttime import HostTime, host_time
from ..measure.timers import Call, Clock, Timer, Watch, make_timer
from ..measure.timing import (
    MeasureConfig,
    Measurement,
    Progress,
    measure,
    pooled,
)
from ..record import Status
from .ab import Twin, base_arguments
from .caseitem import CaseItem
from .checks import DeviceLock, machine_watch
from .state import SessionState, device_id
from .workload import Trial, describe_workload, input_bytes, normalize_inputs

# An undecided case is measured up to this many more times (blocks pooled), within this many seconds of such
# measurements per process (_decide_more); a disturbed GPU is waited for up to QUIET_WAIT_S before its case is
# measured again (_wait_quiet).
EXTRA_MEASUREMENTS = 2
DECIDING_BUDGET_S = 120.0
QUIET_WAIT_S = 30.0


def engine_bindings() -> dict[str, tuple[Any, Any]]:
    """The engine's functions as this module holds them, with the ones their modules had at import: a test
    that patched them here would time with its own clock (the patched-timer check compares them)."""
    original = integrity.ORIGINAL_TIMERS
    homes = {"measure": timing, "pooled": timing, "make_timer": timers, "host_time": hosttime}
    return {f"{__name__}.{name}": (globals()[name], original[f"{m.__name__}.{name}"]) for name, m in homes.items()}


def note_unchecked_faster(verdict: Verdict, stored: bl.BaselineEntry | None, case_offset_on: bool) -> None:
    """An A/B "faster" that stands (confirmed, or with no confirmation to be had) on a case whose stored entry
    holds no A/A reading: two loaded copies of one kernel can differ for every process, so a fresh process
    does not rule that out, and its reason says so (UNCHECKED_FASTER). Called once, where the verdict is
    final: not in the fresh process, whose reason the confirmation note quotes."""
    gate = next((g for g in verdict.gates if g.name == "ab"), None)
    if gate is None or gate.status is not Status.FASTER or not case_offset_on:
        return
    if stored is None or not stored.aa_readings:
        gate.reason += UNCHECKED_FASTER


def timer_for(device: str, clock: Clock | None) -> Timer:
    """The case's timer, made here so that the patched-timer check sees the function it was made by."""
    return make_timer(device, clock)


@dataclass
class Timed:
    """What the timed step returns: the measurement it judged, the verdict, the environment the case ran in
    (part of what a stored entry is compared by) and what the record's notes should say of the timing."""

    m: Measurement
    verdict: Verdict
    env: dict[str, str]
    notes: list[str] = field(default_factory=list)


class TimedStep:
    """Measures and judges one case for its runner, which keeps what it returns in the record."""

    def __init__(
        self,
        state: SessionState,
        item: CaseItem,
        lock: DeviceLock,
        on_progress: Callable[[Progress], None] | None,
    ) -> None:
        self.state = state
        self.item = item
        self.lock = lock
        self.on_progress = on_progress
        self.host: HostTime | None = None  # the eager call's timing (_host_time), once measured
        self.host_s = 0.0  # the seconds it took, counted with the checks' (CaseRecord.checks)
        # What measure_and_judge has found so far; the runner keeps them for a case that raises or times out
        # before the step returns (Runner._keep_found).
        self.env: dict[str, str] | None = None
        self.notes: list[str] = []
        self.measuring = False  # a measurement is taking blocks (for a timeout's message: Runner._where)
        self.device = device_id(state)  # what the case is judged on, and its record names (state.device_id)

    # ------------------------------------------------------------------------- the base revision's twin

    def pair(self, trial: Trial, test: str, workload_desc: str | None, base_unmet: str | None = None) -> Twin:
        """The case at the base revision, checked: its requirements met (`base_unmet`, evaluated beside the
        head's by the runner), same workload, correct on the same inputs."""
        base = self.state.base
        assert base is not None
        twin: Twin = base.twin(self.item, trial.variant_name)
        if not twin.ok:
            return twin
        if base_unmet:
            return Twin(Status.NO_BASE, f"no base: at {base.rev} the variant cannot run: {base_unmet}")
        assert twin.variant is not None
        args = base_arguments(twin.factory, trial.params)
        if isinstance(args, str):
            return Twin(Status.NOT_COMPARABLE, args)
        try:
            manual_seed(trial.seeds[0])
            desc = describe_workload(normalize_inputs(twin.factory(**args), test))
        except Exception as exc:
            return Twin(Status.NO_BASE, f"no base: the base test's inputs raised {type(exc).__name__}: {exc}")
        if desc != workload_desc:
            return Twin(
                Status.NOT_COMPARABLE,
                f"not comparable: the workload differs at {base.rev} (head: {workload_desc}; base: {desc})",
            )
        case, variant = trial.case, twin.variant
        try:
            with self.lock(exclusive=False):
                report = check(
                    variant.fn, case.reference, trial.make_inputs, trial.seeds, [case.tolerance, variant.tolerance]
                )
        except Exception as exc:
            return Twin(Status.NO_BASE, f"no base: the base variant raised {type(exc).__name__}: {exc}")
        if not report.passed:
            return Twin(Status.NO_BASE, f"no base: base incorrect: {report.message}")
        return twin

    # ---------------------------------------------------------------------------------- measure, judge

    def _config(self, trial: Trial, base: object | None) -> MeasureConfig:
        s = self.state.settings
        # On a GPU, blocks spread over at least 0.3 s (nvbench keeps 0.5 s): a few milliseconds of samples
        # see one clock state and give intervals far narrower than the run-to-run spread.
        min_time = min(0.3, s.case_budget / 2) if self.state.kind == "cuda" else 0.0
        cfg = MeasureConfig(target=s.ci_target, budget_s=s.case_budget, min_time_s=min_time)
        if base is None:
            return cfg
        policy = self.state.policy()

        def progress(ratios: Sequence[float], time_ns: float) -> float:
            return ab_progress(
                ratios, policy, s.ab_margin_for(time_ns), s.ab_detect_for(time_ns), s.ab_process_sd_for(time_ns)
            )

        # The A/B gate decides: measure until its MDE reaches its promise; the ratio to `against` is
        # reported, and need not narrow unless a max_ratio gate judges it. Head and base share their input
        # copies, so they need no rotation over them; an update's A/A process stores its times, and does.
        return replace(
            cfg,
            ab_progress=progress,
            stop_on_ratio=trial.max_ratio is not None,
            spread_copies=self.state.role.update_process,
        )

    def measure_and_judge(self, trial: Trial, workload: str, twin: Twin | None, timer: Timer) -> Timed:
        """Measure, judge; a regressed or inconclusive case is measured once more in a fresh order and
        judged on all blocks together. A disturbed measurement is measured once more, in an update too:
        when the second is clean it is judged alone, else the case stays disturbed (inconclusive, never
        stored)."""
        base = trial.calls(twin.variant.fn) if twin is not None and twin.variant is not None else None
        cfg = self._config(trial, base)
        watch = self._watch(trial)
        against = trial.calls(trial.case.against) if trial.case.against is not None else None

        def take(copies: int | None = None) -> Measurement:
            trial.timed = trial.calls(trial.variant.fn)  # the copies this measurement times, for the checks
            with self.lock(exclusive=True), self._measuring():
                return measure(
                    trial.timed,
                    against,
                    timer,
                    cfg,
                    copies=copies,
                    bytes_per_copy=input_bytes(trial.first),
                    watch=watch,
                    base=base,
                    on_progress=self.on_progress,
                )

        # Where the case runs, kept for its record should the measurement raise or hang (its mode, graph or
        # stream, is known once the first measurement ends, and is written then, in its place).
        env = self.env = self._env(trial, "unknown: the first measurement had not ended")
        m = take()
        notes = self.notes
        if isinstance(watch, CpuWatch) and watch.unwatched:
            notes.append(watch.unwatched)
        if "mode" in env:
            env["mode"] = m.mode
        self.host = self._host_time(trial, m, against)
        verdict = self._judge(trial, workload, env, m, twin)
        disturbed = list(m.notes)
        if disturbed or (verdict.needs_remeasure and not self.state.settings.update):
            if disturbed and (waited := self._wait_quiet(watch)) is not None:
                notes.append(waited)
            m2 = take(copies=m.reps)
            if disturbed and not m2.notes:
                # The disturbance passed: the clean blocks alone are judged (and stored by an update).
                m, note = m2, "re-measured once: the first measurement was disturbed (" + "; ".join(disturbed) + ")"
            else:
                m, note = pooled(m, m2, cfg.confidence), "re-measured once in a fresh order (blocks pooled)"
            verdict = self._judge(trial, workload, env, m, twin)
            verdict.notes.append(note)
        m, verdict = self._decide_more(trial, workload, env, twin, m, verdict, take, cfg.confidence, against)
        if verdict.disturbances:
            off = " (where the load is by design, --perfguard-no-cpu-watch)" if isinstance(watch, CpuWatch) else ""
            verdict.notes.append(
                f"disturbed {'in both measurements' if disturbed else 'in the re-measurement'}: inconclusive, "
                f"never a failure, and never stored as a baseline; time it on a quiet machine{off}"
            )
        return Timed(m, verdict, env, list(notes))

    @contextlib.contextmanager
    def _measuring(self) -> Iterator[None]:
        self.measuring = True
        try:
            yield
        finally:
            self.measuring = False

    def _wait_quiet(self, watch: Watch | None) -> str | None:
        """Before a disturbed case is measured again: wait (up to QUIET_WAIT_S) for the GPU's other work to
        end, and say in the case's notes what was waited for and how long."""
        if not isinstance(watch, Disturbances):
            return None
        quiet, waited, seen = watch.wait_quiet(QUIET_WAIT_S)
        if not (seen or waited >= 1.5):
            return None
        state = "it ended" if quiet else "it had not ended"
        return f"waited {waited:.1f} s for the disturbance to end ({seen or 'none seen'}): {state}"

    def _decide_more(
        self,
        trial: Trial,
        workload: str,
        env: dict[str, str],
        twin: Twin | None,
        m: Measurement,
        verdict: Verdict,
        take: Callable[..., Measurement],
        confidence: float,
        against: Callable[[int], Call] | None = None,
    ) -> tuple[Measurement, Verdict]:
        """A verdict still undecided after the re-measurement, where more blocks can decide it (a gate whose
        interval straddles its margin, or a pass whose interval is too wide to rule out twice the margin; not
        an entry that cannot judge or a disturbed machine): measured up to EXTRA_MEASUREMENTS more times,
        blocks pooled, within the process's DECIDING_BUDGET_S. Only then is it unverified (policy.decision)."""
        s = self.state.settings
        extra = 0
        while (
            not s.update
            and not verdict.disturbances
            and extra < EXTRA_MEASUREMENTS
            and self.state.deciding_spent_s < DECIDING_BUDGET_S
            and self._more_can_decide(trial, m, verdict)
        ):
            t0 = time.monotonic()
            host_undecided = any(g.name == "host" and g.status is Status.INCONCLUSIVE for g in verdict.gates)
            m = pooled(m, take(copies=m.reps), confidence)
            if host_undecided and self.host is not None:
                # The eager call's blocks pooled too: the host gate is undecided by its own blocks.
                more = self._host_time(trial, m, against)
                if more is not None and (self.host.against_blocks is None) == (more.against_blocks is None):
                    self.host = HostTime(
                        self.host.variant_blocks + more.variant_blocks,
                        None
                        if self.host.against_blocks is None or more.against_blocks is None
                        else self.host.against_blocks + more.against_blocks,
                        self.host.calls_per_block,
                    )
            verdict = self._judge(trial, workload, env, m, twin)
            extra += 1
            verdict.notes.append(f"undecided: measured {extra} more time(s) to decide it (blocks pooled)")
            self.state.deciding_spent_s += time.monotonic() - t0
        return m, verdict

    def _more_can_decide(self, trial: Trial, m: Measurement, verdict: Verdict) -> bool:
        """More blocks can decide this verdict: a gate straddles its margin, or the verdict is a pass whose
        minimum detectable effect is past policy.MDE_MARGINS margins (a fresh H100's guard left one such case
        unverified, MDE 10.2% against a 10% limit, with no second look; 2026-11-28)."""
        gates = verdict.deciding_gates()
        if any(g.status is Status.INCONCLUSIVE and STRADDLES in g.reason for g in gates):
            return True
        if verdict.status is not Status.PASS:
            return False
        s = self.state.settings
        mde = case_mde(gates, variant_is_against=trial.variant.fn is trial.case.against)
        fallback = s.ab_margin_for(m.time.estimate) if s.against else s.margin
        return could_hide(mde, judged_margin([(g.name, g.threshold) for g in verdict.gates], fallback))

    def _host_time(self, trial: Trial, m: Measurement, against: Callable[[int], Call] | None) -> HostTime | None:
        """The eager call as a user makes it, beside the reference's (GPU only: on CPU the timed figure is
        the host's time already), on the measurement's input copies."""
        if self.state.kind != "cuda" or trial.timed is None:
            return None
        count = max(1, m.reps * max(1, len(m.members)))
        sides = {"v": [trial.timed(i) for i in range(count)]}
        if against is not None:
            sides["a"] = [against(i) for i in range(count)]
        device = torch.device(self.state.settings.device)
        with self.lock(exclusive=True):
            t0 = time.monotonic()
            host = host_time(sides, lambda: torch.cuda.synchronize(device), per_call_ns=m.time.estimate)
            self.host_s += time.monotonic() - t0
            return host

    def _watch(self, trial: Trial) -> Watch | None:
        return machine_watch(self.state.settings, self.state.kind, trial)

    def stored(self) -> bl.BaselineEntry | None:
        baseline = self.state.baseline
        return baseline.cases.get(self.item.nodeid) if baseline is not None else None

    def _judge(self, trial: Trial, workload: str, env: dict[str, str], m: Measurement, twin: Twin | None) -> Verdict:
        """The gates on this measurement; `workload` and `env` say what ran and where (a stored entry of
        another workload or environment is not judged against)."""
        s = self.state.settings
        stored = self.stored()
        verdict = decide(
            m.variant_blocks,
            m.against_blocks,
            None if s.update else stored,
            workload=workload,
            policy=self.state.policy(),
            max_ratio=trial.max_ratio,
            incomparable=incomparable(stored.env, env) if stored is not None else [],
            disturbances=m.notes,
            device=self.device,
        )
        host = self.host
        entry_gate = verdict.gates[0] if verdict.gates else None
        if (
            host is not None
            and host.against_blocks is not None
            and stored is not None
            and not s.update
            and entry_gate is not None
            and entry_gate.status not in (Status.NOT_COMPARABLE, Status.NO_BASELINE)
        ):
            gate = host_gate(host.variant_blocks, host.against_blocks, stored, self.state.policy())
            if gate is not None:
                verdict.gates.append(gate)
        if twin is not None:
            policy = self.state.policy()
            ratios = m.ab_ratios()
            gate = (
                ab_gate(ratios, policy, s.ab_margin_for(m.time.estimate), *self._ab_offset(m.time.estimate))
                if twin.ok
                else unpaired_gate(twin.status or Status.NO_BASE, twin.reason)
            )
            verdict.gates.insert(0, gate)
            verdict.deciding = frozenset({"ab", "max_ratio"})
        return verdict

    def _ab_offset(self, time_ns: float) -> tuple[float, float, str]:
        """The A/B gate's per-process offset for this case, the part of it that the margin absorbs (the
        pooled one, settings.ab_process_sd_for, fitted, built-in or set), and where the rest comes from: the
        case's own offset, from the A/A readings its stored entry holds (policy.case_offset), which can only
        widen it; off with settings.ab_case_offset. A fresh process (confirmation) reads the same file and
        comes to the same value."""
        pooled = self.state.settings.ab_process_sd_for(time_ns)
        stored = self.stored()
        if stored is None or not self.state.settings.ab_case_offset:
            return pooled, pooled, ""
        readings = stored.aa_readings
        return case_offset(pooled, readings), pooled, f"from its {len(readings)} stored A/A reading(s)"

    def _env(self, trial: Trial, mode: str) -> dict[str, str]:
        info = self.state.device_info
        env = {k: str(info.get(k)) for k in ("name", "capability", "torch", "triton", "cuda")}
        if info.get("kind") == "cuda":
            env["timing"] = CUDA_TIMING
            env["mode"] = mode  # graph or stream: part of the workload (device.COMPARED_KEYS)
        case, (args, kwargs) = trial.case, trial.first
        if case.against_backend is not None:
            try:
                env["against_backend"] = str(case.against_backend(*args, **kwargs))
            except Exception as exc:
                env["against_backend"] = f"unknown ({type(exc).__name__})"
        return env
