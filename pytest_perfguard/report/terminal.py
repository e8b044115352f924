"""Presenting results: the terminal table (the results file is results.py, the HTML report and the Markdown
job summary are html.py and markdown.py; every figure is formatted by formats.py).

Every figure printed comes with its interval; a row without timing says why.
"""

from __future__ import annotations

import textwrap
from collections import Counter
from collections.abc import Iterable

from tabulate import tabulate

from ..record import CaseRecord, Outcome, Status, id_order
from .formats import (
    attention,
    format_change,
    format_mde,
    format_ratio,
    format_time,
    plus_minus,
    shape_label,
    significant,
    status_of,
    status_rank,
)

# The results file is results.py's; its writer stays importable from here too, where tests import it.


def delta_text(record: CaseRecord, gate: str) -> str:
    """A gate's change with its CI in points, "+1.2% [+0.3, +2.1]"; its status when it has no estimate."""
    g = record.gate(gate)
    if g is None:
        return "-"
    if g.estimate is None:
        return str(g.status)
    return format_change(g.estimate, (g.lo, g.hi))


def _mde(record: CaseRecord) -> str:
    """The smallest slowdown of the kernel that the case fails on 95% of the time: its better gate's, or the
    time gate's alone for a variant timed against itself (verdict.case_mde)."""
    return format_mde(record.mde)


def rows(records: Iterable[CaseRecord]) -> list[list[str]]:
    out = []
    ab = any(r.gate("ab") is not None for r in records)
    for r in sorted(records, key=lambda r: id_order(r.id)):
        if r.median_ns is None:
            why = "; ".join(r.reasons) or str(r.verdict or r.outcome)
            out.append(
                [r.test, r.variant, _shape(r), "-", "-", "-", "-", "-", *(["-"] if ab else []), "-", shorten(why)]
            )
            continue
        out.append(
            [
                r.test,
                r.variant,
                _shape(r),
                f"{format_time(r.median_ns)} {plus_minus(r.median_ns, r.ci_ns)}",
                _tflops(r),
                _gbps(r),
                format_ratio(r.ratio, r.ratio_ci),
                delta_text(r, "baseline"),
                *([delta_text(r, "ab")] if ab else []),
                _mde(r),
                str(r.verdict or ""),
            ]
        )
    return out


def _tflops(r: CaseRecord) -> str:
    """TFLOP/s with the interval that the time's interval implies (the FLOP count is exact)."""
    t, flops, ci = r.tflops, r.flops, r.ci_ns
    if not t:
        return "-"
    pct = f" ({r.pct_peak_compute:.0f}% pk)" if r.pct_peak_compute is not None else ""
    if not flops or not ci or not ci[0] or not ci[1]:
        return f"{significant(t)}{pct}"
    return f"{significant(t)} [{significant(flops / ci[1] / 1e3)}, {significant(flops / ci[0] / 1e3)}]{pct}"


def _gbps(r: CaseRecord) -> str:
    """GB/s from the bytes the call moves (given, or its inputs and output), with % of peak bandwidth."""
    if not r.gbps:
        return "-"
    pct = f" ({r.pct_peak_bandwidth:.0f}% pk)" if r.pct_peak_bandwidth is not None else ""
    return f"{r.gbps:.4g}{pct}"


HEADERS = [
    "case",
    "variant",
    "shape",
    "time ± CI",
    "TFLOP/s [95% CI]",
    "GB/s",
    "ratio vs against [95% CI]",
    "Δ vs baseline [95% CI]",
    "MDE (95%)",
    "verdict",
]
AB_HEADER = "Δ vs base rev [95% CI]"


_shape = shape_label


def shorten(text: str, n: int = 70) -> str:
    """`text`, cut to `n` characters with an ellipsis where it is longer."""
    return text if len(text) <= n else text[: n - 1].rstrip() + "…"


def table(records: Iterable[CaseRecord], fmt: str = "simple") -> str:
    records = list(records)
    headers = list(HEADERS)
    if any(r.gate("ab") is not None for r in records):
        headers.insert(headers.index("MDE (95%)"), AB_HEADER)
    return tabulate(rows(records), headers=headers, tablefmt=fmt, disable_numparse=True)


# ------------------------------------------------------------------------------------ the terminal summary

WIDTH = 120  # what the terminal summary fits at default verbosity: a CI log or a split-screen terminal
# Short headers: "vs against" is the ratio to the case's `against` function, "Δ base rev" the A/B gate.
SHORT_HEADERS = ["variant", "shape", "time ± CI", "vs against", "Δ baseline", "MDE", "verdict"]


def needs_a_look(r: CaseRecord) -> bool:
    """Failing and inconclusive cases: the ones a reader has to act on, shown first with their reason."""
    return (
        r.outcome is Outcome.FAILED
        or r.decision == "unverified"
        or (r.verdict is not None and attention(str(r.verdict)))
    )


def _skipped(r: CaseRecord) -> bool:
    return not r.timed and r.outcome in (Outcome.SKIPPED, Outcome.NOT_RUN)


def _short_delta(record: CaseRecord, gate: str) -> str:
    """ "+1.2% ±0.8": the estimate and the larger side of its CI, in points; the full interval is in -v."""
    g = record.gate(gate)
    if g is None:
        return "-"
    est, ci = g.estimate, g.ci
    if est is None:
        return str(g.status)
    if ci is None:
        return f"{(est - 1) * 100:+.1f}%"
    # One decimal: the narrowest margin is 1.5%, so hundredths of a point decide nothing.
    return f"{(est - 1) * 100:+.1f}% ±{max(est - ci[0], ci[1] - est) * 100:.1f}"


def _short_ratio(r: CaseRecord) -> str:
    if r.ratio is None:
        return "-"
    text = f"{r.ratio:.{2 if r.ratio < 10 else 1 if r.ratio < 100 else 0}f}"
    return text if r.ratio_ci is None else f"{text} {plus_minus(r.ratio, r.ratio_ci)}"


def verdict_text(r: CaseRecord) -> str:
    """The verdict as the table shows it: an undecided one says it is unverified (policy.decision)."""
    text = str(r.verdict or r.outcome)
    return f"unverified: {text}" if r.decision == "unverified" and text != "unverified" else text


def host_text(r: CaseRecord) -> str:
    """What the eager call costs beyond the device time (the launch overhead), "+12.3 us ±0.41 us" (the wider
    side of the eager time's 95% interval); "-" where the host time was not measured (CPU: the timed figure
    is the host's)."""
    if r.host_ns is None or r.median_ns is None:
        return "-"
    text = "+" + format_time(max(r.host_ns - r.median_ns, 0.0))
    if r.host_ci is not None:
        text += " ±" + format_time(max(r.host_ns - r.host_ci[0], r.host_ci[1] - r.host_ns))
    return text


def _time_text(r: CaseRecord) -> str:
    stream = " [stream]" if r.mode == "cuda-stream" else ""
    return f"{format_time(r.median_ns)} {plus_minus(r.median_ns, r.ci_ns)}{stream}"


def _short_row(r: CaseRecord, ab: bool, host: bool = False) -> list[str]:
    if not r.timed:
        blank = ["-"] * (3 + ab + host)
        return [r.variant, shape_label(r), *blank, "-", verdict_text(r)]
    return [
        r.variant,
        shape_label(r),
        _time_text(r),
        *([host_text(r)] if host else []),
        _short_ratio(r),
        _short_delta(r, "baseline"),
        *([_short_delta(r, "ab")] if ab else []),
        _mde(r),
        verdict_text(r),
    ]


def why(r: CaseRecord) -> str:
    """What made the case fail or stay inconclusive: its gates that did not pass and the notes that are not a
    gate's (a confirmation that disagreed, a re-measurement), leaving out the gates that passed."""
    passed = {g.reason for g in r.gates if g.status in (Status.PASS, Status.FASTER)}
    own = [x for x in r.reasons if x not in passed]
    return "; ".join([*own, *(d for d in r.disturbances if d not in own)]) or str(r.verdict or r.outcome)


# The default table's reason under a row that needs a look: the first thing that decided it, this long at most;
# every reason in -v, the JSON and the item's own failure text.
SHORT_WHY = 200


def weak_pass(mde: float) -> str:
    """Why a pass with this minimum detectable effect is unverified (policy.could_hide), in the row and in
    the run's summary of unverified cases."""
    return f"its pass could hide a slowdown of {mde:+.1%} (its minimum detectable effect)"


def short_why(r: CaseRecord) -> str:
    """One short reason: a disturbance, else what the confirmation concluded (it names the gate it judged),
    else the first failing gate or flag; cut at SHORT_WHY characters."""
    passed = {g.reason for g in r.gates if g.status in (Status.PASS, Status.FASTER)}
    concluded = [x for x in r.reasons if x.startswith(("not confirmed", "confirmed in a fresh process"))]
    if r.decision == "unverified" and not r.disturbances and r.verdict in (Status.PASS, Status.FASTER) and r.mde:
        # every gate passed: what is wrong is the pass's power, not a gate (outcome.why_unverified)
        concluded.insert(0, weak_pass(r.mde))
    first = next((x for x in [*r.disturbances, *concluded, *r.reasons] if x and x not in passed), None)
    return shorten(first or str(r.verdict or r.outcome), SHORT_WHY)


def _fit(rows: list[list[str]], width: int, shrink: int) -> list[int]:
    """Column widths; column `shrink` (the shape) gives up what the line needs to fit `width`."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    over = sum(widths) + 2 * (len(widths) - 1) - width
    if over > 0:
        widths[shrink] = max(8, widths[shrink] - over)
    return widths


def _line(cells: list[str], widths: list[int]) -> str:
    out = []
    for cell, w in zip(cells, widths, strict=True):
        out.append(cell if len(cell) <= w else cell[: w - 1] + "…")
    return "  ".join(c.ljust(w) for c, w in zip(out, widths, strict=True)).rstrip()


def skip_lines(records: Iterable[CaseRecord], width: int = WIDTH) -> list[str]:
    """One line for all skipped cases, counted by reason: 88 rows saying "needs a CUDA GPU" hide the ten that ran."""
    reasons = Counter((r.reasons or [str(r.outcome)])[0] for r in records if _skipped(r))
    if not reasons:
        return []
    text = f"skipped {sum(reasons.values())}: " + "; ".join(f"{n} {why}" for why, n in reasons.most_common())
    return textwrap.wrap(text, width, subsequent_indent="  ")


def margin_lines(records: Iterable[CaseRecord], margin: float | None, width: int = WIDTH) -> list[str]:
    """The margin the baseline and ratio gates judged at, when it is not the setting: stored between-run
    noise widens a case's margin (verdict.py), and a reader told "5%" must not think 5% was the rule."""
    used: dict[float, int] = Counter()
    for r in records:
        for name in ("baseline", "ratio"):
            g = r.gate(name)
            threshold = g.threshold if g is not None else None
            if threshold is not None and threshold > 1.0:
                used[round(threshold - 1.0, 4)] += 1
    if not used or (margin is not None and set(used) == {round(margin, 4)}):
        return []
    if len(used) <= 3:
        parts = ", ".join(f"{m:.1%} ({n} gate(s))" for m, n in sorted(used.items()))
    else:
        parts = f"{min(used):.1%} to {max(used):.1%} ({sum(used.values())} gates)"
    setting = f"{margin:.0%} set, " if margin is not None else ""
    text = (
        f"margin used by the baseline and ratio gates: {parts}; {setting}widened per case by its stored noise (so "
        "that a guard process can see a slowdown of twice the margin)"
    )
    return textwrap.wrap(text, width, subsequent_indent="  ")


def terminal_lines(
    records: Iterable[CaseRecord], *, verbose: bool = False, width: int = WIDTH, margin: float | None = None
) -> list[str]:
    """The table under the test results. Default: fits `width` columns; the cases that need a look come first,
    each with its reason and node id below it; skips are one line. `verbose`: every column and every row.
    `margin`: the setting, so that a wider margin the gates used is said under the table."""
    records = sorted(records, key=lambda r: id_order(r.id))
    if not records:
        return []
    if verbose:
        look = [r for r in records if needs_a_look(r)]
        return [
            *table(records).splitlines(),
            *(
                f"{r.verdict or r.outcome}: {r.id}: "
                + "; ".join([*r.reasons, *(d for d in r.disturbances if d not in r.reasons)])
                for r in look
            ),
            *margin_lines(records, margin, width),
        ]
    shown = [r for r in records if not _skipped(r)]
    ab = any(r.gate("ab") is not None for r in shown)
    host = any(r.host_ns is not None for r in shown)
    headers = list(SHORT_HEADERS)
    if ab:
        headers.insert(5, "Δ base rev")
    if host:
        headers.insert(3, "host +")
    look = sorted((r for r in shown if needs_a_look(r)), key=lambda r: status_rank(status_of(r)))  # then by id
    rest = [r for r in shown if not needs_a_look(r)]
    rows = {r.id: _short_row(r, ab, host) for r in shown}
    widths = _fit([headers, *rows.values()], width, shrink=1) if shown else []
    out: list[str] = []
    if shown:
        out.append(_line(headers, widths))
        out.append(_line(["-" * w for w in widths], widths))
    if look:
        out.append(f"needs a look ({len(look)}):")
        for r in look:
            out.append(_line(rows[r.id], widths))
            out.extend(
                textwrap.wrap(f"{r.id}: {short_why(r)}", width, initial_indent="    ", subsequent_indent="      ")
            )
    test = None
    for r in rest:
        if r.test != test:
            test = r.test
            out.append(f"{test}:")
        out.append(_line(rows[r.id], widths))
        if r.verdict is Status.PASS and (g := r.gate("ab")) is not None and g.status is Status.FASTER:
            # faster in this process only: the row's delta needs the fresh process's word beside it
            out.extend(textwrap.wrap(why(r), width, initial_indent="    ", subsequent_indent="      "))
    out.extend(skip_lines(records, width))
    out.extend(margin_lines(shown, margin, width))
    if host:
        out.append(
            "host +: the eager call's cost beyond the device time (launch and host work, per call), ± its 95% CI"
        )
    out.append("MDE: the smallest slowdown the case fails on 95% of the time. Every column, reason and skipped row: -v")
    return out
