"""The A/B gate end to end: a git repository of two commits, the second slower through the injected clock.

Head and base are timed in the same process on the same input copies. The fake clock lives in a module
that is not committed, so head and base kernels advance the same clock; everything committed (the
conftest's kernels, the test module) is imported twice, once per revision.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

MODES = {"no-xdist": ["-p", "no:xdist"], "n0": ["-n", "0"], "n2": ["-n", "2"]}

FAKECLOCK = '''
class FakeClock:
    """Nanoseconds that only move when a fake kernel runs: shared by head and base."""
    def __init__(self):
        self.t = 0
    def __call__(self):
        return self.t

CLOCK = FakeClock()
'''

CONFTEST = """
import random
import torch
from fakeclock import CLOCK

RNG = random.Random(4321)

def reference(q, k, v):
    return torch.softmax(q @ k.transpose(-1, -2), -1) @ v

_MEMO = {}

def timed(ns, noise=0.01, wrong=False):
    def kernel(q, k, v):
        CLOCK.t += int(ns * RNG.lognormvariate(0.0, noise))
        key = (id(q), id(k), id(v), q._version, k._version, v._version)
        if key not in _MEMO:
            _MEMO[key] = (q, k, v, reference(q, k, v))
        out = _MEMO[key][3].clone()
        return out * 1.5 if wrong else out
    return kernel
"""

TEST = """
import pytest
import torch
from pytest_perfguard import perf_case
from fakeclock import CLOCK
from conftest import reference, timed

@perf_case(
    variants={{"fast": timed({fast}), "same": timed(1000), "flaky": timed(1000, wrong={wrong}){extra}}},
    reference=reference,
    against=timed(1000),
    clock=CLOCK,
)
@pytest.mark.parametrize("S", [8])
def test_k(S, perfguard_device):
    q, k, v = (torch.randn(1, 2, S, 16, dtype=torch.float64) for _ in range(3))
    return (q, k, v), {{}}

@perf_case(variants={{"same": timed(1000)}}, reference=reference, against=timed(1000), clock=CLOCK)
def test_shape(perfguard_device):
    q, k, v = (torch.randn(1, 2, {shape}, 16, dtype=torch.float64) for _ in range(3))
    return (q, k, v), {{}}
"""


def _git(path: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args],
        cwd=path,
        check=True,
        capture_output=True,
        text=True,
        env={
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t",
            "HOME": str(path),
            "PATH": os.environ["PATH"],
        },
    ).stdout.strip()


def _write_test(p: pytest.Pytester, *, fast: int | str, wrong: bool, extra: str, shape: int) -> None:
    (p.path / "test_k.py").write_text(TEST.format(fast=fast, wrong=wrong, extra=extra, shape=shape))


@pytest.fixture
def repo(
    pytester: pytest.Pytester, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> pytest.Pytester:
    """Commit 1: the base. Commit 2: `fast` 5% slower, `flaky` fixed, a new variant, `test_shape` reshaped."""
    monkeypatch.setenv("PERFGUARD_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    p = pytester
    (p.path / "fakeclock.py").write_text(FAKECLOCK)  # not committed: one clock for both revisions
    (p.path / "conftest.py").write_text(CONFTEST)
    (p.path / ".gitignore").write_text("fakeclock.py\n__pycache__/\n*.json\nstdout\nstderr\nrunpytest-*\n")
    _write_test(p, fast=1000, wrong=True, extra="", shape=8)
    _git(p.path, "init", "-q", "-b", "main")
    _git(p.path, "add", "-A")
    _git(p.path, "commit", "-qm", "base")
    _write_test(p, fast=1050, wrong=False, extra=', "newv": timed(1000)', shape=16)
    _git(p.path, "commit", "-qam", "head: fast is 5% slower")
    return p


def run(p: pytest.Pytester, mode: list[str], *args: str) -> pytest.RunResult:
    return p.runpytest_inprocess(*mode, "-p", "no:cacheprovider", "--perfguard-case-budget", "30", *args)


def records(p: pytest.Pytester) -> dict[str, dict]:
    doc = json.loads((p.path / "r.json").read_text())
    return {r["id"].split("::")[1]: r for r in doc["results"]}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["no-xdist", "n2"])  # -n 0 adds nothing (test_plugin.TESTED_MODES)
def test_against_base_revision_pairs_every_variant(repo: pytest.Pytester, mode: str) -> None:
    result = run(repo, MODES[mode], "--perfguard-against", "HEAD~1", "--perfguard-json", "r.json")
    result.assert_outcomes(passed=4, failed=1)
    result.stdout.fnmatch_lines(["*perfguard: against HEAD~1 (*"])
    # the table's header names the base commit and its subject (pytest's own header is gone under -q)
    result.stdout.fnmatch_lines(["=*perfguard: *=", "perfguard: against HEAD~1 (* 'base'), tree in *"])
    by_id = records(repo)
    fast = by_id["test_k[fast-8]"]
    assert fast["verdict"] == "regressed"
    ab = next(g for g in fast["gates"] if g["gate"] == "ab")
    assert ab["status"] == "regressed" and 1.03 < ab["estimate"] < 1.07
    assert "confirmed in a fresh process" in " ".join(fast["reasons"])
    assert len(fast["base_blocks"]) == len(fast["variant_blocks"])
    same = by_id["test_k[same-8]"]
    assert same["verdict"] == "pass"
    ab_same = next(g for g in same["gates"] if g["gate"] == "ab")
    assert 0.99 < ab_same["estimate"] < 1.01 and ab_same["mde"] is not None
    assert by_id["test_k[newv-8]"]["verdict"] == "new"
    assert "variant 'newv' does not exist at HEAD~1" in by_id["test_k[newv-8]"]["reasons"][0]
    assert by_id["test_k[flaky-8]"]["verdict"] == "no base"
    assert "no base: base incorrect" in by_id["test_k[flaky-8]"]["reasons"][0]
    assert by_id["test_shape[same]"]["verdict"] == "not comparable"
    assert "the workload differs at HEAD~1" in by_id["test_shape[same]"]["reasons"][0]
    result.stdout.fnmatch_lines(["*2 of 5 timed case(s) compared with the base revision; not compared: 1 new*"])
    assert not (repo.path / ".ci").exists()  # the A/B gate writes no baseline
    assert _git(repo.path, "status", "--porcelain") == ""


@pytest.mark.slow
def test_a_a_against_head_passes_under_xdist(repo: pytest.Pytester) -> None:
    result = run(repo, MODES["n2"], "--perfguard-against", "HEAD", "--perfguard-json", "r.json")
    result.assert_outcomes(passed=5)
    result.stdout.fnmatch_lines(["*REV is HEAD and the tree is clean: an A/A run*"])
    assert all(r["verdict"] == "pass" for r in records(repo).values())


@pytest.mark.slow
def test_uncommitted_work_against_head(repo: pytest.Pytester) -> None:
    _write_test(repo, fast=1155, wrong=False, extra=', "newv": timed(1000)', shape=16)  # HEAD's fast is 1050
    result = run(repo, MODES["no-xdist"], "--perfguard-against", "HEAD", "--perfguard-no-confirm", "-k", "test_k")
    result.stdout.fnmatch_lines(["*uncommitted changes against HEAD*", "*time vs base revision +10.0%*"])
    result.assert_outcomes(passed=4, failed=1)  # -k test_k selects the module: test_k's four and test_shape


@pytest.mark.slow
def test_a_speedup_is_faster_only_when_a_fresh_process_sees_it_too(
    repo: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two loaded copies of one kernel can differ for a whole process (cuda_scalar on H100s read up to 4.7%
    "faster" than itself). Against HEAD (fast 1050, newv 1000): `fast` is 5% faster only in the process that
    pops FAST_ONCE, so the fresh process that checks it sees no change; `newv` is really 10% faster."""
    once = 'int(1000 if __import__("os").environ.pop("FAST_ONCE", "") else 1050)'
    _write_test(repo, fast=once, wrong=False, extra=', "newv": timed(900)', shape=16)
    monkeypatch.setenv("FAST_ONCE", "1")
    result = run(
        repo, MODES["no-xdist"], "--perfguard-against", "HEAD", "-k", "fast or newv", "--perfguard-json", "r.json"
    )
    result.assert_outcomes(passed=2)
    by_id = records(repo)
    fast, newv = by_id["test_k[fast-8]"], by_id["test_k[newv-8]"]
    assert next(g for g in fast["gates"] if g["gate"] == "ab")["status"] == "faster"  # in this process
    assert fast["verdict"] == "pass" and fast["confirmation"]["verdict"] == "pass"
    note = next(r for r in fast["reasons"] if r.startswith("not confirmed"))
    assert "faster than the base revision" in note and "but pass in a fresh one" in note
    assert "A/A reading" not in note  # the words of an unchecked claim belong to a claim that stands
    text = " ".join(result.stdout.str().split())  # the note under the pass row, wrapped to the table's width
    assert "not confirmed: time vs base revision -" in text and "but pass in a fresh one" in text
    assert newv["verdict"] == "faster" and newv["confirmation"]["verdict"] == "faster"
    # no baseline, so no A/A reading of the case: the claim says what could still explain it
    ab_newv = next(g for g in newv["gates"] if g["gate"] == "ab")
    assert ab_newv["reason"].endswith(
        "; no A/A reading of this case is stored, and only those rule out a per-process offset between its two"
        " copies (an update on a clean checkout stores them)"
    )
    # ... and the summary, which prints no faster case's reason, counts it (so does the PR comment)
    result.stdout.fnmatch_lines(['perfguard: 1 "faster" verdict(s) rest on no stored A/A reading of their case: *'])
    assert any(r.startswith("confirmed in a fresh process: time vs base revision -10") for r in newv["reasons"])


@pytest.mark.slow
def test_the_per_process_offset_setting_widens_the_mde_not_the_decision(repo: pytest.Pytester) -> None:
    """The fake kernels' time is 1% noise; an offset of 5% per process (an ini value) cannot be measured
    away, so the A/B MDE says the case cannot see +10%, while its verdict still comes from the interval."""
    repo.makeini("[pytest]\nperfguard_ab_process_sd = 0.05\nperfguard_ab_small_process_sd = 0.05\n")
    args = ("--perfguard-against", "HEAD", "-k", "same-8", "--perfguard-json", "r.json")
    run(repo, MODES["no-xdist"], *args, "--perfguard-case-budget", "2").assert_outcomes(passed=1)
    ab = next(g for g in records(repo)["test_k[same-8]"]["gates"] if g["gate"] == "ab")
    assert ab["status"] == "pass" and ab["mde"] > 0.10
    run(repo, MODES["no-xdist"], *args, "--perfguard-ab-small-process-sd", "0", "--perfguard-ab-process-sd", "0")
    ab = next(g for g in records(repo)["test_k[same-8]"]["gates"] if g["gate"] == "ab")
    assert ab["status"] == "pass" and ab["mde"] <= 0.02 + 1e-9  # the command line wins over the ini


@pytest.mark.slow
def test_strict_fails_on_a_case_without_base(repo: pytest.Pytester) -> None:
    result = run(repo, MODES["no-xdist"], "--perfguard-against", "HEAD~1", "--perfguard-strict", "-k", "newv")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*--perfguard-strict (new)*"])


def test_bad_revisions_are_usage_errors(repo: pytest.Pytester) -> None:
    result = repo.runpytest_inprocess("--perfguard-against", "no-such-branch")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--perfguard-against no-such-branch: unknown git revision*"])
    clone = repo.path.parent / "shallow"
    _git(repo.path.parent, "clone", "-q", "--depth", "1", f"file://{repo.path}", str(clone))
    out = subprocess.run(
        ["git", "rev-parse", "--is-shallow-repository"], cwd=clone, capture_output=True, text=True
    ).stdout.strip()
    assert out == "true"
    (clone / "fakeclock.py").write_text(FAKECLOCK)
    result = repo.runpytest_inprocess(str(clone), "--rootdir", str(clone), "--perfguard-against", "HEAD~1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*not in this shallow clone*git fetch*"])
    assert _git(repo.path, "status", "--porcelain") == ""


def test_not_a_repository_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_x="def test_x(): pass")
    result = pytester.runpytest_inprocess("--perfguard-against", "HEAD~1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*is not in a git repository*"])


# Inner test modules whose variants' requirements tell the head's copy from the base revision's (imported
# under a name of its own, ab.py) and meet or wait on each other through files in $RENDEZVOUS.
REQUIRES_HEADER = """
import os
import time
import torch
from pytest_perfguard import Variant, perf_case
from fakeclock import CLOCK
from conftest import reference, timed

SIDE = "base" if __name__.startswith("_perfguard_base") else "head"
HERE = os.environ["RENDEZVOUS"]
"""


def requires_case(name: str, requirement: str) -> str:
    """An inner perf case `test_<name>` with one variant, `<name>`, that requires `requirement`."""
    return f"""

@perf_case(
    variants={{"{name}": Variant(timed(1000), requires={requirement})}},
    reference=reference, against=timed(1000), clock=CLOCK,
)
def test_{name}(perfguard_device):
    return tuple(torch.randn(1, 2, 8, 16, dtype=torch.float64) for _ in range(3)), {{}}
"""


REQUIRES_TEST = (
    REQUIRES_HEADER
    + '''

def built_beside_the_other():
    """Stands for a requirement that builds (kernels/cuda_ext.py): each revision's copy marks that it
    started and waits for the other's mark, so it is met only while both run at the same time."""
    open(os.path.join(HERE, SIDE), "w").close()
    other = os.path.join(HERE, "head" if SIDE == "base" else "base")
    until = time.monotonic() + 15
    while time.monotonic() < until:
        if os.path.exists(other):
            return None
        time.sleep(0.005)
    return f"the {SIDE} copy's requirement ran alone"


def missing_at_base():
    return "needs the new intrinsics" if SIDE == "base" else None
'''
    + requires_case("beside", "built_beside_the_other")
    + requires_case("unmet_at_base", "missing_at_base")
)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["no-xdist", "n2"])
def test_the_base_twins_requirements_run_beside_the_heads_and_an_unmet_one_is_no_base(
    repo: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """A requirement that builds (the CUDA extension) is paid once per revision in a fresh runner's first
    case: the base twin's is evaluated in a thread while the head's is, so the builds overlap. A base
    revision whose copy of the variant cannot run is "no base" with that copy's reason."""
    (repo.path / "test_req.py").write_text(REQUIRES_TEST)
    _git(repo.path, "add", "test_req.py")
    _git(repo.path, "commit", "-qm", "requirements")
    monkeypatch.setenv("RENDEZVOUS", str(tmp_path))
    result = run(repo, MODES[mode], "test_req.py", "--perfguard-against", "HEAD", "--perfguard-json", "r.json")
    result.assert_outcomes(passed=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base", "head"]
    by_id = records(repo)
    assert by_id["test_beside[beside]"]["verdict"] == "pass"
    unmet = by_id["test_unmet_at_base[unmet_at_base]"]
    assert unmet["verdict"] == "no base"
    assert unmet["reasons"][0] == "no base: at HEAD the variant cannot run: needs the new intrinsics"


INTERRUPTED_TEST = (
    REQUIRES_HEADER
    + """

def interrupted_while_the_base_builds():
    if SIDE == "head":
        until = time.monotonic() + 30
        while not os.path.exists(os.path.join(HERE, "base-started")) and time.monotonic() < until:
            time.sleep(0.005)
        raise KeyboardInterrupt  # Ctrl-C while the base revision's copy still builds
    open(os.path.join(HERE, "base-started"), "w").close()
    time.sleep(120)
    open(os.path.join(HERE, "base-done"), "w").close()
"""
    + requires_case("interrupted", "interrupted_while_the_base_builds")
)


@pytest.mark.slow
def test_an_interrupt_during_the_heads_build_does_not_wait_for_the_bases(
    repo: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while the head's requirement builds ends the run at once, the base twin's build still going
    (a daemon thread), rather than after it."""
    (repo.path / "test_interrupted.py").write_text(INTERRUPTED_TEST)
    _git(repo.path, "add", "test_interrupted.py")
    _git(repo.path, "commit", "-qm", "interrupted")
    monkeypatch.setenv("RENDEZVOUS", str(tmp_path))
    # A process of its own: an interrupt ends it (in-process, pytester raises it into this test). Joining
    # the base's thread would hold it for the base requirement's 120 s, past the timeout.
    result = repo.runpytest_subprocess(
        "-p", "no:xdist", "-p", "no:cacheprovider", "test_interrupted.py", "--perfguard-against", "HEAD", timeout=90
    )
    assert result.ret == pytest.ExitCode.INTERRUPTED, result.stdout.str()
    assert (tmp_path / "base-started").exists() and not (tmp_path / "base-done").exists()
