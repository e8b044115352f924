"""The A/B gate's per-process offset, fitted on the device it runs on, end to end.

An update on a clean git checkout runs its fresh processes as A/B runs against HEAD: every variant is timed
against its own twin, loaded from HEAD's cached tree as `--perfguard-against` loads a base revision, and each
process's head/base reading is stored with its sample. A later `--perfguard-against` run counts the fit of
those readings instead of the built-in H100 value, and says so.

The fake clock lives in a module that is not committed (one clock for head and base, as in tests/test_ab.py).
The committed conftest plants an offset between the two loaded copies: with PLANT_AA_OFFSET set, the copy
imported as the base revision's runs its kernels 3% faster, so every A/A reading is about +3%, which the
fit must find, and which fails the A/B gate in those processes without costing the baseline its samples.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_ab import FAKECLOCK, MODES, _git
from test_plugin import TESTED_MODES

from pytest_perfguard.judge.storage import read_baseline

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.slow  # updates start fresh processes, and -n 2 starts workers

CONFTEST = """
import os
import random
import torch
from fakeclock import CLOCK

RNG = random.Random(4321)
# The base revision's copy of this module is imported as _perfguard_base_<sha>.conftest; "slower" plants
# the offset the other way.
PLANT = os.environ.get("PLANT_AA_OFFSET")
OFFSET = (1.03 if PLANT == "slower" else 0.97) if __name__.startswith("_perfguard_base_") and PLANT else 1.0

def reference(q, k, v):
    return torch.softmax(q @ k.transpose(-1, -2), -1) @ v

_MEMO = {}

def timed(ns, noise=0.01):
    def kernel(q, k, v):
        CLOCK.t += int(ns * OFFSET * RNG.lognormvariate(0.0, noise))
        key = (id(q), id(k), id(v), q._version, k._version, v._version)
        if key not in _MEMO:
            _MEMO[key] = (q, k, v, reference(q, k, v))
        return _MEMO[key][3].clone()
    return kernel
"""

TEST = """
import pytest
import torch
from pytest_perfguard import perf_case
from fakeclock import CLOCK
from conftest import reference, timed

@perf_case(variants={"a": timed(1000), "b": timed(1200)}, reference=reference, against=timed(1000), clock=CLOCK)
@pytest.mark.parametrize("S", [8, 16, 32])
def test_k(S, perfguard_device):
    q, k, v = (torch.randn(1, 2, S, 16, dtype=torch.float64) for _ in range(3))
    return (q, k, v), {}
"""


@pytest.fixture
def repo(
    pytester: pytest.Pytester, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> pytest.Pytester:
    """One commit holding the conftest and the test module; the fake clock and every output stay untracked."""
    monkeypatch.setenv("PERFGUARD_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    p = pytester
    (p.path / "fakeclock.py").write_text(FAKECLOCK)
    (p.path / "conftest.py").write_text(CONFTEST)
    (p.path / "test_k.py").write_text(TEST)
    (p.path / ".gitignore").write_text("fakeclock.py\n__pycache__/\n*.json\nstdout\nstderr\nrunpytest-*\n")
    _git(p.path, "init", "-q", "-b", "main")
    _git(p.path, "add", "-A")
    _git(p.path, "commit", "-qm", "kernels")
    return p


def run(p: pytest.Pytester, mode: list[str], *args: str) -> pytest.RunResult:
    return p.runpytest_inprocess(*mode, "-p", "no:cacheprovider", *args)


def _results(p: pytest.Pytester) -> dict[str, object]:
    doc = json.loads((p.path / "r.json").read_text())
    assert isinstance(doc, dict)
    return doc


def _update_with_a_planted_offset(repo: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An update of 3 processes on the clean checkout, with the 3% offset between loaded copies planted in the
    fresh processes' A/A timing (the plant is read at import: the base copy exists only in those)."""
    monkeypatch.setenv("PLANT_AA_OFFSET", "1")
    monkeypatch.setenv("PERFGUARD_UPDATE_PROCESSES", "3")
    result = run(repo, MODES["no-xdist"], "--perfguard-update-baseline", "--perfguard-case-budget", "30")
    monkeypatch.delenv("PLANT_AA_OFFSET")
    monkeypatch.delenv("PERFGUARD_UPDATE_PROCESSES")
    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines(
        [
            "*6 added*each case measured in 3 process(es)*",
            "*the A/B gate's per-process offset on this device model, from the A/A readings in *"
            "from 20 us: no readings (the built-in value stays); under 20 us: *% (the 90% upper bound of *%, "
            "12 readings of 6 case(s))*",
        ]
    )
    assert "no A/A readings" not in result.stdout.str()
    return next((repo.path / ".ci" / "baselines").glob("*.json"))


def _ab_mdes(p: pytest.Pytester) -> dict[str, float]:
    return {
        str(r["id"]): next(g for g in r["gates"] if g["gate"] == "ab")["mde"]
        for r in _results(p)["results"]  # type: ignore[attr-defined]
    }


def test_an_update_stores_a_readings_and_later_ab_runs_count_their_fit(
    repo: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _update_with_a_planted_offset(repo, monkeypatch)
    doc = json.loads(path.read_text())
    for case_id, entry in doc["cases"].items():
        first, *fresh = entry["samples"]
        # this process ran no A/A; each fresh one did, and read the planted +3% (its A/B gate failed there, and
        # its time still joined the sample)
        assert first["aa_ratio"] is None and first["aa_ci"] is None, case_id
        assert len(fresh) == 2 and all(1.02 < s["aa_ratio"] < 1.04 for s in fresh), (case_id, fresh)
        assert all(s["aa_ci"][0] <= s["aa_ratio"] <= s["aa_ci"][1] for s in fresh)
    fitted = read_baseline(path).ab_offset()
    assert fitted is not None and fitted.large is None and fitted.small is not None
    assert fitted.small.readings == 12 and fitted.small_cases == 6
    assert 0.02 < fitted.small.fit < 0.04 and fitted.small.fit <= fitted.small.bound < 0.06
    assert _git(repo.path, "status", "--porcelain") == ""  # the update wrote nothing tracked

    # An A/B run on the same device model counts the stored fit, and its header says where it came from; with
    # xdist, every worker reads it. (The budget is short: an offset of 3% per process cannot be measured away,
    # so these cases measure to their budget.)
    args = ("--perfguard-against", "HEAD", "--perfguard-case-budget", "0.2", "--perfguard-json", "r.json")
    for mode in TESTED_MODES:
        result = run(repo, MODES[mode], *args, "-k", "a-8 or b-16")
        assert result.ret == 0 and result.parseoutcomes()["passed"] == 2, mode  # -n 2 deselects in the workers
        result.stdout.fnmatch_lines(
            [
                f"perfguard: A/B per-process offset under 20 us: {fitted.small.bound:.2%}, fitted on this device "
                f"model: the 90% upper bound of {fitted.small.fit:.2%} from 12 A/A readings of 6 case(s) (* dof) "
                "on 1 device(s), this one among them, *, in .ci*baselines*.json",
                "perfguard: A/B per-process offset from 20 us: 0.10%, built-in (fitted on H100s, not on a CPU): no A/A "
                "readings "
                "of this size in *",
            ]
        )
        offsets = _results(repo)["run"]["ab_process_sd"]  # type: ignore[index]
        assert offsets["small"]["source"] == "fitted", mode
        assert offsets["small"]["sd"] == pytest.approx(fitted.small.bound)
        assert offsets["large"]["source"] == "built-in"
        # the MDE counts the fitted offset: the cases cannot see their +3% promise
        assert all(mde > 0.06 for mde in _ab_mdes(repo).values()), (mode, _ab_mdes(repo))

    # A value set by the user wins over the fit, and the header says so. It sets the pooled value: each case's
    # own readings (+3% here) still count unless turned off too.
    user = (*args, "-k", "a-8", "--perfguard-ab-small-process-sd", "0")
    result = run(repo, MODES["no-xdist"], *user, "--perfguard-no-ab-case-offset")
    result.stdout.fnmatch_lines(
        ["perfguard: A/B per-process offset under 20 us: 0.00%, as set (--perfguard-ab-small-process-sd, *"]
    )
    assert all(mde <= 0.03 + 1e-9 for mde in _ab_mdes(repo).values())
    run(repo, MODES["no-xdist"], *user)
    assert all(mde > 0.03 for mde in _ab_mdes(repo).values())

    # A case's own readings (policy.case_offset): case a-8 keeps its +3% readings, every other case's become
    # quiet, so the file's fit falls and a-8 stands out. With the 3% planted between the loaded copies in the
    # A/B run too, the quiet cases regress (and a fresh process confirms it); a-8 is not claimed regressed.
    doc = json.loads(path.read_text())
    for case_id, entry in doc["cases"].items():
        for sample in entry["samples"] if "a-8" not in case_id else []:
            if sample["aa_ratio"] is not None:
                sample["aa_ratio"], sample["aa_ci"] = 1.0, [0.999, 1.001]
    path.write_text(json.dumps(doc))
    monkeypatch.setenv("PLANT_AA_OFFSET", "1")
    # Half the budget, and the regressions confirmed together in one fresh process, not one process each: the
    # samples of 0.1 s resolve differences far below the planted 3% per process, and single confirmations have
    # tests of their own (tests/test_plugin.py, tests/test_batch_confirm.py). 79 s of CPU here became 36 s.
    budget = ("--perfguard-case-budget", "0.1", "--perfguard-confirm-max", "0")
    result = run(repo, MODES["no-xdist"], *args, *budget)
    verdicts = {str(r["id"]).split("[")[1].rstrip("]"): r for r in _results(repo)["results"]}  # type: ignore[attr-defined]
    assert verdicts["a-8"]["verdict"] == "inconclusive", verdicts["a-8"]["reasons"]
    assert any("not claimed: this case's own per-process offset" in r for r in verdicts["a-8"]["reasons"])
    regressed = [name for name, r in verdicts.items() if r["verdict"] == "regressed"]
    assert len(regressed) >= 4 and "a-8" not in regressed, {n: r["verdict"] for n, r in verdicts.items()}
    assert result.ret == 1

    # The other way round, the base copy 3% slower: the quiet cases read faster, and as their entries hold A/A
    # readings, their reasons carry no word of missing ones (tests/test_ab.py has a speed-up without them).
    monkeypatch.setenv("PLANT_AA_OFFSET", "slower")
    result = run(repo, MODES["no-xdist"], *args, *budget)
    assert "rest on no stored A/A reading" not in result.stdout.str()
    verdicts = {str(r["id"]).split("[")[1].rstrip("]"): r for r in _results(repo)["results"]}  # type: ignore[attr-defined]
    faster = {
        n: next(g for g in r["gates"] if g["gate"] == "ab") for n, r in verdicts.items() if r["verdict"] == "faster"
    }
    assert len(faster) >= 4 and "a-8" not in faster, {n: r["verdict"] for n, r in verdicts.items()}
    assert all("A/A reading" not in gate["reason"] for gate in faster.values()), faster


def test_uncommitted_changes_keep_the_update_from_timing_a_a(repo: pytest.Pytester) -> None:
    """With a tracked file changed, HEAD is not the code the update measures: no A/A, said why, baseline kept."""
    (repo.path / "test_k.py").write_text(TEST.replace("timed(1200)", "timed(1300)"))
    os.environ["PERFGUARD_UPDATE_PROCESSES"] = "2"
    try:
        result = run(
            repo, MODES["no-xdist"], "--perfguard-update-baseline", "-k", "a-8", "--perfguard-case-budget", "30"
        )
    finally:
        del os.environ["PERFGUARD_UPDATE_PROCESSES"]
    result.assert_outcomes(passed=1, deselected=5)
    result.stdout.fnmatch_lines(
        [
            "*no A/A readings for the A/B gate's per-process offset in this update: the working tree has uncommitted "
            "changes (test_k.py), so HEAD is not the code this update measured. A/B runs count what earlier *",
            "*1 added*each case measured in 2 process(es)*",
        ]
    )
    path = next((repo.path / ".ci" / "baselines").glob("*.json"))
    (entry,) = json.loads(path.read_text())["cases"].values()
    assert len(entry["samples"]) == 2 and all(s["aa_ratio"] is None for s in entry["samples"])
    assert read_baseline(path).ab_offset() is None
