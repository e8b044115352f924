"""A planted slowdown inside the kernel table, for the stored-baseline proof on a GPU (fresh_hosts_gpu.sh).

Imported by ``kernels`` when PLANT_VARIANTS is set: each named variant runs, then a GPU spin
(``torch.cuda._sleep``) of PLANT_X times its own time on the same stream. The spin is calibrated per shape on
the first eager call: the kernel's time by CUDA events, the spin's cycles per ms measured on this GPU. The
plant is a real slowdown of the code the guard times, not an edited baseline; its realised size includes the
launch gap of one extra kernel, so it is at least PLANT_X.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from typing import Any

import torch

_calibrated: dict[Any, int] = {}
_cycles_per_ms: dict[torch.device, float] = {}


def _ms(fn: Callable[[], Any], reps: int = 20, inner: int = 5) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(reps):
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) / inner)
    return statistics.median(out)


def planted(fn: Callable[..., torch.Tensor], x: float) -> Callable[..., torch.Tensor]:
    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        out = fn(q, k, v, causal)
        key = (tuple(q.shape), q.dtype, bool(causal), q.device)
        cycles = _calibrated.get(key)
        if cycles is None:
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError("plant: first call inside a graph capture, no calibration")
            if q.device not in _cycles_per_ms:
                _ms(lambda: torch.cuda._sleep(1000))
                _cycles_per_ms[q.device] = 400_000 / _ms(lambda: torch.cuda._sleep(400_000))
            _ms(lambda: fn(q, k, v, causal), reps=5)
            own = _ms(lambda: fn(q, k, v, causal))
            cycles = _calibrated[key] = max(1, int(x * own * _cycles_per_ms[q.device]))
        torch.cuda._sleep(cycles)
        return out

    run.__name__ = getattr(fn, "__name__", "planted")
    return run


def plant(kernels: dict[str, Callable[..., torch.Tensor]]) -> None:
    """Wrap the variants PLANT_VARIANTS names (comma-separated) with a PLANT_X slowdown (default 0.05)."""
    x = float(os.environ.get("PLANT_X", "0.05"))
    for name in os.environ["PLANT_VARIANTS"].split(","):
        kernels[name] = planted(kernels[name], x)
