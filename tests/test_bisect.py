"""``perfguard bisect`` end to end on CPU: a temporary repository where one commit slows the case.

The slowdown comes through the injected fake clock, kept outside the commits as in test_ab.py, so head
and base kernels advance one clock and every revision bisect checks out still finds it. Each step is a
pytest subprocess (about 5 s here), so the end-to-end tests are few and marked slow.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from test_ab import CONFTEST, FAKECLOCK

from pytest_perfguard.commands import bisect as bs
from pytest_perfguard.commands.cli import main
from pytest_perfguard.record import CaseRecord, Gate, Outcome, Status

TEST = """
import torch
from pytest_perfguard import perf_case
from fakeclock import CLOCK
from conftest import reference, timed

@perf_case(variants={{"fast": timed({fast})}}, reference=reference, against=timed(1000), clock=CLOCK)
def {name}(perfguard_device):
    q, k, v = (torch.randn(1, 2, 8, 16, dtype=torch.float64) for _ in range(3))
    return (q, k, v), {{}}
"""

# Steps run without the fresh-process confirmation: it would double each regressed step's time here. Nor
# with hypothesis' pytest plugin, which imports hypothesis in each step's terminal summary (tests/conftest.py).
PYTEST_ARGS = ["--perfguard-no-confirm", "--perfguard-case-budget", "30", "-p", "no:hypothesispytest"]


def _git(path: Path, *args: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "HOME": str(path),
        "PATH": os.environ["PATH"],
    }
    return subprocess.run(["git", *args], cwd=path, check=True, capture_output=True, text=True, env=env).stdout.strip()


def _commit(path: Path, message: str, *, fast: int | None = None, name: str = "test_k", note: str = "") -> str:
    if fast is not None:
        (path / "test_perf.py").write_text(TEST.format(fast=fast, name=name))
    if note:
        (path / "NOTES.md").write_text(note + "\n")
    _git(path, "add", "-A")
    _git(path, "commit", "-qm", message)
    return _git(path, "rev-parse", "HEAD")


def _repo(path: Path, monkeypatch: pytest.MonkeyPatch, cache: Path) -> Path:
    monkeypatch.setenv("PERFGUARD_CACHE_DIR", str(cache))
    path.mkdir()
    (path / "fakeclock.py").write_text(FAKECLOCK)  # not committed: one clock for every revision
    (path / "conftest.py").write_text(CONFTEST)
    (path / ".gitignore").write_text("fakeclock.py\n__pycache__/\n")
    _git(path, "init", "-q", "-b", "main")
    monkeypatch.chdir(path)
    return path


@pytest.fixture
def history(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[str]]:
    """Five commits; the third makes the case 8% slower."""
    path = _repo(tmp_path / "repo", monkeypatch, tmp_path / "cache")
    shas = [_commit(path, "base", fast=1000)]
    shas.append(_commit(path, "notes", note="one"))
    shas.append(_commit(path, "slow the kernel down", fast=1080))
    shas.append(_commit(path, "notes again", note="two"))
    shas.append(_commit(path, "last notes", note="three"))
    return path, shas


@pytest.mark.slow
def test_finds_the_commit_that_slowed_the_case(
    history: tuple[Path, list[str]], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    path, shas = history
    status = main(["bisect", shas[0], "HEAD", "-k", "test_k", "--work-dir", str(tmp_path / "work"), *PYTEST_ARGS])
    out = capfd.readouterr().out
    assert status == 0, out
    assert f"first bad commit: {shas[2][:7]} slow the kernel down" in out
    line = next(x for x in out.splitlines() if "test_perf.py::test_k[fast]: +" in x)
    change = float(line.split(": +")[1].split("%")[0])
    assert 6.0 < change < 10.0  # the planted +8%, with its CI in the same line
    assert "[+" in line and "95% CI" in line
    assert _git(path, "rev-parse", "--abbrev-ref", "HEAD") == "main"  # git bisect reset ran
    assert _git(path, "status", "--porcelain") == ""
    assert not Path(_git(path, "rev-parse", "--git-path", "BISECT_START")).exists()


@pytest.fixture
def gap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[str]]:
    """Three commits: the case, renamed away, back again."""
    path = _repo(tmp_path / "repo", monkeypatch, tmp_path / "cache")
    shas = [_commit(path, "case", fast=1000), _commit(path, "renamed", fast=1000, name="test_j")]
    shas.append(_commit(path, "back", fast=1000))
    return path, shas


@pytest.mark.slow
@pytest.mark.parametrize(
    ("good", "bad", "said"),
    [
        # BAD lacks the case: pytest selects nothing there, a skip
        (0, 1, "{bad} skip: no test matches -k 'test_k' at this revision (the case does not exist here)"),
        # GOOD lacks the case: the A/B gate calls it new, said before any bisecting
        (1, 2, "{bad} skip: test_perf.py::test_k[fast] new: test_k does not exist at {good_full}"),
    ],
    ids=["bad-lacks-the-case", "good-lacks-the-case"],
)
def test_a_revision_without_the_case_is_skipped_and_said(
    gap: tuple[Path, list[str]],
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    good: int,
    bad: int,
    said: str,
) -> None:
    path, shas = gap
    argv = ["bisect", shas[good], shas[bad], "-k", "test_k", "--work-dir", str(tmp_path / "w"), *PYTEST_ARGS]
    status = main(argv)
    out = capfd.readouterr().out
    assert status == 1
    assert "perfguard bisect: " + said.format(bad=shas[bad][:12], good_full=shas[good]) in out, out
    assert f"nothing to bisect: BAD {shas[bad][:12]} cannot be compared with GOOD {shas[good][:12]}" in out
    assert _git(path, "rev-parse", "--abbrev-ref", "HEAD") == "main"


# ------------------------------------------------------------------------------ bad input, no pytest run


@pytest.fixture
def small(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[str]]:
    path = _repo(tmp_path / "repo", monkeypatch, tmp_path / "cache")
    return path, [_commit(path, "one", fast=1000), _commit(path, "two", note="x")]


def test_good_not_an_ancestor_is_an_error(small: tuple[Path, list[str]], capfd: pytest.CaptureFixture[str]) -> None:
    path, shas = small
    _git(path, "checkout", "-qb", "side", shas[0])
    side = _commit(path, "side", note="side")
    _git(path, "checkout", "-q", "main")
    assert main(["bisect", side, "main", "-k", "test_k"]) == 2
    err = capfd.readouterr().err
    assert f"GOOD {side} ({side[:12]}) is not an ancestor of BAD main" in err
    assert "git log --oneline main" in err
    assert main(["bisect", "main", shas[0], "-k", "test_k"]) == 2
    assert "BAD is an ancestor of GOOD: swap them" in capfd.readouterr().err


def test_dirty_tree_unknown_revision_and_same_commit_are_errors(
    small: tuple[Path, list[str]], capfd: pytest.CaptureFixture[str]
) -> None:
    path, shas = small
    (path / "NOTES.md").write_text("edited\n")
    assert main(["bisect", shas[0], shas[1], "-k", "test_k"]) == 2
    assert "uncommitted changes (NOTES.md); bisect checks out other revisions: commit them or git stash" in (
        capfd.readouterr().err
    )
    _git(path, "checkout", "-q", "--", "NOTES.md")
    assert main(["bisect", "nope", shas[1], "-k", "test_k"]) == 2
    assert "GOOD 'nope' is not a commit here" in capfd.readouterr().err
    assert main(["bisect", shas[1], "HEAD", "-k", "test_k"]) == 2
    assert "are the same commit" in capfd.readouterr().err
    _git(path, "bisect", "start")
    assert main(["bisect", shas[0], shas[1], "-k", "test_k"]) == 2
    assert "a git bisect is already under way here; finish it with git bisect reset" in capfd.readouterr().err


def test_ctrl_c_still_resets_the_bisection(
    small: tuple[Path, list[str]], monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    path, shas = small
    real = bs._git_loud

    def interrupted(top: Path, *args: str) -> str:
        if args[0] == "checkout":
            raise KeyboardInterrupt
        return real(top, *args)

    monkeypatch.setattr(bs, "_git_loud", interrupted)
    assert main(["bisect", shas[0], shas[1], "-k", "test_k"]) == 130
    assert "interrupted; git bisect reset has run" in capfd.readouterr().err
    assert _git(path, "rev-parse", "--abbrev-ref", "HEAD") == "main"
    assert not (path / _git(path, "rev-parse", "--git-path", "BISECT_START")).exists()


def test_unknown_arguments_go_to_pytest_only_for_bisect_and_explain() -> None:
    from pytest_perfguard.commands.cli import build_parser

    args, unknown = build_parser().parse_known_args(["bisect", "A", "B", "-k", "x", "-p", "no:xdist", "tests"])
    assert (args.good, args.bad, args.k, unknown) == ("A", "B", "x", ["-p", "no:xdist", "tests"])
    with pytest.raises(SystemExit):
        main(["show", "--bogus"])


# ------------------------------------------------------------------------------ what a step answers


def _record(
    verdict: Status,
    gate: str | None,
    estimate: float = 1.0,
    outcome: Outcome = Outcome.PASSED,
    reason: str = "",
) -> CaseRecord:
    gates = (
        [] if gate is None else [Gate("ab", Status(gate), estimate, estimate - 0.01, estimate + 0.01, reason=reason)]
    )
    return CaseRecord(
        id="t.py::test_k[v]",
        variant="v",
        outcome=outcome,
        verdict=verdict,
        gates=gates,
        reasons=[reason] if reason else [],
    )


@pytest.mark.parametrize(
    ("verdict", "gate", "code"),
    [
        (Status.PASS, "pass", bs.GOOD),
        (Status.FASTER, "faster", bs.GOOD),
        (Status.REGRESSED, "regressed", bs.BAD),
        (Status.INCONCLUSIVE, "regressed", bs.SKIP),  # not confirmed in a fresh process
        (Status.INCONCLUSIVE, "inconclusive", bs.SKIP),
        (Status.NOT_COMPARABLE, "not comparable", bs.SKIP),
        (Status.NEW, "new", bs.SKIP),
        (Status.NO_BASE, "no base", bs.SKIP),
        (Status.REGRESSED, "pass", bs.GOOD),  # max_ratio failed, but not slower than GOOD
    ],
)
def test_step_answers_from_the_ab_gate(verdict: Status, gate: str, code: int) -> None:
    assert bs.decide("abc", [_record(verdict, gate, 1.05)]).code == code


def test_step_skips_what_was_not_timed_and_ignores_cases_not_run_here() -> None:
    incorrect = _record(Status.INCORRECT, None, outcome=Outcome.FAILED, reason="max error 0.5")
    assert bs.decide("abc", [incorrect]).code == bs.SKIP
    assert "incorrect: max error 0.5" in bs.decide("abc", [incorrect]).reason
    gpu_only = _record(Status.PASS, None, outcome=Outcome.SKIPPED, reason="needs cuda")
    step = bs.decide("abc", [gpu_only, _record(Status.REGRESSED, "regressed", 1.08)])
    assert step.code == bs.BAD and "+8.0% [+7.0, +9.0]" in step.reason
    assert bs.decide("abc", []).code == bs.SKIP
