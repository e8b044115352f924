"""``perfguard history add|show|changes``: the command side of the history store (store.py).

cli.py imports this module inside ``build_parser``, after its own formatters exist; nothing here imports
torch, and matplotlib and Otava are imported only by the subcommands that need them.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from tabulate import tabulate

from pytest_perfguard.commands.history.store import (
    DEFAULT_PATH,
    Change,
    History,
    HistoryError,
    Point,
    add_results,
    find_changes,
    format_commit_time,
    open_history,
    resolve_commit,
)
from pytest_perfguard.report.formats import format_ratio, format_time
from pytest_perfguard.report.results import ResultsError, read_results

PLOT_SUFFIXES = (".png", ".svg")
PLOT_MAX_CASES = 24


def _err(message: str) -> None:
    print(f"perfguard: error: {message}", file=sys.stderr)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.2f}%"


def cmd_add(args: argparse.Namespace) -> int:
    info = read_results(Path(args.results)).info
    recorded, dirty = info.git_sha, info.git_dirty
    if dirty and not args.allow_dirty:
        _err(
            f"{args.results} measured {str(recorded)[:12]} with uncommitted changes (digest {dirty}): filed under "
            "that commit, the history would say the commit holds code it does not. Commit the changes and measure "
            "again, or pass --allow-dirty to file it under the commit anyway"
        )
        return 1
    if args.sha is None and isinstance(recorded, str) and recorded:
        args.sha = recorded  # the commit the run measured, not the one checked out now
    sha, commit_time = resolve_commit(args.sha, args.commit_time)
    outcome = add_results(Path(args.history), Path(args.results), sha, commit_time)
    if outcome.already:
        print(f"{args.results} is already in {args.history} as run {outcome.run_id}; nothing added")
        return 0
    untimed = f", {outcome.untimed} not timed (left out)" if outcome.untimed else ""
    print(
        f"added run {outcome.run_id} to {args.history}: commit {sha[:12]} of {format_commit_time(commit_time)} "
        f"UTC, {outcome.added} cases{untimed}"
    )
    return 0


def _cases(history: History, pattern: str | None) -> list[str]:
    names = history.case_names(pattern)
    if not names:
        what = f"no case matching {pattern!r}" if pattern else "no case"
        raise HistoryError(f"{history.path}: {what} in {history.run_count()} runs; see `perfguard history show`")
    return names


def _show_rows(points: Sequence[Point]) -> list[list[str]]:
    rows = []
    for number, p in enumerate(points):
        s = p.summary
        env_mark = "" if number == 0 or points[number - 1].env_id == p.env_id else " (changed)"
        rows.append(
            [
                p.sha[:10],
                format_commit_time(p.commit_time),
                format_time(s.estimate_ns, s.ci_ns),
                _percent(s.noise),
                _percent(s.mde),
                format_ratio(s.ratio, s.ratio_ci),
                s.verdict or "-",
                f"#{p.env_id}{env_mark}",
            ]
        )
    return rows


def cmd_show(args: argparse.Namespace) -> int:
    with open_history(Path(args.history)) as history:
        names = _cases(history, args.k)
        series = {name: history.series(name) for name in names}
    for number, name in enumerate(names):
        points = series[name]
        shown = points[-args.last :] if args.last > 0 else points
        if number:
            print()
        more = f", last {len(shown)} shown" if len(shown) < len(points) else ""
        print(f"{name}  ({len(points)} runs{more})")
        headers = [
            "commit",
            "time (UTC)",
            "time [95% CI]",
            "noise",
            "MDE",
            "ratio [95% CI]",
            "verdict",
            "env",
        ]
        print(tabulate(_show_rows(shown), headers=headers, disable_numparse=True))
    if args.plot:
        plot(series, Path(args.plot))
        print(f"plot written to {args.plot}")
    return 0


def plot(series: dict[str, list[Point]], out: Path) -> None:
    """One panel per case: the estimate with its CI over the runs, in commit order."""
    if out.suffix.lower() not in PLOT_SUFFIXES:
        raise HistoryError(f"--plot {out}: give a file name ending in .png or .svg")
    if len(series) > PLOT_MAX_CASES:
        raise HistoryError(
            f"--plot: {len(series)} cases are too many for one figure (at most {PLOT_MAX_CASES}); select with -k CASE"
        )
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display on CI
        import matplotlib.pyplot as plt
    except ImportError:
        raise HistoryError("--plot needs matplotlib: pip install 'pytest-perfguard[plot]'") from None
    fig, axes = plt.subplots(len(series), 1, figsize=(10, 2.6 * len(series)), squeeze=False)
    for ax, (name, points) in zip(axes[:, 0], series.items(), strict=True):
        est = [p.summary.estimate_ns / 1e3 for p in points]
        lo = [e - (p.summary.ci_ns[0] / 1e3 if p.summary.ci_ns else e) for e, p in zip(est, points, strict=True)]
        hi = [(p.summary.ci_ns[1] / 1e3 if p.summary.ci_ns else e) - e for e, p in zip(est, points, strict=True)]
        ax.errorbar(range(len(points)), est, yerr=[lo, hi], fmt="o-", markersize=3, linewidth=0.8, capsize=2)
        ax.set_title(name, fontsize=8, loc="left")
        ax.set_ylabel("time [µs]")
        step = max(1, len(points) // 12)
        ticks = list(range(0, len(points), step))
        ax.set_xticks(ticks, [points[i].sha[:7] for i in ticks], fontsize=7, rotation=30)
    fig.tight_layout()
    try:
        fig.savefig(out)
    except OSError as exc:
        raise HistoryError(f"--plot {out}: cannot write it ({exc.strerror or exc})") from None
    finally:
        plt.close(fig)


def _change_row(c: Change) -> list[str]:
    ci = None if not (math.isfinite(c.size.lo) and math.isfinite(c.size.hi)) else (c.size.lo, c.size.hi)
    return [
        c.case,
        f"{c.before.sha[:10]}..{c.after.sha[:10]}",
        format_commit_time(c.after.commit_time),
        format_ratio(c.size.estimate, ci) + ("" if ci else " (CI: too few runs)"),
        f"{c.n_before}/{c.n_after}",
        f"{c.pvalue:.1e}",
        c.env_note or "same",
    ]


def cmd_changes(args: argparse.Namespace) -> int:
    if not (0.0 < args.max_pvalue < 1.0):
        _err(f"--max-pvalue must be between 0 and 1, got {args.max_pvalue}")
        return 2
    with open_history(Path(args.history)) as history:
        names = _cases(history, args.k)
        series = {name: history.series(name) for name in names}
    rows: list[list[str]] = []
    for name in names:
        changes = find_changes(series[name], metric=args.metric, max_pvalue=args.max_pvalue, min_change=args.min_change)
        rows.extend(_change_row(c) for c in changes)
    if rows:
        headers = [
            "case",
            "commits (before..first after)",
            "at (UTC)",
            f"{args.metric} after/before [95% CI]",
            "runs b/a",
            "p",
            "environment",
        ]
        print(tabulate(rows, headers=headers, disable_numparse=True))
    print(f"{len(rows)} change points in {len(names)} cases (E-Divisive, p <= {args.max_pvalue:g})")
    return 0


def run(args: argparse.Namespace) -> int:
    """Dispatch a ``history`` subcommand; a bad file or input is one message and exit 1."""
    try:
        status: int = args.history_func(args)
    except (HistoryError, ResultsError) as exc:
        _err(str(exc))
        return 1
    return status


def add_history_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``history`` subcommand and its own subcommands."""
    parser = sub.add_parser("history", help="keep per-commit results in a history file and find change points")
    parser.set_defaults(func=run)
    commands = parser.add_subparsers(dest="history_command", required=True, metavar="SUBCOMMAND")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--history",
            default=str(DEFAULT_PATH),
            metavar="FILE",
            help=f"history file (default {DEFAULT_PATH})",
        )

    add = commands.add_parser("add", help="add a results file (pytest --perfguard-json) as one run")
    add.add_argument("results", metavar="RESULTS.json")
    common(add)
    add.add_argument("--sha", help="commit measured (default: the one the results file records, else HEAD)")
    add.add_argument(
        "--allow-dirty",
        action="store_true",
        help="file a run that measured uncommitted changes under its commit (refused by default)",
    )
    add.add_argument("--commit-time", metavar="ISO", help="its commit time (default: from git; no zone = UTC)")
    add.set_defaults(history_func=cmd_add)

    show = commands.add_parser("show", help="print each case's runs")
    common(show)
    show.add_argument("-k", metavar="CASE", help="only cases whose id contains CASE")
    show.add_argument("--last", type=int, default=20, metavar="N", help="runs per case to print (0: all; default 20)")
    show.add_argument("--plot", metavar="FILE", help="also draw the selected cases to FILE (.png or .svg)")
    show.set_defaults(history_func=cmd_show)

    changes = commands.add_parser("changes", help="change points per case (E-Divisive)")
    common(changes)
    changes.add_argument("-k", metavar="CASE", help="only cases whose id contains CASE")
    changes.add_argument(
        "--metric",
        choices=("time", "ratio"),
        default="time",
        help="the series searched: the case's time, or its ratio to the in-run reference (default time)",
    )
    changes.add_argument(
        "--max-pvalue",
        type=float,
        default=1e-4,
        help="significance a change needs (default 1e-4, from benchmarks/changepoints.py; Otava's is 1e-3)",
    )
    changes.add_argument(
        "--min-change",
        type=float,
        default=0.0,
        help="drop changes smaller than this relative size (default 0: keep every significant one)",
    )
    changes.set_defaults(history_func=cmd_changes)
