"""The stored baseline's decision rules, in one place: the plugin (verdict.py, session.py) and the CLI
(`perfguard compare`) call these, so no rule or constant is written twice.

A stored baseline entry is a small sample: the medians of its last k independent processes. A new process
is judged against a one-sided prediction bound of that sample, t(k-1, PREDICTION_LEVEL) * s * sqrt(1 + 1/k)
on the log scale (s the between-process standard deviation, never below the device's noise floor), and
never against less than the margin. With k = 1 there is no spread to predict from: the threshold falls back
to NOISE_K times the stored noise (or the floor), and the guard calls the baseline thin. A regression that
the fresh-process confirmation does not repeat is judged on both processes together: their mean against the
same bound for a mean of two, t * s * sqrt(1/2 + 1/k) (mean_threshold): within it the case passes.

Why: a baseline recorded by one process carries that process's own offset, and on a freshly started H100
the first process read small kernels 30-51% slow; 17 of 98 unchanged cases then failed against it, and the
same entries hid 2x regressions (benchmarks/results/fresh_machine_2026-11-25/README.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .stats import chi2_quantile, normal_quantile, t_quantile

# Between-process noise floors (sd of ln time across processes), measured per device kind: see
# benchmarks/results/README.md. CPU: a shared 2-core machine moved absolute times by tens of percent.
NOISE_FLOOR = {"cuda": 0.005, "cpu": 0.05}
RATIO_NOISE_FLOOR = {"cuda": 0.005, "cpu": 0.05}
# A one-process entry's threshold is at least this many times its stored noise (the k = 1 fallback).
NOISE_K = 4.0
# How many process medians an entry keeps; older ones drop out, so the entry follows a slow drift.
MAX_SAMPLES = 16
# One-sided level of the prediction bound (Bencher's default upper boundary is 0.99).
PREDICTION_LEVEL = 0.99
# Degrees of freedom the file's typical spread is worth when a case's own spread is moderated by it.
PRIOR_DOF = 4
# Processes an update measures every case in, unless told otherwise (asv's `processes` default is 2).
DEFAULT_UPDATE_PROCESSES = 3
# An update's process median that sits further than this from the others' median, and further than
# DISCORD_CI_K of its in-run half-widths, is discordant: the case is measured once more.
DISCORD_CI_K = 4.0
# A case whose processes still disagree after the re-measurement keeps all of them (less one outlier), and its
# threshold (the prediction bound of their spread) widens; it is stored only where that threshold is within this
# many times the threshold of a quiet entry of as many processes, one whose spread is the device's noise floor:
# on a GPU twice the margin, on the CPU (5% floor) twice the ~20% a quiet entry gets. The yardstick is the floor,
# not the update's own typical spread, which one poisoned process (2x slow on a shared 2-core machine) moved with
# every case, so that entries of a 2x spread were stored and passed a +122% regression. On a freshly started H100
# (2026-11-26) 3 cases read 21.9-22.9 us across four processes (thresholds 5.1-5.5%, stored), while the cases this
# limit leaves out flip between per-process modes (6.6 or 17.3 us; 7.9 or 19.2 us): the update names them
# unverifiable and stores nothing for them.
UNSTABLE_FACTOR = 2.0
# An update's process median is an outlier when it sits further from the median of the case's process medians
# than OUTLIER_K robust sds (MAD_SD times their median absolute deviation) and than the discord limit (the floor
# tied to the margin, the device's floor and the in-run width). The median and the MAD of three or four ignore
# one wild value, so one process 2x off is always found; two far ones are a split, not one bad process, and
# none is dropped (outlier_process). Measured on the H200 block medians of tests/data (test_outlier_processes).
OUTLIER_K = 4.0
MAD_SD = 1.4826  # the MAD of a normal sample, as an sd
# When the reference moved with more than this share of the timed cases, the summary says to compare on like
# machines or record the baseline on this one (outcome.compared; the rule itself: reference.machine_moved).
MACHINE_MOVED_SHARE = 0.25
# A ratio to the reference cancels a machine that runs uniformly slower or faster, not one in another state.
# Where the machine moved (the time gate's "the reference moved": variant and reference alike) and the
# reference ran this far from its stored centre during the case (beyond it at the decision level), the ratio
# gate does not call a regression or a speed-up either: inconclusive. Measured: across H100 hosts
# the reference moved 6-11% with ratios within 0.6% (2026-11-25); on a freshly started H200 the reference
# moved +31% and +47% in two processes for one case while its ratio read +9.2% and +9.8%, and 16.6 us
# against 16.1 us stored in the next two runs (2026-11-26). The limit sits between those; its exact place
# is not measured.
MACHINE_MOVED_RATIO_LIMIT = 0.20
# The host gate's margin (verdict.host_gate): the eager call's ratio to the reference's, against the stored
# one. Host time moves with the process far more than device time does: in guards of unchanged code on two
# freshly started hosts (H200 and H100, 2026-11-28) the host ratio read up to +68% (95% CI +60..+76%) and 95%
# intervals reached +90%. At 150% (2.5x the stored host time) that stays decided, and 1 ms of Python and a
# sync per call still read +600..+700% there. What gets past it: a wrapper that adds less than 1.5x its eager
# time (an extra `.item()` on a call of 30 us of host time).
HOST_MARGIN = 1.5
# How far the reference may move from its stored time, beside a case, before the case is flagged rather than
# excused as "the machine moved" (reference.machine_moved): twice as slow or as fast. Hosts of one model moved
# SDPA 6-11% (2026-11-25), a freshly started H200 +47% (2026-11-26); a variant that turned SDPA's fast
# backends off moved it +3,278% and +5,574% (H100, 2026-11-27). And a reference that moved while the run's
# other cases' references did not (their median move under a quarter of it) moved alone: flagged too, at
# the end of the run (outcome.moved_alone), where every case's move is known.
REFERENCE_BAND = 1.0
# A stored interval wider than this (a fraction, each side) or a case margin wider than WIDE_MARGIN makes a
# baseline that catches only gross slowdowns: the update says so, naming the cases (session.py).
WIDE_INTERVAL = 0.25
WIDE_MARGIN = 0.5
# The probability of catching a slowdown at which the minimum detectable effect is reported.
MDE_POWER = 0.95
# The decision level an entry's detectable margin is planned at (detectable_margin): a guard of m cases decides
# at 1 - 0.1 / m (verdict.Policy.decision_confidence), 0.999 for the hundred cases of a typical suite.
DETECT_CONFIDENCE = 0.999
# A batch's fresh process measures for at most this many times what its cases' measurement took in this
# process, plus one case's budget for that process's own warm-up; a case past the bound is not measured
# there, and its regression stands, saying so (confirm.Batch).
BATCH_TIME_FACTOR = 2.0


def case_threshold(margin: float, noise: float, noise_floor: float, noise_k: float = NOISE_K) -> float:
    """A one-process entry's threshold (a fraction): the margin, or ``noise_k`` times its noise (never below
    the floor), whichever is larger."""
    return max(margin, noise_k * max(noise, noise_floor))


def prediction_bound(spread: float, k: int, level: float = PREDICTION_LEVEL, dof: int | None = None) -> float:
    """How far (log scale) a new process's median may sit above the mean of k stored ones by chance alone,
    at one-sided ``level``: t(dof) * spread * sqrt(1 + 1/k), dof = k - 1 unless a pooled spread adds more."""
    return mean_prediction_bound(spread, k, 1, level, dof)


def mean_prediction_bound(
    spread: float, k: int, m: int, level: float = PREDICTION_LEVEL, dof: int | None = None
) -> float:
    """The same bound for the mean of m new processes' log medians: t(dof) * spread * sqrt(1/m + 1/k)."""
    if k < 2:
        raise ValueError("a prediction bound needs at least two stored processes")
    if m < 1:
        raise ValueError("a prediction bound is for at least one new process")
    return t_quantile(level, dof if dof is not None else k - 1) * spread * math.sqrt(1.0 / m + 1.0 / k)


def moderated_spread(spread: float, k: int, prior: float, prior_dof: int = PRIOR_DOF) -> tuple[float, int]:
    """A case's between-process sd shrunk towards the typical one of its file (``prior``, worth
    ``prior_dof`` degrees of freedom), and the degrees of freedom of the result: k - 1 + prior_dof.

    Three processes give an sd with 2 degrees of freedom, and t(2, 0.99) = 6.96 would put every threshold
    at 8 times the spread. The cases of one file share most of their between-process noise (the machine,
    the driver, the process start), so each case borrows strength from the others, as limma's moderated t
    does; a case noisier than the rest still raises its own threshold. A prior of 0 is a file whose
    processes read alike; NO_PRIOR, one with no entry of two processes: then the case's own spread stands."""
    if math.isnan(prior) or prior_dof <= 0:
        return spread, k - 1
    dof = k - 1 + prior_dof
    return math.sqrt(((k - 1) * spread**2 + prior_dof * prior**2) / dof), dof


# A file with no entry of two processes has no typical spread (moderated_spread). Not 0: a file whose
# processes read exactly alike has one, and without it a case's 2 degrees of freedom put its threshold far
# above that of a case whose processes differ a little (an update measured such cases once more).
NO_PRIOR = math.nan


def prior_spread(spreads: Sequence[float]) -> float:
    """The typical between-process sd of a file's sampled entries: their median (robust to a few noisy
    cases); NO_PRIOR when no entry has two processes."""
    values = [x for x in spreads if math.isfinite(x)]
    return _median(values) if values else NO_PRIOR


def detectable_margin(spread: float, k: int, half_width: float, noise_floor: float) -> float:
    """The narrowest margin T (a fraction) at which a guard process still sees a slowdown of M = MDE_MARGINS
    times T (verdict.minimum_detectable_effect with a confirmation, at the decision level of a suite of about a
    hundred cases, DETECT_CONFIDENCE); inf where no margin can.

    With b = max(spread, floor) * sqrt(1 + 1/k) the between-process sd against the stored centre, h the guard's
    in-run half-width at that level and s = h / z its sd, the MDE is (1 + T) e^c - 1 with c = h + z_p *
    sqrt(s^2 + b^2), at most M T where T >= (e^c - 1) / (M - e^c). More blocks narrow h; nothing in one process
    narrows b: on a fresh H200 (2026-11-28) cuda_scalar B8 H16 S4096, stored spread 2.1% under a 5% margin, read
    an MDE of 10.003-10.017% against the 10% ceiling in three guards, every pass unverified. The guard's h is
    planned as the wider of the processes' in-run 95% half-width (``half_width``) and their spread (k >= 2): a
    process can move between the modes the update's processes sat in. Planned at the update's in-run width alone (0.1%),
    cuda_scalar S2048 causal, whose processes read 1.09 or 1.15 ms, met the ceiling to the fourth digit in the
    guards that sat in one mode and missed it in those that read +2.3% in-run (H200, 2026-11-28)."""
    b = max(spread, noise_floor) * math.sqrt(1.0 + 1.0 / min(max(k, 1), MAX_SAMPLES))
    z = normal_quantile(0.5 + DETECT_CONFIDENCE / 2.0)
    # one process has no spread of its own (its noise is the floor or a stored guess): no modes to move between
    h = (max(half_width, spread) if k >= 2 else half_width) * z / normal_quantile(0.975)
    c = h + normal_quantile(math.sqrt(MDE_POWER)) * math.hypot(h / z, b)
    if c >= math.log(MDE_MARGINS):
        return math.inf
    return math.expm1(c) / (MDE_MARGINS - math.exp(c))


def _widened(margin: float, detectable: float) -> float:
    """The margin widened to the detectable one, up to WIDE_MARGIN. Past it the spread widens nothing: the
    detectable margin grows without bound as the spread nears what no margin can see past (an entry of two
    speeds 1.3x apart on a CPU read 367%, and an update 3x slower then joined it as the same kernel), a gate
    that wide guards nothing, and a pass of it stays unverified by its MDE instead."""
    return max(margin, detectable) if detectable <= WIDE_MARGIN else margin


def sample_threshold(
    margin: float,
    spread: float,
    k: int,
    noise_floor: float,
    noise_k: float = NOISE_K,
    prior: float = NO_PRIOR,
    half_width: float | None = None,
) -> float:
    """The threshold (a fraction) of an entry of k process medians with between-process sd ``spread``: the
    prediction bound (the spread moderated by the file's typical one, never below the floor), never below
    the margin; the k = 1 fallback below two. With its processes' in-run 95% half-width ``half_width`` (log
    scale; a stored entry's, as the guard judges it), the margin is never below what one process can detect
    (detectable_margin); without, the prediction bound alone (whether the spread can judge at all)."""
    if half_width is not None:
        margin = _widened(margin, detectable_margin(spread, k, half_width, noise_floor))
    if k < 2:
        return case_threshold(margin, spread, noise_floor, noise_k)
    sd, dof = moderated_spread(spread, k, prior)
    return max(margin, math.expm1(prediction_bound(max(sd, noise_floor), k, dof=dof)))


def log_spread(values: Sequence[float]) -> float:
    """The sd of the logs of these process medians (0 for fewer than two)."""
    logs = [math.log(v) for v in values]
    if len(logs) < 2:
        return 0.0
    mean = math.fsum(logs) / len(logs)
    return math.sqrt(math.fsum((x - mean) ** 2 for x in logs) / (len(logs) - 1))


def medians_threshold(margin: float, medians: Sequence[float], noise_floor: float, prior: float = NO_PRIOR) -> float:
    """The prediction-bound threshold of an entry of these process medians (sample_threshold, with the file's
    typical spread ``prior``): what decides whether their spread can judge a regression at all (too_wide). The
    guard's margin adds what one process can detect (detectable_margin, from the stored in-run widths)."""
    return sample_threshold(margin, log_spread(medians), len(medians), noise_floor, prior=prior)


def verifiable_limit(margin: float, k: int, noise_floor: float) -> float:
    """The widest threshold an entry of k processes may be judged at and still be stored: UNSTABLE_FACTOR times
    that of a quiet entry (its spread and its file's typical spread at the device's floor)."""
    return UNSTABLE_FACTOR * sample_threshold(margin, noise_floor, k, noise_floor, prior=noise_floor)


def too_wide(threshold: float, k: int, margin: float, noise_floor: float) -> bool:
    """An entry of k processes whose threshold is past verifiable_limit: it cannot judge a regression of the
    margin, and an update does not store it."""
    return threshold > verifiable_limit(margin, k, noise_floor)


def discord_limit(margin: float, noise_floor: float, half_widths: Sequence[float] = ()) -> float:
    """How far (log scale) one process's median may sit from the others' median before the case is
    measured again: half the margin, twice the floor, or DISCORD_CI_K in-run half-widths, the largest."""
    widest = max((h for h in half_widths if math.isfinite(h)), default=0.0)
    return max(math.log1p(margin) / 2.0, 2.0 * noise_floor, DISCORD_CI_K * widest)


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def discordant(values: Sequence[float], limit: float) -> list[int]:
    """Indices of the process medians that sit further than ``limit`` (log scale) from the median of all of
    them. With two that disagree, both are: neither can be told from the other."""
    if len(values) < 2:
        return []
    logs = [math.log(v) for v in values]
    centre = _median(logs)
    return [i for i, x in enumerate(logs) if abs(x - centre) > limit]


def outlier_process(values: Sequence[float], limit: float) -> int | None:
    """The index of the one process median that sits apart from the others: further (log scale) from the
    median of all of them than ``limit`` (discord_limit) and than OUTLIER_K robust sds of them; None when no
    process does, when more than one does (a split: which side is right is not known), or for fewer than three
    (two cannot outvote each other)."""
    if len(values) < 3:
        return None
    logs = [math.log(v) for v in values]
    centre = _median(logs)
    scale = MAD_SD * _median([abs(x - centre) for x in logs])
    far = [i for i, x in enumerate(logs) if abs(x - centre) > max(limit, OUTLIER_K * scale)]
    return far[0] if len(far) == 1 else None


# ----------------------------------------------------------------------------------- the A/B offset, fitted

# Each process adds an offset of its own to a head/base ratio, which the in-process interval does not sample;
# the A/B gate's MDE counts it (settings.AB_PROCESS_SD: the built-in H100 fit). An update fits it on the
# user's device from the A/A readings its fresh processes store (ab.aa_base): per case and process, the log
# head/base ratio of two loaded copies of the same code, e, and its in-process sd, s (from its 95% interval).
# The model is the built-in fit's (benchmarks/results/ab_2026-11-25, section 2): e ~ N(0, s^2 + b^2).
# A reading counts at most as an AB_OFFSET_CLIP-sigma one: on H100s cuda_scalar's two loaded copies differed by
# up to 4% per process, and over every case from 20 us the plain root-mean-square fit read 0.51% where the other
# kernels read 0.10% (the built-in fit left cuda_scalar out by hand); clipped, the same readings give 0.16%.
AB_OFFSET_CLIP = 2.5
# The gate uses the fit's one-sided upper confidence bound at this level: an offset fitted too small makes the
# MDE promise more than the gate sees; one too large only measures longer.
AB_OFFSET_LEVEL = 0.90
# A size class with fewer readings keeps the built-in value: the bound of a handful of readings is about twice
# the fit, and it would make every case of the class measure to its budget for a number known that poorly.
AB_OFFSET_MIN_READINGS = 10


@dataclass(frozen=True)
class OffsetFit:
    """The per-process offset of one size class: the fit, its upper confidence bound (what the gate uses), how
    many readings it rests on, and the effective degrees of freedom of the clipped statistic (Satterthwaite;
    clipping lowers its variance, so they exceed the readings, 1.14 per reading at the default clip)."""

    fit: float
    bound: float
    readings: int
    dof: float


def _clipped_moments(clip: float) -> tuple[float, float]:
    """Mean and variance of min(Z^2, clip^2) for a standard normal Z."""
    phi = math.exp(-clip * clip / 2.0) / math.sqrt(2.0 * math.pi)
    inside = math.erf(clip / math.sqrt(2.0))  # P(|Z| < clip)
    tail = 1.0 - inside
    second = inside - 2.0 * clip * phi  # E[Z^2; |Z| < clip]
    fourth = 3.0 * inside - 2.0 * phi * (clip**3 + 3.0 * clip)  # E[Z^4; |Z| < clip]
    mean = second + clip**2 * tail
    return mean, fourth + clip**4 * tail - mean * mean


def _clipped_sum(readings: Sequence[tuple[float, float]], b: float, clip: float) -> float:
    """sum(min(e^2 / (s^2 + b^2), clip^2)): order-free (fsum), so the fit does not depend on the order."""
    cap = clip * clip
    terms = []
    for e, s in readings:
        var = s * s + b * b
        terms.append(min(e * e / var, cap) if var > 0 else (0.0 if e == 0 else cap))
    return math.fsum(terms)


def _offset_for(readings: Sequence[tuple[float, float]], target: float, clip: float) -> float:
    """The b at which the clipped sum falls to `target` (it falls as b grows); 0 when it is there at b = 0."""
    if _clipped_sum(readings, 0.0, clip) <= target:
        return 0.0
    lo, hi = 0.0, math.sqrt(math.fsum(e * e for e, _ in readings) / target)  # the sum is below target there
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if _clipped_sum(readings, mid, clip) > target:
            lo = mid
        else:
            hi = mid
    return hi


def fit_process_offset(
    readings: Sequence[tuple[float, float]], *, clip: float = AB_OFFSET_CLIP, level: float = AB_OFFSET_LEVEL
) -> OffsetFit | None:
    """The per-process offset b of A/A readings (e, s): the b for which sum(min(e^2 / (s^2 + b^2), clip^2))
    equals its expectation, n E[min(Z^2, clip^2)] (Huber's scale equation; without a clip it is the built-in
    fit's root-mean-square rule), and its one-sided upper confidence bound at `level`: the b at which the sum
    falls to the lower (1 - level) quantile of its scaled chi-square approximation (mean n E, variance n V),
    so that a larger offset would have made the readings this small less often than 1 - level. 0 when the
    intervals alone cover the scatter; None without readings."""
    if not readings:
        return None
    if not 0.0 < level < 1.0 or not clip > 0:
        raise ValueError(f"need 0 < level < 1 and clip > 0, got level {level}, clip {clip}")
    n = len(readings)
    mean, var = _clipped_moments(clip)
    scale, dof = var / (2.0 * mean), 2.0 * n * mean * mean / var
    fit = _offset_for(readings, n * mean, clip)
    bound = _offset_for(readings, scale * chi2_quantile(1.0 - level, dof), clip)
    return OffsetFit(fit=fit, bound=max(bound, fit), readings=n, dof=dof)


# A case's own offset. The pooled fit above clips the cases whose two loaded copies differ most, and the A/B
# margin absorbs the pooled value; but those cases keep their offset. cuda_scalar B8 H8 S256 read head/base
# +4.0% on unchanged code in one process on a two-H100 host and +4.1% in its fresh confirmation, one false
# alarm in 392 verdicts (benchmarks/results/two_gpu_h100_2026-11-26), while host H's update stored A/A readings
# of -0.2% and +3.4% for it. A case's stored readings therefore widen its own A/B decision, shrunk toward the
# pooled offset with the weight of this many readings: two readings alone would give the bound a t quantile
# of 6.3, and the pooled value is the better guess for a case that read quiet twice.
AB_CASE_PRIOR_READINGS = 4


def case_offset(pooled: float, readings: Sequence[tuple[float, float]], prior: int = AB_CASE_PRIOR_READINGS) -> float:
    """A case's per-process A/B offset from its own A/A readings (e, s): the mean of e^2 - s^2 (the scatter
    beyond each reading's in-process sd, never below 0) over the readings and ``prior`` pseudo-readings at the
    pooled offset, as an sd; never below ``pooled``, so that a case's readings can only widen its gate."""
    if pooled < 0 or prior < 0:
        raise ValueError(f"need pooled >= 0 and prior >= 0, got {pooled}, {prior}")
    if not readings:
        return pooled
    excess = math.fsum(max(e * e - s * s, 0.0) for e, s in readings)
    return max(pooled, math.sqrt((prior * pooled * pooled + excess) / (prior + len(readings))))


# A regression seen in the guard's process that its fresh-process confirmation does not repeat: the two
# processes are judged together, their mean against the bound for a mean of this many new processes. On
# freshly started H100s 11 of 294 unchanged verdicts were inconclusive because one process read a case
# +5..11% and the fresh one within the threshold (benchmarks/results/fresh_machine_2026-11-25/README.md).
CONFIRM_PROCESSES = 2


def mean_threshold(
    margin: float,
    spread: float,
    k: int,
    noise_floor: float,
    m: int = CONFIRM_PROCESSES,
    prior: float = NO_PRIOR,
    half_width: float | None = None,
) -> float:
    """The threshold (a fraction) for the mean of m new processes against an entry of k >= 2 process medians
    with between-process sd ``spread``: sample_threshold's rule with sqrt(1/m + 1/k) in place of
    sqrt(1 + 1/k), never below the margin (nor, given ``half_width``, what one process can detect, as there).
    Below two stored processes there is no spread to predict from."""
    if half_width is not None:
        margin = _widened(margin, detectable_margin(spread, k, half_width, noise_floor))
    sd, dof = moderated_spread(spread, k, prior)
    return max(margin, math.expm1(mean_prediction_bound(max(sd, noise_floor), k, m, dof=dof)))


def process_mean(readings: Sequence[float]) -> float:
    """The mean of several processes' readings of one gate (each now / stored, a ratio), taken on the log
    scale as the bound is, and returned as a ratio."""
    if not readings or min(readings) <= 0:
        raise ValueError(f"process readings must be positive ratios, got {list(readings)}")
    return math.exp(math.fsum(math.log(r) for r in readings) / len(readings))


def within_together(readings: Sequence[float], threshold: float) -> bool:
    """Regressed in one process and not in another: the case passes when the processes' mean sits within
    the threshold for a mean of that many (mean_threshold); otherwise the verdict stays inconclusive."""
    return math.log(process_mean(readings)) <= math.log1p(threshold)


# ------------------------------------------------------------------------------------ pass, fail, unverified

# The verdicts that decide nothing: the case may be slower by more than the margin, and the run could not say.
UNDECIDED = ("inconclusive", "not comparable", "no base")
# A pass whose minimum detectable effect exceeds this many margins could hide a regression of that size.
MDE_MARGINS = 2.0


# The gates whose threshold is the margin a case is judged at (the host gate's is its own, far wider).
MARGIN_GATES = ("baseline", "ratio", "ab")


def judged_margin(thresholds: Sequence[tuple[str, float | None]], fallback: float) -> float:
    """The margin a case was judged at: its comparing gates' widest threshold (name, threshold as a ratio),
    the set margin widened by the entry's stored spread where that is wider; else `fallback`."""
    used = [t - 1.0 for name, t in thresholds if name in MARGIN_GATES and t is not None]
    return max(used) if used else fallback


def could_hide(mde: float | None, margin: float, *, ab_margin: float = 0.0) -> bool:
    """A pass with this minimum detectable effect could hide a regression of MDE_MARGINS margins."""
    return mde is not None and math.isfinite(mde) and mde > MDE_MARGINS * max(margin, ab_margin)


def decision(
    verdict: str | None, failed: bool, timed: bool, mde: float | None, margin: float, *, ab_margin: float = 0.0
) -> str:
    """A timed case's decision: "fail" (the item failed: a regression shown and confirmed, a flag, a wrong
    answer), "pass" (the evidence excludes a regression of the margin: every deciding gate's interval lies
    below it, and the case could see twice the margin), "unverified" (anything else: undecided, disturbed,
    not comparable, no base, a pass that could hide a regression of MDE_MARGINS margins), "new" (no stored
    figure or base revision to compare with: nothing to regress from; counted apart), or "" for a case that
    was not timed. `margin` is the margin the case was judged at (the A/B margin under --perfguard-against).
    """
    if failed:
        return "fail"
    if not timed:
        return ""
    if verdict in ("no baseline", "new"):
        return "new"
    if verdict in UNDECIDED or verdict is None:
        return "unverified"
    return "unverified" if could_hide(mde, margin, ab_margin=ab_margin) else "pass"


def allowance(text: str, timed: int) -> int:
    """How many unverified cases a run may have: a count, or a share of the timed cases (rounded down)."""
    text = text.strip()
    if text.endswith("%"):
        return int(float(text[:-1]) / 100.0 * timed)
    return int(float(text))
