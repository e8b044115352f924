"""torch's scaled_dot_product_attention as the reference variant, and which backend it really ran.

SDPA is a moving reference: the backend it dispatches to (flash, efficient, cuDNN, math) depends on torch,
cuDNN, GPU, dtype and shape, and the default is not always the fastest. So besides the call itself this
module reports the backend the dispatcher picks (``sdpa_backend``), builds variants pinned to one backend
(``make_sdpa``), and finds the fastest available backend for a shape (``fastest_backend``), so that a
ratio "kernel / SDPA" always says which SDPA it was.
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .reference import AttentionFn

__all__ = [
    "ALLOWED_BACKENDS",
    "BackendTimes",
    "backend_unavailable_reason",
    "fastest_backend",
    "make_sdpa",
    "sdpa",
    "sdpa_backend",
]


# Our names -> torch's enum member names. "cpu-flash" is the name the CPU flash kernel gets in reports; it is
# the same FLASH_ATTENTION enum member, so it is accepted as an alias of "flash".
_BACKENDS: dict[str, str] = {
    "flash": "FLASH_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
    "math": "MATH",
    "overrideable": "OVERRIDEABLE",
    "cpu-flash": "FLASH_ATTENTION",
}
ALLOWED_BACKENDS: tuple[str, ...] = tuple(_BACKENDS)

# Backends worth timing when looking for the fastest one, per device type.
_CANDIDATES: dict[str, tuple[str, ...]] = {
    "cuda": ("flash", "efficient", "cudnn", "math"),
    "cpu": ("cpu-flash", "math"),
}

# aten op names seen by the profiler -> our names; used only when torch has no ``_fused_sdp_choice``.
_PROFILER_OPS: tuple[tuple[str, str], ...] = (
    ("_scaled_dot_product_flash_attention_for_cpu", "cpu-flash"),
    ("_scaled_dot_product_flash_attention", "flash"),
    ("_scaled_dot_product_efficient_attention", "efficient"),
    ("_scaled_dot_product_cudnn_attention", "cudnn"),
    ("_scaled_dot_product_fused_attention_overrideable", "overrideable"),
    ("_scaled_dot_product_attention_math", "math"),
)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """SDPA with whatever backend the current dispatch settings choose."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _enum(name: str) -> SDPBackend:
    if name not in _BACKENDS:
        raise ValueError(
            f"unknown SDPA backend {name!r}; allowed: {', '.join(ALLOWED_BACKENDS)} (or None for the default dispatch)"
        )
    member: SDPBackend | None = getattr(SDPBackend, _BACKENDS[name], None)
    if member is None:
        raise ValueError(f"SDPA backend {name!r} does not exist in torch {torch.__version__}")
    return member


def _our_name(member_index: int, device_type: str) -> str:
    member = SDPBackend(member_index)
    if member == SDPBackend.FLASH_ATTENTION and device_type == "cpu":
        return "cpu-flash"
    for ours, theirs in _BACKENDS.items():
        if theirs == member.name and ours != "cpu-flash":
            return ours
    return member.name.lower()


def _backend_from_profiler(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> str:
    """Run SDPA once under the profiler and read which aten attention op it dispatched to."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        sdpa(q, k, v, causal)
    names = [event.name for event in prof.events()]
    for op, ours in _PROFILER_OPS:
        if any(op in name for name in names):
            return ours
    return "math"  # the math path decomposes into matmul/softmax ops with no attention op of its own


def sdpa_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> str:
    """The backend SDPA dispatches to for these inputs under the current ``sdpa_kernel`` settings.

    Asks the dispatcher itself (``torch._fused_sdp_choice``, the function SDPA calls) so that nothing runs;
    falls back to profiling one call on torch builds without it. On CPU the answer is "cpu-flash" or "math".
    """
    choice = getattr(torch, "_fused_sdp_choice", None)
    if choice is not None:
        try:
            index = choice(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=causal)
        except (RuntimeError, TypeError):
            index = None
        if isinstance(index, int) and index >= 0:
            return _our_name(index, q.device.type)
    return _backend_from_profiler(q, k, v, causal)


def make_sdpa(backend: str | None) -> AttentionFn:
    """A variant pinned to one SDPA backend (``None``: the default dispatch).

    A pinned variant raises torch's RuntimeError when that backend cannot run the inputs, rather than
    silently falling back to another one; ``backend_unavailable_reason`` says why beforehand.
    """
    if backend is None:
        return sdpa
    member = _enum(backend)

    def pinned(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        with sdpa_kernel([member]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    pinned.__name__ = f"sdpa_{backend.replace('-', '_')}"
    pinned.__qualname__ = pinned.__name__
    pinned.__doc__ = f"SDPA pinned to the {backend!r} backend."
    return pinned


def backend_unavailable_reason(
    backend: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool
) -> str | None:
    """None if the pinned backend runs these inputs; otherwise torch's reason, in one line."""
    try:
        variant = make_sdpa(backend)
    except ValueError as exc:
        return str(exc)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            variant(q, k, v, causal)
        except RuntimeError as exc:
            why = "; ".join(str(w.message).splitlines()[0] for w in caught) or str(exc).splitlines()[0]
            return f"{backend}: {why}"
    return None


def _default_time_ms(fn: Callable[[], object], device: torch.device, reps: int = 15, calls: int = 10) -> float:
    """Median per-call milliseconds over ``reps`` blocks of ``calls`` back-to-back calls (queue kept full)."""
    if device.type == "cuda" and device.index is not None and device.index != torch.cuda.current_device():
        with torch.cuda.device(device):  # the events record on the current device's stream
            return _default_time_ms(fn, device, reps, calls)
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    samples: list[float] = []
    for _ in range(reps):
        if device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / calls)
        else:
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            samples.append((time.perf_counter() - t0) * 1e3 / calls)
    return statistics.median(samples)


@dataclass
class BackendTimes:
    """Outcome of ``fastest_backend``: the winner, each backend's time, and why others were skipped."""

    fastest: str
    times_ms: dict[str, float] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)


def fastest_backend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    time_ms: Callable[[AttentionFn], float] | None = None,
    backends: tuple[str, ...] | None = None,
) -> BackendTimes:
    """Time every backend that can run these inputs and return the fastest.

    ``time_ms`` takes a variant and returns its per-call milliseconds on (q, k, v, causal); the benchmark
    passes its CUDA-graph timer. The default is a simple events timer with a full queue, good enough to
    rank backends that differ by more than a few percent.
    """
    candidates = backends if backends is not None else _CANDIDATES.get(q.device.type, ("math",))
    result = BackendTimes(fastest="")
    for name in candidates:
        reason = backend_unavailable_reason(name, q, k, v, causal)
        if reason is not None:
            result.unavailable[name] = reason
            continue
        variant = make_sdpa(name)
        if time_ms is None:

            def call(variant: AttentionFn = variant) -> object:
                return variant(q, k, v, causal)

            result.times_ms[name] = _default_time_ms(call, q.device)
        else:
            result.times_ms[name] = time_ms(variant)
    if not result.times_ms:
        raise RuntimeError(f"no SDPA backend can run these inputs: {result.unavailable}")
    result.fastest = min(result.times_ms, key=lambda name: result.times_ms[name])
    return result
