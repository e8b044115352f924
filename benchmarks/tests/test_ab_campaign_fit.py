"""The package's per-process offset fit against the rule the campaign fitted the built-in values by
(benchmarks/ab_campaign.py)."""

from __future__ import annotations

import math
import random

import pytest

from benchmarks.ab_campaign import process_offset
from pytest_perfguard.research import fit_process_offset
from tests.unit.test_ab_offset import Z975, readings


def test_unclipped_it_is_the_campaigns_root_mean_square_fit() -> None:
    """With the clip out of reach the fit is the rule the built-in value was fitted by (benchmarks/ab_campaign.py)."""
    rows = readings(random.Random(6), 300, 0.002)
    as_records = [
        {
            "median_ns": 50_000.0,
            "gates": [{"gate": "ab", "estimate": math.exp(e), "ci": [math.exp(e - Z975 * s), math.exp(e + Z975 * s)]}],
        }
        for e, s in rows
    ]
    campaign = process_offset(as_records)
    fit = fit_process_offset(rows, clip=50.0)
    assert campaign is not None and fit is not None
    assert fit.fit == pytest.approx(campaign, rel=1e-6)
