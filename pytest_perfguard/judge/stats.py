"""Estimators and confidence intervals for timing data.

Timings are skewed, heavy-tailed and correlated within a block, so the plugin keeps one figure per block
(a median) and works on their logarithms: a ratio becomes a difference and a relative half-width a plain
one. The centre is the Hodges-Lehmann estimate (the median of the Walsh averages) and its interval comes
from the Wilcoxon signed-rank distribution: distribution-free, needing only symmetry of the log block
medians, which holds far better than normality of raw launches.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

import numpy as np
import numpy.typing as npt

# Above this many blocks the exact signed-rank distribution is replaced by its normal approximation.
_EXACT_MAX_N = 60

# The standard normal from the standard library: scipy.stats would add seconds to the start of every
# process that loads the plugin (xdist workers, fresh confirmation processes) for two functions.
_NORMAL = NormalDist()


def normal_quantile(p: float) -> float:
    """The standard normal's quantile function (its inverse CDF) at ``p`` in (0, 1)."""
    return _NORMAL.inv_cdf(p)


def normal_sf(x: float) -> float:
    """P(Z > x) for a standard normal Z, exact in the far tail (1 - CDF would round to 0 there)."""
    return 0.5 * math.erfc(x / math.sqrt(2.0))


def t_cdf(x: float, df: int) -> float:
    """P(T <= x) for Student's t with an integer number of degrees of freedom (Abramowitz and Stegun
    26.7.3-4: a finite series in cos(theta), exact for integer df)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be at least 1, got {df}")
    theta = math.atan(abs(x) / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2:  # odd
        series, term = 0.0, 1.0
        if df > 1:
            series = 1.0
            for j in range(1, (df - 3) // 2 + 1):
                term *= c2 * (2 * j) / (2 * j + 1)
                series += term
            series *= math.sin(theta) * math.cos(theta)
        a = 2.0 / math.pi * (theta + series)
    else:
        series, term = 1.0, 1.0
        for j in range(1, (df - 2) // 2 + 1):
            term *= c2 * (2 * j - 1) / (2 * j)
            series += term
        a = math.sin(theta) * series
    half = 0.5 * min(1.0, max(0.0, a))
    return 0.5 + half if x >= 0 else 0.5 - half


@lru_cache(maxsize=256)
def t_quantile(p: float, df: int) -> float:
    """Student's t quantile at ``p`` in (0, 1), by bisection on t_cdf (no scipy at run time: see above)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be between 0 and 1, got {p}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def chi2_quantile(p: float, df: float) -> float:
    """The chi-square quantile at ``p`` in (0, 1) for ``df`` > 0 degrees of freedom (not only whole ones), by
    the Wilson-Hilferty cube-root approximation (no scipy at run time: see above): within 0.3% of the exact
    value for p from 0.05 to 0.99 from df = 10 on, where the offset fit uses it; far off in the lower tail of a
    few degrees of freedom (34% low at p = 0.01, df = 3)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be between 0 and 1, got {p}")
    if not df > 0:
        raise ValueError(f"degrees of freedom must be positive, got {df}")
    a = 2.0 / (9.0 * df)
    return df * max(0.0, 1.0 - a + normal_quantile(p) * math.sqrt(a)) ** 3


@dataclass(frozen=True)
class Interval:
    """A point estimate with a two-sided confidence interval, all on the same scale."""

    estimate: float
    lo: float
    hi: float
    confidence: float
    n: int

    @property
    def half_width(self) -> float:
        """The larger of the two distances from the estimate to a bound (intervals need not be symmetric)."""
        return max(self.estimate - self.lo, self.hi - self.estimate)

    def exp(self) -> Interval:
        """Maps a log-scale interval back to the ratio scale."""
        return Interval(math.exp(self.estimate), math.exp(self.lo), math.exp(self.hi), self.confidence, self.n)

    def scaled(self, factor: float) -> Interval:
        return Interval(self.estimate * factor, self.lo * factor, self.hi * factor, self.confidence, self.n)


@lru_cache(maxsize=256)
def _signed_rank_cdf(n: int) -> tuple[float, ...]:
    """Exact null CDF of the Wilcoxon signed-rank statistic for n untied observations."""
    total = n * (n + 1) // 2
    counts = np.zeros(total + 1, dtype=np.float64)
    counts[0] = 1.0
    for k in range(1, n + 1):
        shifted = np.zeros_like(counts)
        shifted[k:] = counts[:-k] if k <= total else 0.0
        counts += shifted
    cdf = np.cumsum(counts) / 2.0**n
    return tuple(float(c) for c in cdf)


def signed_rank_critical(n: int, alpha_one_sided: float) -> int:
    """Largest c with P(T <= c) <= alpha under H0, or -1 when even c = 0 is too likely (n too small)."""
    if n <= 0:
        return -1
    if n <= _EXACT_MAX_N:
        cdf = _signed_rank_cdf(n)
        c = -1
        for value, p in enumerate(cdf):
            if p <= alpha_one_sided:
                c = value
            else:
                break
        return c
    total = n * (n + 1) / 2.0
    sd = math.sqrt(n * (n + 1) * (2 * n + 1) / 24.0)
    z = normal_quantile(1.0 - alpha_one_sided)
    return max(-1, math.floor(total / 2.0 - z * sd - 0.5))


def walsh_averages(x: Sequence[float] | npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """All pairwise means (x_i + x_j) / 2 for i <= j, sorted."""
    a = np.asarray(x, dtype=np.float64)
    i, j = np.triu_indices(a.size)
    return np.sort((a[i] + a[j]) / 2.0)


def hodges_lehmann(x: Sequence[float] | npt.NDArray[np.float64], confidence: float = 0.95) -> Interval:
    """Hodges-Lehmann estimate with the Wilcoxon signed-rank interval.

    With too few observations for the requested confidence the interval is the whole real line, so a
    caller that demands a narrow interval keeps measuring instead of trusting a degenerate one.
    """
    a = np.asarray(x, dtype=np.float64)
    if a.size == 0:
        raise ValueError("hodges_lehmann needs at least one observation")
    if not np.all(np.isfinite(a)):
        raise ValueError("hodges_lehmann got a non-finite observation")
    w = walsh_averages(a)
    estimate = float(np.median(w))
    c = signed_rank_critical(a.size, (1.0 - confidence) / 2.0)
    if c < 0:
        return Interval(estimate, -math.inf, math.inf, confidence, int(a.size))
    return Interval(estimate, float(w[c]), float(w[w.size - 1 - c]), confidence, int(a.size))


def log_interval(values: Sequence[float] | npt.NDArray[np.float64], confidence: float = 0.95) -> Interval:
    """Hodges-Lehmann interval of log(values); positive values only (times, ratios)."""
    a = np.asarray(values, dtype=np.float64)
    if np.any(a <= 0) or not np.all(np.isfinite(a)):
        raise ValueError("log_interval needs finite positive values")
    return hodges_lehmann(np.log(a), confidence)


def combine_difference(a: Interval, b_estimate: float, b_half_width: float) -> Interval:
    """Interval of a - b for independent a (measured now) and b (a stored figure with its half-width).

    Half-widths add in quadrature on each side, the usual large-sample rule for independent estimates;
    exact intervals for a difference of two Hodges-Lehmann estimates would need both raw samples.
    """
    d = a.estimate - b_estimate
    lo_side = math.hypot(a.estimate - a.lo, b_half_width)
    hi_side = math.hypot(a.hi - a.estimate, b_half_width)
    return Interval(d, d - lo_side, d + hi_side, a.confidence, a.n)


def one_sided_p_above(interval: Interval, threshold: float) -> float:
    """Approximate p-value for H0: true value <= threshold, from an interval's width (normal approximation).

    For reports and step-down corrections (Holm); the verdicts themselves use intervals, never this value.
    """
    z_conf = normal_quantile(0.5 + interval.confidence / 2.0)
    se = (interval.estimate - interval.lo) / z_conf if math.isfinite(interval.lo) else math.inf
    if se <= 0:
        return 0.0 if interval.estimate > threshold else 1.0
    if not math.isfinite(se):
        return 1.0
    return normal_sf((interval.estimate - threshold) / se)


def relative_half_width(log_iv: Interval) -> float:
    """Half-width of a log-scale interval expressed as a fraction of the estimate (exp(hw) - 1)."""
    hw = log_iv.half_width
    return math.inf if not math.isfinite(hw) else math.expm1(hw)
