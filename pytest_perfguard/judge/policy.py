"""The stored baseline's decision rules, in one place: the plugin (verdict.py, session.py) and the CLI
(`perfguard compare`) call these, so no rule or constant is written twice.

A stored baseline entry is a small sample: the medians of its last k independent processes. A new process
is judged against a one-sided prediction bound of that sample, t(k-1, PREDICTION_LEVEL) * s * sqrt(1 + 1/k)
on the log scale (s the between-process standard deviation, never below the device's noise floor), and
never against less than the margin. With k = 1 there is no spread to predict from: the threshold falls back
to NOISE_K times the stored noise (or the floor), and the guard calls the baseline thin.

Why: a baseline recorded by one process carries that process's own offset, and on a freshly started H100
the first process read small kernels 30-51% slow; 17 of 98 unchanged cases then failed against it, and the
same entries hid 2x regressions (benchmarks/results/fresh_machine_2026-11-25/README.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .stats import t_quantile

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
# When the reference moved with more than this share of the timed cases, the summary says to compare on like
# machines or record the baseline on this one (session._compared; the rule itself: verdict._machine_moved).
MACHINE_MOVED_SHARE = 0.25


def case_threshold(margin: float, noise: float, noise_floor: float, noise_k: float = NOISE_K) -> float:
    """A one-process entry's threshold (a fraction): the margin, or ``noise_k`` times its noise (never below
    the floor), whichever is larger."""
    return max(margin, noise_k * max(noise, noise_floor))


def prediction_bound(spread: float, k: int, level: float = PREDICTION_LEVEL, dof: int | None = None) -> float:
    """How far (log scale) a new process's median may sit above the mean of k stored ones by chance alone,
    at one-sided ``level``: t(dof) * spread * sqrt(1 + 1/k), dof = k - 1 unless a pooled spread adds more."""
    if k < 2:
        raise ValueError("a prediction bound needs at least two stored processes")
    return t_quantile(level, dof if dof is not None else k - 1) * spread * math.sqrt(1.0 + 1.0 / k)


def moderated_spread(spread: float, k: int, prior: float, prior_dof: int = PRIOR_DOF) -> tuple[float, int]:
    """A case's between-process sd shrunk towards the typical one of its file (``prior``, worth
    ``prior_dof`` degrees of freedom), and the degrees of freedom of the result: k - 1 + prior_dof.

    Three processes give an sd with 2 degrees of freedom, and t(2, 0.99) = 6.96 would put every threshold
    at 8 times the spread. The cases of one file share most of their between-process noise (the machine,
    the driver, the process start), so each case borrows strength from the others, as limma's moderated t
    does; a case noisier than the rest still raises its own threshold."""
    if prior <= 0 or prior_dof <= 0:
        return spread, k - 1
    dof = k - 1 + prior_dof
    return math.sqrt(((k - 1) * spread**2 + prior_dof * prior**2) / dof), dof


def prior_spread(spreads: Sequence[float]) -> float:
    """The typical between-process sd of a file's sampled entries: their median (robust to a few noisy
    cases); 0 when no entry has two processes."""
    values = sorted(x for x in spreads if math.isfinite(x))
    if not values:
        return 0.0
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else 0.5 * (values[mid - 1] + values[mid])


def sample_threshold(
    margin: float,
    spread: float,
    k: int,
    noise_floor: float,
    noise_k: float = NOISE_K,
    prior: float = 0.0,
) -> float:
    """The threshold (a fraction) of an entry of k process medians with between-process sd ``spread``: the
    prediction bound (the spread moderated by the file's typical one, never below the floor), never below
    the margin; the k = 1 fallback below two."""
    if k < 2:
        return case_threshold(margin, spread, noise_floor, noise_k)
    sd, dof = moderated_spread(spread, k, prior)
    return max(margin, math.expm1(prediction_bound(max(sd, noise_floor), k, dof=dof)))


def discord_limit(margin: float, noise_floor: float, half_widths: Sequence[float] = ()) -> float:
    """How far (log scale) one process's median may sit from the others' median before the case is
    measured again: half the margin, twice the floor, or DISCORD_CI_K in-run half-widths, the largest."""
    widest = max((h for h in half_widths if math.isfinite(h)), default=0.0)
    return max(math.log1p(margin) / 2.0, 2.0 * noise_floor, DISCORD_CI_K * widest)


def discordant(values: Sequence[float], limit: float) -> list[int]:
    """Indices of the process medians that sit further than ``limit`` (log scale) from the median of all of
    them. With two that disagree, both are: neither can be told from the other."""
    logs = sorted(math.log(v) for v in values)
    if len(logs) < 2:
        return []
    mid = len(logs) // 2
    centre = logs[mid] if len(logs) % 2 else 0.5 * (logs[mid - 1] + logs[mid])
    return [i for i, v in enumerate(values) if abs(math.log(v) - centre) > limit]
