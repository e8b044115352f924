"""What one case computes: its inputs, their canonical description and hash, the seeds, and the `Trial`
that every step after the correctness gate works on. Nothing here times or judges.
"""

from __future__ import annotations

import hashlib
import inspect
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..marker import PerfCase, Variant
from ..measure import integrity
from ..measure.correctness import Inputs, Oracle
from ..measure.timers import Call


def normalize_inputs(value: Any, test_name: str) -> Inputs:
    """The test function's return value as (args, kwargs), or a TypeError that shows the form wanted."""
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


def tensor_bytes(value: object) -> int:
    return value.numel() * value.element_size() if isinstance(value, torch.Tensor) else 0


def draw_seeds(n: int, fixed: int | None) -> list[int]:
    """`n` seeds: consecutive from `fixed` (--perfguard-seed), else drawn from the OS's randomness."""
    if fixed is not None:
        return [fixed + i for i in range(n)]
    sysrand = random.SystemRandom()
    return [sysrand.randrange(1, 2**31 - 1) for _ in range(n)]


def count(what: str, fn: Callable[..., float] | None, params: dict[str, Any]) -> float | None:
    """The case's `flops` or `bytes` callable applied to the test parameters it names."""
    if fn is None:
        return None
    names = inspect.signature(fn).parameters
    try:
        return float(fn(**{k: params[k] for k in names if k in params}))
    except Exception as exc:
        raise TypeError(f"{what} callable failed with the test parameters {sorted(params)}: {exc}") from exc


def finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


class CopyCalls:
    """Makes the call of one function on input copy i, and keeps every copy it made (`inputs`)."""

    def __init__(
        self, fn: Callable[..., Any], first: Inputs, make_inputs: Callable[[int], Inputs], base_seed: int
    ) -> None:
        self.fn = fn
        self.inputs: dict[int, Inputs] = {0: first}
        self._make_inputs = make_inputs
        self._base_seed = base_seed

    def __call__(self, i: int) -> Call:
        if i not in self.inputs:
            self.inputs[i] = self._make_inputs(self._base_seed + i)
        args, kwargs = self.inputs[i]
        fn = self.fn
        return lambda: fn(*args, **kwargs)


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
    timed: CopyCalls | None = None  # the variant's input copies as its last measurement timed them

    def calls(self, fn: Callable[..., Any]) -> CopyCalls:
        """Input copy i -> a call of `fn` on it. Every side of a measurement draws its copies from the same
        seeds (copy 0 is the correctness gate's first input), so the per-block ratios compare like with like.
        The copies are kept on the returned object (`inputs`): the integrity checks refill and check each one."""
        return CopyCalls(fn, self.first, self.make_inputs, self.seeds[0] + 10_007)

    @property
    def max_ratio(self) -> float | None:
        """The variant's own max_ratio, else its case's: the ratio gate that decides in every mode."""
        return self.variant.max_ratio if self.variant.max_ratio is not None else self.case.max_ratio

    @property
    def flops(self) -> float | None:
        return count("flops", self.case.flops, self.params)
