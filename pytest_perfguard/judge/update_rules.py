"""What an update does to a stored entry: new processes join its sample, or, where the kernel changed (its
centre moved past the guard's own threshold, or its workload or environment differ), the entry starts over
from them. The guard's threshold against an entry is the same rule (policy.sample_threshold)."""

from __future__ import annotations

import math
from dataclasses import replace

from .baseline import BaselineEntry
from .migrations import UNKNOWN_WORKLOAD
from .policy import NOISE_K, sample_threshold


def entry_threshold(entry: BaselineEntry, margin: float, noise_floor: float, noise_k: float = NOISE_K) -> float:
    """The guard's threshold (a fraction) for a case against this entry: the prediction bound of its
    sample (policy.sample_threshold), never below the margin."""
    return sample_threshold(margin, entry.noise, entry.runs, noise_floor, noise_k, half_width=entry.half_width)


def change_limit(old: BaselineEntry, change_threshold: float, noise_floor: float, noise_k: float) -> float:
    """How far (a fraction) an update may move from the stored centre and still be the same kernel: the
    guard's own threshold for the case. A move the guard would not call a regression is noise, and joins
    the sample."""
    return entry_threshold(old, change_threshold, noise_floor, noise_k)


def merge_entry(
    old: BaselineEntry | None,
    new: BaselineEntry,
    noise_floor: float,
    change_threshold: float | None = None,
    noise_k: float = NOISE_K,
) -> tuple[BaselineEntry, str]:
    """The entry to store and what happened to it: 'added', 'updated' (new processes join the sample) or
    'reset'.

    With ``change_threshold`` (a fraction, the guard's margin), an update whose centre moved by more than
    ``change_limit`` is a changed kernel, not more samples of the same one: joining them would inflate the
    spread and with it the threshold, silently blinding the guard for that case after every intended
    speed-up. A reset entry starts from the update's own processes.
    """
    if old is None:
        return _floored(new, noise_floor), "added"
    same = old.workload == new.workload and old.workload != UNKNOWN_WORKLOAD and old.env == new.env
    moved = change_threshold is not None and abs(math.log(new.median_ns / old.median_ns)) > math.log1p(
        change_limit(old, change_threshold, noise_floor, noise_k)
    )
    if same and not moved and not old.unstable:
        joined = BaselineEntry.from_samples(
            new.case_id,
            [*old.samples, *new.samples],
            workload=new.workload,
            workload_desc=new.workload_desc,
            env=new.env,
            updated=new.updated,
            noise=max(old.noise, new.noise),
            unstable=new.unstable,
        )
        return _floored(joined, noise_floor), "updated"
    return _floored(new, noise_floor), "reset"


def _floored(entry: BaselineEntry, noise_floor: float) -> BaselineEntry:
    """A one-process entry's noise is never below the floor (it has no spread of its own to show)."""
    return entry if entry.runs > 1 else replace(entry, noise=max(noise_floor, entry.noise))
