"""What was timed is what was checked: the output of the last timed call, every input copy the timed samples
rotate over (on values the variant never saw), and the samples' time on new values against values they
already ran (a memo). Each runs outside the timed window and returns the message naming what it saw, or None
(integrity.py holds the guard's other checks)."""

from __future__ import annotations

import contextlib
import math
import random
import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .correctness import CorrectnessFailure, Inputs, Oracle, judge_output, modified_input, screened, tensors_of
from .timers import Watch

Overrides = Sequence[Any]


def timed_outputs(
    outputs: dict[int, object],
    inputs: Inputs,
    reference: Callable[..., Any],
    overrides: Overrides,
    *,
    seed: int,
    oracles: Sequence[Oracle] = (),
) -> str | None:
    """The output of the last timed call on input copy 0 (`inputs`, drawn with `seed`: the gate's first
    seed) judged as the correctness gate judged it, on the gate's oracle for those values where it kept one.
    A kernel that passes its checked calls and returns something else once timed fails here. Work skipped
    on the other copies, or on values never seen, is `every_copy`'s to find."""
    now = next((o for o in oracles if o.matches(inputs)), None)
    try:
        judge_output(outputs.get(0), inputs, reference, overrides, seed=seed, oracle=now)
    except CorrectnessFailure as exc:
        return (
            "timed output wrong: the output of the last timed call fails the check that its correctness calls "
            f"passed: {exc}"
        )
    return None


@dataclass(frozen=True)
class TimedCopies:
    """What the variant's blocks timed: its samples, taken in turn (member j runs input copies j*reps ..
    (j+1)*reps-1), the copies' inputs, the output of the last call on each copy (a graph's own output
    tensors, which every replay overwrites), and new values for a copy: `fresh(i)` returns a seed drawn
    afresh and inputs made from it, of the copy's form, never the correctness seeds' values."""

    members: Sequence[Callable[[], Any]]
    reps: int
    inputs: Mapping[int, Inputs]
    outputs: dict[int, object]
    fresh: Callable[[int], tuple[int, Inputs]]

    def copies_of(self, j: int) -> range:
        return range(j * self.reps, (j + 1) * self.reps)

    @property
    def count(self) -> int:
        return len(self.members) * self.reps


def _copy_all(dst: Sequence[torch.Tensor], src: Sequence[torch.Tensor]) -> None:
    """`d.copy_(s)` for each pair, in one multi-tensor launch per device and dtype: a small case's check writes a
    few hundred copies' tensors, and one copy_ each was a launch each."""
    if dst:
        torch._foreach_copy_(list(dst), list(src))


def _new_values(tensors: Sequence[tuple[str, torch.Tensor]], new: Inputs) -> list[tuple[str, torch.Tensor]]:
    """`new`'s tensors, detached, once they are known to be of the copy's form (names, shapes, dtypes): what a
    refill writes into the copy in place (same addresses, so a graph replays them) and the input-mutation
    check compares against."""
    values = [(name, t.detach()) for name, t in tensors_of(new)]
    if [(n, t.shape, t.dtype) for n, t in values] != [(n, t.shape, t.dtype) for n, t in tensors]:
        raise ValueError("the test made inputs of another form for a new seed; each copy must have one form")
    return values


def _refill(
    copies: Mapping[int, Sequence[tuple[str, torch.Tensor]]], new: Mapping[int, Inputs]
) -> dict[int, list[tuple[str, torch.Tensor]]]:
    """Writes each copy's `new` values into its tensors in place, all in one multi-tensor copy, and returns the
    values by copy, for the input-mutation check."""
    values = {i: _new_values(copies[i], made) for i, made in new.items()}
    _copy_all([t for i in values for _, t in copies[i]], [v for i in values for _, v in values[i]])
    return values


def _sync(tensors: Sequence[tuple[str, torch.Tensor]]) -> None:
    if tensors and tensors[0][1].is_cuda:
        torch.cuda.synchronize(tensors[0][1].device)


@contextlib.contextmanager
def _values_kept(copies: TimedCopies, indices: Sequence[int]) -> Iterator[dict[int, list[tuple[str, torch.Tensor]]]]:
    """The copies' tensors by index; their timed values are put back on the way out (the later checks, the
    degenerate-input one, time the same copies)."""
    tensors = {i: tensors_of(copies.inputs[i]) for i in indices}
    held = [t.detach() for ts in tensors.values() for _, t in ts]
    saved = [torch.empty_like(t) for t in held]
    _copy_all(saved, held)
    try:
        yield tensors
    finally:
        _copy_all(held, saved)
        _sync(next(iter(tensors.values()), []))


def every_copy(
    copies: TimedCopies,
    reference: Callable[..., Any],
    overrides: Overrides,
    *,
    pairs: list[float] | None = None,
) -> str | None:
    """Every timed copy checked on values the variant has never seen: for each sample the blocks took in
    turn, every copy it runs gets new values in place (outside the timed window) and a NaN output, the
    sample runs once more (one graph replay on CUDA), and each copy's output must match the float64 oracle
    on its new values, with the inputs unchanged. The message of the first failure, or None.

    Where `pairs` is given, each sample, once its copies are checked, runs again on the values it has just
    run, and its time on new values over that time is appended: `seen_values`' first look, for one replay a
    sample (on an H200 its own draws were 6% of a small case's wall time, 2026-11-28). The second run comes
    after the check, so a variant that answers right only on values it has met before still fails here.

    Checking copy 0 alone let a variant that did nothing on the other copies read 45-49% faster (H100,
    2026-11-27); refilling with the correctness seeds' values let a memo keyed on values the variant had
    already seen pass. New seeds per copy close both: a result cached by pointer, shape or value, memory
    holding an earlier answer, work left out of the replay or done on some copies only, all fail here.
    """
    n = copies.count
    for j, member in enumerate(copies.members):
        indices = list(copies.copies_of(j))
        with _values_kept(copies, indices) as tensors:
            seeds: dict[int, int] = {}
            made: dict[int, Inputs] = {}
            for i in indices:
                seeds[i], made[i] = copies.fresh(i)
                out = copies.outputs.get(i)
                if isinstance(out, torch.Tensor) and out.is_floating_point():
                    out.fill_(math.nan)
            new = _refill(tensors, made)
            first = member()
            # One transfer for the whole member's screens (correctness.screened); a copy the screen does not
            # pass is judged in full below, which names what is wrong or passes it.
            screens = {
                i: screened(copies.outputs.get(i), copies.inputs[i], reference, overrides, new[i]) for i in indices
            }
            kept = {i: t for i, t in screens.items() if t is not None}
            passed = dict(zip(kept, torch.stack(list(kept.values())).tolist(), strict=True)) if kept else {}
            _sync(tensors[indices[0]])
            for i in indices:
                if passed.get(i, False):
                    continue
                where = f"input copy {i + 1} of {n} (seed {seeds[i]})"
                changed = modified_input(new[i], tensors[i])
                if changed:
                    return f"input mutation: the timed calls modified input {changed} in place on {where}"
                try:
                    judge_output(copies.outputs.get(i), copies.inputs[i], reference, overrides, seed=seeds[i])
                except CorrectnessFailure as exc:
                    return (
                        f"timed output wrong on {where}: a replay of the timed sample on new input values, never "
                        "seen by the variant, written outside the timed window, returned a stale, cached, "
                        f"unfinished or partial result: {exc}"
                    )
            if pairs is not None:
                again = _device_ns(member())
                pairs.append(_device_ns(first) / again if again > 0 else 1.0)
    return None


# A memo: a run of a timed sample on new values, against a run on the values it has already run. An honest
# kernel reads the same both times (each sample starts on a flushed L2); a kernel that keeps an answer for
# values it has seen (a device-side fingerprint, a cache keyed on tensor versions) is faster on seen values,
# and every timed sample but the first ran on seen values. On a GPU the factor is MEMO_FACTOR; on a host, where one
# process reads 2.3x slow at times, MEMO_FACTOR_HOST; judged on paired rounds (seen_values).
MEMO_FACTOR = 1.10
MEMO_FACTOR_HOST = 1.30
MEMO_ROUNDS = 3
MEMO_CONFIRM_ROUNDS = 7


@dataclass(frozen=True)
class SeenResult:
    flag: str | None
    note: str
    ratio: float  # new values / seen values: the median of the paired rounds
    # The confirming rounds read past the factor, twice, each time while the machine was disturbed: the check
    # could not decide, and the case is disturbed (inconclusive, never stored), neither flagged nor passed.
    disturbed: str | None = None


def _watched(
    copies: TimedCopies, rounds: int, order: random.Random, watch: Callable[[], Watch | None] | None
) -> tuple[list[float], list[str]]:
    """_fresh_and_seen under a watch made for them (`watch()`): the ratios and what disturbed their rounds."""
    made = watch() if watch is not None else None
    if made is None:
        return _fresh_and_seen(copies, rounds, order), []
    made.start()
    ratios = _fresh_and_seen(copies, rounds, order)
    return ratios, made.stop()


def _fresh_and_seen(copies: TimedCopies, rounds: int, order: random.Random) -> list[float]:
    """Per round, the run on new values over the run on the values the copies already hold, on one member (the
    members in turn). Each run follows the same host work (new values drawn for every copy of a member), written
    into the copies for the first kind and thrown away for the second, the two kinds in a random order: the
    first run after other host work reads slower on a host (caches), and only the values may differ."""
    ratios = []
    start = order.randrange(len(copies.members))
    with _values_kept(copies, range(copies.count)) as tensors:  # put back once: a write is a new value
        for k in range(rounds):
            totals = {True: 0.0, False: 0.0}
            # One member a round, in turn from a random one: a memo serves every sample that met seen values,
            # so any member shows it, and all of them each round made this check 7% of a large case's wall
            # time (8 members of one call each; H100, 2026-11-28).
            j = (start + k) % len(copies.members)
            member, indices = copies.members[j], list(copies.copies_of(j))
            kinds = [True, False]
            order.shuffle(kinds)
            for new in kinds:
                drawn = {i: copies.fresh(i)[1] for i in indices}
                if new:
                    _refill(tensors, drawn)
                _sync(tensors[indices[0]])
                totals[new] += _device_ns(member())
            ratios.append(totals[True] / totals[False] if totals[False] > 0 else 1.0)
    return ratios


def _device_ns(sample: Any) -> float:
    return float(getattr(sample, "device_ns", 0.0))


def seen_values(
    copies: TimedCopies,
    *,
    host: bool,
    first: Sequence[float] = (),
    watch: Callable[[], Watch | None] | None = None,
) -> SeenResult:
    """The timed samples' speed on values they have already seen against new values (`every_copy` checks
    the answers; this checks the time). Flags a kernel that is faster on values it has seen by MEMO_FACTOR
    (MEMO_FACTOR_HOST on a host timer): a first look, the median of `first` (every_copy's pairs, one per
    sample, on a GPU) or of MEMO_ROUNDS paired rounds, then MEMO_CONFIRM_ROUNDS rounds in a random order,
    all but one of which must read slower on new values. every_copy's pairs always run new values first; on
    a GPU each sample starts on a flushed L2 after a synchronise, and a first look that reads slow only
    costs the confirming rounds.

    Measured on an H100 (2026-11-27): a device-side fingerprint of a few input elements that skipped half the
    work read 22% faster than the job; a memo on the tensors' version counters in stream mode, 31%. What gets
    past it: a memo that saves less than the factor (10% on a GPU): the stored gate's margin is of that order,
    so such a memo can hide a regression of that size, no more.

    `watch` makes a timers.Watch (or None) for each set of confirming rounds, only when they run: a flag
    fails the case, so it must not rest on rounds the machine disturbed. On a contended 2-core host an honest
    CPU case read 1.31x over 7 rounds (2026-11-28, CI). Disturbed rounds that read past the factor are run
    once more; disturbed again, the result is `disturbed` (the case is inconclusive), never a flag and never
    a pass."""
    factor = MEMO_FACTOR_HOST if host else MEMO_FACTOR
    order = random.Random(copies.count)
    ratios = list(first) or _fresh_and_seen(copies, MEMO_ROUNDS, order)
    ratio = statistics.median(ratios)
    flagged = False
    disturbed: list[str] = []
    for _ in range(2):
        if ratio < factor:
            break
        # A first look can be noise; the claim needs the confirming rounds' median past the factor and all but
        # one of them slower on new values (one round may meet a preempted host): an honest kernel, whatever
        # its noise, reads that way with odds of 8 in 2^7 on the second condition alone.
        ratios, disturbed = _watched(copies, MEMO_CONFIRM_ROUNDS, order, watch)
        ratio = statistics.median(ratios)
        flagged = ratio >= factor and sum(r > 1.0 for r in ratios) >= len(ratios) - 1
        if not disturbed:
            break
    # Rounds that read as a memo while disturbed decide nothing; disturbed rounds under the factor still pass
    # (the load slows both kinds of values alike in expectation, and a memo past the factor would show).
    undecided = flagged and bool(disturbed)
    flagged = flagged and not disturbed
    seen_text = (
        f"on new input values its timed samples read {ratio:.2f}x their time on values they had already run "
        f"(median of {len(ratios)} paired rounds over {len(copies.members)} sample(s) of {copies.reps} call(s) "
        "each)"
    )
    if flagged:
        return SeenResult(
            f"memo on seen inputs: {seen_text}, above {factor:.2f}x: the variant keeps answers for inputs it has "
            "seen, and every timed call ran on such inputs; its time is not the time of the job",
            "",
            ratio,
        )
    if undecided:
        return SeenResult(
            None,
            f"seen-values check undecided: {seen_text}, above {factor:.2f}x, in two sets of confirming rounds "
            f"both disturbed ({'; '.join(disturbed)})",
            ratio,
            disturbed=f"the memo check's rounds were disturbed ({'; '.join(disturbed)}): "
            f"{ratio:.2f}x on new values against seen ones could be the load",
        )
    return SeenResult(None, f"seen-values check: {seen_text}", ratio)
