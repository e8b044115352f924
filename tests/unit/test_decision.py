"""The run's decision on a timed case (policy.decision): pass only where a regression of the margin is ruled
out, fail where the item failed, unverified for everything undecided; and the allowance's two forms."""

from __future__ import annotations

import pytest

from pytest_perfguard.judge.policy import MDE_MARGINS, allowance, decision


@pytest.mark.parametrize("verdict", ["inconclusive", "not comparable", "no base", None])
def test_undecided_verdicts_are_unverified(verdict: str | None) -> None:
    assert decision(verdict, False, True, 0.01, 0.05) == "unverified"


def test_a_failed_item_fails_whatever_its_verdict() -> None:
    assert decision("inconclusive", True, True, None, 0.05) == "fail"
    assert decision("pass", True, False, None, 0.05) == "fail"


def test_a_pass_is_a_pass_only_while_it_could_see_twice_the_margin() -> None:
    assert decision("pass", False, True, 0.09, 0.05) == "pass"
    assert decision("faster", False, True, 0.09, 0.05) == "pass"
    assert decision("pass", False, True, MDE_MARGINS * 0.05 + 1e-6, 0.05) == "unverified"
    assert decision("pass", False, True, None, 0.05) == "pass"  # no MDE (a max_ratio gate alone): its own rule


def test_nothing_stored_is_new_and_untimed_is_nothing() -> None:
    assert decision("no baseline", False, True, None, 0.05) == "new"
    assert decision("new", False, True, None, 0.05) == "new"
    assert decision("correct", False, False, None, 0.05) == ""


def test_the_allowance_is_a_count_or_a_share_rounded_down() -> None:
    assert allowance("0", 98) == 0
    assert allowance("3", 98) == 3
    assert allowance("5%", 98) == 4
    assert allowance("50%", 3) == 1


def test_a_disturbed_case_says_who_disturbed_it_and_how_long_it_waited() -> None:
    from pytest_perfguard.record import CaseRecord, Status
    from pytest_perfguard.run.session import _why_unverified

    busy = "GPU 0 shared with pid 844 (python: gpu_load.py) at 99% SM, 29% memory while timed"
    r = CaseRecord(
        "t.py::a",
        verdict=Status.INCONCLUSIVE,
        disturbances=[busy],
        notes=[f"waited 30.0 s for the disturbance to end ({busy}): it had not ended", "re-measured once"],
    )
    assert _why_unverified(r, 0.05) == f"disturbed while timed: {busy}; waited 30.0 s for it to end: it had not ended"
    r.notes = []
    assert _why_unverified(r, 0.05) == f"disturbed while timed: {busy}"
