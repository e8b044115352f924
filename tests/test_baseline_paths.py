"""No silent green: the baseline is found from any folder, the first update just works, a run that compared
nothing fails under CI, and no lock file is ever left in the tree."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.test_plugin import CONFTEST, MODES, _case, run

pytest_plugins = ["pytester"]


@pytest.fixture
def fresh(pytester: pytest.Pytester) -> pytest.Pytester:
    """A project with an ini file at its root, its tests in a subfolder, and no .ci folder yet."""
    pytester.makeconftest(CONFTEST)
    pytester.makeini("[pytest]\n")
    (pytester.path / "sub").mkdir()
    (pytester.path / "sub" / "test_k.py").write_text(_case())
    return pytester


def _locks(root: Path) -> list[Path]:
    return [p for p in root.rglob("*.lock")]


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(MODES))
def test_baseline_is_found_from_a_subfolder(fresh: pytest.Pytester, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    result = run(fresh, MODES[mode], "--perfguard-update-baseline")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*created the baseline folder .ci*baselines*", "*4 added*"])
    assert len(list((fresh.path / ".ci" / "baselines").glob("*.json"))) == 1
    monkeypatch.chdir(fresh.path / "sub")
    result = run(fresh, MODES[mode], "--perfguard")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(
        [
            "perfguard: baseline *.ci*baselines*.json (4 case(s) stored)",
            "*4 of 4 timed case(s) compared with the baseline*",
        ]
    )
    assert not _locks(fresh.path)
    assert not (fresh.path / "sub" / ".ci").exists()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["no-xdist", "n2"])
def test_nothing_compared_fails_under_ci_and_warns_locally(fresh: pytest.Pytester, mode: str) -> None:
    local = run(fresh, MODES[mode], "--perfguard")
    local.assert_outcomes(passed=4)
    assert local.ret == 0
    local.stdout.fnmatch_lines(["*0 of 4 timed case(s) compared*4 new*", "*This passes locally but fails under CI*"])
    ci = run(fresh, MODES[mode], "--perfguard", env={"CI": "true"})
    assert ci.ret == pytest.ExitCode.TESTS_FAILED
    ci.stdout.fnmatch_lines(
        [
            "*no timed case was compared with anything: looked in .ci*baselines*.json (no such file)*"
            "--perfguard-update-baseline*Under CI this fails the run*"
        ]
    )
    allowed = run(fresh, MODES[mode], "--perfguard", "--perfguard-allow-missing", env={"GITHUB_ACTIONS": "true"})
    assert allowed.ret == 0
    allowed.stdout.fnmatch_lines(["*allowed by --perfguard-allow-missing*"])


@pytest.mark.slow
def test_a_new_case_beside_compared_ones_passes_under_ci(fresh: pytest.Pytester) -> None:
    run(fresh, MODES["no-xdist"], "--perfguard-update-baseline", "-k", "fast").assert_outcomes(passed=2, deselected=2)
    result = run(fresh, MODES["no-xdist"], "--perfguard", env={"CI": "true"})
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*2 of 4 timed case(s) compared with the baseline; not compared: 2 new*"])


def test_explicit_folder_without_parent_is_an_error_and_nothing_is_written(fresh: pytest.Pytester) -> None:
    target = fresh.path / "no" / "such" / "baselines"
    result = fresh.runpytest_inprocess(
        "-p", "no:xdist", "--perfguard-update-baseline", "--perfguard-baseline-dir", str(target), "-k", "fast and 8"
    )
    result.stdout.fnmatch_lines(["*baseline folder*no*such*baselines cannot be created: its parent*does not exist*"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert not (fresh.path / "no").exists()


def test_lock_files_live_outside_the_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_perfguard.jsonio import lock_file, locked

    monkeypatch.delenv("PERFGUARD_LOCK_DIR", raising=False)
    target = tmp_path / "repo" / ".ci" / "baselines" / "dev.json"
    target.parent.mkdir(parents=True)
    with locked(target):
        assert lock_file(target).exists()
        assert not _locks(tmp_path / "repo")
    assert tmp_path not in lock_file(target).parents
    assert os.access(lock_file(target).parent, os.W_OK)
