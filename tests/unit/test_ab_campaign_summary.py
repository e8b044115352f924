"""The A/B campaign's re-judging of recorded A/A noise (benchmarks/ab_campaign.py), on records built here."""

from __future__ import annotations

import random

from benchmarks.ab_campaign import caught_at_promise


def record(ns: float, spread: float, n: int = 60, seed: int = 1) -> dict[str, object]:
    rng = random.Random(seed)
    return {"median_ns": ns, "ab": {"group_ratios": [1.0 + rng.gauss(0.0, spread) for _ in range(n)]}}


def test_a_shift_by_the_promise_is_caught_where_the_noise_allows_it() -> None:
    # Tight A/A noise: +2% (20 us and up) and +3% (below) clear their 1.0% and 1.5% margins.
    assert caught_at_promise(record(50_000, 0.002), family_size=98) is True
    assert caught_at_promise(record(8_000, 0.003), family_size=98) is True
    # Placement noise of 3% per capture group: the same shift straddles the margin.
    assert caught_at_promise(record(50_000, 0.03), family_size=98) is False
    # Just under 20 us is a small case: +3% judged against the 1.5% margin.
    assert caught_at_promise(record(19_999, 0.004), family_size=98) is True
    assert caught_at_promise({"median_ns": 1.0}, family_size=1) is None
