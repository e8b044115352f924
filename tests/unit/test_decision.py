"""The run's decision on a timed case (policy.decision): pass only where a regression of the margin is ruled
out, fail where the item failed, unverified for everything undecided; and the allowance's two forms."""

from __future__ import annotations

import pytest

from pytest_perfguard.judge.baseline import BaselineEntry, ProcessSample
from pytest_perfguard.judge.policy import MDE_MARGINS, allowance, decision
from pytest_perfguard.record import CaseRecord, Status
from pytest_perfguard.run.outcome import why_unverified


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
    from pytest_perfguard.run.outcome import why_unverified

    busy = "GPU 0 shared with pid 844 (python: gpu_load.py) at 99% SM, 29% memory while timed"
    r = CaseRecord(
        "t.py::a",
        verdict=Status.INCONCLUSIVE,
        disturbances=[busy],
        notes=[f"waited 30.0 s for the disturbance to end ({busy}): it had not ended", "re-measured once"],
    )
    assert why_unverified(r, 0.05) == f"disturbed while timed: {busy}; waited 30.0 s for it to end: it had not ended"
    r.notes = []
    assert why_unverified(r, 0.05) == f"disturbed while timed: {busy}"


def test_a_pass_past_the_mde_ceiling_names_the_stored_spread_that_sets_it() -> None:
    """A fresh H200 (2026-11-28): cuda_scalar S2048 causal read 1.105-1.110 ms in three of the update's five
    processes and 1.049-1.050 ms in two; every guard's pass had an MDE of 14.5% against twice its 7.2% margin,
    and measuring more could not change it. The summary says what sets it: the processes' spread."""
    entry = BaselineEntry.from_samples(
        "t::c",
        [ProcessSample(t, (t, t)) for t in (1106.9e3, 1109.3e3, 1048.8e3, 1049.8e3, 1110.4e3)],
        workload="w",
        workload_desc="",
        env={},
        updated="",
    )
    record = CaseRecord(id="t::c", test="t", variant="v", verdict=Status.PASS, mde=0.146)
    why = why_unverified(record, 0.072, entry)
    assert why.startswith("its pass could hide a slowdown of +14.6% (its minimum detectable effect), more than 2x")
    assert "the baseline's 5 processes differ by 3.1% (sd), which more blocks here cannot narrow" in why
    assert "processes differ" not in why_unverified(record, 0.072, None)
