"""A catalogue of kernels that lie about their timing, each a real attention kernel wrapper.

Every cheat computes attention with real torch ops, on whatever device its inputs live on, and each lies in
one of the ways benchmark suites for generated kernels have met (issue 13 lists them). `CATALOGUE` names
each one with what should catch it; tests/adversarial/test_catalogue.py runs them through the plugin on CPU,
and benchmarks/integrity_gpu.py on a GPU. Nothing here knows the plugin, except the two timer patches, which
patch what a cheat would patch.
"""

from __future__ import annotations

import inspect
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

Kernel = Callable[..., torch.Tensor]


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """Honest attention: matmul, softmax, matmul in the inputs' dtype."""
    s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    if causal:
        n = q.shape[-2]
        mask = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
        s = s.masked_fill(mask, float("-inf"))
    return torch.softmax(s.float(), -1).to(q.dtype) @ v


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    return attention(q, k, v, causal)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


# (1) side stream never joined: the events on the current stream see nothing (GPU only).
def side_stream() -> Kernel:
    streams: dict[torch.device, Any] = {}

    def kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        if not q.is_cuda:
            return attention(q, k, v, causal)
        stream = streams.setdefault(q.device, torch.cuda.Stream(q.device))
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            return attention(q, k, v, causal)

    return kernel


# (2) finished by a background thread after the call returns; the correctness calls (the first few) wait.
def background_thread(sync_calls: int = 3, delay_s: float = 0.3) -> Kernel:
    state: dict[str, Any] = {"calls": 0, "job": None}
    ready = threading.Event()

    def worker() -> None:
        while True:
            ready.wait()
            ready.clear()
            time.sleep(delay_s)
            job = state["job"]
            if job is not None:
                out, args = job
                out.copy_(attention(*args))
                if out.is_cuda:
                    torch.cuda.synchronize(out.device)

    threading.Thread(target=worker, daemon=True).start()

    def kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        state["calls"] += 1
        if state["calls"] <= sync_calls:
            return attention(q, k, v, causal)
        out = torch.full_like(q, math.nan)  # the latest call wins; older outputs are never written
        state["job"] = (out, (q, k, v, causal))
        ready.set()
        return out

    return kernel


# (3) output cached by input pointers and shape, returned (as a copy) on later calls.
def cache_by_pointer() -> Kernel:
    cache: dict[tuple[int, ...], torch.Tensor] = {}

    def kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        key = (q.data_ptr(), k.data_ptr(), v.data_ptr(), *q.shape)
        if key not in cache:
            cache[key] = attention(q, k, v, causal)
        return cache[key].clone()

    return kernel


# (4) reused memory: one output buffer per shape, written only for inputs it has not seen, returned as is.
def stale_buffer() -> Kernel:
    buffers: dict[tuple[int, ...], torch.Tensor] = {}
    seen: set[int] = set()

    def kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        shape = tuple(q.shape)
        if shape not in buffers or q.data_ptr() not in seen:
            buffers[shape] = attention(q, k, v, causal)
            seen.add(q.data_ptr())
        return buffers[shape]

    return kernel


# (5) partial write: only the first half of the rows is computed.
def partial_write(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    out = torch.empty_like(q)
    half = q.shape[-2] // 2
    out[..., :half, :] = attention(q, k, v, causal)[..., :half, :]
    return out


# (6) input mutation: q scaled in place (saves a multiply in the kernel).
def mutate_input(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    q.mul_(1.0 / math.sqrt(q.shape[-1]))  # pre-scaled in place, as a fused kernel might
    return attention(q * math.sqrt(q.shape[-1]), k, v, causal)


# (7) silent fallback: the "fast path" is not available, so SDPA runs instead.
def silent_fallback(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    try:
        raise NotImplementedError("fast path not built for this shape")
    except NotImplementedError:
        return sdpa(q, k, v, causal)


# (8) lazy output: a tensor subclass that computes on access.
class LazyTensor(torch.Tensor):
    pass


def lazy_output(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    return attention(q, k, v, causal).as_subclass(LazyTensor)


# (9) patched timers: the clock slowed down, or the engine's own sample function replaced.
def patch_clock() -> Kernel:
    def kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        real = time.perf_counter_ns
        if getattr(real, "__name__", "") != "slow":

            def slow() -> int:
                return real() // 100

            time.perf_counter_ns = slow
        return attention(q, k, v, causal)

    return kernel


def patch_engine() -> Kernel:
    def kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        from pytest_perfguard.measure import timers

        sample = timers._CpuSample
        if not getattr(sample, "patched", False):
            real = sample.__call__

            def quick(self: Any) -> Any:
                t = real(self)
                return type(t)(t.device_ns / 10, t.wall_ns / 10, 0.0)

            sample.__call__ = quick  # type: ignore[method-assign]
            sample.patched = True  # type: ignore[attr-defined]
        return attention(q, k, v, causal)

    return kernel


# (10) lower precision than declared: fp8 inside, the inputs' dtype out.
def fp8_inside(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    def fp8(t: torch.Tensor) -> torch.Tensor:
        return t.to(torch.float8_e4m3fn).to(t.dtype)

    return attention(fp8(q), fp8(k), fp8(v), causal)


# (11) a shortcut for degenerate inputs: constant q makes every softmax row uniform (non-causal).
def degenerate_shortcut(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    if not causal and bool((q == q.flatten()[0]).all()):
        return v.mean(-2, keepdim=True).expand_as(q).clone()
    return attention(q, k, v, causal)


# (12) behaves differently while timed: under the timing engine (or a graph capture) it returns its last result.
def timed_differently() -> Kernel:
    last: dict[tuple[int, ...], torch.Tensor] = {}

    def kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        shape = tuple(q.shape)
        capturing = q.is_cuda and torch.cuda.is_current_stream_capturing()
        timed = capturing or any(f.filename.endswith("timing.py") for f in inspect.stack(0)[1:6])
        if timed and shape in last:
            return last[shape]
        last[shape] = attention(q, k, v, causal)
        return last[shape]

    return kernel


# (13) work skipped on the copies nobody checked: its first calls (the correctness gate's) are computed, and
# after them the first input it is timed on (input copy 0, whose last output is checked); on any other input
# it returns without working.
def skip_other_copies(checked_calls: int = 3) -> Kernel:
    state: dict[str, Any] = {"calls": 0, "copy0": None}

    def kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        state["calls"] += 1
        if state["calls"] <= checked_calls:
            return attention(q, k, v, causal)
        if state["copy0"] is None:
            state["copy0"] = q.data_ptr()
        if q.data_ptr() == state["copy0"]:
            return attention(q, k, v, causal)
        return torch.zeros_like(q)  # no work

    return kernel


# (14) a memo keyed on a fingerprint of a few input values: answers for values it has seen are served from the
# memo, so every timed call after a copy's first is a lookup. Its answers are right for any values.
def value_memo() -> Kernel:
    memo: dict[tuple[float, ...], torch.Tensor] = {}

    def kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        key = (*q.flatten()[:4].tolist(), *k.flatten()[:4].tolist(), *v.flatten()[:4].tolist(), *q.shape)
        hit = memo.get(key)
        if hit is not None:
            return hit.clone()
        out = memo[key] = attention(q, k, v, causal)
        return out.clone()

    return kernel


# (15) a memo keyed on the inputs' addresses and version counters (what Python can see per call when the
# variant is timed without a graph): a refill bumps the version, so its answers are always right.
def version_memo() -> Kernel:
    memo: dict[tuple[int, ...], torch.Tensor] = {}

    def kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        key = (q.data_ptr(), q._version, k.data_ptr(), k._version, v.data_ptr(), v._version)
        if key not in memo:
            memo[key] = attention(q, k, v, causal)
        return memo[key].clone()

    return kernel


# (16) the reference sabotaged: SDPA's flash backend turned off, process-wide (on a GPU, the reference beside
# it runs on a slower backend; a library that does this at import does the same by accident).
def flip_switch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    return attention(q, k, v, causal)


# (17) host cost nobody times: Python work and a synchronise in every call, which a graph replay never runs
# (GPU only: on a host the timer sees it, and it is simply slow).
def host_cost(busy_s: float = 0.001) -> Kernel:
    def kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        if q.is_cuda and not torch.cuda.is_current_stream_capturing():
            end = time.perf_counter() + busy_s
            while time.perf_counter() < end:
                pass
            torch.cuda.synchronize(q.device)
        return attention(q, k, v, causal)

    return kernel


# name -> (kernel factory, what catches it). Factories make fresh state per use.
CATALOGUE: dict[str, tuple[Callable[[], Kernel], str]] = {
    "side_stream": (side_stream, "work outside the timed stream (GPU only)"),
    "background_thread": (background_thread, "timed output wrong"),
    "cache_by_pointer": (
        cache_by_pointer,
        "timed output wrong (or incorrect, when pointers repeat across seeds)",
    ),
    "stale_buffer": (stale_buffer, "timed output wrong (or incorrect)"),
    "partial_write": (lambda: partial_write, "incorrect: unwritten output (NaN-poisoned on GPU)"),
    "mutate_input": (lambda: mutate_input, "incorrect: input modified in place"),
    "silent_fallback": (lambda: silent_fallback, "silent fallback (Variant not_kernels)"),
    "lazy_output": (lambda: lazy_output, "incorrect: not a plain torch.Tensor"),
    "patch_clock": (patch_clock, "patched timer"),
    "patch_engine": (patch_engine, "patched timer"),
    "fp8_inside": (lambda: fp8_inside, "incorrect: native-precision bound"),
    "degenerate_shortcut": (lambda: degenerate_shortcut, "shortcut on degenerate input (timed on a randomised copy)"),
    "timed_differently": (timed_differently, "timed output wrong"),
    "skip_other_copies": (skip_other_copies, "timed output wrong on input copy N (every copy checked)"),
    "value_memo": (value_memo, "memo on seen inputs (timed on new values against seen ones)"),
    "version_memo": (version_memo, "memo on seen inputs (timed on new values against seen ones)"),
    "flip_switch": (lambda: flip_switch, "global state changed (torch's switches guarded)"),
    "host_cost": (host_cost, "host time per eager call vs baseline (GPU only)"),
}
