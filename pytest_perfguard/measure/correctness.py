"""The correctness gate: every variant, every run, several fresh seeds, against a float64 oracle.

The seeds' first lesson was that every kernel they had was silently wrong. So the gate is strict about
the ways kernels lie: unwritten output (the allocator is poisoned with NaN before the call), NaN or Inf
where the oracle is finite, inputs modified in place, a result of the wrong type, shape, dtype or
device, and errors larger than PyTorch's own native-precision path makes (FlashAttention's test rule:
at most twice that error, plus a small epsilon), with an absolute/relative backstop per dtype.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..record import Correctness

Inputs = tuple[tuple[Any, ...], dict[str, Any]]

# Backstop bounds (atol, rtol) per dtype. KernelBench uses 1e-2 for half precision; bf16 has 3 fewer
# mantissa bits than fp16, so its bound is wider. The FlashAttention rule below is the sharper test.
DEFAULT_TOLERANCE: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (2e-2, 2e-2),
    torch.float32: (1e-4, 1e-4),
    torch.float64: (1e-10, 1e-10),
}
FA_FACTOR = 2.0
FA_EPSILON = 1e-5


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    native_factor: float | None = FA_FACTOR  # None disables the native-precision (FlashAttention) bound


def resolve_tolerance(dtype: torch.dtype, overrides: Sequence[Mapping[Any, Mapping[str, float]] | None]) -> Tolerance:
    """Case-level then variant-level overrides on top of the defaults; later entries win."""
    atol, rtol = DEFAULT_TOLERANCE.get(dtype, (1e-5, 1e-5))
    factor: float | None = FA_FACTOR if dtype in (torch.float16, torch.bfloat16) else None
    for table in overrides:
        if not table or dtype not in table:
            continue
        entry = table[dtype]
        atol = float(entry.get("atol", atol))
        rtol = float(entry.get("rtol", rtol))
        if "native_factor" in entry:
            nf = entry["native_factor"]
            factor = None if nf is None else float(nf)
    return Tolerance(atol, rtol, factor)


@dataclass
class SeedReport:
    seed: int
    max_abs: float
    rel_fro: float
    worst_index: tuple[int, ...]
    native_max_abs: float | None
    call_s: float = 0.0  # wall time of the variant's call, synchronised


@dataclass
class Oracle:
    """What the float64 oracle said about one set of input values.

    The correctness gate keeps those of its first seeds, so that the timed-output check (copies.py) can
    judge outputs on the same values without computing the reference again: for a large case the reference
    is the most expensive part of that check (benchmarks/results/integrity_2026-11-23/README.md).
    """

    seed: int
    values: list[tuple[str, torch.Tensor]]  # untouched copies of the tensor inputs
    ref: torch.Tensor  # the reference on float64 copies, on the inputs' device
    native_dtype: torch.dtype | None  # the dtype of the reference run on the inputs as they are
    native_err: float | None  # that native-precision path's max error against `ref`, where `ref` is finite

    @functools.cached_property
    def finite(self) -> bool:
        """Every reference element is finite: the common case, judged without the non-finite bookkeeping."""
        return bool(torch.isfinite(self.ref).all())

    @functools.cached_property
    def ref_norm(self) -> float:
        """The reference's Frobenius norm over its finite elements."""
        r = self.ref
        return float(torch.linalg.vector_norm(r if self.finite else torch.where(torch.isfinite(r), r, 0.0)))

    @functools.cached_property
    def ref_abs_max(self) -> float:
        return float(self.ref.abs().max()) if self.ref.numel() else 0.0

    def fits(self, inputs: Inputs) -> bool:
        """The inputs have these names, shapes, dtypes and devices: these values could be copied into them."""
        return [(n, t.shape, t.dtype, t.device) for n, t in tensors_of(inputs)] == [
            (n, t.shape, t.dtype, t.device) for n, t in self.values
        ]

    def matches(self, inputs: Inputs) -> bool:
        """The inputs hold exactly these values (a factory that repeats its values for a seed)."""
        return self.fits(inputs) and all(
            torch.equal(a.detach(), b) for (_, a), (_, b) in zip(tensors_of(inputs), self.values, strict=True)
        )


@dataclass
class CorrectnessReport:
    passed: bool
    seeds: list[int]
    per_seed: list[SeedReport] = field(default_factory=list)
    message: str = ""
    dtype: str = ""
    oracles: list[Oracle] = field(default_factory=list, repr=False)  # the first `keep` seeds' (see `check`)

    @property
    def max_abs(self) -> float:
        return max((s.max_abs for s in self.per_seed), default=math.nan)

    @property
    def rel_fro(self) -> float:
        return max((s.rel_fro for s in self.per_seed), default=math.nan)

    def summary(self) -> Correctness:
        """What the record keeps of the gate: the worst error over the seeds and where it was."""
        worst = max(self.per_seed, key=lambda s: s.max_abs, default=None)
        return Correctness(
            passed=self.passed,
            seeds=list(self.seeds),
            dtype=self.dtype,
            max_abs=_finite_or_none(self.max_abs),
            rel_fro=_finite_or_none(self.rel_fro),
            worst_index=list(worst.worst_index) if worst else None,
            native_max_abs=_finite_or_none(worst.native_max_abs)
            if worst and worst.native_max_abs is not None
            else None,
            message=self.message,
        )


def _finite_or_none(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def tensors_of(inputs: Inputs) -> list[tuple[str, torch.Tensor]]:
    """The tensor inputs with their names (arg0, arg1, ..., or the keyword)."""
    args, kwargs = inputs
    out = [(f"arg{i}", a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    out += [(k, v) for k, v in kwargs.items() if isinstance(v, torch.Tensor)]
    return out


def _map_inputs(inputs: Inputs, fn: Callable[[torch.Tensor], torch.Tensor]) -> Inputs:
    args, kwargs = inputs
    return (
        tuple(fn(a) if isinstance(a, torch.Tensor) else a for a in args),
        {k: fn(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()},
    )


def _upcast(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(torch.float64) if t.is_floating_point() else t.detach().clone()


def poison_allocator(inputs: Inputs) -> None:
    """Leaves NaN bytes in the CUDA caching allocator's free blocks of the sizes the call is likely to ask for.

    A kernel that allocates its output and forgets to write part of it then returns NaN there, which the
    gate reports as unwritten output. 0xFF bytes are NaN in fp16, bf16, fp32 and fp64. The CPU allocator
    hands out fresh pages, so on CPU this is not possible and unwritten output may read as zero.
    """
    tensors = [t for _, t in tensors_of(inputs) if t.is_cuda]
    if not tensors:
        return
    sizes = sorted({t.numel() * t.element_size() for t in tensors})
    blocks = [torch.empty(n, dtype=torch.uint8, device=tensors[0].device).fill_(0xFF) for n in sizes for _ in range(2)]
    torch.cuda.synchronize(tensors[0].device)
    del blocks


_MANTISSA_BITS = {torch.float16: 10, torch.bfloat16: 7, torch.float32: 23, torch.float64: 52}


def _ulp(dtype: torch.dtype, magnitude: float) -> float:
    """The spacing of `dtype` numbers at `magnitude`."""
    if magnitude <= 0 or not math.isfinite(magnitude) or dtype not in _MANTISSA_BITS:
        return 0.0
    return float(2.0 ** (math.floor(math.log2(magnitude)) - _MANTISSA_BITS[dtype]))


def _index(flat_index: int, shape: Sequence[int]) -> tuple[int, ...]:
    idx: list[int] = []
    for dim in reversed(shape):
        idx.append(flat_index % dim if dim else 0)
        flat_index //= dim if dim else 1
    return tuple(reversed(idx))


def modified_input(before: Sequence[tuple[str, torch.Tensor]], after: Sequence[tuple[str, torch.Tensor]]) -> str | None:
    """The name of the first input whose values differ from its copy taken before the call, or None."""
    for (name, b), (_, a) in zip(before, after, strict=True):
        if b.shape != a.shape:
            return name
        # Equal as they are settles it without copies; only then are NaNs in the same places counted equal
        # (nan_to_num copies both tensors, 134 MB per input at B8 H16 S4096 in fp16).
        if not torch.equal(b, a.detach()) and not torch.equal(b.nan_to_num(), a.detach().nan_to_num()):
            return name
    return None


class CorrectnessFailure(AssertionError):
    """The variant computed the wrong thing; the message says how, with the seed to reproduce it."""


def check_once(
    fn: Callable[..., Any],
    reference: Callable[..., Any],
    make_inputs: Callable[[int], Inputs],
    seed: int,
    overrides: Sequence[Mapping[Any, Mapping[str, float]] | None],
    *,
    around: Callable[[Callable[[], Any]], Any] | None = None,
) -> tuple[SeedReport, Oracle]:
    """One seed: the variant's call (through `around`, when given) judged against the oracle."""
    inputs = make_inputs(seed)
    tensors = tensors_of(inputs)
    if not tensors:
        raise CorrectnessFailure("the test returned no tensor inputs: return ((q, k, v, ...), {kwargs})")
    untouched = [(name, t.detach().clone()) for name, t in tensors]
    upcast = _map_inputs(inputs, _upcast)
    device = tensors[0][1].device

    poison_allocator(inputs)
    t0 = time.monotonic()

    def call() -> Any:
        result = fn(*inputs[0], **inputs[1])
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return result

    out = call() if around is None else around(call)
    call_s = time.monotonic() - t0

    changed = modified_input(untouched, tensors)
    if changed:
        raise CorrectnessFailure(f"input {changed} was modified in place by the variant (seed {seed})")

    _plain_tensor(out, seed)
    oracle = oracle_of(inputs, reference, seed=seed, upcast=upcast, values=untouched)
    report = judge_output(out, inputs, reference, overrides, seed=seed, oracle=oracle)
    report.call_s = call_s
    return report, oracle


def _plain_tensor(out: Any, seed: int) -> None:
    if type(out) is not torch.Tensor:
        raise CorrectnessFailure(
            f"the variant returned {type(out).__name__}, expected a plain torch.Tensor (seed {seed})"
        )


def _reference_outputs(
    inputs: Inputs, reference: Callable[..., Any], upcast: Inputs | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The reference on float64 copies of `inputs` (as float64, on the inputs' device) and on clones of them
    as they are (None where that native path has no kernel or returns no tensor). Queued, never synchronised."""
    if upcast is None:
        upcast = _map_inputs(inputs, _upcast)
    device = tensors_of(inputs)[0][1].device
    ref = reference(*upcast[0], **upcast[1])
    if not isinstance(ref, torch.Tensor):
        raise CorrectnessFailure(f"the reference returned {type(ref).__name__}, expected a torch.Tensor")
    native: torch.Tensor | None
    try:
        native_out = reference(*_map_inputs(inputs, lambda t: t.detach().clone())[0], **inputs[1])
        native = native_out if isinstance(native_out, torch.Tensor) else None
    except Exception:  # some reference paths have no native half-precision kernel on some devices
        native = None
    return ref.detach().to(torch.float64).to(device), native


def screened(
    out: Any,
    inputs: Inputs,
    reference: Callable[..., Any],
    overrides: Sequence[Mapping[Any, Mapping[str, float]] | None],
    before: Sequence[tuple[str, torch.Tensor]],
) -> torch.Tensor | None:
    """judge_output's rules, and modified_input's against `before`, queued on the device with no
    synchronisation: a 0-dim bool tensor that is True only where both would pass, or None where the output is
    not one that could be judged there (not a plain tensor of the reference's shape, dtype and device; empty).
    Stricter than judge_output, never looser: every element finite in output and reference alike, the
    native-precision bound without its half ulp, the atol/rtol backstop, the inputs bit-equal. A False is
    only a reason to judge the output in full, which says what is wrong or passes it; the timed-copy check
    (copies.every_copy) reads all its copies' screens in one transfer instead of a dozen per copy."""
    if type(out) is not torch.Tensor or out.numel() == 0:
        return None
    tensors = tensors_of(inputs)
    floats = [t for _, t in tensors if t.is_floating_point()]
    device = tensors[0][1].device
    r, native = _reference_outputs(inputs, reference)
    expected = native.dtype if native is not None else (floats[0].dtype if floats else tensors[0][1].dtype)
    if tuple(out.shape) != tuple(r.shape) or out.dtype != expected or out.device != device:
        return None
    tol = resolve_tolerance(expected, overrides)
    native_on = tol.native_factor is not None and native is not None and tuple(native.shape) == tuple(r.shape)
    # Few operations, each a launch: `diff <= bound` is False where either side is NaN, and a finite `worst`
    # rules out an infinite one (an infinite reference has an infinite bound), so no separate finiteness test.
    checks: list[torch.Tensor] = []
    worst: torch.Tensor | None = None
    native_worst: torch.Tensor | None = None
    o_all, r_all = out.detach().reshape(-1), r.reshape(-1)
    n_all = native.detach().reshape(-1) if native_on and native is not None else None
    for start in range(0, r_all.numel(), JUDGE_CHUNK):
        o = o_all[start : start + JUDGE_CHUNK].to(torch.float64)
        ref = r_all[start : start + JUDGE_CHUNK]
        diff = (o - ref).abs_()  # `o` is the output itself where it is float64 already
        checks.append(diff.le(ref.abs().mul_(tol.rtol).add_(tol.atol)).all())
        worst = diff.max() if worst is None else torch.maximum(worst, diff.max())
        if n_all is not None:
            nd = (n_all[start : start + JUDGE_CHUNK].to(torch.float64) - ref).abs_().max()
            native_worst = nd if native_worst is None else torch.maximum(native_worst, nd)
    assert worst is not None  # out.numel() > 0 and r has out's shape
    checks.append(torch.isfinite(worst))
    if native_on and tol.native_factor is not None and native_worst is not None:
        # NaN in either maximum (a non-finite element) makes the comparison False: judged in full
        checks.append(worst <= tol.native_factor * native_worst + FA_EPSILON)
    for (_, b), (_, a) in zip(before, tensors, strict=True):
        if b.shape != a.shape:
            return None
        checks.append((b == a.detach()).all())
    return torch.stack(checks).all()


def oracle_of(
    inputs: Inputs,
    reference: Callable[..., Any],
    *,
    seed: int,
    upcast: Inputs | None = None,
    values: list[tuple[str, torch.Tensor]] | None = None,
) -> Oracle:
    """The reference on float64 copies of `inputs`, and the error of the reference run on them as they are."""
    tensors = tensors_of(inputs)
    device = tensors[0][1].device
    r, native = _reference_outputs(inputs, reference, upcast)
    native_err: float | None = None
    if native is not None and tuple(native.shape) == tuple(r.shape):
        nd = (native.detach().to(torch.float64).to(device) - r).abs()
        native_err = float(torch.where(torch.isfinite(r), nd, torch.zeros_like(nd)).max()) if nd.numel() else 0.0
    return Oracle(
        seed=seed,
        values=values if values is not None else [(name, t.detach().clone()) for name, t in tensors],
        ref=r,
        native_dtype=native.dtype if native is not None else None,
        native_err=native_err,
    )


def judge_output(
    out: Any,
    inputs: Inputs,
    reference: Callable[..., Any],
    overrides: Sequence[Mapping[Any, Mapping[str, float]] | None],
    *,
    seed: int,
    upcast: Inputs | None = None,
    oracle: Oracle | None = None,
) -> SeedReport:
    """Judges one output against the float64 oracle on `inputs`: type, shape, dtype, device, unwritten
    elements and the error bounds. The timed-output check (copies.py) reuses it on a replay's output,
    with the oracle the gate kept for those values (`oracle`), or a new one."""
    tensors = tensors_of(inputs)
    floats = [t for _, t in tensors if t.is_floating_point()]
    in_dtype = floats[0].dtype if floats else tensors[0][1].dtype
    device = tensors[0][1].device
    _plain_tensor(out, seed)
    if oracle is None:
        oracle = oracle_of(inputs, reference, seed=seed, upcast=upcast)
    expected_dtype = oracle.native_dtype if oracle.native_dtype is not None else in_dtype
    _same_form(out, oracle.ref, expected_dtype, device, seed)
    return _within_bounds(out, oracle, expected_dtype, overrides, seed)


def _same_form(
    out: torch.Tensor, ref: torch.Tensor, expected_dtype: torch.dtype, device: torch.device, seed: int
) -> None:
    """The output has the reference's shape, the expected dtype and the inputs' device: the errors are
    computed only on an output that could be the answer."""
    if tuple(out.shape) != tuple(ref.shape):
        raise CorrectnessFailure(f"output shape {tuple(out.shape)} != reference shape {tuple(ref.shape)} (seed {seed})")
    if out.dtype != expected_dtype:
        raise CorrectnessFailure(f"output dtype {out.dtype} != expected {expected_dtype} (seed {seed})")
    if out.device != device:
        raise CorrectnessFailure(f"output on {out.device}, inputs on {device} (seed {seed})")


def _within_bounds(
    out: torch.Tensor,
    oracle: Oracle,
    expected_dtype: torch.dtype,
    overrides: Sequence[Mapping[Any, Mapping[str, float]] | None],
    seed: int,
) -> SeedReport:
    """The output's errors against the oracle, judged in order: unwritten elements, a non-finite reference it
    does not equal, the native-precision bound, then the atol/rtol backstop. The first that fails raises."""
    ref = oracle.ref
    tol = resolve_tolerance(expected_dtype, overrides)
    e = _errors(out.detach(), ref, oracle.finite, tol)
    if e.unwritten:
        raise CorrectnessFailure(
            f"{e.unwritten} of {ref.numel()} output elements are NaN/Inf where the reference is finite, first at "
            f"index {_index(e.first_unwritten, ref.shape)} (seed {seed}): unwritten output or overflow"
        )
    if e.first_mismatch is not None:
        first = _index(e.first_mismatch, ref.shape)
        raise CorrectnessFailure(f"reference is non-finite at {first} but the output differs there (seed {seed})")
    max_abs, worst = e.max_abs, _index(e.worst, ref.shape)
    ref_norm = oracle.ref_norm
    rel_fro = math.sqrt(e.sum_sq) / ref_norm if ref_norm > 0 else (0.0 if max_abs == 0 else math.inf)
    native_err = oracle.native_err
    detail = (
        f"max abs error {max_abs:.3g} at index {worst} (output {e.out_at_worst:.6g}, reference "
        f"{e.ref_at_worst:.6g}), relative Frobenius error {rel_fro:.3g}"
    )
    if tol.native_factor is not None and native_err is not None:
        # Both paths round their outputs independently, so half an ulp of the output dtype at the largest
        # reference magnitude is added: without it, a seed on which the native path happens to round well
        # fails a correct bf16 kernel by a fraction of an ulp (seen on an H200 for the matmul-softmax-matmul path).
        bound = tol.native_factor * native_err + FA_EPSILON + 0.5 * _ulp(expected_dtype, oracle.ref_abs_max)
        if max_abs > bound:
            raise CorrectnessFailure(
                f"native-precision bound failed (seed {seed}): {detail} > {tol.native_factor:g} x the native "
                f"{expected_dtype} path's error {native_err:.3g} + {FA_EPSILON:g} + half an output ulp = {bound:.3g}"
            )
    if e.over:
        raise CorrectnessFailure(
            f"atol/rtol bound failed (seed {seed}): {e.over} of {ref.numel()} elements exceed atol={tol.atol:g} + "
            f"rtol={tol.rtol:g} x |reference|; {detail}"
        )
    return SeedReport(seed, max_abs, rel_fro, worst, native_err)


# Elements judged per step. The output is compared in float64 in slices of this many elements, so that no
# temporary is larger than 32 MB: the whole-output way made five float64 temporaries of 268 MB each at
# B8 H16 S4096, over a gigabyte beside the oracles on a 24 GB L4. (The timed-output check's 19-28 ms there on
# H100s was not this: it is one driver allocation after the measurement, benchmarks/results/integrity_2026-11-23.)
JUDGE_CHUNK = 1 << 22


@dataclass
class _Errors:
    unwritten: int = 0  # NaN/Inf output elements where the reference is finite
    first_unwritten: int = 0  # flat index
    first_mismatch: int | None = None  # a non-finite reference element that the output does not equal
    max_abs: float = 0.0
    worst: int = 0  # flat index of max_abs
    out_at_worst: float = 0.0
    ref_at_worst: float = 0.0
    sum_sq: float = 0.0  # of the errors over finite reference elements
    over: int = 0  # elements beyond atol + rtol * |reference|


def _errors(out: torch.Tensor, ref: torch.Tensor, finite: bool, tol: Tolerance) -> _Errors:
    """The output's errors against the float64 reference (same shape), slice by slice (JUDGE_CHUNK)."""
    e = _Errors()
    o_all, r_all = out.reshape(-1), ref.reshape(-1)
    sums = torch.zeros(2, dtype=torch.float64, device=ref.device)  # squared errors, elements over: read once
    best = (-1.0, 0)
    for start in range(0, r_all.numel(), JUDGE_CHUNK):
        o = o_all[start : start + JUDGE_CHUNK].to(torch.float64)
        r = r_all[start : start + JUDGE_CHUNK]
        ref_finite = None if finite else torch.isfinite(r)
        bad = ~torch.isfinite(o) if ref_finite is None else ~torch.isfinite(o) & ref_finite
        if bool(bad.any()):
            if not e.unwritten:
                e.first_unwritten = start + int(torch.nonzero(bad)[0])
            e.unwritten += int(bad.sum())
            continue
        if ref_finite is None:
            diff = (o - r).abs_()
        else:
            mismatch = ~ref_finite & ~((torch.isnan(o) & torch.isnan(r)) | (o == r))
            if e.first_mismatch is None and bool(mismatch.any()):
                e.first_mismatch = start + int(torch.nonzero(mismatch)[0])
            diff = torch.where(ref_finite, (o - r).abs(), 0.0)
        i = int(torch.argmax(diff))
        if float(diff[i]) > best[0]:
            best = (float(diff[i]), start + i)
            e.out_at_worst, e.ref_at_worst = float(o[i]), float(r[i])
        sums[0] += diff.square().sum()
        over = diff > r.abs().mul_(tol.rtol).add_(tol.atol)
        sums[1] += (over if ref_finite is None else over & ref_finite).sum()
    if e.unwritten or e.first_mismatch is not None:
        return e
    e.max_abs, e.worst = max(best[0], 0.0), best[1]
    sum_sq, over_count = sums.tolist()
    e.sum_sq, e.over = sum_sq, int(over_count)
    return e


def check(
    fn: Callable[..., Any],
    reference: Callable[..., Any],
    make_inputs: Callable[[int], Inputs],
    seeds: Sequence[int],
    overrides: Sequence[Mapping[Any, Mapping[str, float]] | None] = (),
    *,
    keep: int = 0,
    around_last: Callable[[Callable[[], Any]], Any] | None = None,
) -> CorrectnessReport:
    """Runs the gate for every seed; stops at the first failing seed and says which one it was.

    `keep`: how many of the first seeds' oracles (input values and reference) the report keeps for later
    checks. `around_last` wraps the variant's call on the last seed, by then warm (the silent-fallback check
    profiles it)."""
    report = CorrectnessReport(passed=True, seeds=list(seeds))
    for i, seed in enumerate(seeds):
        around = around_last if i == len(seeds) - 1 else None
        try:
            one, oracle = check_once(fn, reference, make_inputs, seed, overrides, around=around)
        except CorrectnessFailure as exc:
            report.passed = False
            report.message = f"{exc}. Seeds drawn for this run: {list(seeds)}; reproduce with --perfguard-seed={seed}"
            report.oracles.clear()
            break
        report.per_seed.append(one)
        if i < keep:
            report.oracles.append(oracle)
    return report
