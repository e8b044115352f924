"""The confirmation's rules on what a fresh process read (confirm.settle): two processes judged together
against a stored sample, and where that rule does not apply (end to end: tests/test_batch_confirm.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pytest_perfguard.judge import policy
from pytest_perfguard.judge.baseline import BaselineEntry, BaselineFile, ProcessSample
from pytest_perfguard.judge.verdict import Verdict
from pytest_perfguard.record import CaseRecord, Confirmed, Gate, Outcome, Status
from pytest_perfguard.run import context
from pytest_perfguard.run.confirm import Confirmation, settle
from pytest_perfguard.run.context import Context, RanItem, RunOrder
from pytest_perfguard.run.state import SessionState, make_state
from pytest_perfguard.settings import Settings

CASE = "test_k.py::test_attn[fast-8]"


@dataclass
class FakeItem:
    nodeid: str = CASE


@dataclass
class FakeRun:
    """What settle reads of the runner of the case it confirms."""

    state: SessionState
    item: FakeItem = field(default_factory=FakeItem)
    timing_s: float = 0.0


def _state(runs: int = 3, *, against: str | None = None, unstable: bool = False) -> SessionState:
    state = make_state(Settings(enabled=True, device="cpu", against=against))
    times = [1000.0, 1002.0, 998.0][:runs]
    samples = [ProcessSample(t, (t * 0.99, t * 1.01), t / 800.0, 800.0) for t in times]
    entry = BaselineEntry.from_samples(
        CASE, samples, workload="w", workload_desc="", env={}, updated="", noise=0.002, unstable=unstable
    )
    state.baseline = BaselineFile(path=Path("b.json"), exists=True, device={}, cases={CASE: entry})
    return state


def _gate(name: str, status: Status, estimate: float | None) -> Gate:
    return Gate(name, status, estimate=estimate, reason=f"{name} {status}")


def _verdict(time: float, ratio: float, *, time_status: Status = Status.REGRESSED) -> Verdict:
    ratio_status = Status.REGRESSED if ratio > 1.1 else Status.PASS
    return Verdict(gates=[_gate("baseline", time_status, time), _gate("ratio", ratio_status, ratio)])


def _child(time: float, ratio: float, **kw: object) -> CaseRecord:
    gates = [
        Gate("baseline", Status.PASS, estimate=time, reason="time vs baseline"),
        Gate("ratio", Status.PASS, estimate=ratio, reason="ratio"),
    ]
    record = CaseRecord(id=CASE, outcome=Outcome.PASSED, verdict=Status.PASS, median_ns=1000.0 * time, gates=gates)
    for name, value in kw.items():
        setattr(record, name, value)
    return record


def _settle(state: SessionState, verdict: Verdict, child: CaseRecord) -> Confirmation:
    return settle(FakeRun(state), verdict, Status.REGRESSED, child, None)  # type: ignore[arg-type]


def _limit(state: SessionState) -> float:
    """The time gate's threshold for a mean of two processes, from the policy the session judges with."""
    p = state.policy()
    entry = state.baseline.cases[CASE] if state.baseline is not None else None
    assert entry is not None
    return policy.mean_threshold(
        p.margin, entry.noise, entry.runs, p.noise_floor, prior=p.prior_spread, half_width=entry.half_width
    )


def test_two_processes_whose_mean_is_within_the_threshold_pass_and_the_note_gives_both_readings() -> None:
    state = _state()
    limit = _limit(state)
    here, there = 1.0 + limit * 1.3, 1.0 + limit * 0.3  # beyond the threshold here, within it there
    verdict = _verdict(here, 1.0)
    got = _settle(state, verdict, _child(there, 1.0))
    assert got.status is Status.PASS
    mean = math.sqrt(here * there) - 1
    assert got.note == (
        f"not confirmed: time vs baseline {(here - 1) * 100:+.1f}% in this process, {(there - 1) * 100:+.1f}% in a "
        f"fresh one; the two processes' mean {mean * 100:+.1f}% is within the {limit * 100:.1f}% threshold"
    )
    assert verdict.notes[0] == got.note


def test_two_processes_whose_mean_is_beyond_the_threshold_stay_inconclusive_and_say_so() -> None:
    state = _state()
    limit = _limit(state)
    got = _settle(state, _verdict(1.0 + limit * 2.5, 1.0), _child(1.0 + limit * 0.5, 1.0))
    assert got.status is Status.INCONCLUSIVE
    assert got.note.startswith("not confirmed: baseline regressed in this process, but pass in a fresh one")
    assert got.note.endswith(f"is beyond the {limit * 100:.1f}% threshold")


def test_the_ratio_gate_is_judged_the_same_way_and_both_must_be_within() -> None:
    state = _state()
    assert _limit(state) == pytest.approx(0.161, abs=0.001)  # the CPU's noise floor sets it (detectable_margin)
    both = _settle(state, _verdict(1.25, 1.25), _child(1.0, 1.0))  # both gates +25% here, 0 there: +11.8%
    assert both.status is Status.PASS
    assert "; ratio vs baseline ratio +25.0% in this process, +0.0% in a fresh one" in both.note
    one = _settle(state, _verdict(1.25, 1.60), _child(1.0, 1.0))  # the ratio's mean +26.5%: beyond
    assert one.status is Status.INCONCLUSIVE and "ratio vs baseline ratio +60.0%" in one.note


def test_a_time_gate_the_machine_moved_is_left_to_the_ratio_gate() -> None:
    state = _state()
    verdict = _verdict(1.25, 1.25, time_status=Status.NOT_COMPARABLE)
    got = _settle(state, verdict, _child(1.0, 1.0))
    assert got.status is Status.NOT_COMPARABLE  # what the case is with its ratio gate passed
    assert "time vs baseline" not in got.note and "ratio vs baseline ratio +25.0%" in got.note


@pytest.mark.parametrize(
    "why",
    ["one process stored", "unstable entry", "against a base revision", "fresh process disturbed", "max_ratio"],
)
def test_where_the_rule_does_not_apply_a_regression_not_repeated_stays_inconclusive(why: str) -> None:
    state = {
        "one process stored": _state(1),
        "unstable entry": _state(unstable=True),
        "against a base revision": _state(against="HEAD~1"),
    }.get(why, _state())
    verdict = _verdict(1.40, 1.0)
    if why == "max_ratio":
        verdict.gates.append(_gate("max_ratio", Status.REGRESSED, 1.4))
    child = _child(1.0, 1.0, disturbances=["busy"] if why == "fresh process disturbed" else [])
    got = _settle(state, verdict, child)
    assert got.status is Status.INCONCLUSIVE
    assert "mean" not in got.note and got.note.endswith("a process-dependent time, not judged")


def test_a_regression_the_fresh_process_repeats_stands_whatever_the_mean() -> None:
    state = _state()
    child = _child(1.30, 1.0)
    child.verdict = Status.REGRESSED
    child.gates[0].status = Status.REGRESSED
    got = _settle(state, _verdict(1.40, 1.0), child)
    assert got.status is Status.REGRESSED and got.note.startswith("confirmed in a fresh process: time vs baseline")


@pytest.mark.parametrize("update", [True, False])
def test_a_fresh_process_gets_the_gpu_memory_and_knows_if_its_times_are_stored(
    update: bool, pytestconfig: pytest.Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An update's further processes run with A/A against HEAD, and what they time is stored: they must know
    it (they spread each side over several input copies, as a plain run does). A confirmation must not. And
    the memory this process keeps cached on the GPU is given back before either starts."""
    import torch

    from pytest_perfguard.run import fresh
    from pytest_perfguard.run.role import Role

    seen: dict[str, str] = {}
    events: list[str] = []

    class FakeChild:
        """What start_fresh_cases starts: it exits at once with status 1 and writes no result."""

        returncode = 1

        def __init__(self, cmd: list[str], **kwargs: object) -> None:
            env = kwargs["env"]
            assert isinstance(env, dict)
            seen.update(env)
            events.append("child")

        def wait(self, timeout: float | None = None) -> int:
            return self.returncode

    monkeypatch.setattr(fresh.subprocess, "Popen", FakeChild)
    # As on a GPU that this process has used: its cached memory goes back before the child starts.
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: events.append("released"))
    got = fresh.start_fresh_cases(pytestconfig, ["t.py::a"], Settings(), None, update=update).result()
    assert isinstance(got, str) and "wrote no result" in got
    assert events == ["released", "child"]
    role = Role.of(None, seen)  # the role the child decides at its configure, from the environment it got
    assert role.child and role.update_process is update and not role.alone


def test_a_fresh_process_past_its_timeout_is_killed_and_says_so(pytestconfig: pytest.Config) -> None:
    """A real child (pytest in a new interpreter) cannot import torch in 0.3 s: it is killed, its folder goes,
    and the reason names the timeout."""
    from pytest_perfguard.run.fresh import start_fresh_cases

    fresh = start_fresh_cases(pytestconfig, ["t.py::a"], Settings(), 0.3)
    assert fresh.proc is not None and fresh.proc.poll() is None  # running while this process goes on
    assert fresh.result() == "the fresh process did not finish in 0.3s"
    assert fresh.proc.returncode is not None and fresh.proc.returncode < 0  # killed
    assert not Path(fresh.folder.name).exists()


def test_a_fresh_process_goes_when_the_wait_for_it_is_interrupted(
    pytestconfig: pytest.Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C while this session waits for its child (as subprocess.run does): the child is killed, not left
    timing on the GPU, and the interrupt goes on."""
    from pytest_perfguard.run.fresh import start_fresh_cases

    fresh = start_fresh_cases(pytestconfig, ["t.py::a"], Settings(), None)
    proc = fresh.proc
    assert proc is not None
    real_wait = proc.wait

    def interrupted_once(timeout: float | None = None) -> int:
        monkeypatch.setattr(proc, "wait", real_wait)
        raise KeyboardInterrupt

    monkeypatch.setattr(proc, "wait", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        fresh.result()
    assert proc.returncode is not None and proc.returncode < 0  # killed
    assert not Path(fresh.folder.name).exists()


# ------------------------------------------------------------------------------------------ the context


def _replayed(time: float, verdict: Status) -> CaseRecord:
    """The case's record in a replay after the cases that preceded it."""
    child = _child(time, 1.0)
    child.verdict = verdict
    child.gates[0].status = verdict
    child.gates[0].reason = f"time vs baseline {(time - 1) * 100:+.1f}%"
    return child


def test_a_regression_the_replay_after_its_preceding_cases_repeats_stands_and_names_them() -> None:
    """Alone the fresh process reads pass; after the cases that preceded it here, regressed: the regression
    stands, the note names those cases (the first two, the last and the count of many), and the record
    keeps the replay's reading, and both processes' seconds (the case's own time leaves them out)."""
    after = [f"test_k.py::test_a[{i}]" for i in range(5)]
    context = Context(after, _replayed(1.5, Status.REGRESSED), elapsed_s=7.0)
    verdict = _verdict(1.5, 1.0)
    got = settle(
        FakeRun(_state()),  # type: ignore[arg-type]
        verdict,
        Status.REGRESSED,
        _child(1.0, 1.0),
        Confirmed(elapsed_s=3.0, verdict=Status.PASS),
        context=context,
    )
    assert got.status is Status.REGRESSED
    assert got.note == (
        "confirmed in a fresh process only after test_k.py::test_a[0], test_k.py::test_a[1] ... test_k.py::test_a[4] "
        "(5 cases), as in this process (alone it read pass): time vs baseline +50.0%"
    )
    assert got.info is not None and got.info.verdict is Status.REGRESSED and got.info.elapsed_s == 10.0


def test_a_regression_neither_alone_nor_after_its_preceding_cases_stays_as_before_and_says_so() -> None:
    """Neither process repeats it: the rule of a single confirmation decides (the two processes judged
    together, here beyond the threshold), and the note says what the replay read, after which cases."""
    state = _state()
    limit = _limit(state)
    after = ["test_k.py::test_a[0]", "test_k.py::test_a[1]"]
    context = Context(after, _replayed(1.0, Status.PASS), elapsed_s=7.0)
    got = settle(
        FakeRun(state),  # type: ignore[arg-type]
        _verdict(1.0 + limit * 2.5, 1.0),
        Status.REGRESSED,
        _child(1.0 + limit * 0.5, 1.0),
        None,
        context=context,
    )
    assert got.status is Status.INCONCLUSIVE
    assert (
        "a process-dependent time, not judged; pass also in a fresh one that first ran test_k.py::test_a[0], "
        "test_k.py::test_a[1], as this process did; time vs baseline" in got.note
    ), got.note
    within = settle(
        FakeRun(state),  # type: ignore[arg-type]
        _verdict(1.0 + limit * 1.3, 1.0),
        Status.REGRESSED,
        _child(1.0 + limit * 0.3, 1.0),
        None,
        context=Context(after, "the fresh process did not finish in 9s", elapsed_s=9.0),
    )
    assert within.status is Status.PASS
    assert within.note.endswith(
        "threshold; not replayed after the cases that preceded it here: the fresh process did not finish in 9s"
    )


def _order(took: list[float]) -> RunOrder:
    order = RunOrder()
    order.ran = [RanItem(f"t.py::t{i}", s) for i, s in enumerate(took)]
    return order


def test_a_replay_runs_a_bounded_tail_of_what_preceded_the_case(monkeypatch: pytest.MonkeyPatch) -> None:
    """At most CONTEXT_CASES items, at most CONTEXT_S of their time here, and at least the one before it."""
    monkeypatch.setattr(context, "CONTEXT_CASES", 3)
    monkeypatch.setattr(context, "CONTEXT_S", 10.0)
    assert _order([1.0] * 6).window("t.py::t5") == (5, [2, 3, 4])  # the count
    assert _order([1.0, 1.0, 6.0, 4.0, 1.0]).window("t.py::t4") == (4, [2, 3])  # the time: 4 + 6
    assert _order([1.0, 50.0, 0.0]).window("t.py::t2") == (2, [1])  # the one before it, however long
    assert _order([1.0, 1.0]).window("t.py::t0") is None  # it ran first: nothing to replay
    assert _order([1.0]).window("t.py::other") is None


def test_one_replay_for_several_runs_the_union_of_their_windows_in_this_process_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A batch's regressions share one replay: a subsequence of what ran here, each after its own window;
    past CONTEXT_BATCH_S of items, later windows wait for no one and are left out."""
    monkeypatch.setattr(context, "CONTEXT_CASES", 2)
    order = _order([1.0] * 10)
    ids, took, cases = order.plan(["t.py::t8", "t.py::t3"])
    assert cases == ["t.py::t3", "t.py::t8"]
    assert ids == ["t.py::t1", "t.py::t2", "t.py::t3", "t.py::t6", "t.py::t7", "t.py::t8"]
    assert took == 4.0  # the context items only: the cases' own time is added by the caller
    monkeypatch.setattr(context, "CONTEXT_BATCH_S", 3.0)
    ids, took, cases = order.plan(["t.py::t8", "t.py::t3"])
    assert cases == ["t.py::t3"] and ids == ["t.py::t1", "t.py::t2", "t.py::t3"]
