"""The change-point detection of `perfguard history` on synthetic histories built from recorded H200 noise
(benchmarks/changepoints.py): planted steps and drifts are found where they were planted, pure noise stays
mostly clean."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.changepoints import CLASSES, block_pools, scenarios, simulate


@pytest.fixture(scope="module")
def device_pools() -> list[np.ndarray]:
    return block_pools(CLASSES["device"], np.random.default_rng(7), size=400)


@pytest.mark.parametrize(("name", "max_missed"), [("step +10%", 0), ("step +5%", 1), ("drift 10x +0.5%", 2)])
def test_planted_changes_are_found_where_they_were_planted(
    device_pools: list[np.ndarray], name: str, max_missed: int
) -> None:
    score = simulate(CLASSES["device"], scenarios()[name], n_series=40, seed=11, max_pvalue=1e-4, pools=device_pools)
    assert score.planted == 40
    assert score.missed <= max_missed, score
    assert score.false <= 2, score
    if name.startswith("step"):
        assert score.index_errors is not None and max(score.index_errors) <= 2


def test_pure_noise_is_mostly_clean(device_pools: list[np.ndarray]) -> None:
    score = simulate(CLASSES["device"], scenarios()["noise"], n_series=60, seed=12, max_pvalue=1e-4, pools=device_pools)
    assert score.false <= 1, score
