"""The `perf_case` decorator and `Variant`: the user's side of the plugin.

`perf_case` validates its arguments against one real signature (the decorator's own), stores a
`PerfCase` on the test and gives the test two extra parameters that the plugin fills: the variant's
name (parametrized, so each variant becomes its own item, first in the id) and the runner fixture that
checks and times it. The user's function stays a plain input factory.
"""

from __future__ import annotations

import functools
import inspect
import os
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import torch

VARIANT_ARG = "perfguard_variant"
RUNNER_ARG = "perfguard_runner"
MARK_NAME = "perfguard_case"

Requirement = str | Callable[[], str | None]
ToleranceTable = Mapping["torch.dtype", Mapping[str, float]]
Clock = Callable[[], int]  # nanoseconds, as measure.timers.Clock: declared here, the API imports no timer

_REQUIREMENT_HELP = (
    "'cuda', 'triton', 'nvcc', 'sm<major><minor>' (e.g. 'sm80'), or a callable returning a skip reason or None"
)


@dataclass(frozen=True)
class Variant:
    """One implementation under guard, with what it needs and its own limits.

    requires: what the variant needs; a callable returns a skip reason or None, and may do one-time work
    (compile an extension). In an A/B run the base revision's copy of it is called in another thread while
    the head's runs, with the case's device current in both: state the two copies share (in a module the
    base revision does not provide) needs a lock of its own.
    not_kernels: substrings of operator or kernel names the variant declares it never runs (e.g.
    "scaled_dot_product" for a kernel that claims to replace SDPA). Under --perfguard the correctness gate's
    last call is profiled; a name that matches fails the case as a silent fallback.
    """

    fn: Callable[..., Any]
    requires: Requirement | Sequence[Requirement] | None = None
    max_ratio: float | None = None
    tolerance: ToleranceTable | None = None
    not_kernels: Sequence[str] = ()

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TypeError(f"Variant fn must be callable, got {type(self.fn).__name__}")
        for req in _as_list(self.requires):
            if isinstance(req, str) and not _known_requirement(req):
                raise ValueError(f"unknown requirement {req!r}; allowed: {_REQUIREMENT_HELP}")
        if self.max_ratio is not None and not (isinstance(self.max_ratio, int | float) and self.max_ratio > 0):
            raise ValueError(f"max_ratio must be a positive number, got {self.max_ratio!r}")
        _check_tolerance(self.tolerance, "Variant tolerance")
        if isinstance(self.not_kernels, str) or not all(isinstance(k, str) and k for k in self.not_kernels):
            raise TypeError(
                f"Variant not_kernels must be a list of non-empty name substrings, got {self.not_kernels!r}"
            )
        object.__setattr__(self, "not_kernels", tuple(self.not_kernels))  # frozen: keep it hashable


@dataclass(frozen=True)
class PerfCase:
    variants: dict[str, Variant]
    reference: Callable[..., Any]
    against: Callable[..., Any] | None = None
    tolerance: ToleranceTable | None = None
    flops: Callable[..., float] | None = None
    seeds: int = 3
    max_ratio: float | None = None
    clock: Clock | None = None
    bytes: Callable[..., float] | None = None
    against_name: str = field(default="against")
    against_backend: Callable[..., str] | None = None


def _as_list(req: Requirement | Sequence[Requirement] | None) -> list[Requirement]:
    if req is None:
        return []
    if isinstance(req, str) or callable(req):
        return [req]
    return list(req)


def _known_requirement(req: str) -> bool:
    return req in ("cuda", "triton", "nvcc") or re.fullmatch(r"sm_?\d{2,3}", req) is not None


def _check_tolerance(table: Any, what: str) -> None:
    if table is None:
        return
    import torch

    if not isinstance(table, Mapping):
        raise TypeError(f"{what} must map torch dtypes to dict(atol=..., rtol=...), got {type(table).__name__}")
    for dtype, entry in table.items():
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"{what}: keys must be torch dtypes such as torch.float16, got {dtype!r}")
        if not isinstance(entry, Mapping):
            raise TypeError(f"{what}[{dtype}] must be a dict with atol/rtol/native_factor, got {entry!r}")
        unknown = set(entry) - {"atol", "rtol", "native_factor"}
        if unknown:
            raise ValueError(f"{what}[{dtype}]: unknown keys {sorted(unknown)}; allowed: atol, rtol, native_factor")


def unmet_requirement(req: Requirement | Sequence[Requirement] | None, device: str) -> str | None:
    """The first unmet requirement as a skip reason, or None when all are met."""
    for r in _as_list(req):
        reason = _check_one(r, device)
        if reason:
            return reason
    return None


def _check_one(req: Requirement, device: str) -> str | None:
    import torch

    if callable(req):
        try:
            return req()
        except Exception as exc:  # a broken availability probe must not crash collection
            return f"availability check {getattr(req, '__name__', req)!r} raised {type(exc).__name__}: {exc}"
    if req == "cuda":
        if not torch.cuda.is_available():
            return "needs a CUDA GPU: torch.cuda.is_available() is False"
        if not device.startswith("cuda"):
            return f"needs a CUDA GPU, but the perfguard device is {device}"
        return None
    if req == "triton":
        try:
            import triton  # noqa: F401
        except Exception as exc:
            return f"needs triton: {exc}"
        if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
            return "needs triton on a GPU, or TRITON_INTERPRET=1 to run its interpreter on CPU"
        return None
    if req == "nvcc":
        return None if shutil.which("nvcc") else "needs nvcc (CUDA toolkit) on PATH"
    m = re.fullmatch(r"sm_?(\d+)(\d)", req)
    if m:
        if not torch.cuda.is_available() or not device.startswith("cuda"):
            return f"needs a CUDA GPU of compute capability >= {m.group(1)}.{m.group(2)}"
        major, minor = torch.cuda.get_device_capability(torch.device(device))
        want = (int(m.group(1)), int(m.group(2)))
        if (major, minor) < want:
            return f"needs compute capability >= {want[0]}.{want[1]}, this GPU is {major}.{minor}"
        return None
    return f"unknown requirement {req!r}"


def _bind(**kwargs: Any) -> inspect.BoundArguments:
    sig = inspect.signature(perf_case)
    allowed = ", ".join(sig.parameters)
    unknown = sorted(set(kwargs) - set(sig.parameters))
    if unknown:
        raise TypeError(f"perf_case() got unknown argument(s) {unknown}; allowed: {allowed}")
    try:
        return sig.bind(**kwargs)
    except TypeError as exc:
        raise TypeError(f"perf_case(): {exc}; allowed: {allowed}") from None


def _variants(variants: Mapping[str, Callable[..., Any] | Variant]) -> dict[str, Variant]:
    """Each variant as a `Variant`, its name checked here because it becomes part of the test id."""
    if not isinstance(variants, Mapping) or not variants:
        raise TypeError("perf_case(variants=...) must be a non-empty dict of name -> callable or Variant")
    normalized: dict[str, Variant] = {}
    for name, v in variants.items():
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.]+", name):
            raise ValueError(
                f"variant name {name!r} must be letters, digits, '_' or '.' (it becomes part of the test id)"
            )
        normalized[name] = v if isinstance(v, Variant) else Variant(v)
    return normalized


def _check_arguments(
    *,
    reference: Callable[..., Any],
    against: Callable[..., Any] | None,
    against_backend: Callable[..., str] | None,
    flops: Callable[..., float] | None,
    bytes: Callable[..., float] | None,
    seeds: int,
    max_ratio: float | None,
    tolerance: ToleranceTable | None,
) -> None:
    """Rejects a bad argument where the test is decorated, with what it must be, rather than when an item runs."""
    if not callable(reference):
        raise TypeError("perf_case(reference=...) must be callable: the float64 correctness oracle")
    if against is not None and not callable(against):
        raise TypeError("perf_case(against=...) must be callable or None")
    if against_backend is not None and not callable(against_backend):
        raise TypeError("perf_case(against_backend=...) must be callable: it takes the inputs and names a backend")
    if flops is not None and not callable(flops):
        raise TypeError("perf_case(flops=...) must be a callable taking the test's parameters by name")
    if bytes is not None and not callable(bytes):
        raise TypeError("perf_case(bytes=...) must be a callable taking the test's parameters by name")
    if not isinstance(seeds, int) or seeds < 3:
        raise ValueError(f"perf_case(seeds=...) must be an integer >= 3, got {seeds!r}")
    if max_ratio is not None and not (isinstance(max_ratio, int | float) and max_ratio > 0):
        raise ValueError(f"perf_case(max_ratio=...) must be a positive number, got {max_ratio!r}")
    _check_tolerance(tolerance, "perf_case tolerance")


def _decorator(case: PerfCase) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Turns the user's input factory into the test pytest collects: the factory's parameters plus the two
    the plugin fills, a body that hands the case to the runner, and the mark that carries the case."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(fn)
        clash = {VARIANT_ARG, RUNNER_ARG} & set(sig.parameters)
        if clash:
            raise TypeError(f"{fn.__name__}: parameter names {sorted(clash)} are reserved by perf_case")

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> None:
            __tracebackhide__ = True
            variant = kwargs.pop(VARIANT_ARG)
            runner = kwargs.pop(RUNNER_ARG)
            params = sig.bind_partial(*args, **kwargs).arguments
            runner.run(case, variant, lambda: fn(*args, **kwargs), dict(params))

        extra = [
            inspect.Parameter(VARIANT_ARG, inspect.Parameter.KEYWORD_ONLY),
            inspect.Parameter(RUNNER_ARG, inspect.Parameter.KEYWORD_ONLY),
        ]
        if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in sig.parameters.values()):
            raise TypeError(f"{fn.__name__}: a perf_case test takes named parameters only (no *args/**kwargs)")
        wrapper.__signature__ = sig.replace(parameters=[*sig.parameters.values(), *extra])  # type: ignore[attr-defined]
        del wrapper.__wrapped__  # pytest must see the new signature, not the factory's
        # the factory travels with the mark: the A/B gate calls a base revision's twin of it
        marked: Callable[..., Any] = getattr(pytest.mark, MARK_NAME)(case, factory=fn)(wrapper)
        return marked

    return decorate


def perf_case(
    *,
    variants: Mapping[str, Callable[..., Any] | Variant],
    reference: Callable[..., Any],
    against: Callable[..., Any] | None = None,
    tolerance: ToleranceTable | None = None,
    flops: Callable[..., float] | None = None,
    seeds: int = 3,
    max_ratio: float | None = None,
    clock: Clock | None = None,
    against_backend: Callable[..., str] | None = None,
    bytes: Callable[..., float] | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Guards every variant of a kernel: one test item per variant and parametrization.

    The decorated function makes one trial's inputs and returns `(args, kwargs)`; the plugin calls it
    again, under a fresh seed, for every correctness trial and every input copy used in timing.

    variants: name -> callable or `Variant`. reference: the correctness oracle, run on float64 copies.
    against: timed interleaved with each variant (the ratio gate). tolerance: dtype -> dict(atol, rtol,
    native_factor). flops: FLOP count from the test's parameters (by name), for TFLOP/s. seeds: number of
    correctness trials (at least 3). max_ratio: default ratio limit to `against`. clock: a nanosecond
    clock for the CPU timer, for testing the guard itself. against_backend: called with a case's inputs,
    names the implementation `against` dispatches to (e.g. SDPA's flash or cuDNN backend); it is stored
    with the baseline, and a change of it makes the baseline "not comparable". bytes: bytes moved per call
    from the test's parameters (by name), for GB/s; by default the sizes of the inputs and the output.
    A throughput above the GPU's peak fails the case (integrity.py).
    """
    normalized = _variants(variants)
    _check_arguments(
        reference=reference,
        against=against,
        against_backend=against_backend,
        flops=flops,
        bytes=bytes,
        seeds=seeds,
        max_ratio=max_ratio,
        tolerance=tolerance,
    )
    case = PerfCase(
        variants=normalized,
        reference=reference,
        against=against,
        tolerance=tolerance,
        flops=flops,
        seeds=seeds,
        max_ratio=max_ratio,
        clock=clock,
        against_backend=against_backend,
        bytes=bytes,
        against_name=getattr(against, "__name__", "against") if against is not None else "against",
    )
    return _decorator(case)


# The signature check runs before the body: unknown keywords get a message that lists the allowed ones.
_perf_case_impl = perf_case


def perf_case_checked(**kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    bound = _bind(**kwargs)
    return _perf_case_impl(**bound.arguments)


perf_case_checked.__doc__ = perf_case.__doc__
perf_case_checked.__signature__ = inspect.signature(perf_case)  # type: ignore[attr-defined]
