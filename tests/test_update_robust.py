"""One bad update process cannot widen a baseline entry, nor have it stored.

On a shared 2-core machine one update process ran 2x slow; the entry was stored from it and three others,
and a +122% regression then passed against it ("+122.3% ±410.0"). Here the update's processes count
themselves (a file each process that imports the test module bumps), and the ones named by POISON_AT run
2x slow: the variant and its reference alike (a process the machine slowed), or the variant alone
(VARIANT_ONLY). The fake clock of tests/test_plugin.py keeps every other process at the same speed.
"""

from __future__ import annotations

import json

import pytest
from test_plugin import CONFTEST, _case, baseline_json, run

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.slow  # every test runs the plugin end to end, in several processes

NO_XDIST = ["-p", "no:xdist"]

POISON = """
from pathlib import Path

_COUNTER = Path(os.environ["COUNTER_FILE"])
_N = int(_COUNTER.read_text()) if _COUNTER.exists() else 0
_COUNTER.write_text(str(_N + 1))
_POISONED = str(_N) in os.environ.get("POISON_AT", "").split(",")
POISON = 2.0 if _POISONED else 1.0
"""


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    (pytester.path / ".ci" / "baselines").mkdir(parents=True)
    return pytester


def _poisoned(project: pytest.Pytester, at: str, processes: int, *, variant_only: bool = False) -> dict[str, str]:
    """The test module, its processes numbered from 0 (the update's own), those in ``at`` 2x slow; the
    environment of an update of ``processes`` processes."""
    code = _case().replace(
        'SLOW = float(os.environ.get("PLANT_SLOWDOWN", "1.0"))',
        POISON + '\nSLOW = POISON * float(os.environ.get("PLANT_SLOWDOWN", "1.0"))',
    )
    # the other variant at 3x, so that no process has two variants of one speed (the fake kernels are named by it)
    code = code.replace("timed(2 * 1000)", "timed(3 * 1000)")
    assert "timed(3 * 1000)" in code
    if not variant_only:
        code = code.replace('AGAINST = float(os.environ.get("PLANT_AGAINST", "1.0"))', "AGAINST = POISON")
    project.makepyfile(test_k=code)
    return {"PERFGUARD_UPDATE_PROCESSES": str(processes), "COUNTER_FILE": str(project.path / "n"), "POISON_AT": at}


def _verdicts(project: pytest.Pytester, name: str) -> dict[str, dict]:
    return {r["id"]: r for r in json.loads((project.path / name).read_text())["results"]}


def test_a_poisoned_update_process_is_dropped_and_a_2x_regression_then_fails(project: pytest.Pytester) -> None:
    """Process 2 of 3 runs the fast variant 2x slow: its cases drop it, a make-up process replaces it, the
    entries stay as tight as the fake clock, and the guard then fails a +100% regression of the variant. (With
    the reference slowed alike, that process leaves the fast cases unrecorded, and the make-up process for
    cases a process did not record replaces them: tests/test_stored_baseline.py.)"""
    env = _poisoned(project, "1", 3, variant_only=True)
    result = run(project, NO_XDIST, "--perfguard-update-baseline", env=env)
    result.assert_outcomes(passed=4)
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        [
            "*2 case(s) had one process median apart from the others: it was dropped and measured again in a "
            "make-up process: *(2.00x the others)*",
            "*4 added*each case measured in 3 process(es)*",
            "*the guard will judge the 4 stored case(s) at: margin used by the baseline and ratio gates: *",
        ]
    )
    result.stdout.no_fnmatch_line("*processes that disagreed*")
    for case_id, e in baseline_json(project)["cases"].items():
        times = [s["median_ns"] for s in e["samples"]]
        assert e["runs"] == 3 and max(times) / min(times) < 1.02 and e["noise"] < 0.01, (case_id, times)
    guard = {**env, "POISON_AT": "", "PLANT_SLOWDOWN": "2.0"}
    result = run(project, NO_XDIST, "--perfguard", "--perfguard-json", "g.json", env=guard)
    result.assert_outcomes(failed=2, passed=2)
    for case_id, r in _verdicts(project, "g.json").items():
        assert r["verdict"] == ("regressed" if "[fast-" in case_id else "pass"), (case_id, r["reasons"])


def test_two_of_four_processes_slow_is_not_stored_as_a_tight_entry(project: pytest.Pytester) -> None:
    """The variant alone 2x slow in processes 2 and 3 of 4: no process is the odd one out, the re-measurement
    does not settle it (1.0, 2.0, 2.0, 1.0, 1.0), and neither gate could judge the margin by that spread:
    nothing is stored, and the update, having stored nothing, fails and says why."""
    env = _poisoned(project, "1,2", 4, variant_only=True)
    result = run(project, NO_XDIST, "--perfguard-update-baseline", "-k", "fast", env=env)
    result.assert_outcomes(passed=2, deselected=2)
    assert result.ret != 0
    result.stdout.no_fnmatch_line("*one process median apart*")
    result.stdout.fnmatch_lines(
        [
            "*2 case(s) had processes that disagreed*0 agreed*2 stayed unverifiable",
            "*2 case(s) not stored*: unverifiable: its processes disagree by 100%*record it on a quiet machine*",
            "*no baseline entry written: none of the 2 timed case(s) could be stored (2 unverifiable*",
        ]
    )
    assert not list((project.path / ".ci" / "baselines").glob("*.json"))


def test_two_of_four_processes_the_machine_slowed_keep_a_wide_time_and_a_ratio_that_judges(
    project: pytest.Pytester,
) -> None:
    """Processes 2 and 3 of 4 slow variant and reference alike: the time's spread stays in the entry (wide,
    not tight), the ratio's is the clock's, so the entry is stored and the ratio gate fails a +100%
    regression of the variant."""
    env = _poisoned(project, "1,2", 4)
    result = run(project, NO_XDIST, "--perfguard-update-baseline", "-k", "fast", env=env)
    result.assert_outcomes(passed=2, deselected=2)
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        ["*2 case(s) had processes that disagreed*2 kept their processes*0 stayed unverifiable"]
    )
    for case_id, e in baseline_json(project)["cases"].items():
        times = [s["median_ns"] for s in e["samples"]]
        assert e["runs"] == 5 and max(times) / min(times) > 1.9, (case_id, times)
    guard = {**env, "POISON_AT": "", "PLANT_SLOWDOWN": "2.0"}
    result = run(project, NO_XDIST, "--perfguard", "-k", "fast", "--perfguard-json", "g.json", env=guard)
    result.assert_outcomes(failed=2, deselected=2)
    for case_id, r in _verdicts(project, "g.json").items():
        gates = {g["gate"]: g["status"] for g in r["gates"]}
        assert gates["ratio"] == "regressed", (case_id, r["reasons"])
