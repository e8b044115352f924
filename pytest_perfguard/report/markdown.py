"""The Markdown summary of a results file: the GitHub job summary and the PR comment.

What needs a person comes first (failing, then inconclusive cases, each with its reason and the command
that reproduces it), then the full table folded away, then one chart per test that GitHub draws itself
(Mermaid ``xychart-beta``): each variant's time over the reference's, per shape. Plain text, no plotting
library: the plugin writes this on every CI run.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from . import view as rd
from .formats import format_mde, format_ratio, format_time
from .merge import write_file
from .view import Case, Report

# A PR comment holds at most 65,536 characters; leave room for the marker and a note.
COMMENT_LIMIT = 60_000
# The attention list is cut here in the summary (the HTML report and the table below have the rest).
MAX_ATTENTION = 40
# Profiler diffs shown (each is a table of ~17 rows); the first few open. The HTML report has them all.
MAX_EXPLAINED = 10
OPEN_EXPLAINED = 3
# Mermaid's xychart has no legend in the versions GitHub renders, so each series gets a fixed colour
# and the line under the chart names them with the matching coloured square.
SERIES = (
    ("🟦", "#55acee"),
    ("🟧", "#f4900c"),
    ("🟩", "#78b159"),
    ("🟥", "#dd2e44"),
    ("🟪", "#aa8ed6"),
    ("🟫", "#c1694f"),
    ("🟨", "#fdcb58"),
)
# The reference itself (its ratio is 1 by construction) is drawn last, in black, as the baseline line.
REFERENCE = ("⬛", "#31373d")
# Past this spread of ratios a linear axis flattens every fast variant onto the reference's line.
LOG_SPREAD = 8.0


def _cell(text: str) -> str:
    """Table cells cannot hold a pipe or a line break."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


# A zero-width joiner after "@": reads the same, but GitHub no longer turns it into a mention (a ping).
_MENTION = re.compile(r"@(?=[\w-])")


def _unmention(text: str) -> str:
    return _MENTION.sub("@\u200d", text)


def _plain(text: object) -> str:
    """Text from a results file (test ids, variant names, reasons, device names) shown as text, on one line
    and safe in a table cell: no HTML (``<details>``, ``<img>``), no link or image (``[x](javascript:...)``),
    no code span and no @mention. A pull request chooses these strings; the summary is a bot's comment."""
    out = html.escape(_cell(str(text)), quote=False)
    out = out.replace("`", "\\`").replace("[", "\\[").replace("]", "\\]")
    return _unmention(out)


def _code(text: str) -> str:
    """Inline code that survives any backtick run in a node id: the fence is one backtick longer than the
    longest run inside (CommonMark), padded by spaces; no mention or link is made inside code."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    return f"{fence}{text}{fence}" if longest == 0 else f"{fence} {text} {fence}"


def _where(report: Report, case: Case) -> str:
    return f" ({case.device_name})" if len(report.devices) > 1 else ""


def _attention(report: Report) -> list[str]:
    cases = report.attention()
    if not cases:
        return ["No case failed and none was inconclusive.", ""]
    lines = [
        "#### Failing and inconclusive",
        "",
        "| verdict | case | why | MDE | reproduce |",
        "| --- | --- | --- | --- | --- |",
    ]
    for case in cases[:MAX_ATTENTION]:
        lines.append(
            f"| **{_plain(case.status)}** | {_plain(case.rec.variant)} · "
            f"{_plain(case.shape)}{_plain(_where(report, case))} "
            f"| {_plain(case.decisive_reason())} | {format_mde(case.mde)} | {_cell(_code(case.command()))} |"
        )
    if len(cases) > MAX_ATTENTION:
        lines.append(f"\n…and {len(cases) - MAX_ATTENTION} more: see the full table below or the HTML report.")
    return [*lines, ""]


def _explained(report: Report) -> list[str]:
    """Each explained case's profiler diff (perfguard explain): metric, head, base and change, duration
    first and then what moved most (moved rows in bold), under the line saying where it was measured."""
    cases = [case for case in report.cases if case.rec.explain is not None]
    if not cases:
        return []
    lines = ["#### Why: Nsight Compute, head vs base", ""]
    for index, case in enumerate(cases[:MAX_EXPLAINED]):
        e = case.rec.explain
        assert e is not None
        opened = " open" if index < OPEN_EXPLAINED else ""
        title = f"{case.rec.variant} · {case.shape}{_where(report, case)}: {e.headline()}"
        lines += [
            f"<details{opened}><summary><b>{_unmention(html.escape(case.status))}</b> "
            f"{_unmention(html.escape(title))}</summary>",
            "",
            _plain(e.source()),
            "",
        ]
        for number, kernel in enumerate(e.kernels, 1):
            lines += [
                _code(f"kernel {number} of {len(e.kernels)}: {kernel.title}"),
                "",
                "| metric | head | base | change |",
                "| --- | ---: | ---: | ---: |",
            ]
            for row in kernel.rows():
                cells = [_plain(c) for c in (row.label, row.head, row.base, row.change)]
                lines.append("| " + " | ".join(f"**{c}**" if row.moved else c for c in cells) + " |")
            lines.append("")
        lines += ["</details>", ""]
    if len(cases) > MAX_EXPLAINED:
        lines += [f"…and {len(cases) - MAX_EXPLAINED} more explained cases: see the HTML report.", ""]
    return lines


def _table_rows(report: Report) -> list[str]:
    device_col = len(report.devices) > 1
    head = [
        "verdict",
        "case",
        "variant",
        "shape",
        "time [95% CI]",
        "TFLOP/s [95% CI]",
        "ratio vs reference [95% CI]",
        "gates: change [95% CI]",
        "MDE",
    ] + (["device"] if device_col else [])
    rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for case in report.cases:
        cells = [
            case.status,
            case.test,
            case.rec.variant,
            case.shape,
            format_time(case.rec.median_ns, case.rec.ci_ns),
            rd.fmt_tflops(case),
            format_ratio(case.rec.ratio, case.rec.ratio_ci),
            rd.gate_text(case),
            format_mde(case.mde),
        ]
        if device_col:
            cells.append(case.device_name)
        rows.append("| " + " | ".join(_plain(c) for c in cells) + " |")
    return rows


def _quoted(label: str) -> str:
    """A label inside the Mermaid block: one line (a line of backticks would end the block), no quote that
    ends it early, no tag."""
    flat = " ".join(label.split()).replace('"', "'").replace("`", "'").replace("<", "\u2039").replace(">", "\u203a")
    return '"' + flat + '"'


def _num(x: float) -> str:
    """Fixed point: mermaid's xychart does not read exponents (6.99e-05)."""
    text = f"{x:.3f}"
    return "0.000" if text == "-0.000" else text


def ratio_chart(cases: Sequence[Case], title: str) -> list[str]:
    """A Mermaid xychart-beta of time over the reference's time, per shape, one line per variant.

    Only shapes where every plotted variant has a ratio (xychart has no gaps); a variant missing at a
    shape that others have is left out and named under the chart. Empty when nothing has a ratio."""
    rated = [c for c in cases if c.rec.ratio is not None]
    if not rated:
        return []
    shapes = rd.shape_order(rated)
    by_variant: dict[str, dict[str, float]] = {}
    for c in rated:
        by_variant.setdefault(c.rec.variant, {})[c.shape] = c.rec.ratio or 1.0
    against = next((c.against for c in rated if c.against), None) or "the reference"
    full = sorted(
        (v for v, got in by_variant.items() if all(s in got for s in shapes)), key=lambda v: (v == against, v)
    )
    partial = sorted(set(by_variant) - set(full))
    others = [v for v in full if v != against]
    shown = others[: len(SERIES)] + [v for v in full if v == against]
    dropped = partial + others[len(SERIES) :]
    if not shown:
        return []
    colors = [REFERENCE if v == against else SERIES[i] for i, v in enumerate(shown)]
    values = [by_variant[v][s] for v in shown for s in shapes]
    log = max(values) / min(values) > LOG_SPREAD
    palette = ", ".join(color for _, color in colors)
    axis = f"log2(time / {against})" if log else f"time / {against}"
    lines = [
        "```mermaid",
        "---",
        "config:",
        "  xyChart:",
        "    width: 900",
        "    height: 420",
        "    xAxis:",
        "      labelFontSize: 11",
        "  themeVariables:",
        "    xyChart:",
        f'      plotColorPalette: "{palette}"',
        "---",
        "xychart-beta",
        f"  title {_quoted(f'{title}: time / {against}')}",
        "  x-axis [" + ", ".join(_quoted(s) for s in shapes) + "]",
        f"  y-axis {_quoted(axis)}",
    ]
    for variant in shown:
        ys = [by_variant[variant][s] for s in shapes]
        lines.append("  line [" + ", ".join(_num(math.log2(y) if log else y) for y in ys) + "]")
    lines.append("```")
    legend = " · ".join(f"{square} {_plain(variant)}" for (square, _), variant in zip(colors, shown, strict=True))
    lines.append("")
    lines.append(legend + (f" · y: log2, 0 = as fast as {_plain(against)}, 1 = twice its time" if log else ""))
    if dropped:
        lines.append(
            f"\nNot drawn (no ratio at every shape, or more than {len(SERIES)} variants): "
            + ", ".join(_plain(v) for v in dropped)
        )
    return [*lines, ""]


def markdown_summary(doc: Mapping[str, Any], limit: int | None = COMMENT_LIMIT, notes: Sequence[str] = ()) -> str:
    """The summary as Markdown; past ``limit`` characters the full table is cut (a PR comment's limit).
    ``notes``: the session's messages (stale entries, files written), listed after the chart."""
    report = rd.build(doc)
    devices = " + ".join(d.label for d in report.devices.values()) or "unknown device"
    env = " · ".join(f"**{_plain(k)}** {_plain(v)}" for k, v in rd.environment(report) if k != "device")
    head = [f"### perfguard: {_plain(devices)}", "", f"**{_plain(rd.counts_line(report))}**", "", env, ""]
    if report.errors:
        head += ["#### Session errors", "", *[f"- {_plain(e)}" for e in report.errors], ""]
    head += _attention(report)
    head += _explained(report)
    charts: list[str] = []
    for device, test, cases in report.tests():
        name = report.device_label(device)
        where = f" on {name}" if len(report.devices) > 1 else ""
        charts += ratio_chart(cases, f"{test}{where}")
    rows = _table_rows(report)
    opening = [f"<details><summary>All {len(report.cases)} cases</summary>", ""]
    closing = ["", "</details>", ""]

    tail = [f"- {_plain(note)}" for note in notes]

    def assemble(table: list[str]) -> str:
        return "\n".join([*head, *opening, *table, *closing, *charts, *tail]).rstrip("\n") + "\n"

    text = assemble(rows)
    if limit is None or len(text) <= limit:
        return text
    kept = rows[:]
    while len(kept) > 2 and len(text) > limit:
        kept = kept[: max(2, len(kept) - max(1, len(kept) // 10))]
        cut = len(rows) - len(kept)
        text = assemble([*kept, "", f"…{cut} more rows left out to fit a comment: see the results artifact."])
    return text


def write_markdown(path: Path, doc: Mapping[str, Any]) -> None:
    """The summary as a file, written atomically: a job that posts it never reads half of one."""
    write_file(Path(path), markdown_summary(doc))
