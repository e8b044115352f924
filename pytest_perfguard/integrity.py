"""What the guard refuses to believe: checks that the time measured is the time of the work checked.

The correctness gate checks calls made for it; a kernel can still return a cached, stale, unfinished or
lazy result while it is timed, hide its work from the events, patch the timer, or fall back to the
reference it claims to beat. Each check here runs outside the timed window and, when it sees one of
these, returns a message that names what it saw; the runner fails the case as FLAGGED.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import timing
from .correctness import CorrectnessFailure, Inputs, judge_output, modified_input, tensors_of

Overrides = Sequence[Any]

# ------------------------------------------------------------------------------------ patched timers


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
    for name, value in vars(timing).items():
        if getattr(value, "__module__", None) != timing.__name__:
            continue
        found[f"{timing.__name__}.{name}"] = value
        if isinstance(value, type):
            for attr, member in vars(value).items():
                if callable(member):
                    found[f"{timing.__name__}.{name}.{attr}"] = member
    return found


# Captured when the plugin is imported, before any test module can patch anything.
ORIGINAL_TIMERS: dict[str, Any] = _timer_functions()


def _lookup(dotted: str) -> Any:
    module_name, _, rest = dotted.partition(".")
    obj: Any = {"time": time, "torch": torch}.get(module_name)
    if obj is None:  # pytest_perfguard.timing....
        obj, rest = timing, dotted[len(timing.__name__) + 1 :]
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


# ------------------------------------------------------------------------------ timed outputs checked


def timed_outputs(
    outputs: dict[int, object],
    sample: Callable[[], object] | None,
    inputs: Inputs,
    refill: Inputs,
    reference: Callable[..., Any],
    overrides: Overrides,
    *,
    seed: int,
) -> str | None:
    """What was timed is what was checked: the message of the first failure, or None.

    1. The output of the last timed call on input copy 0 is judged against the oracle on that copy.
    2. Copy 0's inputs are overwritten in place with fresh values (seed `seed`), the output is poisoned
       with NaN, and the timed sample runs once more (a graph replay on CUDA). Its output must match the
       oracle on the new values, and the inputs must be unchanged. A result cached by pointer or shape,
       memory holding an earlier answer, work that is not in the replay, a shortcut keyed on the test's
       inputs, or a kernel that behaves differently once timed, all fail here.
    The inputs get their original values back afterwards.
    """
    first = outputs.get(0)
    where = "the output of the last timed call"
    try:
        judge_output(first, inputs, reference, overrides, seed=seed)
    except CorrectnessFailure as exc:
        return f"timed output wrong: {where} fails the check that its correctness calls passed: {exc}"
    if sample is None:
        return None
    tensors = tensors_of(inputs)
    original = [(name, t.detach().clone()) for name, t in tensors]
    try:
        for (_, t), (_, new) in zip(tensors, tensors_of(refill), strict=True):
            t.copy_(new)
        fresh = [(name, t.detach().clone()) for name, t in tensors]
        if isinstance(first, torch.Tensor) and first.is_floating_point():
            first.fill_(math.nan)
        sample()
        if tensors[0][1].is_cuda:
            torch.cuda.synchronize()
        changed = modified_input(fresh, tensors)
        if changed:
            return f"input mutation: the timed calls modified input {changed} in place (seed {seed})"
        try:
            judge_output(outputs.get(0), inputs, reference, overrides, seed=seed)
        except CorrectnessFailure as exc:
            return (
                "timed output wrong: a replay of the timed calls on new input values, outside the timed window, "
                f"returned a stale, cached, unfinished or partial result: {exc}"
            )
    finally:
        for (_, t), (_, old) in zip(tensors, original, strict=True):
            t.copy_(old)
    return None


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


# ------------------------------------------------------------------------------------ input sanity


def degenerate_input(inputs: Inputs) -> str | None:
    """A floating input whose elements are all equal: a kernel may shortcut it, and its output proves little."""
    for name, t in tensors_of(inputs):
        if t.is_floating_point() and t.numel() > 1:
            flat = t.detach().flatten()
            if bool((flat == flat[0]).all()):
                return (
                    f"degenerate input: {name} holds one value ({float(flat[0]):g}) in all {t.numel()} elements; "
                    "a kernel "
                    "may return a constant or shortcut for it. Draw random inputs (torch.randn) in the test"
                )
    return None


# --------------------------------------------------------------------------------- silent fallback


def profiled_names(call: Callable[[], object], cuda: bool) -> set[str]:
    """The operator and kernel names one call runs, from torch.profiler (aten ops on CPU, kernels on CUDA)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        call()
        if cuda:
            torch.cuda.synchronize()
    return {str(e.key) for e in prof.key_averages()}


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
