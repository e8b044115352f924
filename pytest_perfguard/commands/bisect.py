"""``perfguard bisect GOOD BAD -k CASE``: the first commit at which a case got slower than at GOOD.

A per-PR gate sees one step at a time; a slowdown that slipped through leaves the question of which commit
did it. This drives ``git bisect run`` with the A/B gate: every step runs
``pytest -k CASE --perfguard --perfguard-against GOOD_SHA`` in the checked-out revision, so each revision is
timed against GOOD's twin in the same process (no stored number from another process or day), and answers
git with 0 (pass or faster), 1 (regressed) or 125 (skip: inconclusive, not comparable, new, no base, or the
revision does not build, import or collect the case), saying which.

Each revision's kernels are built by its own code: a ``torch.utils.cpp_extension`` kernel whose build name
is a hash of its sources (as in ``kernels/cuda_ext.py``) is compiled once per distinct source and reused
from the extension cache when bisect returns to it, and GOOD's tree is extracted once into the A/B cache
(``PERFGUARD_CACHE_DIR``). The plugin itself is pinned (pinned.py), so every step is judged by the same rules
even when the bisected repository is the plugin's own.

BAD is measured first, before bisecting: if it is not "regressed" against GOOD there is nothing to find, and
if GOOD does not build or lacks the case the A/B gate says so there. ``git bisect reset`` always runs at the
end, also on an error or Ctrl-C. Exit status: 0 when the first bad commit was found, 1 when not, 2 for bad
input (unknown revisions, GOOD not an ancestor of BAD, uncommitted changes, a bisect already under way).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..gitrev import GitError, git
from ..record import CaseRecord, Outcome, Status
from ..report.formats import format_change
from ..report.results import ResultsError, read_results
from .pinned import child_env, pin, pytest_command

GOOD, BAD, SKIP, ABORT = 0, 1, 125, 128  # git bisect run: 125 skips, 128 and above stop the bisection
STEP_LAUNCHER = "perfguard_bisect_step.py"
_WORDS = {GOOD: "pass", BAD: "regressed", SKIP: "skip"}
_STEP_TEXT = '''"""One step of perfguard bisect, run by git bisect run with the pinned plugin beside this file."""
import sys

from pytest_perfguard.commands.bisect import step_main

sys.exit(step_main(sys.argv[1:]))
'''


class BisectError(Exception):
    """Bad input to bisect; the message says what to run instead."""


# ------------------------------------------------------------------------------------------ one step


@dataclass
class CaseStep:
    """One case at one revision: its A/B status against GOOD and the change it measured."""

    id: str
    status: str
    code: int
    change: str = "-"
    estimate: float | None = None
    ci: list[float] | None = None
    reason: str = ""


@dataclass
class StepResult:
    """What one revision answered, kept as JSON in the work folder for the final report."""

    sha: str
    code: int
    reason: str
    cases: list[CaseStep] = field(default_factory=list)

    @property
    def word(self) -> str:
        return _WORDS.get(self.code, "abort")

    def line(self) -> str:
        return f"perfguard bisect: {self.sha[:12]} {self.word}: {self.reason}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> StepResult:
        cases = [CaseStep(**c) for c in obj.get("cases", [])]
        return cls(sha=obj["sha"], code=int(obj["code"]), reason=str(obj["reason"]), cases=cases)


def judge_case(record: CaseRecord) -> CaseStep:
    """The A/B gate decides; a regression that its fresh-process confirmation did not repeat is a skip."""
    gate = record.gate("ab")
    if gate is None:
        status = str(record.verdict or record.outcome)
        reason = record.reasons[0] if record.reasons else status
        return CaseStep(record.id, status, SKIP, reason=f"{status}: {reason}" if reason != status else status)
    status = str(gate.status)
    estimate = gate.estimate
    ci = list(gate.ci) if gate.ci is not None else None
    change = format_change(estimate, ci)
    reason = gate.reason or status
    if status == Status.REGRESSED:
        if record.verdict is Status.REGRESSED:
            return CaseStep(record.id, status, BAD, change, estimate, ci, reason)
        why = record.reasons[0] if record.reasons else f"verdict {record.verdict}"
        return CaseStep(record.id, str(record.verdict), SKIP, change, estimate, ci, why)
    code = GOOD if status in (Status.PASS, Status.FASTER) else SKIP
    return CaseStep(record.id, status, code, change, estimate, ci, reason)


def decide(sha: str, records: Sequence[CaseRecord]) -> StepResult:
    """Bad if any selected case regressed; good if every case that ran passed; else skip, with the reasons.

    Cases pytest skipped here (a GPU variant on a CPU host) do not count unless nothing else ran.
    """
    ran = [r for r in records if r.outcome not in (Outcome.SKIPPED, Outcome.NOT_RUN)] or list(records)
    cases = [judge_case(r) for r in ran]
    if not cases:
        return StepResult(sha, SKIP, "no perf case ran")
    bad = [c for c in cases if c.code == BAD]
    chosen = bad or [c for c in cases if c.code == SKIP] or cases
    code = BAD if bad else (SKIP if any(c.code == SKIP for c in cases) else GOOD)
    reason = "; ".join(f"{c.id} {c.status} {c.change}" if c.code != SKIP else f"{c.id} {c.reason}" for c in chosen)
    return StepResult(sha, code, reason, cases)


def _log_tail(log: Path, lines: int = 3) -> str:
    """The lines of a pytest log that say why it stopped: its E-lines and errors, else its last lines."""
    try:
        text = log.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    picked = [t.strip() for t in text if t.startswith("E ") or t.startswith("ERROR ")]
    chosen = picked[-lines:] if picked else [t.strip() for t in text if t.strip()][-lines:]
    return " | ".join(chosen)


def run_step(work: Path, cwd: Path, good_sha: str, case: str, pytest_args: Sequence[str]) -> StepResult:
    """Run the case at the checked-out revision against GOOD and decide what git bisect hears."""
    sha = git(cwd if cwd.is_dir() else work, "rev-parse", "HEAD")
    steps = work / "steps"
    steps.mkdir(parents=True, exist_ok=True)
    results, log = steps / f"{sha}.json", steps / f"{sha}.log"
    results.unlink(missing_ok=True)
    if not cwd.is_dir():
        result = StepResult(sha, SKIP, f"the folder {cwd} does not exist at this revision")
    else:
        command = [
            *pytest_command(work / "plugin"),
            "-k",
            case,
            "--perfguard",
            "--perfguard-against",
            good_sha,
            "--perfguard-json",
            str(results),
            "-p",
            "no:cacheprovider",
            *pytest_args,
        ]
        with log.open("w", encoding="utf-8") as out:
            ret = subprocess.run(
                command,
                cwd=cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=child_env(work / "plugin"),
                check=False,
            ).returncode
        result = _interpret(sha, ret, results, log, case)
    (steps / f"{sha}.step.json").write_text(json.dumps(result.to_json(), indent=1) + "\n", encoding="utf-8")
    return result


def _interpret(sha: str, ret: int, results: Path, log: Path, case: str) -> StepResult:
    if ret == 5:
        return StepResult(sha, SKIP, f"no test matches -k {case!r} at this revision (the case does not exist here)")
    if ret not in (0, 1) or not results.is_file():
        why = _log_tail(log) or "no output"
        return StepResult(
            sha,
            SKIP,
            f"pytest could not run the case here (exit {ret}: build, import or collection failure?): {why}; log: {log}",
        )
    try:
        records = read_results(results).results
    except ResultsError as exc:
        return StepResult(sha, SKIP, f"unreadable results: {exc}")
    return decide(sha, records)


def step_main(argv: Sequence[str]) -> int:
    """Entry point of a step under git bisect run; a failure of the step itself stops the bisection."""
    parser = argparse.ArgumentParser(prog="perfguard bisect step")
    parser.add_argument("--work", required=True)
    parser.add_argument("--cwd", required=True)
    parser.add_argument("--good", required=True)
    parser.add_argument("-k", required=True)
    parser.add_argument("pytest_args", nargs="*")
    args = parser.parse_args(argv)
    try:
        result = run_step(Path(args.work), Path(args.cwd), args.good, args.k, args.pytest_args)
    except (GitError, OSError) as exc:
        print(f"perfguard bisect: the step failed, stopping the bisection: {exc}", flush=True)
        return ABORT
    print(result.line(), flush=True)
    return result.code


# ------------------------------------------------------------------------------------------ the driver


def _rev(top: Path, rev: str, what: str) -> str:
    try:
        return git(top, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except GitError:
        raise BisectError(
            f"{what} {rev!r} is not a commit here (git rev-parse {rev} finds none); give a SHA, "
            "branch or tag, after git fetch if it is on a remote"
        ) from None


def check_range(top: Path, good: str, bad: str) -> tuple[str, str]:
    """GOOD and BAD as SHAs, GOOD an ancestor of BAD, a clean tree and no bisection under way."""
    good_sha, bad_sha = _rev(top, good, "GOOD"), _rev(top, bad, "BAD")
    if good_sha == bad_sha:
        raise BisectError(f"GOOD {good} and BAD {bad} are the same commit {good_sha[:12]}: nothing to bisect")
    ancestor = subprocess.run(
        ["git", "merge-base", "--is-ancestor", good_sha, bad_sha],
        cwd=top,
        capture_output=True,
        text=True,
        check=False,
    )
    if ancestor.returncode == 1:
        swapped = (
            subprocess.run(
                ["git", "merge-base", "--is-ancestor", bad_sha, good_sha],
                cwd=top,
                capture_output=True,
                check=False,
            ).returncode
            == 0
        )
        hint = (
            " (BAD is an ancestor of GOOD: swap them)"
            if swapped
            else f"; pick a GOOD on BAD's history, e.g. from git log --oneline {bad}"
        )
        raise BisectError(
            f"GOOD {good} ({good_sha[:12]}) is not an ancestor of BAD {bad} ({bad_sha[:12]}): "
            f"git bisect needs GOOD on the history of BAD{hint}"
        )
    if ancestor.returncode != 0:
        raise BisectError(f"git merge-base --is-ancestor failed: {ancestor.stderr.strip()}")
    if Path(top, git(top, "rev-parse", "--git-path", "BISECT_START")).exists():
        raise BisectError("a git bisect is already under way here; finish it with git bisect reset, then run again")
    dirty = git(top, "diff", "--name-only", "HEAD")
    if dirty:
        files = dirty.splitlines()
        shown = ", ".join(files[:5]) + (" ..." if len(files) > 5 else "")
        raise BisectError(
            f"the working tree has uncommitted changes ({shown}); bisect checks out other "
            "revisions: commit them or git stash, then run again"
        )
    return good_sha, bad_sha


def _git_loud(top: Path, *args: str) -> str:
    """A git command whose output is shown and returned (bisect says what it checked out and found)."""
    proc = subprocess.run(["git", *args], cwd=top, capture_output=True, text=True, check=False)
    text = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        raise GitError(text or f"git {' '.join(args)} failed with exit {proc.returncode}")
    return text


def _bisect_run(top: Path, command: Sequence[str]) -> str:
    """git bisect run, its output shown as it comes and returned."""
    proc = subprocess.Popen(
        ["git", "bisect", "run", *command],
        cwd=top,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    lines = []
    try:
        for line in proc.stdout:
            print(line, end="", flush=True)
            lines.append(line)
        proc.wait()
    finally:  # Ctrl-C: let git bisect run end before the caller resets the bisection
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=60)
    return "".join(lines)


def _name(rev: str, sha: str) -> str:
    """A revision as the user gave it, with its short SHA; just the short SHA when they gave a SHA."""
    return sha[:12] if sha.startswith(rev) else f"{rev} ({sha[:12]})"


def _subject(top: Path, sha: str) -> str:
    return git(top, "log", "-1", "--format=%h %s", sha)


def _load_step(work: Path, sha: str) -> StepResult | None:
    path = work / "steps" / f"{sha}.step.json"
    try:
        return StepResult.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError):
        return None


def _report(top: Path, work: Path, good: str, first_bad: str) -> None:
    print(f"\nfirst bad commit: {_subject(top, first_bad)}")
    step = _load_step(work, first_bad)
    if step is not None:
        for c in step.cases:
            if c.code == BAD:
                print(f"  {c.id}: {c.change} time against GOOD {good} (A/B gate, 95% CI)")
    print("steps (in the order measured):")
    for path in sorted((work / "steps").glob("*.step.json"), key=lambda p: p.stat().st_mtime):
        other = _load_step(work, path.name.split(".")[0])
        if other is not None:
            print(f"  {_subject(top, other.sha)[:60]:<60} {other.word:<9} {other.reason}")


def _bisect_started(
    top: Path, work: Path, step: Sequence[str], *, good_sha: str, bad_sha: str, good_name: str, bad_name: str
) -> int:
    """The bisection once git bisect has started (the caller resets it). BAD is measured first, so a range
    whose BAD is not slower than GOOD stops before any other revision is measured."""
    _git_loud(top, "checkout", "-q", "--detach", bad_sha)
    print(f"perfguard bisect: measuring BAD {bad_name} against GOOD {good_name} first", flush=True)
    first = subprocess.run(step, cwd=top, check=False).returncode
    if first != BAD:
        result = _load_step(work, bad_sha)
        why = result.reason if result is not None else f"the step exited {first}"
        what = "is not slower than" if first == GOOD else "cannot be compared with"
        print(f"perfguard bisect: nothing to bisect: BAD {bad_name} {what} GOOD {good_name}: {why}")
        return 1
    _git_loud(top, "bisect", "bad", bad_sha)
    output = _git_loud(top, "bisect", "good", good_sha)
    print(output, flush=True)
    if "is the first bad commit" not in output:
        output = _bisect_run(top, step)
    if "is the first bad commit" not in output:
        print(
            "perfguard bisect: no single first bad commit (skipped revisions hide it, or a step failed); "
            f"the steps are listed in {work}/steps"
        )
        return 1
    first_bad = git(top, "rev-parse", "refs/bisect/bad")
    _report(top, work, good_name, first_bad)
    return 0


def bisect(good: str, bad: str, case: str, pytest_args: Sequence[str], cwd: Path, work: Path | None) -> int:
    """The whole bisection; returns the exit status."""
    try:
        top = Path(git(cwd, "rev-parse", "--show-toplevel"))
    except GitError as exc:
        raise BisectError(f"{cwd} is not in a git repository ({exc})") from None
    good_sha, bad_sha = check_range(top, good, bad)
    work = work if work is not None else Path(tempfile.mkdtemp(prefix="perfguard-bisect-"))
    pin(work / "plugin")
    (work / "plugin" / STEP_LAUNCHER).write_text(_STEP_TEXT, encoding="utf-8")
    count = git(top, "rev-list", "--count", f"{good_sha}..{bad_sha}")
    step = [
        sys.executable,
        str(work / "plugin" / STEP_LAUNCHER),
        "--work",
        str(work),
        "--cwd",
        str(cwd),
        "--good",
        good_sha,
        "-k",
        case,
        "--",
        *pytest_args,
    ]
    good_name, bad_name = _name(good, good_sha), _name(bad, bad_sha)
    print(
        f"perfguard bisect: {count} commits after GOOD {good_name} up to BAD {bad_name}, case -k {case!r}; "
        f"each step: pytest -k {case!r} --perfguard --perfguard-against {good_sha[:12]}; logs and results in "
        f"{work}",
        flush=True,
    )
    _git_loud(top, "bisect", "start")
    try:
        return _bisect_started(
            top, work, step, good_sha=good_sha, bad_sha=bad_sha, good_name=good_name, bad_name=bad_name
        )
    finally:
        reset = subprocess.run(["git", "bisect", "reset"], cwd=top, capture_output=True, text=True, check=False)
        if reset.returncode != 0:
            print(
                f"perfguard bisect: git bisect reset failed ({reset.stderr.strip()}); run git bisect reset",
                file=sys.stderr,
            )


def cmd_bisect(args: argparse.Namespace) -> int:
    try:
        return bisect(
            args.good,
            args.bad,
            args.k,
            args.pytest_args,
            Path.cwd(),
            Path(args.work_dir) if args.work_dir else None,
        )
    except BisectError as exc:
        print(f"perfguard: error: bisect: {exc}", file=sys.stderr)
        return 2
    except GitError as exc:
        print(f"perfguard: error: bisect: git failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("perfguard bisect: interrupted; git bisect reset has run", file=sys.stderr)
        return 130


def add_bisect_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``bisect`` subcommand; arguments it does not know go to pytest."""
    parser = sub.add_parser(
        "bisect",
        allow_abbrev=False,
        usage="perfguard bisect GOOD BAD -k CASE [--work-dir DIR] [PYTEST_ARG ...]",
        help="find the first commit between GOOD and BAD at which a case got slower than at GOOD",
        description="Drive git bisect run with the A/B gate (--perfguard-against GOOD). Arguments after "
        "GOOD BAD -k CASE go to pytest, e.g. tests/perf --perfguard-case-budget 10.",
    )
    parser.add_argument("good", metavar="GOOD", help="a revision where the case was fast")
    parser.add_argument("bad", metavar="BAD", help="a later revision where it is slow (GOOD must be its ancestor)")
    parser.add_argument("-k", required=True, metavar="CASE", help="pytest -k expression selecting the case(s)")
    parser.add_argument("--work-dir", metavar="DIR", help="where step logs and results go (default: a new temp folder)")
    parser.set_defaults(func=cmd_bisect, pytest_args=[], passes_unknown_args=True)
