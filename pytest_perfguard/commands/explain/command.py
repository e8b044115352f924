"""``perfguard explain -k CASE [--against REV] [--results FILE]``: why a kernel got slower, from Nsight Compute.

A verdict says a case is slower; the profiler says why. This profiles the selected variant's kernels once
at head (the working tree) and once at REV (its tree from the A/B cache, basetree.materialise) with ``ncu``, and
diffs the metrics that explain kernel time: duration and SM clock, registers and spills (local-memory
traffic), achieved occupancy, DRAM and L2 throughput and the L2 hit rate, tensor-pipe utilisation and the
launch configuration.

Only the one call of the variant is profiled (probe.py, ``--profile-from-start off``). Clocks are
left as the timing saw them (``--clock-control none``), so a clock drop shows in the SM clock row;
``--lock-clocks`` locks them to base instead, for a duration diff free of boost. Without ncu, or without
permission to read the GPU's counters, it says what it needs and exits 2.

After a red run, ``--results FILE`` attaches the diff to the case's record in that run's results file (under
a lock, atomically; a file that does not validate is refused before anything is profiled and never
written), where ``perfguard report`` and the Markdown summary show it; ``--regressed`` explains every case
the file marks regressed, against the base revision the run compared with, two profiles per case.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ...explanation import Explanation
from ...gitrev import GitError, git
from ...jsonio import JSONFileError, dumps, load_json_text, locked, write_text_atomic
from ...record import CaseRecord, Status
from ...report.results import ResultsError, ResultsFile, parse_results, set_record_field
from ...settings import from_env
from ..pinned import pin
from .ncu import (
    NO_NCU,
    ExplainError,
    NcuUnusable,
    find_ncu,
    kernel_diffs,
    ncu_version,
    profile,
)


def _base_tree(top: Path, rev: str) -> tuple[str, Path]:
    try:
        sha = git(top, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except GitError:
        raise ExplainError(f"--against {rev}: unknown git revision (git rev-parse {rev} finds none)") from None
    import pytest

    from ...run.basetree import materialise

    try:
        return sha, materialise(top, sha)
    except pytest.UsageError as exc:
        raise ExplainError(str(exc)) from None


def default_against(top: Path, results: ResultsFile | None = None) -> str:
    """The base the results file's run compared with (an A/B run); else $PERFGUARD_AGAINST, as the A/B
    gate would use it; else HEAD when the tree has uncommitted changes."""
    if results is not None:
        recorded = results.info.base_sha or next(
            (r.ab.sha for r in results.results if r.ab is not None and r.ab.sha is not None), None
        )
        if recorded:
            return recorded
    env: str | None = from_env("against")
    if env:
        return env
    if git(top, "status", "--porcelain", "--untracked-files=no"):
        return "HEAD"
    raise ExplainError(
        "nothing to compare with: the tree is clean and --against is not given"
        + (" (and the results file's run had no base revision)" if results is not None else "")
        + "; pass --against REV (the revision the case was fast at, e.g. --against origin/main)"
    )


# ------------------------------------------------------------------------------------ the results file


def read_results_for_update(path: Path) -> ResultsFile:
    """The results file explain will write into, checked before anything is profiled."""
    from ...report.merge import MERGED_KIND

    obj, exists = load_json_text(path, ResultsError, "results")
    if not exists:
        raise ResultsError(f"{path}: no such results file; write one with pytest --perfguard --perfguard-json {path}")
    if isinstance(obj, dict) and obj.get("kind") == MERGED_KIND:
        raise ResultsError(
            f"{path}: a merged file (perfguard merge); explain writes into one run's results file: "
            "explain that run's file, then merge again"
        )
    return parse_results(path, obj)


def attach(path: Path, case_id: str, explanation: Explanation) -> None:
    """Put the explanation under the case's record, changing nothing else in the file.

    Read, change and write under the file's lock, so explanations written side by side are all kept; the
    file is validated before and after, and replaced atomically, so a file that does not validate (corrupt,
    or from a newer pytest-perfguard) is left as it is."""
    with locked(path, error=ResultsError):
        obj, exists = load_json_text(path, ResultsError, "results")
        if not exists:
            raise ResultsError(f"{path}: the results file is gone (removed while explain ran); nothing written")
        set_record_field(path, obj, case_id, "explain", explanation.to_json())
        write_text_atomic(path, dumps(obj), ResultsError)


def _worst_first(record: CaseRecord) -> float:
    """The largest change among the gates that found the regression (1.3 = 30% slower)."""
    estimates = [g.estimate for g in record.gates if g.status is Status.REGRESSED and g.estimate is not None]
    return -max(estimates, default=0.0)


# ------------------------------------------------------------------------------------------ the command


# Each explained case costs two profiled pytest runs (head and base); --regressed stops at this many cases.
MAX_CASES = 10


@dataclass
class Setup:
    """What every explained case shares: ncu, both trees, the work folder and the file to write into."""

    ncu: str
    version: str
    cwd: Path
    base_cwd: Path
    against: str
    sha: str
    head_sha: str | None
    dirty: bool
    work: Path
    pytest_args: list[str]
    lock_clocks: bool
    results: ResultsFile | None = None


def _setup(args: argparse.Namespace, cwd: Path, results: ResultsFile | None) -> Setup | None:
    ncu = find_ncu(args.ncu)
    if ncu is None:
        where = f"--ncu {args.ncu}: not found or not executable. " if args.ncu else ""
        print(f"perfguard: error: {where}{NO_NCU}", file=sys.stderr)
        return None
    try:
        top = Path(git(cwd, "rev-parse", "--show-toplevel"))
    except GitError as exc:
        raise ExplainError(f"{cwd} is not in a git repository ({exc}); --against needs one") from None
    rev = args.against or default_against(top, results)
    sha, tree = _base_tree(top, rev)
    base_cwd = tree / cwd.resolve().relative_to(top.resolve())
    if not base_cwd.is_dir():
        raise ExplainError(f"the folder {base_cwd.relative_to(tree)} does not exist at {rev}; run from one that does")
    head_sha = git(top, "rev-parse", "HEAD", check=False) or None
    dirty = bool(git(top, "status", "--porcelain", "--untracked-files=no", check=False))
    work = Path(tempfile.mkdtemp(prefix="perfguard-explain-"))
    pin(work / "plugin")
    return Setup(
        ncu=ncu,
        version=ncu_version(ncu),
        cwd=cwd,
        base_cwd=base_cwd,
        against=rev,
        sha=sha,
        head_sha=head_sha,
        dirty=dirty,
        work=work,
        pytest_args=list(args.pytest_args),
        lock_clocks=args.lock_clocks,
        results=results,
    )


def explain_case(s: Setup, select: Sequence[str], label: str, tag: str = "") -> Explanation:
    """Profile one case at head and at base, print the diff, and attach it when there is a results file
    (a case that file does not hold is refused after the head profile, before the base one is taken)."""
    print(
        f"perfguard explain: {label}: head (working tree) vs {s.against} ({s.sha[:12]}), one call each under ncu; "
        f"reports in {s.work}",
        flush=True,
    )
    head = profile(s.ncu, s.cwd, select, s.pytest_args, s.work, f"{tag}head", s.lock_clocks)
    if s.results is not None and head.case_id not in s.results.by_id():
        raise ExplainError(
            f"{s.results.path} has no record of {head.case_id} (the case {label} selected); explain a case of "
            "that run, or leave out --results"
        )
    base = profile(s.ncu, s.base_cwd, select, s.pytest_args, s.work, f"{tag}base", s.lock_clocks)
    if base.case_id != head.case_id:
        print(f"perfguard explain: note: at base the probe ran {base.case_id}, at head {head.case_id}")
    if base.device != head.device:
        print(f"perfguard explain: note: head ran on {head.device}, base on {base.device}")
    explanation = Explanation(
        against=s.against,
        base_sha=s.sha,
        head_sha=s.head_sha,
        head_dirty=s.dirty,
        device=head.device,
        ncu=s.version,
        clock_control="base" if s.lock_clocks else "none",
        kernels=kernel_diffs(head.kernels, base.kernels),
    )
    print(f"{head.case_id}\n{explanation.source()}\n\n{explanation.text()}\n", flush=True)
    if s.results is not None:
        attach(s.results.path, head.case_id, explanation)
        print(f"perfguard explain: attached to its record in {s.results.path}", flush=True)
    return explanation


def _regressed(s: Setup, max_cases: int) -> int:
    """Explain every regressed case of the results file not yet explained against this base; worst first."""
    assert s.results is not None
    regressed = sorted((r for r in s.results.results if r.verdict is Status.REGRESSED), key=_worst_first)
    if not regressed:
        print(f"perfguard explain: {s.results.path} marks no case regressed; nothing to explain")
        return 0
    done = [r for r in regressed if r.explain is not None and r.explain.base_sha == s.sha]
    todo = [r for r in regressed if r not in done]
    for r in done:
        print(f"perfguard explain: {r.id}: already explained against {s.sha[:12]}; -k selects it to explain it again")
    chosen, left = todo[:max_cases], todo[max_cases:]
    if chosen:
        print(
            f"perfguard explain: {len(chosen)} regressed case(s), worst first: two ncu profiles each "
            f"(head and {s.against})",
            flush=True,
        )
    failed: list[str] = []
    for number, record in enumerate(chosen, 1):
        try:
            explain_case(s, ["--perfguard-explain-id", record.id], record.id, tag=f"case{number}-")
        except NcuUnusable:
            raise
        except (ExplainError, JSONFileError) as exc:
            print(f"perfguard: error: explain: {record.id}: {exc}", file=sys.stderr, flush=True)
            failed.append(record.id)
    if left:
        print(
            f"perfguard explain: {len(left)} more regressed case(s) not explained (--max-cases {max_cases}): "
            + ", ".join(r.id for r in left[:5])
            + (" ..." if len(left) > 5 else "")
            + "; run again to explain them (explained cases are skipped), or raise --max-cases"
        )
    if failed:
        print(f"perfguard explain: {len(failed)} of {len(chosen)} could not be explained (errors above)")
    return 1 if failed else 0


def explain(args: argparse.Namespace, cwd: Path) -> int:
    results = read_results_for_update(Path(args.results)) if args.results else None
    if results is not None:
        _note_head(results, cwd)
    s = _setup(args, cwd, results)
    if s is None:
        return 2
    if args.regressed:
        status = _regressed(s, args.max_cases)
    else:
        explain_case(s, ["-k", args.k], f"-k {args.k!r}")
        status = 0
    if results is not None:
        print(f"perfguard explain: see it in the report: perfguard report {results.path} --html report.html")
    return status


def _note_head(results: ResultsFile, cwd: Path) -> None:
    """Say so when the working tree is not the commit the results file measured: head is profiled as it is."""
    measured = results.info.git_sha
    now = git(cwd, "rev-parse", "HEAD", check=False)
    if measured and now and now != measured:
        print(
            f"perfguard explain: note: {results.path} measured {measured[:12]}, the working tree is at {now[:12]}; "
            f"head is profiled as the working tree is (git checkout {measured[:12]} to profile what the run measured)"
        )


def _usage_error(args: argparse.Namespace) -> str | None:
    if args.regressed and args.k:
        return "-k and --regressed: choose one (-k explains one case, --regressed every regressed case)"
    if not args.regressed and not args.k:
        return "say what to explain: -k CASE, or --regressed --results RESULTS"
    if args.regressed and not args.results:
        return "--regressed needs --results RESULTS: the run whose regressed cases to explain"
    if args.max_cases < 1:
        return f"--max-cases must be at least 1, got {args.max_cases}"
    return None


def cmd_explain(args: argparse.Namespace) -> int:
    problem = _usage_error(args)
    if problem:
        print(f"perfguard: error: explain: {problem}", file=sys.stderr)
        return 2
    try:
        return explain(args, Path.cwd())
    except NcuUnusable as exc:
        print(f"perfguard: error: explain: {exc}", file=sys.stderr)
        return 2
    except (ExplainError, GitError, JSONFileError) as exc:
        print(f"perfguard: error: explain: {exc}", file=sys.stderr)
        return 1


def add_explain_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``explain`` subcommand; arguments it does not know go to pytest."""
    parser = sub.add_parser(
        "explain",
        allow_abbrev=False,
        usage=(
            "perfguard explain (-k CASE | --regressed) [--against REV] [--results RESULTS] [--max-cases N] "
            "[--lock-clocks] [--ncu PATH] [PYTEST_ARG ...]"
        ),
        help="profile one case with Nsight Compute at head and at REV and diff what explains kernel time",
        description="Arguments it does not know go to pytest (e.g. tests/perf).",
    )
    parser.add_argument("-k", metavar="CASE", help="pytest -k expression selecting exactly one case")
    parser.add_argument(
        "--against",
        metavar="REV",
        help="revision to compare with (default: the base revision of the --results run, else "
        "$PERFGUARD_AGAINST, else HEAD if the tree is dirty)",
    )
    parser.add_argument(
        "--results",
        metavar="RESULTS",
        help="results file of the run (--perfguard-json): the explanation is written into the case's record, "
        "where perfguard report shows it",
    )
    parser.add_argument(
        "--regressed",
        action="store_true",
        help="explain every case RESULTS marks regressed, worst first (two ncu profiles per case)",
    )
    parser.add_argument(
        "--max-cases",
        type=int,
        default=MAX_CASES,
        metavar="N",
        help=f"with --regressed, explain at most N cases (default {MAX_CASES})",
    )
    parser.add_argument(
        "--lock-clocks",
        action="store_true",
        help="lock GPU clocks to base while profiling (ncu --clock-control base)",
    )
    parser.add_argument("--ncu", metavar="PATH", help="the ncu to run (default: on PATH, else in the CUDA toolkit)")
    parser.set_defaults(func=cmd_explain, pytest_args=[], passes_unknown_args=True)
