"""The stored baseline end to end: an update measures every case in several processes, a process that
reads a case apart from the others is dropped and made up, a case whose processes keep disagreeing is not
stored (unverifiable), and a one-process (thin) baseline says so. tests/test_update_robust.py plants
poisoned update processes.

The fake kernels of tests/test_plugin.py move a fake clock; the slow first process of a freshly started
machine is planted in the parent process only (an environment variable it pops, so the fresh processes the
update starts do not see it), as benchmarks/results/fresh_machine_2026-11-25 measured it on an H100.
"""

from __future__ import annotations

import json

import pytest
from test_plugin import CONFTEST, _case, baseline_json, run

from pytest_perfguard.judge.baseline import SCHEMA_VERSION
from pytest_perfguard.run import xdist as xd

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.slow  # every test runs the plugin end to end, in several processes

NO_XDIST = ["-p", "no:xdist"]


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    (pytester.path / ".ci" / "baselines").mkdir(parents=True)
    return pytester


def _slow_first_process() -> str:
    return _case().replace(
        'SLOW = float(os.environ.get("PLANT_SLOWDOWN", "1.0"))', 'SLOW = float(os.environ.pop("PLANT_ONCE", "1.0"))'
    )


# Each update process logs when it started (the kernel's start time of the process, in seconds since boot)
# and when it ended, on the same clock (PROCESS_LOG).
PROCESS_LOG = """
import atexit, json, os, time

if os.environ.get("PERFGUARD_UPDATE_PROCESS") == "1":
    with open("/proc/self/stat") as f:
        _T0 = int(f.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")

    def _log_span():
        with open(os.environ["PROCESS_LOG"], "a") as f:
            f.write(json.dumps([_T0, time.clock_gettime(time.CLOCK_BOOTTIME)]) + "\\n")

    atexit.register(_log_span)
"""


def test_under_xdist_the_controller_runs_the_further_processes_one_on_each_gpu(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Workers on two GPUs (faked here: the controller is told of two devices, both the CPU): each further
    process's cases are split over them, one fresh process on each at once, and every case still gets a
    sample from every process."""
    monkeypatch.setattr(xd, "update_devices", lambda config: ["cpu", "cpu"])
    log = project.path / "processes.log"
    project.makepyfile(test_k=_case() + PROCESS_LOG)
    env = {"PERFGUARD_UPDATE_PROCESSES": "3", "PROCESS_LOG": str(log)}
    result = run(project, ["-n", "2"], "--perfguard-update-baseline", env=env)
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*4 added*each case measured in 3 process(es)*"])
    # The controller is this process (tests/test_plugin.py `run`): its progress lines are on this stderr.
    pytest.LineMatcher(capsys.readouterr().err.splitlines()).fnmatch_lines(
        [
            "perfguard: update process 2 of 3 (reverse order): 4 case(s) in parallel: ? on cpu, ? on cpu",
            "perfguard: update process 3 of 3 (forward order): 4 case(s) in parallel: ? on cpu, ? on cpu",
        ]
    )
    assert all(len(e["samples"]) == 3 for e in baseline_json(project)["cases"].values())
    spans = sorted(json.loads(line) for line in log.read_text().splitlines())
    assert len(spans) == 4, spans  # two rounds of two processes
    first, second = spans[:2], spans[2:]
    assert first[1][0] < first[0][1] and second[1][0] < second[0][1], spans  # the two of a round overlap
    assert max(end for _, end in first) <= second[0][0], spans  # and a round starts when the last one is done


def test_a_slow_first_process_is_outvoted_not_stored(project: pytest.Pytester) -> None:
    project.makepyfile(test_k=_slow_first_process())
    result = run(
        project, NO_XDIST, "--perfguard-update-baseline", env={"PLANT_ONCE": "1.5", "PERFGUARD_UPDATE_PROCESSES": "3"}
    )
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(
        [
            "*2 case(s) had one process median apart from the others: it was dropped and measured again in a "
            "make-up process*(1.50x the others)*",
            "*4 added*each case measured in 3 process(es)*",
        ]
    )
    cases = baseline_json(project)["cases"]
    assert len(cases) == 4
    for case_id, e in cases.items():
        assert e["runs"] == 3 and len(e["samples"]) == 3 and e["unstable"] is False, case_id
        # the 1.5x slow first process was dropped: every stored process read about 1x
        times = [s["median_ns"] for s in e["samples"]]
        assert max(times) / min(times) < 1.2, (case_id, times)
    fast = [e for k, e in cases.items() if "[fast-" in k]
    assert all(e["median_ns"] < 1_200 for e in fast)
    # judged against that sample, an unchanged second run passes
    run(project, NO_XDIST, "--perfguard").assert_outcomes(passed=4)


UNSTABLE = """
import os
from pathlib import Path

# Every process that imports this file counts itself; odd ones run the kernel FLIP times slower, so its
# update processes read 1.0, FLIP, 1.0 and the re-measurement FLIP: they never agree.
_COUNTER = Path(os.environ["COUNTER_FILE"])
_N = int(_COUNTER.read_text()) if _COUNTER.exists() else 0
_COUNTER.write_text(str(_N + 1))
FLIP = float(os.environ["FLIP"]) if _N % 2 else 1.0
"""


def _flipping(project: pytest.Pytester, flip: str, *, against_too: bool = False) -> dict[str, str]:
    """The fast variant's odd processes run FLIP times slower (the reference too with ``against_too``); the
    environment an update of 3 processes needs for it."""
    code = _case().replace('SLOW = float(os.environ.get("PLANT_SLOWDOWN", "1.0"))', UNSTABLE + "\nSLOW = FLIP")
    if against_too:
        code = code.replace('AGAINST = float(os.environ.get("PLANT_AGAINST", "1.0"))', "AGAINST = FLIP")
    project.makepyfile(test_k=code)
    return {"PERFGUARD_UPDATE_PROCESSES": "3", "COUNTER_FILE": str(project.path / "counter"), "FLIP": flip}


def test_cases_a_process_did_not_record_are_measured_in_one_more_process(project: pytest.Pytester) -> None:
    """The update's second process fails the fast cases (as one that a foreign load disturbed leaves them
    out): one make-up process measures them again, so their entries still rest on three processes."""
    broken = UNSTABLE.replace('FLIP = float(os.environ["FLIP"]) if _N % 2 else 1.0', "WRONG = _N == 1")
    code = _case().replace('SLOW = float(os.environ.get("PLANT_SLOWDOWN", "1.0"))', broken + "\nSLOW = 1.0")
    code = code.replace(
        '"fast": timed(int(1000 * SLOW))',
        '"fast": timed(1000, fn=(lambda q, k, v, causal: 2 * reference(q, k, v, causal)) if WRONG else reference)',
    )
    assert "if WRONG" in code
    project.makepyfile(test_k=code)
    env = {"PERFGUARD_UPDATE_PROCESSES": "3", "COUNTER_FILE": str(project.path / "counter")}
    result = run(project, NO_XDIST, "--perfguard-update-baseline", env=env)
    result.assert_outcomes(passed=4)
    result.stdout.no_fnmatch_line("*not recorded by every process*")
    result.stderr.fnmatch_lines(["*make-up process for the cases a process did not record: 2 case(s)*"])
    cases = baseline_json(project)["cases"]
    assert len(cases) == 4 and all(e["runs"] == 3 for e in cases.values()), cases
    assert (project.path / "counter").read_text() == "4"  # the parent, processes 2 and 3, and the make-up


def test_a_case_whose_processes_keep_disagreeing_is_not_stored_and_an_update_of_nothing_fails(
    project: pytest.Pytester,
) -> None:
    """Processes that read 1.0, 1.6, 1.0, 1.6 (the make-up of the dropped one) and 1.0: no entry of them
    could judge a regression of the margin, so none is stored, and an update that stored nothing fails."""
    env = _flipping(project, "1.6")
    result = run(project, NO_XDIST, "--perfguard-update-baseline", "-k", "fast", env=env)
    result.assert_outcomes(passed=2, deselected=2)
    assert result.ret != 0
    result.stdout.fnmatch_lines(
        [
            "*2 case(s) had processes that disagreed*0 agreed*0 kept their processes*2 stayed unverifiable",
            "*2 case(s) not stored*test_attn[[]fast-16[]]: unverifiable: its processes disagree by 60%*"
            "record it on a quiet machine*",
            "*no baseline entry written: none of the 2 timed case(s) could be stored (2 unverifiable*",
        ]
    )
    assert not list((project.path / ".ci" / "baselines").glob("*.json"))


def test_processes_that_disagree_within_what_a_threshold_can_carry_widen_it_and_stay_judged(
    project: pytest.Pytester,
) -> None:
    """Processes that read 1.0, 1.12, 1.0, 1.12 and 1.0 disagree (CPU: beyond twice its 5% floor), but a
    threshold from their spread still judges the case: they are all kept, the entry is stored and its
    threshold wider, and the next run is judged, not called inconclusive."""
    env = _flipping(project, "1.12")
    result = run(project, NO_XDIST, "--perfguard-update-baseline", "-k", "fast", env=env)
    result.assert_outcomes(passed=2, deselected=2)
    result.stdout.fnmatch_lines(
        [
            "*2 case(s) had processes that disagreed*0 agreed*2 kept their processes*0 stayed unverifiable",
            "*the guard will judge the 2 stored case(s) at: margin used by the baseline and ratio gates: *",
        ]
    )
    cases = baseline_json(project)["cases"]
    # 1.0, 1.12, 1.0, the make-up of the dropped 1.12 (1.12) and the re-measurement (1.0): a split of 2 in 5,
    # so the dropped process is back and no side is dropped
    assert all(e["unstable"] is False and e["runs"] == 5 for e in cases.values()), cases
    result = run(project, NO_XDIST, "--perfguard", "-k", "fast", "--perfguard-json", "g.json", env=env)
    result.assert_outcomes(passed=2, deselected=2)
    doc = json.loads((project.path / "g.json").read_text())
    assert [r["verdict"] for r in doc["results"]] == ["pass", "pass"], [r["reasons"] for r in doc["results"]]
    # a slowdown beyond the widened threshold still fails
    env_slow = {**env, "FLIP": "1.0", "PLANT_SLOWDOWN": "1.0"}
    code = (project.path / "test_k.py").read_text()
    project.makepyfile(test_k=code.replace("SLOW = FLIP", "SLOW = 1.6"))
    result = run(project, NO_XDIST, "--perfguard", "-k", "fast", "--perfguard-no-confirm", env=env_slow)
    result.assert_outcomes(failed=2, deselected=2)


def test_processes_whose_reference_moved_alike_keep_a_ratio_that_judges(project: pytest.Pytester) -> None:
    """A process state that slows variant and reference alike by 1.6x (cuda_wmma's S128 cases on a fresh
    H100 read 4.7 or 5.3 us per process, SDPA beside them moving alike): the time's spread is too wide to
    judge by, the ratio's is not, so the entry is kept and a slowdown of the variant alone still fails."""
    env = _flipping(project, "1.6", against_too=True)
    result = run(project, NO_XDIST, "--perfguard-update-baseline", "-k", "fast", env=env)
    result.assert_outcomes(passed=2, deselected=2)
    result.stdout.fnmatch_lines(
        ["*2 case(s) had processes that disagreed*2 kept their processes*0 stayed unverifiable"]
    )
    assert all(e["unstable"] is False for e in baseline_json(project)["cases"].values())
    code = (project.path / "test_k.py").read_text()
    project.makepyfile(test_k=code.replace("SLOW = FLIP", "SLOW = 1.3 * FLIP"))
    result = run(project, NO_XDIST, "--perfguard", "-k", "fast", "--perfguard-json", "g.json", env=env)
    result.assert_outcomes(failed=2, deselected=2)
    doc = json.loads((project.path / "g.json").read_text())
    for r in doc["results"]:
        gates = {g["gate"]: g["status"] for g in r["gates"]}
        assert gates["ratio"] == "regressed", r["reasons"]


def test_a_later_update_with_join_adds_a_second_speed_instead_of_restarting(project: pytest.Pytester) -> None:
    """A kernel that the first update saw at one speed and a later update of the same code at another, 1.3x
    slower (cuda_scalar on a fresh H100, 2026-11-26: 1221 us in the update, 1330 us in every guard after it).
    A plain update restarts the entry from the slow speed alone; with --perfguard-join it keeps both speeds,
    and a guard at either passes."""
    project.makepyfile(test_k=_case())
    env = {"PERFGUARD_UPDATE_PROCESSES": "2"}
    run(project, NO_XDIST, "--perfguard-update-baseline", "-k", "fast", env=env).assert_outcomes(passed=2, deselected=2)
    slow = {**env, "PLANT_SLOWDOWN": "1.3"}
    result = run(project, NO_XDIST, "--perfguard-update-baseline", "--perfguard-join", "-k", "fast", env=slow)
    result.assert_outcomes(passed=2, deselected=2)
    result.stdout.fnmatch_lines(["*0 added, 2 updated*0 reset*"])
    cases = baseline_json(project)["cases"]
    assert all(e["runs"] == 4 for e in cases.values()), cases
    for speed in ("1.0", "1.3"):
        result = run(project, NO_XDIST, "--perfguard", "-k", "fast", env={"PLANT_SLOWDOWN": speed})
        result.assert_outcomes(passed=2, deselected=2)
    # without --perfguard-join the same update restarts each entry from its own processes, all of them: the
    # further processes run as guards and fail against the stored entry, which does not cost their samples
    result = run(project, NO_XDIST, "--perfguard-update-baseline", "-k", "fast", env={**env, "PLANT_SLOWDOWN": "3.0"})
    result.stdout.fnmatch_lines(["*0 added, 0 updated*2 reset*"])
    assert all(e["runs"] == 2 for e in baseline_json(project)["cases"].values())
    result = project.runpytest("-p", "no:cacheprovider", "--perfguard-join")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--perfguard-join only works with --perfguard-update-baseline*"])


def test_an_old_one_number_file_is_read_migrated_and_its_cases_stay_judged(project: pytest.Pytester) -> None:
    """A schema 1 file (one number per case) keeps working: it migrates in memory, and `perfguard migrate`
    rewrites it as one-process samples."""
    project.makepyfile(test_k=_case())
    run(project, NO_XDIST, "--perfguard-update-baseline", env={"PERFGUARD_UPDATE_PROCESSES": "1"})
    path = next((project.path / ".ci" / "baselines").glob("*.json"))
    doc = json.loads(path.read_text())
    old = {"schema_version": 1, "device": doc["device"], "cases": {}}
    for case_id, e in doc["cases"].items():
        old["cases"][case_id] = {k: v for k, v in e.items() if k not in ("samples", "unstable")}
    path.write_text(json.dumps(old))
    result = run(project, NO_XDIST, "--perfguard")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*4 stored case(s) rest on one process, a thin baseline*--perfguard-update-baseline*"])
    assert json.loads(path.read_text())["schema_version"] == 1  # reading never rewrites the file
    result = project.run("perfguard", "migrate", str(path))
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    migrated = json.loads(path.read_text())
    assert migrated["schema_version"] == SCHEMA_VERSION
    assert all(len(e["samples"]) == 1 and e["runs"] == 1 for e in migrated["cases"].values())


# Not under -n 0, which takes the no-xdist path here (tests/test_plugin.py, NO_N0): its fresh confirmation
# processes cost seconds of CPU each.
@pytest.mark.parametrize("mode", [NO_XDIST, ["-n", "2"]], ids=["no-xdist", "n2"])
def test_when_the_reference_moved_with_the_case_the_machine_moved_and_the_ratio_decides(
    project: pytest.Pytester, mode: list[str]
) -> None:
    """Another machine of the model, 30% slower for the variant and the reference alike: the time gate is
    not comparable and the ratio gate passes it; a variant slowed on its own still fails."""
    project.makepyfile(test_k=_case())
    run(project, NO_XDIST, "--perfguard-update-baseline").assert_outcomes(passed=4)
    machine = {"PLANT_SLOWDOWN": "1.3", "PLANT_AGAINST": "1.3"}
    result = run(project, mode, "--perfguard", "-k", "fast", "--perfguard-json", "m.json", env=machine)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*in 2 of 2 timed case(s) the reference moved past the threshold with the case*"])
    doc = json.loads((project.path / "m.json").read_text())
    for r in doc["results"]:
        gates = {g["gate"]: g for g in r["gates"]}
        assert gates["baseline"]["status"] == "not comparable" and "this GPU runs slower" in gates["baseline"]["reason"]
        assert gates["ratio"]["status"] == "pass"
    result = run(project, mode, "--perfguard", "-k", "fast", env={"PLANT_SLOWDOWN": "1.3"})
    result.assert_outcomes(failed=2)
