"""The README's quick start, as written, in a fresh project of its own (issue 46): the example file and the
commands after it are copied from the README, run in order in a new git repository with an `origin` whose
main branch holds the recorded baseline, then the kernel gets twice as slow on a branch, and both guards the
README recommends fail it: the stored baseline (`pytest --perfguard`) and the pull-request form
(`--perfguard-against origin/main`). Real timing on this machine: the budgets are cut short by environment
settings only, and the CPU watch is off (the test suite's own workers load the CPU by design).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.real_timer]

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
# The settings a quick test turns down, each through its environment variable (settings.py): what the
# README's commands say is run unchanged.
QUICK = {
    "PERFGUARD_CASE_BUDGET": "1.0",
    "PERFGUARD_CPU_WATCH": "0",
    "PERFGUARD_UPDATE_PROCESSES": "3",
}


def _quick_start() -> tuple[str, list[str]]:
    """The README's example file and the commands that follow it, comments dropped."""
    section = README[README.index("## Use it in your own project") :]
    section = section[: section.index("\n## ", 1)]
    example = re.search(r"```python\n(.*?)```", section, re.S)
    then = section[section.index("Then:") :]
    commands = re.search(r"```bash\n(.*?)```", then, re.S)
    assert example is not None and commands is not None, "the README's quick start moved"
    lines = [line.split("  #", 1)[0].strip() for line in commands.group(1).splitlines()]
    return example.group(1), [line for line in lines if line]


def _sh(cwd: Path, command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A README command, with `pytest` run by this interpreter (the one that has the plugin installed)."""
    words = shlex.split(command)
    if words[0] == "pytest":
        words = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *words[1:]]
    return subprocess.run(words, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False)


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True)


def test_the_quick_start_records_a_baseline_and_fails_a_two_fold_slowdown(tmp_path: Path) -> None:
    example, commands = _quick_start()
    assert [c.split()[0] for c in commands] == ["pytest", "pytest", "git", "pytest", "pytest"], commands
    env = {**os.environ, **QUICK, "CI": "", "GIT_AUTHOR_NAME": "u", "GIT_AUTHOR_EMAIL": "u@example.com"}
    env |= {"GIT_COMMITTER_NAME": "u", "GIT_COMMITTER_EMAIL": "u@example.com"}
    origin, project = tmp_path / "origin.git", tmp_path / "project"
    project.mkdir()
    _git(tmp_path, "init", "-q", "--bare", "-b", "main", str(origin))
    _git(project, "init", "-q", "-b", "main")
    (project / "test_attention.py").write_text(example)
    _git(project, "add", "test_attention.py")
    _git(project, "commit", "-q", "-m", "the kernel")
    _git(project, "remote", "add", "origin", str(origin))

    check, update, commit, guard, against = commands
    ran = _sh(project, check, env)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    ran = _sh(project, update, env)
    stored_nothing = "perfguard: no baseline entry written" in ran.stdout
    if ran.returncode != 0 and stored_nothing:
        # The update refused to store on a machine too loaded to judge by (this suite's own workers): the
        # product's answer, not the README's fault; the steps after it need a baseline.
        pytest.skip("the machine's load left the update unable to store a baseline (it said so and exited 1)")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "commit it (git add .ci/baselines/)" in ran.stdout  # the update says to commit what it stored
    ran = subprocess.run(commit, shell=True, cwd=project, env=env, capture_output=True, text=True, check=False)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    _git(project, "push", "-q", "origin", "main")
    assert subprocess.run(["git", "status", "--porcelain"], cwd=project, capture_output=True, text=True).stdout == ""
    ran = _sh(project, guard, env)
    assert ran.returncode == 0, ran.stdout + ran.stderr  # unchanged code: no failure

    # A pull request that makes the kernel do its work twice.
    _git(project, "checkout", "-q", "-b", "slower")
    slow = example.replace(
        "\n\ndef sdpa_attention",
        "\n\n_naive = naive_attention\n\n\n"
        "def naive_attention(q, k, v, causal):  # the planted slowdown: the work done twice\n"
        "    _naive(q, k, v, causal)\n"
        "    return _naive(q, k, v, causal)\n\n\ndef sdpa_attention",
    )
    assert slow != example, "the README's kernel changed: plant the slowdown anew"
    (project / "test_attention.py").write_text(slow)
    _git(project, "commit", "-q", "-am", "twice the work")
    stored = _sh(project, guard, env)
    assert stored.returncode == 1, stored.stdout + stored.stderr
    assert re.search(r"naive\s.*regressed", stored.stdout), stored.stdout
    pr = _sh(project, against, env)
    assert pr.returncode == 1, pr.stdout + pr.stderr
    assert re.search(r"naive\s.*regressed", pr.stdout), pr.stdout
