"""Presenting results: the terminal table and the JSON results file (the HTML report and the Markdown job
summary are html_report.py and markdown_report.py).

Every figure printed comes with its interval; a row without timing says why.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tabulate import tabulate

from .jsonio import write_text_atomic
from .record import CaseRecord
from .results_io import RESULTS_KIND, RESULTS_SCHEMA_VERSION, ResultsError

_UNITS = ((1e9, "s"), (1e6, "ms"), (1e3, "µs"), (1.0, "ns"))


def _unit(ns: float) -> tuple[float, str]:
    for scale, name in _UNITS:
        if ns >= scale:
            return scale, name
    return 1.0, "ns"


def _digits(value: float) -> int:
    """Decimals for about four significant figures."""
    return 1 if value >= 100 else 2 if value >= 10 else 3


def format_time(ns: float | None, ci: tuple[float, float] | None = None) -> str:
    """A time in ns as "9.123 µs", with its CI "[9.100, 9.150]" in the same unit; "-" for none."""
    if ns is None or not math.isfinite(ns):
        return "-"
    scale, unit = _unit(ns)
    digits = _digits(ns / scale)
    text = f"{ns / scale:.{digits}f} {unit}"
    if ci is not None:
        text += f" [{ci[0] / scale:.{digits}f}, {ci[1] / scale:.{digits}f}]"
    return text


def format_ratio(ratio: float | None, ci: tuple[float, float] | None) -> str:
    """A ratio with its CI, or "-" when no reference was timed."""
    if ratio is None:
        return "-"
    text = f"{ratio:.3f}"
    if ci is not None:
        text += f" [{ci[0]:.3f}, {ci[1]:.3f}]"
    return text


def _pm(center: float | None, ci: Sequence[float | None] | None, unit: str = "%") -> str:
    if center is None or not ci or ci[0] is None or ci[1] is None:
        return "-"
    half = max(center - float(ci[0]), float(ci[1]) - center) / center * 100
    return f"±{half:.1f}{unit}"


def _delta(record: CaseRecord, gate: str) -> str:
    g = record.gate(gate)
    if g is None:
        return "-"
    if g.get("estimate") is None:
        return str(g.get("status"))
    est = (g["estimate"] - 1) * 100
    ci = g.get("ci") or [None, None]
    if ci[0] is None or ci[1] is None:
        return f"{est:+.1f}%"
    return f"{est:+.1f}% [{(ci[0] - 1) * 100:+.1f}, {(ci[1] - 1) * 100:+.1f}]"


def _mde(record: CaseRecord) -> str:
    """The smallest slowdown of the kernel that the case fails on 95% of the time: its better gate's, or the
    time gate's alone for a variant timed against itself (verdict.case_mde)."""
    return "-" if record.mde is None else f"{record.mde * 100:+.1f}%"


def rows(records: Iterable[CaseRecord]) -> list[list[str]]:
    out = []
    ab = any(r.gate("ab") is not None for r in records)
    for r in sorted(records, key=lambda r: r.id):
        if r.median_ns is None:
            why = "; ".join(r.reasons) or str(r.verdict or r.outcome)
            out.append([r.test, r.variant, _shape(r), "-", "-", "-", "-", "-", *(["-"] if ab else []), "-", _short(why)])
            continue
        out.append(
            [
                r.test,
                r.variant,
                _shape(r),
                f"{format_time(r.median_ns)} {_pm(r.median_ns, r.ci_ns)}",
                _tflops(r),
                _gbps(r),
                format_ratio(r.ratio, r.ratio_ci),
                _delta(r, "baseline"),
                *([_delta(r, "ab")] if ab else []),
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
        return f"{t:.3g}{pct}"
    return f"{t:.3g} [{flops / ci[1] / 1e3:.3g}, {flops / ci[0] / 1e3:.3g}]{pct}"


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


def _shape(r: CaseRecord) -> str:
    return ",".join(f"{k}={v}" for k, v in r.params.items()) if r.params else str(r.workload_desc or "")


def _short(text: str, n: int = 70) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def table(records: Iterable[CaseRecord], fmt: str = "simple") -> str:
    records = list(records)
    headers = list(HEADERS)
    if any(r.gate("ab") is not None for r in records):
        headers.insert(headers.index("MDE (95%)"), AB_HEADER)
    return tabulate(rows(records), headers=headers, tablefmt=fmt, disable_numparse=True)


def results_document(
    records: Sequence[CaseRecord],
    device: Mapping[str, Any],
    summary: Mapping[str, Any],
    run: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "schema_version": RESULTS_SCHEMA_VERSION,
        "kind": RESULTS_KIND,
        "device": dict(device),
        "run": dict(run or {}),
        "summary": dict(summary),
        "results": [r.to_json() for r in sorted(records, key=lambda r: r.id)],
    }


def write_results(path: Path, doc: Mapping[str, Any]) -> None:
    text = json.dumps(doc, sort_keys=True, indent=2, allow_nan=False, default=str) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, text, ResultsError)
