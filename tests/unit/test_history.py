"""perfguard history: the SQLite store (round trip, idempotency, git defaults, bad files, concurrent writers)
and what `history changes` says of a change (how well changes are found on synthetic histories built from
recorded H200 noise: benchmarks/tests/test_changepoints.py)."""

from __future__ import annotations

import json
import math
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_perfguard.commands.history.store import (
    SCHEMA_VERSION,
    find_changes,
    open_history,
    resolve_commit,
    shift_interval,
)
from pytest_perfguard.gitrev import tree_digest
from tests.unit.test_cli import make_results, run

DEVICE: dict[str, Any] = {
    "slug": "nvidia-h200",
    "name": "NVIDIA H200",
    "kind": "cuda",
    "torch": "2.11.0+cu130",
}
CASE = "tests/perf/test_attention.py::test_attention[triton_flash-8-8-128-64]"
OTHER = "tests/perf/test_attention.py::test_attention[sdpa-8-8-128-64]"
ROOT = Path(__file__).resolve().parents[2]


def record(case_id: str, median: float | None, **changes: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": case_id,
        "variant": "v",
        "median_ns": median,
        "ci_ns": None if median is None else [median * math.exp(-0.004), median * math.exp(0.005)],
        "ratio": None if median is None else 1.25,
        "ratio_ci": None if median is None else [1.24, 1.27],
        "blocks": None if median is None else 5,
        "verdict": None if median is None else "pass",
        "reasons": [],
        "mde": 0.031,
        "env": {"against_backend": "flash"},
        "variant_blocks": None if median is None else [median * f for f in (0.99, 1.0, 1.0, 1.01, 1.02)],
    }
    out.update(changes)
    return out


def results(path: Path, median: float, device: dict[str, Any] | None = None, other: float | None = 5e4) -> Path:
    recs = [record(CASE, median), record(OTHER, other), record("t.py::skipped", None, outcome="skipped")]
    return make_results(path, recs, device or DEVICE)


def add(capsys: pytest.CaptureFixture[str], hist: Path, res: Path, sha: str, when: str) -> tuple[int, str, str]:
    return run(capsys, "history", "add", str(res), "--history", str(hist), "--sha", sha, "--commit-time", when)


# ------------------------------------------------------------------------------------------------ store


def test_add_and_show_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hist = tmp_path / "ci" / "history.sqlite"
    status, out, _ = add(capsys, hist, results(tmp_path / "r.json", 9123.4), "a" * 40, "2026-11-23T10:00:00Z")
    assert status == 0
    assert "added run 1" in out and "2 cases, 1 not timed" in out
    with open_history(hist) as history:
        assert history.case_names() == [OTHER, CASE]
        (point,) = history.series(CASE)
    s = point.summary
    assert point.sha == "a" * 40 and point.commit_time == 1795428000
    assert s.estimate_ns == pytest.approx(9123.4, abs=1e-3)
    assert s.ci_ns == pytest.approx((9123.4 * math.exp(-0.004), 9123.4 * math.exp(0.005)), rel=2e-6)
    assert s.ratio == pytest.approx(1.25, rel=2e-6) and s.ratio_ci == pytest.approx((1.24, 1.27), rel=2e-6)
    assert s.mde == pytest.approx(0.031) and s.noise is not None and 0.0 < s.noise < 0.02
    assert s.verdict == "pass"
    assert s.env["torch"] == "2.11.0+cu130" and s.env["case.against_backend"] == "flash"
    status, out, _ = run(capsys, "history", "show", "--history", str(hist), "-k", "triton")
    assert status == 0
    assert "triton_flash" in out and "sdpa-8" not in out
    assert "aaaaaaaaaa  2026-11-23 10:00  9.123 µs" in out and "1.250 [1.240, 1.270]" in out


def test_same_run_twice_is_idempotent_and_a_conflicting_sha_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hist, res = tmp_path / "h.sqlite", results(tmp_path / "r.json", 9000.0)
    assert add(capsys, hist, res, "a" * 40, "2026-11-23T10:00:00Z")[0] == 0
    before = hist.read_bytes()
    status, out, _ = add(capsys, hist, res, "a" * 40, "2026-11-23T10:00:00Z")
    assert status == 0 and "already in" in out and "nothing added" in out
    status, _, err = add(capsys, hist, res, "b" * 40, "2026-11-23T11:00:00Z")
    assert status == 1 and "already in the history as run 1 of commit aaaa" in err
    assert hist.read_bytes() == before
    with open_history(hist) as history:
        assert history.run_count() == 1


def git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_COMMITTER_DATE": "2026-11-20T08:00:00+00:00"}
    cmd = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def test_commit_defaults_from_git_and_a_clear_error_outside_a_repository(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "commit", "-q", "--allow-empty", "-m", "x")
    head = git(repo, "rev-parse", "HEAD").strip()
    assert resolve_commit(None, None, repo) == (head, 1795161600)
    monkeypatch.chdir(repo)
    status, out, _ = run(capsys, "history", "add", str(results(tmp_path / "r.json", 9000.0)))
    assert status == 0 and head[:12] in out
    assert (repo / ".ci" / "history.sqlite").is_file()
    outside = tmp_path / "outside"
    outside.mkdir()
    monkeypatch.chdir(outside)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    status, _, err = run(capsys, "history", "add", str(tmp_path / "r.json"), "--history", "h.sqlite")
    assert status == 1 and "not in a git repository" in err and "--sha SHA --commit-time ISO" in err
    status, _, err = run(capsys, "history", "add", str(tmp_path / "r.json"), "--history", "h.sqlite", "--sha", "abc")
    assert status == 1 and "pass --commit-time" in err
    assert not (outside / "h.sqlite").exists()


@pytest.mark.parametrize("content", [b"not a database at all" * 100, b"SQLite format 3\x00" + b"\x07" * 5000])
def test_corrupt_history_is_named_and_never_overwritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes
) -> None:
    hist = tmp_path / "h.sqlite"
    hist.write_bytes(content)
    status, _, err = add(capsys, hist, results(tmp_path / "r.json", 9000.0), "a" * 40, "2026-11-23")
    assert status == 1 and str(hist) in err and "left untouched" in err
    for command in ("show", "changes"):
        status, _, err = run(capsys, "history", command, "--history", str(hist))
        assert status == 1 and str(hist) in err
    assert hist.read_bytes() == content


def test_newer_schema_and_foreign_sqlite_are_refused_untouched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hist, res = tmp_path / "h.sqlite", results(tmp_path / "r.json", 9000.0)
    assert add(capsys, hist, res, "a" * 40, "2026-11-23")[0] == 0
    with sqlite3.connect(hist) as db:
        db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    db.close()
    before = hist.read_bytes()
    status, _, err = add(capsys, hist, results(tmp_path / "r2.json", 9100.0), "b" * 40, "2026-11-24")
    assert status == 1 and "newer pytest-perfguard" in err and "upgrade" in err and str(hist) in err
    assert hist.read_bytes() == before

    foreign = tmp_path / "other.sqlite"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE t (x)")
    db.close()
    before = foreign.read_bytes()
    status, _, err = add(capsys, foreign, res, "a" * 40, "2026-11-23")
    assert status == 1 and "not a perfguard history" in err
    assert foreign.read_bytes() == before


def test_missing_history_and_unknown_case_say_what_to_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hist = tmp_path / "h.sqlite"
    status, _, err = run(capsys, "history", "show", "--history", str(hist))
    assert status == 1 and "perfguard history add RESULTS" in err
    status, _, err = add(capsys, hist, tmp_path / "missing.json", "a" * 40, "2026-11-23")
    assert status == 1 and "no such results file" in err
    assert not hist.exists()
    add(capsys, hist, results(tmp_path / "r.json", 9000.0), "a" * 40, "2026-11-23")
    status, _, err = run(capsys, "history", "changes", "--history", str(hist), "-k", "nope")
    assert status == 1 and "no case matching 'nope'" in err


WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from pytest_perfguard.commands.history.store import add_results
    hist, tag, files = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
    for number, name in enumerate(files):
        add_results(hist, Path(name), f"{tag}{number:039d}", 1_795_000_000 + number)
    """
)


def test_two_concurrent_writer_processes_lose_nothing(tmp_path: Path) -> None:
    hist = tmp_path / "h.sqlite"  # does not exist yet: both writers race to create it too
    procs = []
    for offset, tag in enumerate("ab"):
        files = [str(results(tmp_path / f"{tag}{n}.json", 9000.0 + n, other=5e4 + offset)) for n in range(10)]
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", WRITER, str(hist), tag, *files],
                cwd=ROOT,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    with open_history(hist) as history:
        assert history.run_count() == 20
        assert len(history.series(CASE)) == 20 and len(history.series(OTHER)) == 20
    with sqlite3.connect(hist) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    db.close()


@pytest.mark.fresh_interpreter
def test_history_command_does_not_import_torch(tmp_path: Path) -> None:
    code = (
        "import sys; from pytest_perfguard.commands.cli import main; "
        f"main(['history', 'add', {str(results(tmp_path / 'r.json', 9000.0))!r}, '--history', "
        f"{str(tmp_path / 'h.sqlite')!r}, '--sha', 'abc', '--commit-time', '2026-11-23']); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_plot_png_and_svg(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    hist = tmp_path / "h.sqlite"
    for n in range(3):
        add(capsys, hist, results(tmp_path / f"r{n}.json", 9000.0 + 50 * n), f"{n}" * 40, f"2026-11-2{n}")
    for name in ("p.png", "p.svg"):
        status, _, _ = run(capsys, "history", "show", "--history", str(hist), "--plot", str(tmp_path / name))
        assert status == 0 and (tmp_path / name).stat().st_size > 1000
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    status, _, err = run(capsys, "history", "show", "--history", str(hist), "--plot", str(tmp_path / "p.pdf"))
    assert status == 1 and ".png or .svg" in err


# --------------------------------------------------------------------------------------- change points


def test_shift_interval_recovers_a_shift() -> None:
    rng = np.random.default_rng(3)
    iv = shift_interval(rng.normal(0, 0.01, 30), rng.normal(0.05, 0.01, 30))
    assert iv.lo < 0.05 < iv.hi and iv.hi - iv.lo < 0.02
    assert math.isinf(shift_interval([0.0], [1.0]).lo)


def test_changes_lists_commit_range_size_and_environment(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """What the command says of one change; how well changes are found on recorded noise is
    benchmarks/tests/test_changepoints.py's."""
    rng = np.random.default_rng(5)
    values = 10_000.0 * np.exp(rng.normal(0.0, 0.003, 45))
    values[30:] *= 1.10
    hist = tmp_path / "h.sqlite"
    for n, value in enumerate(values):
        device = dict(DEVICE, torch="2.12.0+cu130" if n >= 30 else DEVICE["torch"])
        res = results(tmp_path / f"r{n}.json", float(value), device=device, other=5e4 * (1 + 1e-3 * (n % 3)))
        add(capsys, hist, res, f"{n:02d}" * 20, f"2026-10-01T00:{n:02d}:00Z")
    status, out, _ = run(capsys, "history", "changes", "--history", str(hist), "-k", "triton")
    assert status == 0, out
    assert f"{'29' * 5}..{'30' * 5}" in out
    assert "torch 2.11.0+cu130 -> 2.12.0+cu130" in out and "at the change" in out
    assert "1 change points in 1 cases" in out
    with open_history(hist) as history:
        (change,) = find_changes(history.series(CASE), max_pvalue=1e-4)
    assert change.index == 30
    assert change.size.lo < 1.10 < change.size.hi and change.size.hi - change.size.lo < 0.03


def test_a_run_of_uncommitted_changes_is_never_filed_under_the_bare_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run with uncommitted changes was filed under HEAD with no mark. The results file now records the
    changes' digest, and `history add` refuses it unless told; a clean run is filed under the commit its
    file records, not under the one checked out when it is added."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "commit", "-q", "--allow-empty", "-m", "measured")
    measured = git(repo, "rev-parse", "HEAD").strip()
    (repo / "kernel.py").write_text("x = 1\n")
    digest = tree_digest(repo)
    assert digest is not None and tree_digest(repo) == digest
    (repo / "kernel.py").write_text("x = 2\n")
    assert tree_digest(repo) not in (None, digest)
    path = results(tmp_path / "r.json", 9000.0)
    doc = json.loads(path.read_text())
    doc["run"] = {"git_sha": measured, "git_dirty": digest}
    path.write_text(json.dumps(doc))
    monkeypatch.chdir(repo)
    status, _, err = run(capsys, "history", "add", str(path))
    assert status == 1 and "with uncommitted changes (digest " in err and "--allow-dirty" in err
    assert not (repo / ".ci" / "history.sqlite").exists()
    doc["run"] = {"git_sha": measured}
    path.write_text(json.dumps(doc))
    git(repo, "add", "kernel.py")
    git(repo, "commit", "-q", "-m", "later")
    status, out, _ = run(capsys, "history", "add", str(path))
    assert status == 0 and f"commit {measured[:12]}" in out  # the commit measured, not HEAD now
