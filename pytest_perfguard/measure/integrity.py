"""What the guard refuses to believe: checks that the time measured is the time of the work checked.

The correctness gate checks calls made for it; a kernel can still return a cached, stale, unfinished or
lazy result while it is timed (copies.py: every timed copy checked, and the memo check), hide its work from
the events, patch the timer, or fall back to the reference it claims to beat, or take a shortcut on a
constant input that real inputs never allow. Each check here runs outside the timed window and, when it
sees one of these, returns a message that names what it saw; the runner fails the case as FLAGGED. The
runner records each check's wall time per case (`CaseRecord.checks`); what a process pays once (`warm_up`)
is paid before its first case and reported apart.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from . import hosttime, peaks, timers, timing
from .correctness import CorrectnessFailure, Inputs, judge_output, tensors_of

Overrides = Sequence[Any]

# ------------------------------------------------------------------------------------ patched timers


# The modules whose functions and classes time a case: the timers, the engine, the eager call's timing.
ENGINE_MODULES = (timers, timing, hosttime)


def _timer_functions() -> dict[str, Any]:
    """Every function the engine's clock reading depends on, by dotted name."""
    found: dict[str, Any] = {
        "time.perf_counter_ns": time.perf_counter_ns,
        "time.perf_counter": time.perf_counter,
        "time.monotonic": time.monotonic,
    }
    cuda = torch.cuda
    for name in ("Event", "synchronize", "CUDAGraph", "graph", "Stream", "_sleep", "current_stream"):
        found[f"torch.cuda.{name}"] = getattr(cuda, name, None)
    for owner, names in (
        (cuda.Event, ("record", "elapsed_time", "synchronize", "query")),
        (cuda.CUDAGraph, ("replay", "capture_begin", "capture_end")),
    ):
        for name in names:
            found[f"torch.cuda.{owner.__name__}.{name}"] = getattr(owner, name, None)
    for module in ENGINE_MODULES:
        for name, value in vars(module).items():
            if getattr(value, "__module__", None) != module.__name__:
                continue
            found[f"{module.__name__}.{name}"] = value
            if isinstance(value, type):
                for attr, member in vars(value).items():
                    if callable(member):
                        found[f"{module.__name__}.{name}.{attr}"] = member
    return found


# Captured when the plugin is imported, before any test module can patch anything.
ORIGINAL_TIMERS: dict[str, Any] = _timer_functions()


def _lookup(dotted: str) -> Any:
    module_name, _, rest = dotted.partition(".")
    obj: Any = {"time": time, "torch": torch}.get(module_name)
    if obj is None:  # pytest_perfguard.measure.timing....
        obj = next(m for m in ENGINE_MODULES if dotted.startswith(m.__name__ + "."))
        rest = dotted[len(obj.__name__) + 1 :]
    for part in rest.split("."):
        obj = getattr(obj, part, None)
    return obj


def patched_timers(extra: dict[str, tuple[Any, Any]] | None = None) -> list[str]:
    """The timer functions that are no longer the ones captured at import: a monkeypatched clock, event or
    engine function. `extra` maps a name to (current, original) for bindings held elsewhere (the runner's)."""
    changed = [name for name, original in ORIGINAL_TIMERS.items() if _lookup(name) is not original]
    changed += [name for name, (now, original) in (extra or {}).items() if now is not original]
    return changed


def patched_message(names: Sequence[str]) -> str:
    return (
        f"patched timer: {', '.join(names)} is not the function the plugin imported; the timing cannot be "
        "believed. Remove the monkeypatch (a test may inject a clock through perf_case(clock=...))"
    )


# ------------------------------------------------------------------------------------ unseen work


GAP_FACTOR = 4.0
GAP_FLOOR_NS = 20_000.0
GAP_SHARE = 0.10


def gap_threshold(overhead_ns: float, sample_ns: float) -> float:
    """How far a sample's wall clock may exceed its events before the difference is work the events missed.

    Every sample is closed by a device-wide synchronise, so wall - events = host cost of recording the events,
    launching the graph and returning from the synchronise, plus any device work outside the timed stream.
    The host cost is measured (`overhead_ns`: the 90th percentile for a graph doing no work) and grows with a
    graph's node count; GAP_FACTOR x overhead + GAP_FLOOR_NS (20 us) covers that and host jitter at every size,
    and GAP_SHARE (10%) of the sample's device time covers clock-domain disagreement on long samples. A hidden
    kernel is caught at any size because a sample holds enough calls to take >= 200 us by the events: a
    timer that misses most of the work gets more calls per sample, and so more hidden work.
    """
    return GAP_FACTOR * overhead_ns + GAP_FLOOR_NS + GAP_SHARE * sample_ns


def unseen_work(gap_ns: float, sample_ns: float, overhead_ns: float, reps: int) -> str | None:
    limit = gap_threshold(overhead_ns, sample_ns)
    if gap_ns <= limit:
        return None
    return (
        f"work outside the timed stream: each sample's wall clock (closed by a device-wide synchronise) exceeds "
        f"its CUDA-event time by {gap_ns / 1e3:.1f} us (median; {reps} calls timed at {sample_ns / 1e3:.1f} us), "
        f"above the {limit / 1e3:.1f} us that replay overhead ({overhead_ns / 1e3:.1f} us) explains: the events "
        "do not see the work (a side stream never joined, a background thread). Do the work on the current stream"
    )


def forked_work(capture_error: str | None) -> str | None:
    """A capture that failed because the variant forked work onto another stream and never joined it back.

    Such a variant is timed without a graph, on one stream, and its hidden work can run under the spin that
    lets the host enqueue ahead, where the wall clock does not see it either. CUDA names the cause exactly
    (cudaErrorStreamCaptureUnjoined), so that error alone fails the case.
    """
    if not capture_error:
        return None
    text = capture_error.lower()
    if "not joined" not in text and "unjoined" not in text:
        return None
    return (
        "work outside the timed stream: capturing the variant in a CUDA graph failed because it forks work onto "
        f"another stream and never joins it back ({capture_error.strip()[:200]}); the events on the timed "
        "stream do not see that work. Make the current stream wait for every stream the variant uses"
    )


# ------------------------------------------------------------------------------------ degenerate inputs


@dataclass(frozen=True)
class Constant:
    """A floating input whose elements all hold one finite value: an all-ones weight, a zero bias, a zero q."""

    name: str
    value: float
    numel: int

    def describe(self) -> str:
        return f"{self.name} holds one value ({self.value:g}) in all {self.numel} elements"


def constant_inputs(inputs: Inputs) -> list[Constant]:
    """The floating inputs of more than one element that hold a single finite value."""
    found = []
    for name, t in tensors_of(inputs):
        if t.is_floating_point() and t.numel() > 1:
            flat = t.detach().flatten()
            first = flat[0]
            if bool(torch.isfinite(first) & (flat == first).all()):
                found.append(Constant(name, float(first), t.numel()))
    return found


def randomised(inputs: Inputs, constants: Sequence[Constant], seed: int) -> Inputs:
    """`inputs` with each constant tensor replaced by random values of its shape, dtype and device.

    Around the constant, so the domain a test chose stays: c x U(0.5, 1.5) keeps a weight's sign and size
    and a variance positive; zero becomes U(0, 1). The other inputs are the same tensors.
    """
    values = {c.name: c.value for c in constants}
    # Drawn on the host and copied: no device generator state is touched by the check.
    generator = torch.Generator().manual_seed(seed)

    def fresh(name: str, t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or name not in values:
            return t
        u = torch.rand(t.shape, generator=generator, dtype=torch.float32).to(t.device)
        c = values[name]
        return (c * (0.5 + u) if c != 0 else u).to(t.dtype)

    args, kwargs = inputs
    return (
        tuple(fresh(f"arg{i}", a) for i, a in enumerate(args)),
        {k: fresh(k, v) for k, v in kwargs.items()},
    )


# A shortcut: the randomised copy's fastest sample is at least SHORTCUT_FACTOR x the constant input's, over
# CONFIRM_ROUNDS alternating samples of each. Noise (another process, a descheduled thread) only adds time,
# so the fastest sample of each side is its time, and an honest kernel's two differ by far less than 1.5x;
# GPUs draw less power on constant or zero data and may run a little faster on it, which is not flagged
# either. On an H200 (benchmarks/results/integrity_2026-11-23) honest attention on a zero q read 1.02x,
# and the catalogue's shortcut only 1.9x at B4 H8 S512 (its host sync dominates there), under a 2x bar. The first look
# at the copy spends at most SCREEN_SHARE of the measurement's time (1 to 3 rounds of a sample per side).
SHORTCUT_FACTOR = 1.5
CONFIRM_ROUNDS = 9
SCREEN_SHARE = 0.03


Sample = Callable[[], timers.SampleTime]


def _fastest(samples: dict[str, Sample], rounds: int, order: random.Random) -> dict[str, float]:
    """The fastest per-call time of each side over `rounds` rounds, the sides in a random order each round."""
    times: dict[str, list[float]] = {side: [] for side in samples}
    for _ in range(rounds):
        sides = list(samples.items())
        order.shuffle(sides)
        for side, sample in sides:
            times[side].append(sample().device_ns)
    return {side: min(t) for side, t in times.items()}


@dataclass(frozen=True)
class DegenerateResult:
    flag: str | None  # the case's failure, or None
    note: str  # what was seen, for the record's notes


def _screened(
    out: object,
    rand: Inputs,
    fastest: dict[str, float],
    what: str,
    *,
    reference: Callable[..., Any],
    overrides: Overrides,
    seed: int,
) -> DegenerateResult | None:
    """What the first look at the randomised copy settles: a wrong output on it fails the case, and a copy
    not SHORTCUT_FACTOR x slower clears it. None when a shortcut is suspected: a few samples cannot say more."""
    try:
        judge_output(out, rand, reference, overrides, seed=seed)
    except CorrectnessFailure as exc:
        return DegenerateResult(
            f"degenerate input: {what}, and on a randomised copy of the same shape the variant's output fails "
            f"the check: {exc}. The kernel may rely on that value: test it with random values (torch.randn)",
            "",
        )
    ratio = fastest["copy"] / max(fastest["constant"], 1e-9)
    if ratio < SHORTCUT_FACTOR:
        return DegenerateResult(
            None,
            f"degenerate input: {what}; a randomised copy read {ratio:.2f}x its time and computed the right "
            "output: no shortcut",
        )
    return None


def _confirmed(
    variant: Callable[..., Any],
    first: Inputs,
    timer: timers.Timer,
    copy_sample: Sample,
    what: str,
    *,
    reps: int,
    seed: int,
) -> DegenerateResult:
    """A suspected shortcut, timed again before it fails the case: CONFIRM_ROUNDS alternating samples of each
    side (the constant inputs in a sample of their own), and the fastest of each compared."""

    def on_constant() -> object:
        return variant(*first[0], **first[1])

    constant_sample = timer.prepare([on_constant] * reps)
    fastest = _fastest({"constant": constant_sample, "copy": copy_sample}, CONFIRM_ROUNDS, random.Random(seed + 1))
    fast, slow = fastest["constant"], fastest["copy"]
    ratio = slow / max(fast, 1e-9)
    seen = (
        f"the variant takes {fast / 1e3:.3g} us per call on it vs {slow / 1e3:.3g} us on random data of the same "
        f"shape (the fastest of {CONFIRM_ROUNDS} alternating samples each: {ratio:.1f}x)"
    )
    if ratio >= SHORTCUT_FACTOR:
        return DegenerateResult(
            f"shortcut on degenerate input: {what}; {seen}: its time would not hold for real inputs. Time it on "
            "random data (torch.randn)",
            "",
        )
    return DegenerateResult(None, f"degenerate input: {what}; {seen}: not a shortcut")


def degenerate_inputs(
    variant: Callable[..., Any],
    first: Inputs,
    constants: Sequence[Constant],
    timer: timers.Timer,
    measured: Sample,
    *,
    reps: int,
    degenerate_ns: float,
    spent_ns: float,
    reference: Callable[..., Any],
    overrides: Overrides,
    seed: int,
) -> DegenerateResult:
    """A test may feed a constant input (an all-ones weight, a zero bias), and an honest kernel computes it
    like any other. The lie to catch is a kernel that takes a shortcut on it, so that its time says nothing
    of real inputs: timed on its constant input and on a randomised copy of the same shape, it is much
    faster on the constant one. And a kernel whose output is right only for the constant (one that ignores
    an all-ones weight) is wrong on the copy.

    The copy is timed with the measurement's timer and `reps`, alternating with `measured` (the
    measurement's own sample on the constant inputs, `degenerate_ns` per call); only when the copy's fastest
    sample reads SHORTCUT_FACTOR x the constant's are both sides timed again, alternating, CONFIRM_ROUNDS
    samples each, and the fastest of each compared. The output of the copy's timed calls is judged against
    the reference on the copy.
    """
    what = "; ".join(c.describe() for c in constants)
    box: dict[str, object] = {}
    rand: Inputs = first

    def on_copy() -> object:
        box["out"] = out = variant(*rand[0], **rand[1])
        return out

    try:
        rand = randomised(first, constants, seed)
        copy_sample = timer.prepare([on_copy] * reps)
        screens = max(1, min(3, int(SCREEN_SHARE * spent_ns / max(2 * degenerate_ns * reps, 1.0))))
        fastest = _fastest({"constant": measured, "copy": copy_sample}, screens, random.Random(seed))
    except Exception as exc:  # a kernel may refuse values outside its domain: no judgement, and said so
        return DegenerateResult(
            None,
            f"degenerate input: {what}; not checked: the variant raised {type(exc).__name__} on a randomised copy "
            f"(seed {seed}): {exc}",
        )
    settled = _screened(box.get("out"), rand, fastest, what, reference=reference, overrides=overrides, seed=seed)
    if settled is not None:
        return settled
    return _confirmed(variant, first, timer, copy_sample, what, reps=reps, seed=seed)


# --------------------------------------------------------------------------------- silent fallback


@contextlib.contextmanager
def _quiet_profiler() -> Iterator[None]:
    """Kineto writes "USDT: ... profiler_start" (and _stop) straight to the process's stderr on every session,
    and torch.profiler warns that it "clears events" between cycles: noise in every user's output and
    warnings summary. Both are silenced for the profiler's start and stop only, never around the user's call."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Profiler clears events", category=UserWarning)
        sys.stderr.flush()
        saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, 2)
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            os.close(null)


def profiled_call(call: Callable[[], Any], device: torch.device | None) -> tuple[Any, set[str], float]:
    """One call under torch.profiler: its result, the operator and kernel names it ran (aten ops on CPU,
    kernels too on CUDA, where `device` is the CUDA device), and the seconds the profiler's own start, stop
    and parse took."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device is not None and device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    t0 = time.monotonic()
    prof = profile(activities=activities)
    with _quiet_profiler():
        prof.start()
    started = time.monotonic()
    try:
        out = call()
        if cuda:
            torch.cuda.synchronize(device)
    finally:
        called = time.monotonic()
        with _quiet_profiler():
            prof.stop()
    names = {str(e.key) for e in prof.key_averages()}
    return out, names, (started - t0) + (time.monotonic() - called)


def profiled_names(call: Callable[[], object], cuda: bool) -> set[str]:
    """The operator and kernel names one call runs."""
    return profiled_call(call, torch.device("cuda", torch.cuda.current_device()) if cuda else None)[1]


class ProfiledCall:
    """Wraps a call in torch.profiler and keeps what it saw: the correctness gate's last call goes through
    one, so the silent-fallback check needs no call of its own (a slow kernel's call would be most of the
    check's cost)."""

    def __init__(self, device: torch.device | None) -> None:
        self.device = device
        self.names: set[str] | None = None
        self.own_s = 0.0  # the profiler's start, stop and parse

    def __call__(self, call: Callable[[], Any]) -> Any:
        out, self.names, self.own_s = profiled_call(call, self.device)
        return out


def forbidden_kernel(names: set[str], not_kernels: Sequence[str]) -> str | None:
    """The message when a variant ran a kernel or op it declared it does not use (`Variant(not_kernels=...)`)."""
    hits = sorted(n for n in names if any(word.lower() in n.lower() for word in not_kernels))
    if not hits:
        return None
    shown = ", ".join(hits[:3]) + (f" and {len(hits) - 3} more" if len(hits) > 3 else "")
    return (
        f"silent fallback: the variant ran {shown}, which it declares it does not use "
        f"(not_kernels={list(not_kernels)}); it is timing another implementation"
    )


# ---------------------------------------------------------------------------------- one-time costs


def warm_up(device: str, *, profiler: bool) -> dict[str, float]:
    """Pays the checks' one-time costs of this process before its first case, and says what they were.

    The first torch.profiler session of a process starts Kineto (and CUPTI on CUDA): 4.3 s on a CPU host
    and about 3.8 s on an H100 (benchmarks/results/integrity_2026-11-23), against milliseconds for every
    later one. Inside a case it would be that case's check cost; here it is reported once, per process. On
    CUDA the device's peaks are looked up too (NVML), once.
    """
    costs: dict[str, float] = {}
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    if profiler:
        t0 = time.monotonic()
        x = torch.zeros(16, device=dev)
        profiled_call(lambda: x.add_(1), dev if dev.type == "cuda" else None)
        costs["profiler_s"] = round(time.monotonic() - t0, 4)
    if dev.type == "cuda":
        t0 = time.monotonic()
        peaks.device_peak(dev.index if dev.index is not None else 0)
        costs["device_peak_s"] = round(time.monotonic() - t0, 4)
    return costs
