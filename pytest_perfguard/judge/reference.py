"""Where the reference timed beside a case says the machine, not the code, moved: the stored gates'
exceptions. A time gate whose reference moved the same way is not comparable (the ratio decides); a ratio
gate whose reference moved alone, or ran in a state the baseline never saw, decides nothing; a reference
that moved beyond belief flags the case. verdict.decide applies them in that order."""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..record import Gate, Status
from .baseline import BaselineEntry
from .policy import MACHINE_MOVED_RATIO_LIMIT, REFERENCE_BAND, medians_threshold
from .stats import Interval, log_interval

REGRESSED, FASTER, PASS = Status.REGRESSED, Status.FASTER, Status.PASS
INCONCLUSIVE, NOT_COMPARABLE = Status.INCONCLUSIVE, Status.NOT_COMPARABLE

MACHINE_MOVED = "the reference moved"  # in the reason of a time gate the machine made not comparable


def machine_moved(gate: Gate, against_blocks: Sequence[float], stored: BaselineEntry, tau: float, conf: float) -> bool:
    """A time gate that failed (or called the case faster) while the reference timed in the same blocks
    moved past the same threshold, the same way, is the machine, not the code: another host of the same
    model, or this one in another state (a baseline recorded on one H100 and guarded on another read small
    SDPA cases 6-11% slow, with their ratios within 0.6%: benchmarks/results/fresh_machine_2026-11-25). The
    time gate becomes not comparable and the ratio gate decides (True)."""
    move = reference_move(against_blocks, stored, conf) if gate.status in (REGRESSED, FASTER) else None
    if move is None:
        return False
    if (gate.status is REGRESSED and move.lo > tau) or (gate.status is FASTER and move.hi < -tau):
        moved = math.expm1(move.estimate)
        where = "slower" if moved > 0 else "faster"
        gate.status = NOT_COMPARABLE
        gate.reason = (
            f"not comparable: {gate.reason}; {MACHINE_MOVED} {moved * 100:+.1f}% too: this GPU runs {where} than "
            "when the baseline was recorded, so the ratio gate decides"
        )
        return True
    return False


def reference_band(
    against_blocks: Sequence[float] | None, stored: BaselineEntry, conf: float
) -> tuple[float | None, str | None]:
    """The reference's move from its stored time (a log ratio, kept in the verdict), and the flag when it moved
    beyond REFERENCE_BAND at the decision level: a GPU of the same model, torch and SDPA backend does not run
    the reference twice as slow or as fast, something beside the case did (a process-wide switch, work left
    running)."""
    move = reference_move(against_blocks, stored, conf) if against_blocks else None
    if move is None:
        return None, None
    band = math.log1p(REFERENCE_BAND)
    if move.lo > band or move.hi < -band:
        return move.estimate, (
            f"reference moved beyond belief: the reference timed beside the variant ran "
            f"{math.expm1(move.estimate) * 100:+.1f}% from its stored time (beyond the +-{REFERENCE_BAND:.0%} a "
            "machine of the same model, torch and SDPA backend can explain); something the case did moved it. "
            "The time gate cannot be excused by it"
        )
    return move.estimate, None


def reference_move(against_blocks: Sequence[float], stored: BaselineEntry, conf: float) -> Interval | None:
    """How far the reference ran from its stored centre (the mean of its processes' log medians), as a log
    interval at the decision level; None when the entry lacks a reference time for any of its processes."""
    stored_against = [x.against_ns for x in stored.samples if x.against_ns]
    if not stored_against or len(stored_against) != len(stored.samples):
        return None
    centre = math.fsum(math.log(a) for a in stored_against) / len(stored_against)
    now = log_interval(against_blocks, conf)
    return Interval(now.estimate - centre, now.lo - centre, now.hi - centre, now.confidence, now.n)


def reference_far(gate: Gate, against_blocks: Sequence[float], stored: BaselineEntry, conf: float) -> None:
    """A ratio gate that failed (or called the case faster) where the machine moved (machine_moved: variant
    and reference alike) and the reference ran further from its stored centre than
    policy.MACHINE_MOVED_RATIO_LIMIT: the machine was in a state the baseline never saw, where variant and
    reference need not slow alike, so the ratio does not decide either: inconclusive. A reference that moved
    alone is reference_alone's."""
    move = reference_move(against_blocks, stored, conf) if gate.status in (REGRESSED, FASTER) else None
    limit = math.log1p(MACHINE_MOVED_RATIO_LIMIT)
    if move is not None and (move.lo > limit or move.hi < -limit):
        moved, lo, hi = (math.expm1(x) * 100 for x in (move.estimate, move.lo, move.hi))
        gate.status = INCONCLUSIVE
        gate.reason = (
            f"inconclusive: {gate.reason}, but the reference itself ran {moved:+.1f}% from its stored time "
            f"({move.confidence:.0%} CI {lo:+.1f}% .. {hi:+.1f}%, beyond {MACHINE_MOVED_RATIO_LIMIT:.0%}): this "
            "GPU was in another state, where a ratio is not judged; run again"
        )


def reference_alone(
    gate: Gate,
    time_gate: Gate,
    against_blocks: Sequence[float],
    stored: BaselineEntry,
    *,
    conf: float,
    noise_floor: float,
    prior: float,
) -> None:
    """A ratio gate that failed while the variant's own time passed its gate (or read faster) and the
    reference ran faster than its stored centre at the decision level: the ratio moved because the
    reference did. It cannot be an upgrade of the reference: a changed torch, Triton, CUDA or SDPA backend
    makes the entry not comparable before any gate runs (device.COMPARED_KEYS), so the reference's code is
    the stored one and its move is the machine's state beside this variant. Measured: on a freshly started
    H100 (2026-11-26) SDPA timed beside cuda_scalar B8 H8 S256 read 13.9-14.1 us in the update's three
    processes and 13.2-13.3 us in both later guards, while the variant read +1.5%; in the second guard the
    fresh process repeated the ratio's +6%, and the ratio gate failed the unchanged case. Such a reading
    decides nothing: inconclusive, never a failure.
    A uniform speed-up of the machine hiding an equal slowdown of the variant reads the same way, which is
    why it is not a pass. The move must pass the prediction bound of the reference's stored processes
    (with the file's typical spread and the floor), else the ratio decides."""
    if gate.status is not REGRESSED or time_gate.status not in (PASS, FASTER):
        return
    move = reference_move(against_blocks, stored, conf)
    stored_against = [x.against_ns for x in stored.samples if x.against_ns]
    if move is None or len(stored_against) < 2:
        return
    # beyond what the reference's own processes spread (their prediction bound): a reference stored from
    # processes in different states (4.7 or 5.3 us) says nothing about this one's by being far from their mean
    spread = medians_threshold(0.0, stored_against, noise_floor, prior)
    if move.hi >= -math.log1p(spread):
        return
    moved, lo, hi = (math.expm1(x) * 100 for x in (move.estimate, move.lo, move.hi))
    own = (time_gate.estimate - 1.0) * 100 if time_gate.estimate is not None else math.nan
    gate.status = INCONCLUSIVE
    gate.reason = (
        f"inconclusive: {gate.reason}, but the variant's own time passed ({own:+.1f}%) and the reference ran "
        f"{moved:+.1f}% from its stored time beside it ({move.confidence:.0%} CI {lo:+.1f}% .. {hi:+.1f}%), "
        "with the same torch and SDPA backend: the reference moved, not the variant, and the ratio does "
        "not decide"
    )
