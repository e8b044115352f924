"""pytest-perfguard: keep GPU kernels correct and fast.

`@perf_case` turns one test into one item per kernel variant; every item is checked against a float64
oracle, and with `--perfguard` timed interleaved with a reference and judged against a stored baseline.
Names are loaded lazily so that the `perfguard` command starts without importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .marker import Variant
    from .marker import perf_case_checked as perf_case
    from .measure.timers import CpuTimer
    from .measure.timing import MeasureConfig, measure

__all__ = ["CpuTimer", "MeasureConfig", "Variant", "measure", "perf_case"]
__version__ = "0.1.0"

_LAZY = {
    "Variant": ("marker", "Variant"),
    "perf_case": ("marker", "perf_case_checked"),
    "CpuTimer": ("measure.timers", "CpuTimer"),
    "MeasureConfig": ("measure.timing", "MeasureConfig"),
    "measure": ("measure.timing", "measure"),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'pytest_perfguard' has no attribute {name!r}")
    import importlib

    module, attr = _LAZY[name]
    return getattr(importlib.import_module(f".{module}", __name__), attr)
