"""Presenting results: the terminal table, the JSON results file and the Markdown job summary.

Every figure printed comes with its interval; a row without timing says why.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tabulate import tabulate

from .baseline import write_text_atomic
from .results_io import ResultsError

RESULTS_SCHEMA = 1


def fmt_time(ns: float | None) -> str:
    if ns is None or not math.isfinite(ns):
        return "-"
    if ns < 1e3:
        return f"{ns:.1f} ns"
    if ns < 1e6:
        return f"{ns / 1e3:.2f} us"
    if ns < 1e9:
        return f"{ns / 1e6:.3f} ms"
    return f"{ns / 1e9:.3f} s"


def _pm(center: float | None, ci: Sequence[float | None] | None, unit: str = "%") -> str:
    if center is None or not ci or ci[0] is None or ci[1] is None:
        return "-"
    half = max(center - float(ci[0]), float(ci[1]) - center) / center * 100
    return f"±{half:.1f}{unit}"


def _gate(record: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    for g in record.get("gates") or []:
        if g.get("gate") == name:
            return dict(g)
    return None


def _delta(record: Mapping[str, Any]) -> str:
    g = _gate(record, "baseline")
    if g is None:
        return "-"
    if g.get("estimate") is None:
        return str(g.get("status"))
    est = (g["estimate"] - 1) * 100
    ci = g.get("ci") or [None, None]
    if ci[0] is None or ci[1] is None:
        return f"{est:+.1f}%"
    return f"{est:+.1f}% [{(ci[0] - 1) * 100:+.1f}, {(ci[1] - 1) * 100:+.1f}]"


def _mde(record: Mapping[str, Any]) -> str:
    """The smallest slowdown of the kernel that the case fails on 95% of the time: its better gate's, or the
    time gate's alone for a variant timed against itself (verdict.case_mde)."""
    mde = record.get("mde")
    return "-" if mde is None else f"{mde * 100:+.1f}%"


def rows(records: Iterable[Mapping[str, Any]]) -> list[list[str]]:
    out = []
    for r in sorted(records, key=lambda r: str(r.get("id"))):
        if r.get("median_ns") is None:
            why = "; ".join(r.get("reasons") or []) or r.get("verdict", r.get("outcome", ""))
            out.append([r.get("test", ""), r.get("variant", ""), _shape(r), "-", "-", "-", "-", "-", _short(str(why))])
            continue
        ratio = r.get("ratio")
        rci = r.get("ratio_ci")
        out.append(
            [
                r.get("test", ""),
                r.get("variant", ""),
                _shape(r),
                f"{fmt_time(r['median_ns'])} {_pm(r['median_ns'], r.get('ci_ns'))}",
                _tflops(r),
                f"{ratio:.3f} [{rci[0]:.3f}, {rci[1]:.3f}]" if ratio is not None and rci else "-",
                _delta(r),
                _mde(r),
                str(r.get("verdict", "")),
            ]
        )
    return out


def _tflops(r: Mapping[str, Any]) -> str:
    """TFLOP/s with the interval that the time's interval implies (the FLOP count is exact)."""
    t, flops, ci = r.get("tflops"), r.get("flops"), r.get("ci_ns")
    if not t:
        return "-"
    if not flops or not ci or not ci[0] or not ci[1]:
        return f"{t:.3g}"
    return f"{t:.3g} [{flops / ci[1] / 1e3:.3g}, {flops / ci[0] / 1e3:.3g}]"


HEADERS = ["case", "variant", "shape", "time ± CI", "TFLOP/s [95% CI]", "ratio vs against [95% CI]", "Δ vs baseline [95% CI]", "MDE (95%)", "verdict"]


def _shape(r: Mapping[str, Any]) -> str:
    params = r.get("params") or {}
    return ",".join(f"{k}={v}" for k, v in params.items()) if params else str(r.get("workload_desc", ""))


def _short(text: str, n: int = 70) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def table(records: Iterable[Mapping[str, Any]], fmt: str = "simple") -> str:
    return tabulate(rows(records), headers=HEADERS, tablefmt=fmt, disable_numparse=True)


def markdown(records: Sequence[Mapping[str, Any]], device: Mapping[str, Any], footer: Sequence[str]) -> str:
    head = f"### perfguard: {device.get('name')} (torch {device.get('torch')})\n\n"
    body = table(records, fmt="github") + "\n"
    tail = "".join(f"\n- {line}" for line in footer)
    return head + body + (tail + "\n" if tail else "")


def results_document(records: Sequence[Mapping[str, Any]], device: Mapping[str, Any], summary: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "schema_version": RESULTS_SCHEMA,
        "kind": "perfguard-results",
        "device": dict(device),
        "summary": dict(summary),
        "results": [dict(r) for r in sorted(records, key=lambda r: str(r.get("id")))],
    }


def write_results(path: Path, doc: Mapping[str, Any]) -> None:
    text = json.dumps(doc, sort_keys=True, indent=2, allow_nan=False, default=str) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, text, ResultsError)
