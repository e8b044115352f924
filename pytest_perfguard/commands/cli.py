"""The ``perfguard`` command: look at baselines, compare two runs, migrate and validate files.

Every bad file ends as one message on stderr and exit status 1, never a traceback, so the command can sit in
CI and pre-commit hooks.
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tabulate import tabulate

from .. import __version__
from ..jsonio import JSONFileError, load_json_text
from ..judge.baseline import DEFAULT_FOLDER, SCHEMA_VERSION, BaselineError, BaselineFile
from ..judge.policy import NOISE_FLOOR, case_threshold
from ..judge.storage import migrate_file, parse_baseline, read_baseline
from ..judge.verdict import Policy, Verdict, recorded_gate
from ..record import CaseRecord, Status, id_order
from ..report.formats import format_mde, format_ratio, format_time
from ..report.html import ReportDependencyError
from ..report.merge import MERGED_KIND, read_runs
from ..report.results import RESULTS_KIND, ResultsFile, parse_results, read_results
from ..report.terminal import delta_text
from ..report.writers import flagged
from ..settings import DEFAULT_MARGIN


def device_line(device: dict[str, Any]) -> str:
    """One line naming the device model and the versions the numbers belong to."""
    rest = ", ".join(
        f"{key} {device[key]}" for key in sorted(device) if key not in ("name", "slug") and device[key] is not None
    )
    name = device.get("name", "?")
    return f"device: {name}" + (f" ({rest})" if rest else "")


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _err(message: str) -> None:
    print(f"perfguard: error: {message}", file=sys.stderr)


# ------------------------------------------------------------------------------------------------- show


def _baseline_paths(target: Path) -> list[Path]:
    if target.is_dir():
        return sorted(path for path in target.glob("*.json") if path.is_file())
    return [target]


def _show_one(bf: BaselineFile) -> None:
    print(f"{bf.path}")
    print(device_line(bf.device))
    fitted = bf.ab_offset()
    if fitted is not None:
        print(f"A/B per-process offset from its A/A readings: {fitted.describe()}")
    if bf.migrated_from is not None:
        print(f"note: schema {bf.migrated_from} file, migrated in memory; rewrite with `perfguard migrate {bf.path}`")
    rows = [
        [
            case_id,
            entry.workload_desc or "?",
            format_time(entry.median_ns, entry.ci_ns),
            format_ratio(entry.ratio, entry.ratio_ci),
            f"{entry.noise * 100:.2f}%",
            entry.runs,
            entry.updated or "?",
        ]
        for case_id, entry in sorted(bf.cases.items())
    ]
    if rows:
        headers = ["case", "workload", "time [95% CI]", "ratio [95% CI]", "noise", "runs", "updated"]
        print(tabulate(rows, headers=headers, disable_numparse=True))
    else:
        print("(no cases)")


def _found_upwards(path: Path) -> Path:
    """A relative path as the plugin finds it from any folder of the project: here, else in the nearest
    folder above that holds it. Unchanged where none does."""
    if path.is_absolute() or path.exists():
        return path
    for folder in Path.cwd().parents:
        if (folder / path).exists():
            return folder / path
    return path


def cmd_show(args: argparse.Namespace) -> int:
    """Print every baseline at the path; exit 1 if any is missing or bad."""
    target = _found_upwards(Path(args.path))
    if not target.exists():
        _err(f"{target}: no such baseline file or folder here or in a folder above ({Path.cwd()})")
        return 1
    paths = _baseline_paths(target)
    if not paths:
        print(f"{target}: no baseline files (*.json)")
        return 0
    status = 0
    for number, path in enumerate(paths):
        if number:
            print()
        try:
            bf = read_baseline(path)
        except BaselineError as exc:
            _err(str(exc))
            status = 1
            continue
        _show_one(bf)
    return status


# ---------------------------------------------------------------------------------------------- compare


def _half_width(ci: tuple[float, float]) -> float:
    return (math.log(ci[1]) - math.log(ci[0])) / 2.0


def change_ci(a: CaseRecord, b: CaseRecord) -> tuple[float, tuple[float, float] | None] | None:
    """B/A and an approximate 95% CI: the two CIs' log half-widths combined in quadrature.

    None when either side was not timed; the CI is None when either side has none.
    """
    if a.median_ns is None or b.median_ns is None:
        return None
    change = b.median_ns / a.median_ns
    if a.ci_ns is None or b.ci_ns is None:
        return change, None
    half = math.hypot(_half_width(a.ci_ns), _half_width(b.ci_ns))
    return change, (change * math.exp(-half), change * math.exp(half))


def compare_threshold(margin: float, a: dict[str, Any], b: dict[str, Any]) -> float:
    """The margin two single runs are judged at: the plugin's rule for a one-process baseline entry, the
    margin or NOISE_K times the device's between-process noise floor, whichever is larger."""
    floor = max(NOISE_FLOOR.get(str(d.get("kind")), max(NOISE_FLOOR.values())) for d in (a, b))
    return case_threshold(margin, floor, floor)


def judge(a: CaseRecord, b: CaseRecord, threshold: float, family_size: int = 1) -> Verdict:
    """B against A with the plugin's gates and words: the time gate, and the ratio gate when both runs timed
    `against` (it cancels what moved the whole machine between the runs). Any gate regressed or inconclusive
    outranks a faster one (verdict.Verdict.status), so a slowdown is never called faster."""
    assert a.median_ns is not None and b.median_ns is not None
    policy = Policy(margin=threshold, family_size=family_size)
    tau = math.log1p(threshold)
    gates = [recorded_gate("baseline", (b.median_ns, b.ci_ns), (a.median_ns, a.ci_ns), tau, policy, "B/A time", "A")]
    if a.ratio is not None and b.ratio is not None:
        gates.append(
            recorded_gate("ratio", (b.ratio, b.ratio_ci), (a.ratio, a.ratio_ci), tau, policy, "B/A ratio", "A")
        )
    return Verdict(gates=gates)


def device_differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Keys whose values differ between two device descriptions, as "key 'x' vs 'y'"."""
    return [
        f"{key} {a.get(key)!r} vs {b.get(key)!r}"
        for key in sorted(set(a) | set(b))
        if key != "slug" and a.get(key) != b.get(key)
    ]


def _ab_text(r: CaseRecord) -> str:
    """B's own A/B gate (head against its base revision, one process): the firmest evidence a file holds."""
    g = r.gate("ab")
    if g is None:
        return "-"
    status = str(g.status)
    return status if g.estimate is None else f"{delta_text(r, 'ab')} {status}"


def _mde_text(a: CaseRecord, b: CaseRecord) -> str:
    """The smallest slowdown B's run would have failed on (A's when B has none): a "same" that is narrower
    than the MDE says little."""
    return format_mde(b.mde if b.mde is not None else a.mde)


def _compare_rows(
    a: ResultsFile, b: ResultsFile, threshold: float
) -> tuple[list[list[str]], int, list[str], list[str]]:
    a_by, b_by = a.by_id(), b.by_id()
    rows: list[list[str]] = []
    slower = 0
    ab = any(r.gate("ab") is not None for r in b.results)
    common = sorted(set(a_by) & set(b_by), key=id_order)
    timed = sum(1 for case_id in common if a_by[case_id].timed and b_by[case_id].timed)
    for case_id in common:
        ra, rb = a_by[case_id], b_by[case_id]
        result = change_ci(ra, rb)
        if result is None:
            untimed = [f"{side} {r.verdict or r.outcome}" for side, r in (("A", ra), ("B", rb)) if r.median_ns is None]
            change_text, flag = "-", "not timed (" + ", ".join(untimed) + ")"
        else:
            change, ci = result
            change_text = format_ratio(change, ci)
            flag = str(judge(ra, rb, threshold, family_size=timed).status)
        env_a, env_b = ra.env, rb.env
        if isinstance(env_a, dict) and isinstance(env_b, dict) and env_a != env_b:
            flag += " (env differs)"
        slower += flag.startswith(str(Status.REGRESSED))
        rows.append(
            [
                case_id,
                "-" if ra.median_ns is None else format_time(ra.median_ns, ra.ci_ns),
                "-" if rb.median_ns is None else format_time(rb.median_ns, rb.ci_ns),
                change_text,
                _mde_text(ra, rb),
                *([_ab_text(rb)] if ab else []),
                flag,
            ]
        )
    only_a = sorted(set(a_by) - set(b_by))
    only_b = sorted(set(b_by) - set(a_by))
    return rows, slower, only_a, only_b


def firmer_answer(rows: list[list[str]], margin: float, a_sha: str | None, a_dirty: str | None = None) -> list[str]:
    """What each verdict means, and what to run where the answer is not firm: two runs in two processes
    carry the between-run noise, so "unclear" needs more blocks and "slower" a paired run."""
    by: dict[str, list[str]] = {}
    for row in rows:
        by.setdefault(row[-1].split(" (")[0], []).append(row[0])  # "same (env differs)" counts as same
    regressed, faster = by.get(str(Status.REGRESSED), []), by.get(str(Status.FASTER), [])
    out: list[str] = ["is it real?"]
    if regressed or faster:
        out.append(
            f"  regressed, faster: the 95% CI of B/A (time, or its ratio to `against`) lies past the {margin:.1%} "
            "margin. Two runs in two processes: a machine that moved between them can fake either; a paired "
            "run against A's revision cannot be fooled so"
        )
    if str(Status.PASS) in by:
        out.append(f"  pass: the CI lies under the {margin:.1%} margin; a change below the MDE can hide in it")
    unclear = by.get(str(Status.INCONCLUSIVE), [])
    if unclear:
        out.append(
            f"  inconclusive: the two runs' intervals cannot separate at the margin. To firm up these "
            f"{len(unclear)}, measure longer:"
        )
        out.extend(f"    pytest {shlex.quote(case)} --perfguard --perfguard-case-budget 20" for case in unclear[:10])
        if len(unclear) > 10:
            out.append(f"    ... and {len(unclear) - 10} more")
    if (regressed or faster) and a_dirty:
        out.append(
            f"  to confirm a change in one process, commit A's code and run against that commit: run A measured "
            f"{a_sha[:12] if a_sha else 'a commit'} with uncommitted changes (digest {a_dirty}), "
            "which no revision holds"
        )
    elif (regressed or faster) and a_sha:
        out.append("  to confirm a change in one process, against A's revision (paired, no between-run noise):")
        out.extend(
            f"    pytest {shlex.quote(case)} --perfguard --perfguard-against {a_sha[:12]}"
            for case in (regressed + faster)[:10]
        )
    return out if len(out) > 1 else []


def cmd_compare(args: argparse.Namespace) -> int:
    """Print B against A per common case; exit 1 on a regression only with --fail-on-regression."""
    if not (math.isfinite(args.margin) and args.margin >= 0):
        _err(f"--margin must be a number >= 0, got {args.margin}")
        return 2
    try:
        a = read_results(Path(args.a))
        b = read_results(Path(args.b))
    except JSONFileError as exc:
        _err(str(exc))
        return 1
    print(f"A: {a.path}  {device_line(a.device)}")
    print(f"B: {b.path}  {device_line(b.device)}")
    differences = device_differences(a.device, b.device)
    if differences:
        print(f"warning: not comparable: {'; '.join(differences)}")
    threshold = compare_threshold(args.margin, a.device, b.device)
    rows, slower, only_a, only_b = _compare_rows(a, b, threshold)
    if threshold > args.margin:
        print(
            f"margin: {threshold:.1%}, not the {args.margin:.1%} asked: two runs in two processes differ by the "
            "device's between-process noise, which the plugin's margin never goes below"
        )
    if rows:
        headers = ["case", "A [95% CI]", "B [95% CI]", "B/A [95% CI]", "MDE"]
        if len(rows[0]) == 7:
            headers.append("B's A/B gate")
        headers.append(f"verdict (margin {threshold:.1%})")
        print(tabulate(rows, headers=headers, disable_numparse=True))
    else:
        print("no case in common")
    if only_a:
        print(f"only in A ({len(only_a)}): " + ", ".join(only_a))
    if only_b:
        print(f"only in B ({len(only_b)}): " + ", ".join(only_b))
    print(f"{slower} regressed of {len(rows)} compared")
    gates = Counter(str(g.status) for r in b.results if (g := r.gate("ab")) is not None)
    if gates:
        counts = ", ".join(f"{n} {status}" for status, n in gates.most_common())
        print(f"B's own A/B gate (head against its base revision in one process, the firmer evidence): {counts}")
    for line in firmer_answer(rows, threshold, a.info.git_sha, a.info.git_dirty):
        print(line)
    return 1 if args.fail_on_regression and slower else 0


# ------------------------------------------------------------------------------------- migrate / validate


def cmd_migrate(args: argparse.Namespace) -> int:
    """Rewrite old-schema baselines in the current schema, atomically."""
    status = 0
    for raw in args.paths:
        path = Path(raw)
        try:
            old = migrate_file(path)
        except BaselineError as exc:
            _err(str(exc))
            status = 1
            continue
        if old is None:
            print(f"{path}: already schema {SCHEMA_VERSION}, nothing to do")
        else:
            print(f"{path}: migrated from schema {old} to {SCHEMA_VERSION}")
    return status


def validate_file(path: Path) -> str:
    """Check one baseline or results file; returns a one-line description, raises JSONFileError if bad."""
    obj, exists = load_json_text(path, BaselineError, "perfguard JSON")
    if not exists:
        raise BaselineError(f"{path}: no such file")
    if isinstance(obj, dict) and obj.get("kind") == RESULTS_KIND:
        results = parse_results(path, obj)
        return f"results, {_plural(len(results.results), 'record')}"
    if isinstance(obj, dict) and obj.get("kind") == MERGED_KIND:  # what `perfguard merge` writes
        runs = read_runs(path)
        records = sum(len(run.checked.results) for run in runs)
        return f"merged results, {_plural(len(runs), 'run')}, {_plural(records, 'record')}"
    bf = parse_baseline(path, obj)
    text = f"baseline, {_plural(len(bf.cases), 'case')}"
    if bf.migrated_from is not None:
        text += f", schema {bf.migrated_from}: rewrite with `perfguard migrate {path}`"
    return text


def cmd_validate(args: argparse.Namespace) -> int:
    """Exit 1 if any given file (or *.json in a given folder) is bad; for CI and pre-commit."""
    status = 0
    for raw in args.paths:
        target = Path(raw)
        paths = _baseline_paths(target) if target.is_dir() else [target]
        for path in paths:
            try:
                description = validate_file(path)
            except JSONFileError as exc:
                _err(str(exc))
                status = 1
                continue
            print(f"ok: {path} ({description})")
    return status


# ------------------------------------------------------------------------------------------ merge / report


def cmd_merge(args: argparse.Namespace) -> int:
    """Combine results files of several runners into one file, cases of different devices kept apart."""
    from pytest_perfguard.report.merge import merge_files, runs_in, write_merged

    output = Path(args.output)
    try:
        doc = merge_files([Path(p) for p in args.results])
        write_merged(output, doc)
        runs = runs_in(doc, output)
    except JSONFileError as exc:
        _err(str(exc))
        return 1
    cases = sum(len(run.checked.results) for run in runs)
    devices = sorted({run.checked.device_info.label for run in runs})
    print(f"{output}: {_plural(cases, 'case')} from {_plural(len(runs), 'run')} ({', '.join(devices)})")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Render a results or merged file as HTML and/or Markdown, after the fact."""
    from pytest_perfguard.report.merge import read_document

    # Those that need nothing extra first: a missing extra then costs only its own file.
    wanted = [
        (w, value) for w in sorted(flagged(), key=lambda w: w.needs is not None) if (value := getattr(args, w.name))
    ]
    if not wanted:
        flags = " and/or ".join(f"{w.flag} FILE" for w in flagged())
        _err(f"nothing to write: add {flags} (- for standard output)")
        return 2
    try:
        doc = read_document(Path(args.results))
        for writer, value in wanted:
            if value == "-" and writer.stdout is not None:
                sys.stdout.write(writer.stdout(doc))
                continue
            writer.write(Path(value), doc)
            print(f"{value}: {writer.title} written" + (f"; {writer.then}" if writer.then else ""))
    except (ReportDependencyError, JSONFileError) as exc:
        _err(str(exc))
        return 1
    return 0


# ----------------------------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    """The argument parser, separate so tests and docs can inspect it."""
    parser = argparse.ArgumentParser(
        prog="perfguard",
        description="The command of pytest-perfguard: show and validate baselines, compare, merge and report "
        "results files, keep the history, bisect a slowdown and explain it with Nsight Compute. The guard "
        "itself runs in pytest: pytest --perfguard.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    show = sub.add_parser("show", help="print a baseline file, or every *.json in a folder")
    show.add_argument("path", nargs="?", default=str(DEFAULT_FOLDER), help=f"file or folder (default {DEFAULT_FOLDER})")
    show.set_defaults(func=cmd_show)

    compare = sub.add_parser("compare", help="compare two results files (--perfguard-json) case by case")
    compare.add_argument("a", metavar="A.json")
    compare.add_argument("b", metavar="B.json")
    compare.add_argument(
        "--margin",
        type=float,
        default=DEFAULT_MARGIN,
        help=f"relative change that counts (default {DEFAULT_MARGIN:g}, the plugin's --perfguard-margin); as in "
        "the plugin, never below 4x the device's between-process noise floor",
    )
    compare.add_argument("--fail-on-regression", action="store_true", help="exit 1 when any case regressed in B")
    compare.set_defaults(func=cmd_compare)

    migrate = sub.add_parser("migrate", help="rewrite old-schema baseline files in the current schema")
    migrate.add_argument("paths", nargs="+", metavar="PATH")
    migrate.set_defaults(func=cmd_migrate)

    validate = sub.add_parser("validate", help="check baseline, results and merged files; exit 1 if any is bad")
    validate.add_argument("paths", nargs="+", metavar="PATH")
    validate.set_defaults(func=cmd_validate)

    merge = sub.add_parser(
        "merge", help="combine results files of several runners or matrix jobs; devices are kept apart"
    )
    merge.add_argument("results", nargs="+", metavar="RESULTS", help="results files (--perfguard-json) or merged files")
    merge.add_argument("-o", "--output", required=True, metavar="FILE", help="the merged file to write")
    merge.set_defaults(func=cmd_merge)

    report = sub.add_parser("report", help="render a results or merged file as an HTML report and/or Markdown")
    report.add_argument("results", metavar="RESULTS")
    for writer in flagged():
        report.add_argument(writer.flag, dest=writer.name, metavar="FILE", help=writer.flag_help)
    report.set_defaults(func=cmd_report)

    from pytest_perfguard.commands.history.command import add_history_parser

    add_history_parser(sub)
    from pytest_perfguard.commands.bisect import add_bisect_parser
    from pytest_perfguard.commands.explain.command import add_explain_parser

    add_bisect_parser(sub)
    add_explain_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``perfguard`` console script."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and not getattr(args, "passes_unknown_args", False):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if unknown:  # bisect and explain hand what they do not know to pytest
        args.pytest_args = unknown[1:] if unknown[0] == "--" else unknown
    status: int = args.func(args)
    return status


if __name__ == "__main__":
    sys.exit(main())
