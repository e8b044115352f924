"""The HTML report's figures: plotly figure specs built from the view's cases (the page is html.py)."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from ..record import Gate
from .formats import escaped, format_change, format_mde, format_ratio, format_time
from .view import Case, fmt_tflops, shape_order

STATUS_COLORS = {
    "regressed": "#d62728",
    "incorrect": "#d62728",
    "error": "#d62728",
    "timeout": "#d62728",
    "flagged": "#d62728",
    "failed": "#d62728",
    "inconclusive": "#ff7f0e",
    "faster": "#17becf",
    "pass": "#2ca02c",
    "correct": "#2ca02c",
}
OTHER_COLOR = "#8c8c8c"
VARIANT_COLORS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#bcbd22",
    "#17becf",
)


def status_color(status: str) -> str:
    return STATUS_COLORS.get(status, OTHER_COLOR)


def plot_label(text: object) -> str:
    """A label plotly.js draws (trace name, category, tick): it renders a subset of HTML there (<a href> is a
    live link), so < > & are escaped; quotes stay, as plotly.js decodes no &quot; and a tag needs a <."""
    return html.escape(str(text), quote=False)


#
# Figures are plotly figure specs (the JSON that plotly.js draws), written as dicts: building ~100 of them
# through plotly.graph_objects validated every property and took 0.25 s each. Shared styling (plotly's
# "plotly_white" template) is sent once and applied by the page's script.

Figure = dict[str, Any]


def _pct(x: float) -> float:
    return _r((x - 1.0) * 100.0)


def _r(x: float) -> float:
    """Five significant digits: the figures' data are most of a report's weight, and no CI is finer."""
    return float(f"{x:.5g}")


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _axis(**extra: Any) -> dict[str, Any]:
    return {"automargin": True, **extra}


def _title(text: str) -> dict[str, Any]:
    return {"text": escaped(text), "font": {"size": 15}, "x": 0.01}


def _gate_names(cases: Sequence[Case]) -> list[str]:
    preferred = ["baseline", "ratio", "ab"]
    names = {g.name for case in cases for g in case.gates if g.estimate is not None}
    return [n for n in preferred if n in names] + sorted(names - set(preferred))


def _forest(
    rows: Sequence[tuple[str, Gate, str]], xaxis: str, yaxis: str, *, labels: bool = False
) -> list[dict[str, Any]]:
    """Each row's margin band as a grey bar, and its estimate with its CI coloured by the gate's status."""
    band_x: list[float | None] = []
    band_y: list[str | None] = []
    for label, gate, _ in rows:
        if gate.band is not None:
            band_x += [_pct(gate.band[0]), _pct(gate.band[1]), None]
            band_y += [label, label, None]
    points = [(label, gate, case_id, gate.estimate) for label, gate, case_id in rows if gate.estimate is not None]
    ests = [_pct(est) for _, _, _, est in points]
    ci = [g.ci or (est, est) for _, g, _, est in points]
    return [
        {
            "type": "scatter",
            "x": band_x,
            "y": band_y,
            "mode": "lines",
            "name": "margin band",
            "line": {"color": "rgba(120,120,120,0.28)", "width": 9},
            "hoverinfo": "skip",
            "showlegend": False,
            "xaxis": xaxis,
            "yaxis": yaxis,
        },
        {
            "type": "scatter",
            "x": ests,
            "y": [label for label, _, _, _ in points],
            "mode": "markers+text" if labels else "markers",
            "textposition": "top center",
            "text": [format_change(est) for _, _, _, est in points] if labels else None,
            "marker": {"color": [status_color(g.status) for _, g, _, _ in points], "size": 8, "symbol": "diamond"},
            "error_x": {
                "type": "data",
                "symmetric": False,
                "color": "#444",
                "thickness": 1.2,
                "width": 3,
                "array": [_r(_pct(hi) - x) for x, (_, hi) in zip(ests, ci, strict=True)],
                "arrayminus": [_r(x - _pct(lo)) for x, (lo, _) in zip(ests, ci, strict=True)],
            },
            "hovertext": [
                f"{escaped(case_id)}<br>{escaped(g.name)}: {escaped(g.status)}<br>{escaped(g.reason)}"
                f"<br>MDE {escaped(format_mde(g.mde))}"
                for _, g, case_id, _ in points
            ],
            "hoverinfo": "text",
            "showlegend": False,
            "xaxis": xaxis,
            "yaxis": yaxis,
        },
    ]


def _vline(xref: str) -> dict[str, Any]:
    return {
        "type": "line",
        "xref": xref,
        "x0": 0,
        "x1": 0,
        "yref": "paper",
        "y0": 0,
        "y1": 1,
        "line": {"color": "#999", "width": 1},
    }


def gates_figure(cases: Sequence[Case], title: str) -> Figure | None:
    """Every case's gates side by side: change against the baseline (or base revision) with its 95% CI,
    in its margin band. None when no case was judged against anything."""
    names = _gate_names(cases)
    judged = [c for c in cases if any(g.estimate is not None for g in c.gates)]
    if not names or not judged:
        return None
    labels = [plot_label(f"{c.rec.variant} · {c.shape}") for c in judged]
    gap = 0.04
    width = (1.0 - gap * (len(names) - 1)) / len(names)
    data: list[dict[str, Any]] = []
    layout: dict[str, Any] = {
        "title": _title(title),
        "height": 110 + 17 * len(labels),
        "hovermode": "closest",
        "margin": {"l": 10, "r": 10, "t": 50, "b": 50},
        "shapes": [],
        "yaxis": _axis(
            autorange="reversed",
            type="category",
            categoryorder="array",
            categoryarray=labels,
            tickfont={"size": 10},
        ),
    }
    for index, name in enumerate(names):
        xref = "x" if index == 0 else f"x{index + 1}"
        rows = [(label, g, c.id) for label, c in zip(labels, judged, strict=True) for g in c.gates if g.name == name]
        data += _forest(rows, xref, "y")
        left = index * (width + gap)
        layout["xaxis" if index == 0 else f"xaxis{index + 1}"] = _axis(
            domain=[left, left + width],
            anchor="y",
            ticksuffix="%",
            zeroline=False,
            title={"text": f"{escaped(name)} gate: change (95% CI)"},
        )
        layout["shapes"].append(_vline(xref))
    return {"data": data, "layout": layout}


def _error_bars(ys: Sequence[float], cis: Sequence[tuple[float, float] | None], color: str) -> dict[str, Any]:
    return {
        "type": "data",
        "symmetric": False,
        "color": color,
        "thickness": 1.2,
        "width": 3,
        "array": [_r(ci[1] - y) if ci else 0.0 for y, ci in zip(ys, cis, strict=True)],
        "arrayminus": [_r(y - ci[0]) if ci else 0.0 for y, ci in zip(ys, cis, strict=True)],
    }


def _grid_style(variant: str, color: str, *, reference: bool) -> dict[str, Any]:
    """One variant's line in both panels; the reference is dashed, so the eye finds what the ratios divide by."""
    return {
        "line": {"color": color, "dash": "dash" if reference else "solid", "width": 1.5},
        "marker": {"size": 7, "color": color},
        "mode": "lines+markers",
        "legendgroup": plot_label(variant),
    }


def _throughput_trace(
    cases: Sequence[Case], variant: str, style: dict[str, Any], scale: float | None
) -> dict[str, Any]:
    """The top panel's points of one variant: FLOP/s times `scale` (TFLOP/s to the unit shown), or the time in
    µs where `scale` is None (a case without a FLOP count)."""
    if scale is not None:
        ys = [_r((c.rec.tflops or 0.0) * scale) for c in cases]
        cis = [(ci[0] * scale, ci[1] * scale) if (ci := c.tflops_ci) else None for c in cases]
    else:
        ys = [_r((c.rec.median_ns or 0.0) / 1e3) for c in cases]
        cis = [(c.rec.ci_ns[0] / 1e3, c.rec.ci_ns[1] / 1e3) if c.rec.ci_ns else None for c in cases]
    return {
        "type": "scatter",
        "name": plot_label(variant),
        "x": [plot_label(c.shape) for c in cases],
        "y": ys,
        **style,
        "error_y": _error_bars(ys, cis, style["line"]["color"]),
        "hoverinfo": "text",
        "hovertext": [
            f"{escaped(c.id)}<br>{escaped(format_time(c.rec.median_ns, c.rec.ci_ns))}"
            f"<br>{escaped(fmt_tflops(c))} TFLOP/s"
            f"<br>verdict: {escaped(c.status)}"
            for c in cases
        ],
    }


def _ratio_trace(cases: Sequence[Case], variant: str, style: dict[str, Any]) -> dict[str, Any]:
    """The bottom panel's points of one variant: its time over the reference's, in the legend once (above)."""
    ratios = [_r(c.rec.ratio or 0.0) for c in cases]
    return {
        "type": "scatter",
        "name": plot_label(variant),
        "x": [plot_label(c.shape) for c in cases],
        "y": ratios,
        **style,
        "showlegend": False,
        "xaxis": "x2",
        "yaxis": "y2",
        "error_y": _error_bars(ratios, [c.rec.ratio_ci for c in cases], style["line"]["color"]),
        "hoverinfo": "text",
        "hovertext": [f"{escaped(c.id)}<br>ratio {escaped(format_ratio(c.rec.ratio, c.rec.ratio_ci))}" for c in cases],
    }


def _grid_layout(
    title: str, shapes: Sequence[str], top: str, against: str | None, *, has_ratio: bool
) -> dict[str, Any]:
    """Shapes along x, log y; with ratios, a second panel below that shares the x axis and marks 1.0."""
    xaxis = _axis(type="category", categoryorder="array", categoryarray=[plot_label(s) for s in shapes], tickangle=-30)
    layout: dict[str, Any] = {
        "title": _title(title),
        "height": 640 if has_ratio else 380,
        "hovermode": "closest",
        "margin": {"l": 10, "r": 10, "t": 50, "b": 60},
        "legend": {"orientation": "h", "y": -0.14 if has_ratio else -0.25},
        "xaxis": {**xaxis, "anchor": "y", "showticklabels": not has_ratio},
        "yaxis": _axis(type="log", title={"text": top}, domain=[0.52, 1.0] if has_ratio else [0.0, 1.0]),
    }
    if has_ratio:
        layout["xaxis2"] = {**xaxis, "anchor": "y2", "matches": "x"}
        layout["yaxis2"] = _axis(
            type="log", domain=[0.0, 0.45], title={"text": f"time / {escaped(against or 'reference')} (95% CI)"}
        )
        layout["shapes"] = [
            {
                "type": "line",
                "xref": "x2 domain",
                "x0": 0,
                "x1": 1,
                "yref": "y2",
                "y0": 1,
                "y1": 1,
                "line": {"color": "#999", "width": 1},
            }
        ]
    return layout


def grid_figure(cases: Sequence[Case], title: str) -> Figure | None:
    """Per variant over the whole grid: throughput (or time) and the ratio to the reference, with CIs."""
    timed = [c for c in cases if c.rec.median_ns is not None]
    if not timed:
        return None
    use_tflops = all(c.rec.tflops is not None for c in timed)
    # A CPU run does GFLOP/s: plotly would label 0.002 TFLOP/s "2m", which reads as minutes.
    unit, scale = ("TFLOP/s", 1.0) if max(c.rec.tflops or 0.0 for c in timed) >= 1.0 else ("GFLOP/s", 1e3)
    has_ratio = any(c.rec.ratio is not None for c in timed)
    shapes = shape_order(timed)
    against = next((c.against for c in timed if c.against), None)
    data: list[dict[str, Any]] = []
    variants = sorted({c.rec.variant for c in timed}, key=lambda v: (v == against, v))
    for index, variant in enumerate(variants):
        mine = sorted((c for c in timed if c.rec.variant == variant), key=lambda c: shapes.index(c.shape))
        color = "#222222" if variant == against else VARIANT_COLORS[index % len(VARIANT_COLORS)]
        style = _grid_style(variant, color, reference=variant == against)
        data.append(_throughput_trace(mine, variant, style, scale if use_tflops else None))
        rated = [c for c in mine if c.rec.ratio is not None]
        if has_ratio and rated:
            data.append(_ratio_trace(rated, variant, style))
    top = f"{unit} (95% CI)" if use_tflops else "time, µs (95% CI)"
    return {"data": data, "layout": _grid_layout(title, shapes, top, against, has_ratio=has_ratio)}


def case_figure(case: Case) -> Figure | None:
    """One case: its block medians as points (the variant, the reference, the base revision), and each
    gate's estimate and CI in its margin band."""
    series = [
        (case.rec.variant, case.variant_blocks, status_color(case.status)),
        (f"{case.against or 'reference'} (reference)", case.against_blocks, "#7f7f7f"),
        ("base revision", case.base_blocks, "#9467bd"),
    ]
    series = [s for s in series if s[1]]
    gates = [g for g in case.gates if g.estimate is not None]
    if not series and not gates:
        return None
    data: list[dict[str, Any]] = []
    layout: dict[str, Any] = {
        "height": 270,
        "margin": {"l": 10, "r": 10, "t": 16, "b": 36},
        "hovermode": "closest",
        "legend": {"orientation": "h", "y": -0.22},
        "shapes": [],
    }
    left = [0.0, 0.58] if gates else [0.0, 1.0]
    # Each series relative to its own median: a kernel 10x slower than its reference would otherwise
    # flatten the reference's drift and outliers, which are what the points are for. Hover gives µs.
    for name, values, color in series:
        centre = _median(values)
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": escaped(name),
                "x0": 1,
                "dx": 1,
                "y": [_r((v / centre - 1.0) * 100.0) for v in values],
                "customdata": [_r(v / 1e3) for v in values],
                "marker": {"color": color, "size": 5, "opacity": 0.75},
                "hovertemplate": "block %{x}: %{customdata} µs (%{y:+.2f}%)<extra>" + escaped(name) + "</extra>",
            }
        )
    if series:
        layout["xaxis"] = _axis(domain=left, anchor="y", title={"text": "block, in measuring order"})
        layout["yaxis"] = _axis(
            title={"text": "block median vs its median"}, ticksuffix="%", zeroline=True, zerolinecolor="#bbb"
        )
    if gates:
        x, y = ("x2", "y2") if series else ("x", "y")
        data += _forest([(plot_label(g.name), g, case.id) for g in gates], x, y, labels=True)
        layout["xaxis2" if series else "xaxis"] = _axis(
            domain=[0.7, 1.0] if series else [0.0, 1.0],
            anchor=y,
            ticksuffix="%",
            zeroline=False,
            title={"text": "gates: change (95% CI)"},
        )
        # First gate on top; room above each row for its label.
        layout["yaxis2" if series else "yaxis"] = _axis(anchor=x, type="category", range=[len(gates) - 0.6, -0.8])
        layout["shapes"].append(_vline(x))
    return {"data": data, "layout": layout}
