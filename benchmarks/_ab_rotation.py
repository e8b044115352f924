"""An experiment hook, not a setting: loaded with `-p benchmarks._ab_rotation` and AB_ROTATION=1, a plain A/B
run spreads its samples over the input copies as an update's processes do (MeasureConfig.spread_copies),
so that `benchmarks/ab_rotation.sh` can time A/A runs with and without the rotation on one host and compare
the per-process head/base offsets (benchmarks/results/two_gpu_h100_2026-11-26: cuda_scalar B8 H8 S256 read
+4.0% head/base in one process, a false alarm)."""

from __future__ import annotations

import os

import pytest


@pytest.hookimpl(trylast=True)  # after the plugin's configure has made the session state
def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("AB_ROTATION") == "1":
        from dataclasses import replace

        from pytest_perfguard.research import STATE

        state = config.stash[STATE]
        state.role = replace(state.role, update_process=True)
