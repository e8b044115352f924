"""A regression replayed after the cases that preceded it in this process (confirm.py's last step before it
calls a regression process-dependent): the order this process ran its items in, the window replayed, the
replay itself and what it made of the case."""

from __future__ import annotations

import math
import time
from collections.abc import Generator, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace

import pytest

from ..judge.policy import BATCH_TIME_FACTOR
from ..record import CaseRecord, Confirmed, Outcome, Status
from ..settings import Settings
from .fresh import confirmed_of, say, start_fresh_cases

# The tail of this process's run a regression is replayed after (`RunOrder.window`): at most this many of the
# items that preceded it, and no more of them than took this many seconds here (at least the one just before
# it). A slowdown left by another case comes from the same kernel's other shapes or variants far more often
# than from anything else, and those run together (a parametrization's cases are adjacent; an xdist worker
# sorts perf cases by stored time, which keeps a kernel's shapes near one another), so a tail of 32 covers a
# seed grid; 120 s is about 15-25 GPU cases at the default budget, and each replay costs that again.
CONTEXT_CASES = 32
CONTEXT_S = 120.0
# A batch replays the windows of all its unrepeated regressions in one process, their union in run order;
# its windows are admitted in run order while that union took at most this long here.
CONTEXT_BATCH_S = 4 * CONTEXT_S


@dataclass
class RanItem:
    """An item this process ran, and what it took here."""

    nodeid: str
    took_s: float = 0.0  # its protocol less its fresh processes (`aside_s`); 0 while it runs
    aside_s: float = 0.0


class RunOrder:
    """The items this process ran, in its order, and what each took: the context a regression is replayed
    after (`replay_in_context`). A pytest plugin, installed with the session's `Batch`. Not the session's
    records, which hold perf cases only, in the order they concluded (a batched regression's after the last
    case), while a plain test can leave state behind too; not `session.items`, of which an xdist worker
    runs its share, and in an order of its own (xdist.longest_first)."""

    def __init__(self) -> None:
        self.ran: list[RanItem] = []

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_protocol(
        self, item: pytest.Item, nextitem: pytest.Item | None
    ) -> Generator[None, object, object]:
        entry = RanItem(item.nodeid)
        self.ran.append(entry)  # before it runs: its own confirmation reads what preceded it
        t0 = time.monotonic()
        try:
            return (yield)
        finally:
            entry.took_s = max(time.monotonic() - t0 - entry.aside_s, 0.0)

    @contextmanager
    def aside(self) -> Iterator[None]:
        """Around a fresh process started during an item: not the item's time, which bounds a replay."""
        t0 = time.monotonic()
        try:
            yield
        finally:
            if self.ran:
                self.ran[-1].aside_s += time.monotonic() - t0

    def window(self, nodeid: str) -> tuple[int, list[int]] | None:
        """Where the item last ran here, and the items a replay runs before it: the newest of those that
        preceded it, at most CONTEXT_CASES of them and CONTEXT_S of their time here (at least one), in
        order. None when nothing ran before it."""
        at = next((i for i in range(len(self.ran) - 1, -1, -1) if self.ran[i].nodeid == nodeid), None)
        if at is None:
            return None
        kept: list[int] = []
        spent = 0.0
        for i in range(at - 1, -1, -1):
            ran = self.ran[i]
            if ran.nodeid == nodeid:
                continue  # an earlier run of the same item (a rerun plugin): it is the one replayed
            if len(kept) >= CONTEXT_CASES or (kept and spent + ran.took_s > CONTEXT_S):
                break
            kept.append(i)
            spent += ran.took_s
        return (at, kept[::-1]) if kept else None

    def plan(self, nodeids: Sequence[str]) -> tuple[list[str], float, list[str]]:
        """One replay for these items: what it runs (each one's window and the item, in this process's
        order: a subsequence of what ran here, so no item runs after anything it did not follow here), what
        the context items took here, and the items it replays. Windows are admitted in run order while their
        union took at most CONTEXT_BATCH_S here; an item without a window is not replayed."""
        windows = sorted((w for w in map(self.window, dict.fromkeys(nodeids)) if w is not None), key=lambda w: w[0])
        chosen: set[int] = set()
        targets: set[int] = set()
        took = 0.0
        for at, kept in windows:
            more = [i for i in kept if i not in chosen and i not in targets]
            cost = math.fsum(self.ran[i].took_s for i in more)
            if targets and took + cost > CONTEXT_BATCH_S:
                continue
            chosen.update(more)
            targets.add(at)
            took += cost
        ids = list(dict.fromkeys(self.ran[i].nodeid for i in sorted(chosen | targets)))
        return ids, took, [self.ran[i].nodeid for i in sorted(targets)]


RUN_ORDER = pytest.StashKey[RunOrder]()


@dataclass
class Context:
    """What a replay after the cases that preceded a regression here made of it (`replay_in_context`)."""

    after: list[str]  # what ran before it in the replay, in this process's order
    child: CaseRecord | str  # its record there, or why there is none
    elapsed_s: float  # the replay's seconds (shared by the cases one replay confirms)
    bound_s: float = 0.0  # the replay's bound of measurement

    @property
    def reproduced(self) -> bool:
        return isinstance(self.child, CaseRecord) and self.child.verdict is Status.REGRESSED

    def said(self) -> str:
        """A note's words on a replay that did not repeat the regression."""
        if isinstance(self.child, str):
            return f"not replayed after the cases that preceded it here: {self.child}"
        if unmeasured(self.child):
            return (
                f"not replayed after {cases_text(self.after)}: the replay's bound of {self.bound_s:.0f} s of "
                "measurement was spent before this case"
            )
        return f"{self.child.verdict} also in a fresh one that first ran {cases_text(self.after)}, as this process did"

    def kept(self, info: Confirmed | None) -> Confirmed:
        """What the record keeps of a confirmation that the replay made: the replay's reading."""
        spent = round((info.elapsed_s if info is not None else 0.0) + self.elapsed_s, 1)
        return replace(confirmed_of(self.child, spent), batch=info.batch if info is not None else None)

    def added_to(self, info: Confirmed | None) -> Confirmed | None:
        """The fresh process's reading kept, with the replay's seconds: the case's own time leaves both out."""
        return None if info is None else replace(info, elapsed_s=round(info.elapsed_s + self.elapsed_s, 1))


def cases_text(ids: Sequence[str]) -> str:
    """Items named in a note: a few by name; of many, the first two, the last and the count."""
    if len(ids) <= 3:
        return ", ".join(ids)
    return f"{ids[0]}, {ids[1]} ... {ids[-1]} ({len(ids)} cases)"


def unrepeated(child: CaseRecord | str) -> bool:
    """The fresh process measured the case and did not read it regressed."""
    return isinstance(child, CaseRecord) and child.verdict is not Status.REGRESSED and not unmeasured(child)


@contextmanager
def aside(config: pytest.Config) -> Iterator[None]:
    order = config.stash.get(RUN_ORDER, None)
    with order.aside() if order is not None else nullcontext():
        yield


def replay_in_context(
    config: pytest.Config, order: RunOrder, timings: Mapping[str, float], settings: Settings
) -> dict[str, Context]:
    """These regressions (their ids, and what measuring each took here) run again in one fresh process,
    each after the items that preceded it in this process, in its order (`RunOrder.plan`): only their
    records are read, the context items' verdicts are the original run's. One without a window (it ran
    first) has no entry. The replay measures for at most twice what its items took here, plus one case's
    budget, as a batch does."""
    ids, took, cases = order.plan(list(timings))
    out: dict[str, Context] = {}
    for nodeid in timings:
        if nodeid not in cases and order.window(nodeid) is not None:
            why = f"the replays of one batch run at most {CONTEXT_BATCH_S:.0f} s of this process's cases"
            out[nodeid] = Context([], f"{why}, spent on the regressions before it", 0.0)
    if not cases:
        return out
    bound = BATCH_TIME_FACTOR * (took + math.fsum(timings[c] for c in cases)) + settings.case_budget
    timeout = 2 * settings.case_timeout * len(ids) + bound + 120 if settings.case_timeout else None
    say(
        config,
        f"perfguard: {len(cases)} regression(s) not repeated alone: run again in a fresh process after the "
        f"{len(ids) - len(cases)} case(s) that preceded them here (at most {bound:.0f} s of measurement)",
    )
    t0 = time.monotonic()
    got = start_fresh_cases(config, ids, settings, timeout, total_budget=bound, alone=True, judged=cases).result()
    spent = round(time.monotonic() - t0, 1)
    for nodeid in cases:
        child = got if isinstance(got, str) else got.get(nodeid, "the replay did not run this case")
        out[nodeid] = Context(ids[: ids.index(nodeid)], child, spent, bound)
    return out


def unmeasured(child: CaseRecord) -> bool:
    """The batch's process reached its measurement bound before this case (runner: "not timed: total
    budget spent")."""
    return not child.timed and child.outcome is Outcome.PASSED and child.verdict is Status.INCONCLUSIVE
