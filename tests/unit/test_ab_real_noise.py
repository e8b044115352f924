"""The A/B gate on real noise: the head/base capture-group ratios of two A/A runs of the guarded suite on
H100s (2026-11-25, hosts 7 and 9 of benchmarks/results/ab_2026-11-25, read from its raw archive), judged
again by today's gate. Unchanged code must not fail once a fresh process has been asked, and the same
noise moved by the slowdown the gate promises to see (+2% from 20 us, +3% below) must fail in at least 95%
of the cases, in one measurement."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_perfguard.judge.verdict import Policy, ab_gate
from pytest_perfguard.settings import AB_SMALL_NS, Settings
from tests.unit.recorded_aa import records


def judge(r: dict[str, Any], shift: float = 0.0) -> tuple[str, float | None]:
    s = Settings()
    ns = r["median_ns"]
    ratios = [x * (1.0 + shift) for x in r["ab"]["group_ratios"]]
    gate = ab_gate(ratios, Policy(family_size=98, confirm=True), s.ab_margin_for(ns), s.ab_process_sd_for(ns))
    return str(gate.status), gate.mde


def test_the_recorded_runs_are_there() -> None:
    assert len(records()) == 196
    assert sum(r["median_ns"] < AB_SMALL_NS for r in records()) == 67


def test_unchanged_code_fails_nowhere_a_fresh_process_would_not_overturn() -> None:
    # One process can read a regression on identical code: cuda_scalar's two loaded copies differ by up to 4%
    # per process. That is why a regression must repeat in a fresh process; the recorded runs did that, and
    # every case judged regressed here is one the fresh process found to pass.
    regressed = [r for r in records() if judge(r)[0] == "regressed"]
    assert len(regressed) <= 2, [r["id"] for r in regressed]
    for r in regressed:
        assert "cuda_scalar" in r["id"] and r["verdict"] != "regressed"
        assert any("but pass in a fresh one" in reason for reason in r["reasons"]), r["reasons"]


@pytest.mark.parametrize("small", [True, False], ids=["under 20 us, +3%", "20 us and up, +2%"])
def test_the_promised_slowdown_is_caught_in_95_percent_of_cases(small: bool) -> None:
    s = Settings()
    cases = [r for r in records() if (r["median_ns"] < AB_SMALL_NS) == small]
    caught = [judge(r, s.ab_detect_for(r["median_ns"]))[0] == "regressed" for r in cases]
    assert sum(caught) >= 0.95 * len(cases), f"{sum(caught)} of {len(cases)}"


def test_the_mde_keeps_the_promise_where_the_budget_allowed() -> None:
    s = Settings()
    over = [r["id"] for r in records() if (judge(r)[1] or 1.0) > s.ab_detect_for(r["median_ns"]) + 1e-9]
    # One case in the two runs: cuda_scalar, whose two loaded copies differ by up to 4% per process, after a
    # re-measurement pooled two orders' offsets.
    assert len(over) <= 1, over
