"""The statistics against known tables, brute force and real H200 noise (tests/data), deterministically."""

from __future__ import annotations

import itertools
import json
import lzma
import math
from pathlib import Path

import numpy as np
import pytest

from pytest_perfguard.judge.stats import (
    Interval,
    combine_difference,
    hodges_lehmann,
    log_interval,
    normal_quantile,
    normal_sf,
    one_sided_p_above,
    relative_half_width,
    signed_rank_critical,
    walsh_averages,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "h200_attention_timing_samples.json.xz"

# Two-sided 0.05 critical values of the Wilcoxon signed-rank statistic (reject when T <= c), as printed in
# the standard tables (e.g. Siegel & Castellan, Table J); n = 5 has none.
TABLE_TWO_SIDED_05 = {
    6: 0,
    7: 2,
    8: 3,
    9: 5,
    10: 8,
    11: 10,
    12: 13,
    13: 17,
    14: 21,
    15: 25,
    16: 29,
    17: 34,
    18: 40,
    19: 46,
    20: 52,
    25: 89,
    30: 137,
}


@pytest.fixture(scope="module")
def block_medians() -> dict[tuple[str, str], np.ndarray]:
    """Median of each recorded block (30 per case and kernel), in microseconds."""
    raw = json.loads(lzma.decompress(DATA.read_bytes()))
    return {
        (case, kernel): np.median(np.asarray(blocks, dtype=np.float64), axis=1)
        for case, kernels in raw["cases"].items()
        for kernel, blocks in kernels.items()
    }


def _exact_cdf_by_enumeration(n: int) -> list[float]:
    """P(T <= t) by listing all 2**n sign patterns: slow, obviously right, for small n only."""
    counts = [0] * (n * (n + 1) // 2 + 1)
    for signs in itertools.product((0, 1), repeat=n):
        counts[sum(rank for rank, s in zip(range(1, n + 1), signs, strict=True) if s)] += 1
    return list(itertools.accumulate(c / 2**n for c in counts))


# ------------------------------------------------------------------------------------ critical values


@pytest.mark.parametrize(("n", "expected"), sorted(TABLE_TWO_SIDED_05.items()))
def test_signed_rank_critical_matches_the_printed_table(n: int, expected: int) -> None:
    assert signed_rank_critical(n, 0.025) == expected


def test_signed_rank_critical_named_values() -> None:
    assert signed_rank_critical(10, 0.025) == 8
    assert signed_rank_critical(20, 0.025) == 52


@pytest.mark.parametrize("n", [5, 8, 11])
def test_signed_rank_critical_agrees_with_enumeration(n: int) -> None:
    cdf = _exact_cdf_by_enumeration(n)
    for alpha in (0.005, 0.025, 0.05, 0.1):
        c = signed_rank_critical(n, alpha)
        assert c == max((t for t, p in enumerate(cdf) if p <= alpha), default=-1)


def test_too_few_observations_have_no_critical_value() -> None:
    assert signed_rank_critical(5, 0.025) == -1  # even T = 0 has probability 1/32 > 0.025
    assert signed_rank_critical(0, 0.025) == -1
    assert signed_rank_critical(6, 0.025) == 0  # 1/64 <= 0.025


def test_normal_approximation_continues_the_exact_values() -> None:
    """Above the exact range the normal approximation is used; it must not jump away from the exact value."""
    exact_60 = signed_rank_critical(60, 0.025)
    approx_61 = signed_rank_critical(61, 0.025)
    assert exact_60 < approx_61 < exact_60 + 2 * 61  # monotone, and near (each step adds about n/2)
    # Large-n value against the textbook formula n(n+1)/4 - z sqrt(n(n+1)(2n+1)/24), within rounding.
    n = 200
    mean = n * (n + 1) / 4
    sd = math.sqrt(n * (n + 1) * (2 * n + 1) / 24)
    assert abs(signed_rank_critical(n, 0.025) - (mean - 1.959964 * sd)) <= 1.5


# ------------------------------------------------------------------------------------ Hodges-Lehmann


def test_walsh_averages_are_all_pairwise_means_sorted() -> None:
    x = [3.0, 1.0, 2.0]
    assert walsh_averages(x).tolist() == [1.0, 1.5, 2.0, 2.0, 2.5, 3.0]


def test_hodges_lehmann_estimate_is_the_median_of_walsh_averages() -> None:
    rng = np.random.default_rng(7)
    for n in (1, 2, 7, 12, 31):
        x = rng.lognormal(0.0, 0.3, size=n)
        pairs = [(x[i] + x[j]) / 2 for i, j in itertools.combinations_with_replacement(range(n), 2)]
        assert hodges_lehmann(x).estimate == pytest.approx(float(np.median(pairs)), rel=1e-12)


def test_interval_bounds_are_the_walsh_averages_at_the_critical_rank() -> None:
    rng = np.random.default_rng(11)
    x = rng.normal(size=20)
    w = walsh_averages(x)
    iv = hodges_lehmann(x, 0.95)
    assert (iv.lo, iv.hi) == (w[52], w[w.size - 1 - 52])
    assert iv.n == 20 and iv.confidence == 0.95
    assert iv.lo <= iv.estimate <= iv.hi


def test_higher_confidence_gives_a_wider_interval() -> None:
    x = np.random.default_rng(3).normal(size=24)
    narrow, wide = hodges_lehmann(x, 0.90), hodges_lehmann(x, 0.995)
    assert wide.lo <= narrow.lo and wide.hi >= narrow.hi
    assert wide.half_width > narrow.half_width


@pytest.mark.parametrize("n", [1, 2, 5])
def test_too_few_observations_give_an_infinite_interval(n: int) -> None:
    iv = hodges_lehmann(np.arange(1.0, n + 1.0), 0.95)
    assert iv.lo == -math.inf and iv.hi == math.inf
    assert math.isfinite(iv.estimate)
    assert relative_half_width(iv) == math.inf


def test_six_observations_give_the_extreme_walsh_averages() -> None:
    iv = hodges_lehmann([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 0.95)
    assert (iv.lo, iv.hi) == (1.0, 6.0)


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError):
        hodges_lehmann([])
    with pytest.raises(ValueError):
        hodges_lehmann([1.0, math.nan])
    with pytest.raises(ValueError):
        log_interval([1.0, 0.0, 2.0])
    with pytest.raises(ValueError):
        log_interval([1.0, -2.0])


def test_log_interval_is_the_interval_of_the_logs() -> None:
    x = np.random.default_rng(5).lognormal(2.0, 0.1, size=15)
    a, b = log_interval(x), hodges_lehmann(np.log(x))
    assert (a.estimate, a.lo, a.hi) == (b.estimate, b.lo, b.hi)
    r = a.exp()
    assert r.lo < r.estimate < r.hi
    assert r.estimate == pytest.approx(math.exp(b.estimate))


def test_coverage_on_symmetric_noise_is_nominal() -> None:
    rng = np.random.default_rng(2026)
    hits = sum(
        (lambda iv: iv.lo <= 0.0 <= iv.hi)(hodges_lehmann(rng.standard_t(5, size=12), 0.95)) for _ in range(2000)
    )
    assert 0.93 <= hits / 2000 <= 0.975  # exact method: 1 - 2 * P(T <= 13) = 0.9575 for n = 12


# ---------------------------------------------------------------------------------- on real H200 noise


def test_log_median_interval_covers_the_full_data_value_on_h200_noise(
    block_medians: dict[tuple[str, str], np.ndarray],
) -> None:
    """Resample 12 block medians (an engine's minimum) with replacement; the 95% interval should cover
    the value from all 30 blocks about 95% of the time, and never much less than 90%."""
    rng = np.random.default_rng(20261121)
    resamples = 200
    rates: dict[tuple[str, str], float] = {}
    for key, med in block_medians.items():
        truth = hodges_lehmann(np.log(med)).estimate
        hits = 0
        for _ in range(resamples):
            iv = log_interval(rng.choice(med, size=12, replace=True), 0.95)
            hits += iv.lo <= truth <= iv.hi
        rates[key] = hits / resamples
    pooled = sum(rates.values()) / len(rates)
    assert pooled >= 0.92, rates
    assert min(rates.values()) >= 0.85, rates  # the drifting launch-bound series are the hardest
    device_like = [r for (case, kernel), r in rates.items() if kernel == "sdpa_l2flush"]
    assert min(device_like) >= 0.90, rates


def test_paired_ratio_interval_covers_on_h200_noise(block_medians: dict[tuple[str, str], np.ndarray]) -> None:
    """Per-block naive/SDPA ratios (recorded side by side) resampled in pairs, as the ratio gate uses them."""
    rng = np.random.default_rng(7)
    rates = []
    for case in sorted({c for c, _ in block_medians}):
        ratios = block_medians[(case, "naive")] / block_medians[(case, "sdpa_l2flush")]
        truth = hodges_lehmann(np.log(ratios)).estimate
        hits = 0
        for _ in range(200):
            iv = log_interval(rng.choice(ratios, size=12, replace=True), 0.95)
            hits += iv.lo <= truth <= iv.hi
        rates.append(hits / 200)
    assert sum(rates) / len(rates) >= 0.90, rates


def test_h200_device_noise_gives_a_narrow_interval_from_twelve_blocks(
    block_medians: dict[tuple[str, str], np.ndarray],
) -> None:
    """With the queue busy (L2 flushed before each launch) 12 blocks pin the time to well under 1%."""
    for (case, kernel), med in block_medians.items():
        if kernel == "sdpa_l2flush":
            assert relative_half_width(log_interval(med[:12])) < 0.005, case


# ---------------------------------------------------------------------------- combining and reporting


def test_combine_difference_adds_half_widths_in_quadrature() -> None:
    a = Interval(estimate=0.05, lo=0.02, hi=0.09, confidence=0.95, n=20)
    d = combine_difference(a, 0.01, 0.04)
    assert d.estimate == pytest.approx(0.04)
    assert d.estimate - d.lo == pytest.approx(math.hypot(0.03, 0.04))  # 0.05: asymmetric sides kept apart
    assert d.hi - d.estimate == pytest.approx(math.hypot(0.04, 0.04))
    assert (d.confidence, d.n) == (0.95, 20)


def test_combine_difference_with_an_exact_stored_value_shifts_the_interval() -> None:
    a = Interval(estimate=1.0, lo=0.9, hi=1.2, confidence=0.9, n=12)
    d = combine_difference(a, 0.25, 0.0)
    assert (d.estimate, d.lo, d.hi) == pytest.approx((0.75, 0.65, 0.95))


def test_combine_difference_keeps_an_infinite_interval_infinite() -> None:
    a = hodges_lehmann([1.0, 2.0, 3.0])
    d = combine_difference(a, 0.0, 0.01)
    assert d.lo == -math.inf and d.hi == math.inf


def test_relative_half_width_is_expm1_of_the_larger_side() -> None:
    iv = Interval(estimate=0.0, lo=-0.01, hi=0.03, confidence=0.95, n=12)
    assert iv.half_width == pytest.approx(0.03)
    assert relative_half_width(iv) == pytest.approx(math.expm1(0.03))
    assert relative_half_width(Interval(0.0, 0.0, 0.0, 0.95, 12)) == 0.0


def test_interval_exp_and_scaled() -> None:
    iv = Interval(estimate=math.log(2.0), lo=math.log(1.5), hi=math.log(3.0), confidence=0.95, n=10)
    r = iv.exp()
    assert (r.estimate, r.lo, r.hi) == pytest.approx((2.0, 1.5, 3.0))
    s = r.scaled(1e3)
    assert (s.estimate, s.lo, s.hi, s.n) == pytest.approx((2000.0, 1500.0, 3000.0, 10))


def test_one_sided_p_orders_by_distance_beyond_the_threshold() -> None:
    near = Interval(0.025, 0.015, 0.035, 0.95, 20)
    far = Interval(0.06, 0.05, 0.07, 0.95, 20)
    below = Interval(0.0, -0.01, 0.01, 0.95, 20)
    tau = math.log(1.02)
    assert one_sided_p_above(far, tau) < one_sided_p_above(near, tau) < 0.5 < one_sided_p_above(below, tau)
    assert one_sided_p_above(hodges_lehmann([1.0, 2.0]), tau) == 1.0


def test_normal_quantile_and_tail_match_the_tables() -> None:
    """The standard normal's quantiles and upper tail, against printed values (Abramowitz & Stegun 26.2),
    and far out in the tail, where 1 - CDF would round to 0."""
    assert normal_quantile(0.975) == pytest.approx(1.959963984540054, rel=1e-14)
    assert normal_quantile(0.95) == pytest.approx(1.6448536269514722, rel=1e-14)
    assert normal_quantile(0.5) == 0.0
    assert normal_quantile(0.025) == pytest.approx(-normal_quantile(0.975), rel=1e-14)
    assert normal_sf(1.0) == pytest.approx(0.15865525393145707, rel=1e-14)
    assert normal_sf(-3.0) == pytest.approx(0.9986501019683699, rel=1e-14)
    assert normal_sf(8.0) == pytest.approx(6.22096057427174e-16, rel=1e-12)
    assert normal_sf(normal_quantile(0.999)) == pytest.approx(0.001, rel=1e-12)
