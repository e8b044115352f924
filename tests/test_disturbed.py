"""A disturbed measurement end to end: re-measured once, judged on the clean one when the disturbance
passed, inconclusive and never stored when it stayed; a case on an injected clock is never watched.

The host's load is injected through the CPU watch's counters: the project's conftest replaces the timing
step's CpuWatch with one whose windows read as recorded beside two busy-loop processes (39% of each window
waiting for a CPU), for each case's first window (DISTURB=first) or every one (DISTURB=all). The cases
time with the real clock, so their numbers move with the machine; what is asserted here does not. The
last test loads the host for real: a busy process on the CPU the run is pinned to.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from test_plugin import MODES, TESTED_MODES, baseline_json, run

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.slow  # every test runs the plugin end to end

LOADED_HOST = '''
import os

from pytest_perfguard.measure import cpuwatch
from pytest_perfguard.run import checks


class LoadedHost(cpuwatch.CpuWatch):
    """Each timed window lasts 1 s; in the windows DISTURB names the process waited 0.39 s of it for a CPU:
    "all", a case's "first" window, the windows of the "checks" (a watch that counts any wait, floor_ns 0:
    the memo check's confirming rounds), or "none"."""

    def __init__(self, floor_ns=cpuwatch.RUN_WAIT_FLOOR_NS):
        super().__init__(read=self.counters, runnable=lambda: 3, cores=2, floor_ns=floor_ns)
        self.reads = self.wall = self.wait = 0

    def counters(self):
        self.reads += 1
        if self.reads % 2 == 0:  # the window's end
            mode = os.environ["DISTURB"]
            loaded = (
                mode == "all"
                or (mode == "first" and self.reads == 2)
                or (mode == "checks" and self.floor_ns == 0)
            )
            self.wall += 1_000_000_000
            self.wait += 390_000_000 if loaded else 1_000_000
        return cpuwatch.Counters(
            wall_ns=self.wall,
            thread_cpu_ns=self.wall - self.wait,
            run_wait_ns=self.wait,
            on_cpu_ns=self.wall - self.wait,
            involuntary=self.reads * 50,
            steal_ticks=0,
            all_ticks=self.reads * 200,
        )


def pytest_configure(config):
    checks.CpuWatch = LoadedHost


def pytest_unconfigure(config):
    checks.CpuWatch = cpuwatch.CpuWatch
'''

CASES = """
import torch
from pytest_perfguard import perf_case


def double(x):
    return x * 2


@perf_case(variants={"mul": double, "add": lambda x: x + x}, reference=double)
def test_double(perfguard_device):
    return (torch.randn(4096, device=perfguard_device),), {}


class Clock:
    t = 0

    def __call__(self):
        return self.t


CLOCK = Clock()


def ticking(x):
    CLOCK.t += 20_000
    return x * 2


@perf_case(variants={"ticking": ticking}, reference=double, clock=CLOCK)
def test_on_a_fake_clock(perfguard_device):
    return (torch.randn(4096, device=perfguard_device),), {}
"""

BUDGET = ("--perfguard-case-budget", "0.3")
REAL = ("test_double.py::test_double[mul]", "test_double.py::test_double[add]")
FAKE = "test_double.py::test_on_a_fake_clock[ticking]"


@pytest.fixture(params=TESTED_MODES)  # -n 0 adds nothing to these (tests/test_plugin.py, TESTED_MODES)
def mode(request: pytest.FixtureRequest) -> list[str]:
    return MODES[request.param]


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(LOADED_HOST)
    pytester.makepyfile(test_double=CASES)
    (pytester.path / ".ci" / "baselines").mkdir(parents=True)
    return pytester


def results(p: pytest.Pytester, name: str) -> dict[str, dict[str, Any]]:
    doc: dict[str, Any] = json.loads((p.path / name).read_text())
    return {r["id"]: r for r in doc["results"]}


def test_a_passing_disturbance_is_remeasured_and_a_lasting_one_is_inconclusive_and_never_stored(
    project: pytest.Pytester, mode: list[str]
) -> None:
    # The load passes after each case's first window: the re-measurement alone is judged, and stored.
    result = run(
        project, mode, "--perfguard-update-baseline", "--perfguard-json", "u.json", *BUDGET, env={"DISTURB": "first"}
    )
    result.assert_outcomes(passed=3)
    stored = baseline_json(project)["cases"]
    assert set(stored) == {*REAL, FAKE}
    for case_id in REAL:
        r = results(project, "u.json")[case_id]
        assert not r.get("disturbances") and r["verdict"] != "inconclusive", r
        assert any(
            n.startswith("re-measured once: the first measurement was disturbed (CPU contended") for n in r["notes"]
        )
    # The load stays: a guard run calls the watched cases inconclusive, whatever their numbers say.
    result = run(project, mode, "--perfguard", "--perfguard-json", "g.json", *BUDGET, env={"DISTURB": "all"})
    result.assert_outcomes(passed=3)
    got = results(project, "g.json")
    for case_id in REAL:
        r = got[case_id]
        assert r["verdict"] == "inconclusive", r
        assert r["reasons"][0].startswith(
            "CPU contended while timing: its threads waited for a CPU 39% of the time they could run (390 ms "
            "waiting, 610 ms running, in 1.00 s of timing; over 5% is load from other processes, or a "
            "container's CPU quota); the timing thread ran 61% of the wall time, 3.0 tasks runnable on 2 cores"
        ), r["reasons"]
        assert len(r["disturbances"]) == 1  # the same numbers both times: one disturbance
        assert any(n.startswith("disturbed in both measurements: inconclusive, never a failure") for n in r["reasons"])
    assert not got[FAKE].get("disturbances") and got[FAKE]["verdict"] == "pass"  # its clock is not the host's
    # Each disturbed case is named once, in the unverified cases' summary, its reason cut short there.
    result.stdout.fnmatch_lines(["*test_double.py::test_double[[]mul[]]: disturbed while timed: CPU contended*…"])
    assert "stayed disturbed" not in result.stdout.str()
    # Under CI a case that stayed disturbed is unverified, and fails the run with the summary naming it.
    result = run(project, mode, "--perfguard", *BUDGET, env={"DISTURB": "all", "CI": "true"})
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*case(s) unverified: the guard could not rule out a regression:",
            "*test_double.py::test_double[[]mul[]]: disturbed while timed: CPU contended while timing*",
            "*Under CI an unverified case is not a pass*",
        ]
    )
    # An update under the same load stores nothing from the disturbed cases.
    before = baseline_json(project)["cases"]
    result = run(project, mode, "--perfguard-update-baseline", *BUDGET, env={"DISTURB": "all"})
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        [
            "*2 timed case(s) not recorded (failed or disturbed)*",
            "*2 timed case(s) stayed disturbed while timed (re-measured once): inconclusive, not stored*",
        ]
    )
    after = baseline_json(project)["cases"]
    for case_id in REAL:
        assert after[case_id]["samples"] == before[case_id]["samples"], case_id


def test_the_cpu_watch_can_be_turned_off(project: pytest.Pytester) -> None:
    result = run(
        project,
        MODES["no-xdist"],
        "--perfguard-update-baseline",
        "--perfguard-json",
        "u.json",
        *BUDGET,
        env={"DISTURB": "all", "PERFGUARD_CPU_WATCH": "0"},
    )
    result.assert_outcomes(passed=3)
    assert set(baseline_json(project)["cases"]) == {*REAL, FAKE}
    assert not any(r.get("disturbances") for r in results(project, "u.json").values())


MEMO_CASES = """
import torch
from pytest_perfguard import perf_case

MEMO = {}


def square(x):
    return x @ x


def memo(x):
    # Right on any values (a refill bumps the version); every timed call after a copy's first is a lookup.
    # The input is kept with its answer: its memory cannot be reused for another tensor under the same key.
    key = (x.data_ptr(), x._version)
    if key not in MEMO:
        MEMO[key] = (x, x @ x)
    return MEMO[key][1].clone()


@perf_case(variants={"honest": square, "memo": memo}, reference=square)
def test_square(perfguard_device):
    return (torch.randn(384, 384, device=perfguard_device),), {}
"""
MEMO, HONEST = "test_square.py::test_square[memo]", "test_square.py::test_square[honest]"


def test_a_memo_check_the_load_kept_from_deciding_is_unverified_not_flagged_nor_passed(
    pytester: pytest.Pytester,
) -> None:
    """The memo check's confirming rounds on a loaded host (an honest CPU case once read 1.31x against 1.30x
    there): what they read cannot fail the case, and cannot pass it either. A memo on a quiet host is
    flagged; the same memo with its confirming rounds disturbed, twice, is unverified, and under CI fails
    the run as unverified. What would get past: a check that ran its rounds unwatched (a false flag on a
    loaded host), or one that called disturbed rounds a pass (a memo hiding behind the load)."""
    pytester.makeconftest(LOADED_HOST)
    pytester.makepyfile(test_square=MEMO_CASES)
    quiet = run(
        pytester, MODES["no-xdist"], "--perfguard", "--perfguard-json", "q.json", *BUDGET, env={"DISTURB": "none"}
    )
    got = results(pytester, "q.json")
    assert got[MEMO]["verdict"] == "flagged" and got[MEMO]["reasons"][0].startswith("memo on seen inputs"), got[MEMO]
    assert got[HONEST]["outcome"] == "passed", got[HONEST]
    quiet.assert_outcomes(passed=1, failed=1)

    loaded = run(
        pytester, MODES["no-xdist"], "--perfguard", "--perfguard-json", "l.json", *BUDGET, env={"DISTURB": "checks"}
    )
    got = results(pytester, "l.json")
    r = got[MEMO]
    assert r["verdict"] == "inconclusive" and r["outcome"] == "passed", r
    assert r["disturbances"][0].startswith("the memo check's rounds were disturbed (CPU contended"), r
    assert any(n.startswith("seen-values check undecided:") for n in r["notes"]), r["notes"]
    assert not any("memo on seen inputs" in x for x in r["reasons"]), r["reasons"]
    assert got[HONEST]["verdict"] != "inconclusive" and not got[HONEST].get("disturbances"), got[HONEST]
    loaded.assert_outcomes(passed=2)

    strict = run(pytester, MODES["no-xdist"], "--perfguard", *BUDGET, env={"DISTURB": "checks", "CI": "true"})
    assert strict.ret == pytest.ExitCode.TESTS_FAILED
    strict.stdout.fnmatch_lines(
        ["*case(s) unverified: the guard could not rule out a regression:", "*test_square.py::test_square[[]memo[]]*"]
    )


@pytest.fixture
def pinned_beside_a_busy_process() -> Iterator[int]:
    """This thread, and so the processes it starts, pinned to one CPU that a busy loop also holds: they share
    it about half and half, far past the watch's limit, whatever else the machine runs."""
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("needs CPU affinity (Linux)")
    before = os.sched_getaffinity(0)
    cpu = min(before)
    spin = f"import os; os.sched_setaffinity(0, {{{cpu}}}); print('pinned', flush=True)\nwhile True: pass"
    busy = subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True)
    try:
        assert busy.stdout is not None and busy.stdout.readline() == "pinned\n"
        os.sched_setaffinity(0, {cpu})
        yield cpu
    finally:
        os.sched_setaffinity(0, before)
        busy.kill()
        busy.wait()


@pytest.mark.real_timer  # measures alone, as the suite's other real-clock runs do (tests/conftest.py)
def test_a_real_busy_process_on_the_runs_cpu_keeps_its_cases_out_of_the_baseline(
    pytester: pytest.Pytester, pinned_beside_a_busy_process: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PERFGUARD_UPDATE_PROCESSES", "1")
    pytester.makepyfile(test_double=CASES)  # the real CPU watch: no conftest
    (pytester.path / ".ci" / "baselines").mkdir(parents=True)
    result = pytester.runpytest_subprocess(
        "-p",
        "no:xdist",
        "-p",
        "no:cacheprovider",
        "--perfguard-update-baseline",
        "--perfguard-json",
        "u.json",
        *BUDGET,
    )
    result.assert_outcomes(passed=3)
    got = results(pytester, "u.json")
    for case_id in REAL:
        assert got[case_id]["verdict"] == "inconclusive", got[case_id]
        assert got[case_id]["disturbances"][0].startswith("CPU contended while timing: its threads waited")
    assert set(baseline_json(pytester)["cases"]) == {FAKE}  # the fake clock's case alone was stored
