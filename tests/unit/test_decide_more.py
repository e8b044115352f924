"""Before a case is called unverified the guard measures it more (run/timed.py, TimedStep._decide_more):
where a gate straddles its margin, and where a pass is too wide to rule out twice the margin (its minimum
detectable effect past policy.MDE_MARGINS margins). Not where more blocks cannot help: a decided pass, a
regression, a stored entry that cannot be compared."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from pytest_perfguard.judge.policy import MDE_MARGINS, could_hide, judged_margin
from pytest_perfguard.judge.verdict import Verdict
from pytest_perfguard.record import Gate, Status
from pytest_perfguard.run.timed import TimedStep

MARGIN = 0.05


def _more(*gates: Gate, against: bool = False) -> bool:
    settings = SimpleNamespace(margin=MARGIN, against=None, ab_margin_for=lambda ns: MARGIN)
    step: Any = SimpleNamespace(state=SimpleNamespace(settings=settings))
    fn = object()
    trial = SimpleNamespace(variant=SimpleNamespace(fn=fn), case=SimpleNamespace(against=fn if against else None))
    m = SimpleNamespace(time=SimpleNamespace(estimate=1000.0))
    return TimedStep._more_can_decide(step, trial, m, Verdict(gates=list(gates)))  # type: ignore[arg-type]


def _gate(name: str, status: Status, mde: float | None, reason: str = "") -> Gate:
    return Gate(name, status, 1.0, 0.95, 1.05, 1.0 + MARGIN, reason or f"{name} vs baseline +0.0%", mde)


def test_a_pass_too_wide_to_rule_out_twice_the_margin_is_measured_more() -> None:
    # The fresh H100's one unverified case (2026-11-28): both gates pass, the better MDE 10.2% > 2 x 5%.
    wide = MDE_MARGINS * MARGIN * 1.02
    assert _more(_gate("baseline", Status.PASS, wide * 1.2), _gate("ratio", Status.PASS, wide))
    # The case's MDE is its best gate's: one sharp gate decides it.
    assert not _more(_gate("baseline", Status.PASS, wide), _gate("ratio", Status.PASS, MARGIN))
    # The ratio gate of the reference timed against itself sees nothing (variant_is_against)
    assert _more(_gate("baseline", Status.PASS, wide), _gate("ratio", Status.PASS, MARGIN), against=True)


def test_a_straddling_gate_is_measured_more_and_a_decided_one_is_not() -> None:
    straddles = _gate("baseline", Status.INCONCLUSIVE, None, "time vs baseline +4.0% (...) straddles the 5.0% margin")
    assert _more(straddles)
    assert not _more(_gate("baseline", Status.REGRESSED, MARGIN))
    assert not _more(_gate("baseline", Status.NOT_COMPARABLE, None, "not comparable: torch 1.0 -> 2.0"))
    assert not _more(_gate("baseline", Status.INCONCLUSIVE, None, "inconclusive: unstable baseline"))


def test_the_judged_margin_is_the_widest_comparing_gate_and_never_the_host_gate() -> None:
    assert judged_margin([("baseline", 1.05), ("ratio", 1.08), ("host", 2.5)], 0.05) == pytest.approx(0.08)
    assert judged_margin([("host", 2.5)], 0.03) == 0.03
    assert could_hide(0.101, 0.05) and not could_hide(0.099, 0.05) and not could_hide(None, 0.05)
