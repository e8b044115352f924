"""An HTML report of a results file: what failed and why, and the pictures behind it.

Plotting library: plotly, not matplotlib. A report is read in a browser to find out which of ~100 cases
moved and why: plotly's hover names the case, the gate's reason and the numbers of every point, and its
zoom makes block medians of short and long kernels readable in one chart. The cost is plotly.js (about
4.8 MB): written once beside the reports of a folder (write_html), so a page of a small run is tens of
kilobytes and opens offline; each figure adds only its data. Per-case figures
are drawn when their section is opened, so a report of hundreds of cases still opens at once. matplotlib
would give static SVGs of about the same total size for this many figures, with no way to tell which
point is which case. plotly is an optional extra (``pip install 'pytest-perfguard[report]'``) and is
imported only when a report is written.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..record import Gate
from .formats import format_change, format_mde, format_ratio, format_time
from .merge import write_file
from .view import (
    Case,
    Report,
    build,
    counts_line,
    environment,
    fmt_tflops,
    gate_text,
    shape_order,
)

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
_PLOT_CONFIG = {
    "displaylogo": False,
    "displayModeBar": "hover",
    "responsive": True,
    "modeBarButtonsToRemove": ["toImage"],
}


# The optional extra the report draws with, and how to get it: said here and before a run that asks for a report.
NEEDS = "plotly"
INSTALL = "pip install 'pytest-perfguard[report]'"


class ReportDependencyError(RuntimeError):
    """plotly is missing; the message says what to install."""


def plotly_script_name() -> str:
    """The file beside a written report that holds plotly.js (write_html): named by plotly's version, so
    reports written into one folder share it and a report never loads another version's."""
    try:
        from plotly import __version__
    except ImportError:
        raise ReportDependencyError(f"the HTML report needs {NEEDS}: {INSTALL}") from None
    return f"perfguard-plotly-{__version__}.min.js"


def _plotly_assets() -> tuple[str, str]:
    """plotly.js and the shared template, from the installed plotly (so the report needs no network)."""
    try:
        import plotly.io as pio
        from plotly.offline import get_plotlyjs
    except ImportError:
        raise ReportDependencyError(f"the HTML report needs {NEEDS}: {INSTALL}") from None
    template = pio.templates["plotly_white"].to_plotly_json()
    return get_plotlyjs(), json.dumps(template, separators=(",", ":"))


def _color(status: str) -> str:
    return STATUS_COLORS.get(status, OTHER_COLOR)


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _label(text: object) -> str:
    """A label plotly.js draws (trace name, category, tick): it renders a subset of HTML there (<a href> is a
    live link), so < > & are escaped; quotes stay, as plotly.js decodes no &quot; and a tag needs a <."""
    return html.escape(str(text), quote=False)


# ------------------------------------------------------------------------------------------------ figures
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
    return {"text": _e(text), "font": {"size": 15}, "x": 0.01}


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
            "marker": {"color": [_color(g.status) for _, g, _, _ in points], "size": 8, "symbol": "diamond"},
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
                f"{_e(case_id)}<br>{_e(g.name)}: {_e(g.status)}<br>{_e(g.reason)}<br>MDE {_e(format_mde(g.mde))}"
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
    labels = [_label(f"{c.rec.variant} · {c.shape}") for c in judged]
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
            title={"text": f"{_e(name)} gate: change (95% CI)"},
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
        "legendgroup": _label(variant),
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
        "name": _label(variant),
        "x": [_label(c.shape) for c in cases],
        "y": ys,
        **style,
        "error_y": _error_bars(ys, cis, style["line"]["color"]),
        "hoverinfo": "text",
        "hovertext": [
            f"{_e(c.id)}<br>{_e(format_time(c.rec.median_ns, c.rec.ci_ns))}<br>{_e(fmt_tflops(c))} TFLOP/s"
            f"<br>verdict: {_e(c.status)}"
            for c in cases
        ],
    }


def _ratio_trace(cases: Sequence[Case], variant: str, style: dict[str, Any]) -> dict[str, Any]:
    """The bottom panel's points of one variant: its time over the reference's, in the legend once (above)."""
    ratios = [_r(c.rec.ratio or 0.0) for c in cases]
    return {
        "type": "scatter",
        "name": _label(variant),
        "x": [_label(c.shape) for c in cases],
        "y": ratios,
        **style,
        "showlegend": False,
        "xaxis": "x2",
        "yaxis": "y2",
        "error_y": _error_bars(ratios, [c.rec.ratio_ci for c in cases], style["line"]["color"]),
        "hoverinfo": "text",
        "hovertext": [f"{_e(c.id)}<br>ratio {_e(format_ratio(c.rec.ratio, c.rec.ratio_ci))}" for c in cases],
    }


def _grid_layout(
    title: str, shapes: Sequence[str], top: str, against: str | None, *, has_ratio: bool
) -> dict[str, Any]:
    """Shapes along x, log y; with ratios, a second panel below that shares the x axis and marks 1.0."""
    xaxis = _axis(type="category", categoryorder="array", categoryarray=[_label(s) for s in shapes], tickangle=-30)
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
            type="log", domain=[0.0, 0.45], title={"text": f"time / {_e(against or 'reference')} (95% CI)"}
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
        (case.rec.variant, case.variant_blocks, _color(case.status)),
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
                "name": _e(name),
                "x0": 1,
                "dx": 1,
                "y": [_r((v / centre - 1.0) * 100.0) for v in values],
                "customdata": [_r(v / 1e3) for v in values],
                "marker": {"color": color, "size": 5, "opacity": 0.75},
                "hovertemplate": "block %{x}: %{customdata} µs (%{y:+.2f}%)<extra>" + _e(name) + "</extra>",
            }
        )
    if series:
        layout["xaxis"] = _axis(domain=left, anchor="y", title={"text": "block, in measuring order"})
        layout["yaxis"] = _axis(
            title={"text": "block median vs its median"}, ticksuffix="%", zeroline=True, zerolinecolor="#bbb"
        )
    if gates:
        x, y = ("x2", "y2") if series else ("x", "y")
        data += _forest([(_label(g.name), g, case.id) for g in gates], x, y, labels=True)
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


# ---------------------------------------------------------------------------------------------------- page


class _Page:
    """Collects figures as JSON specs; the page's script draws them (now, or when a case is opened)."""

    def __init__(self) -> None:
        self.specs: list[str] = []
        self.shared: dict[str, int] = {}

    def plot(self, fig: Figure | None, *, lazy: bool = False, key: str | None = None) -> str:
        """A placeholder that the script draws; a figure shown twice (by key) is stored once."""
        if fig is None:
            return ""
        if key is not None and key in self.shared:
            index = self.shared[key]
        else:
            index = len(self.specs)
            # "</" would end the script element early; JSON allows the escaped form.
            self.specs.append(json.dumps(fig, allow_nan=False, separators=(",", ":")).replace("</", "<\\/"))
            if key is not None:
                self.shared[key] = index
        css = "plot lazy" if lazy else "plot"
        return f'<div class="{css}" data-spec="spec-{index}"></div>'

    def scripts(self) -> str:
        return "\n".join(
            f'<script type="application/json" id="spec-{i}">{spec}</script>' for i, spec in enumerate(self.specs)
        )


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#222;background:#fafafa}
main{max-width:1340px;margin:0 auto;padding:18px 24px 60px}
h1{font-size:22px;margin:6px 0 4px} h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:15px;margin:18px 0 6px}
.chips span{display:inline-block;margin:2px 6px 2px 0;padding:2px 10px;border-radius:12px;color:#fff;font-weight:600}
table{border-collapse:collapse;background:#fff} td,th{padding:3px 9px;border-bottom:1px solid #eee;text-align:left;
vertical-align:top} th{background:#f0f0f0} table.env td:first-child{color:#555;white-space:nowrap}
code,pre{font:12.5px ui-monospace,SFMono-Regular,Menlo,monospace;background:#f1f1f1;border-radius:3px}
code{padding:1px 4px} pre{padding:6px 8px;white-space:pre-wrap;word-break:break-all;margin:4px 0}
.card{background:#fff;border:1px solid #e3e3e3;border-left:5px solid var(--c);border-radius:4px;
padding:8px 12px;margin:8px 0}
.status{font-weight:700;color:var(--c)} .muted{color:#666} ul{margin:4px 0 4px 18px;padding:0}
details.case{background:#fff;border:1px solid #e6e6e6;border-left:4px solid var(--c);margin:3px 0;border-radius:3px}
details.case>summary{cursor:pointer;padding:4px 10px;display:grid;gap:10px;
grid-template-columns:minmax(120px,.9fr) minmax(120px,.9fr) 1.2fr 1fr 2.1fr 60px 100px}
details.case>summary>span{overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
details.case[open]>summary{border-bottom:1px solid #eee} .body{padding:6px 12px 10px}
details.attn>summary{display:block;padding:5px 12px} details.attn>summary>div:first-child{overflow:hidden;
text-overflow:ellipsis;white-space:nowrap} details.attn code{word-break:break-all} details.attn>summary>div:first-
child::before{content:"▸ ";color:#888}
details.attn[open]>summary>div:first-child::before{content:"▾ "}
.head{display:grid;gap:10px;padding:4px 14px;font-weight:600;color:#555;
grid-template-columns:minmax(120px,.9fr) minmax(120px,.9fr) 1.2fr 1fr 2.1fr 60px 100px}
.plot{width:100%;min-height:120px}
.explain h4{margin:8px 0 2px;font-size:14px} .explain p{margin:2px 0}
table.explain{margin:4px 0 8px} table.explain tr.moved td{font-weight:600}
table.explain :is(td,th):nth-child(n+2){text-align:right;font-variant-numeric:tabular-nums}
"""

_JS = """
(function () {
  var drawn = 0;
  function draw(el) {
    if (el.getAttribute('data-drawn')) return;
    el.setAttribute('data-drawn', '1');
    var spec = JSON.parse(document.getElementById(el.getAttribute('data-spec')).textContent);
    spec.layout.template = TEMPLATE;
    Plotly.newPlot(el, spec.data, spec.layout, CONFIG);
    drawn += 1;
    document.body.setAttribute('data-plots-drawn', String(drawn));
  }
  document.querySelectorAll('.plot:not(.lazy)').forEach(draw);
  document.querySelectorAll('details.case').forEach(function (d) {
    function open() { if (d.open) d.querySelectorAll('.plot').forEach(draw); }
    d.addEventListener('toggle', open);
    open();
  });
})();
"""


def _chips(report: Report) -> str:
    return "".join(
        f'<span style="background:{_color(status)}">{n} {_e(status)}</span>' for status, n in report.counts()
    )


# The first few failing cases are drawn at once; past that a page of a hundred regressions (a broken
# build) would draw a hundred figures before anyone could scroll.
OPEN_FIGURES = 5


def _attention(report: Report, page: _Page) -> str:
    """One compact row per case (its verdict, id, deciding reason and command); opened, it shows every
    reason and its figure. The first few are open, so a short list reads without a click."""
    cases = report.attention()
    if not cases:
        return '<p class="muted">No case failed and none was inconclusive.</p>'
    out = []
    for index, case in enumerate(cases):
        reasons = "".join(f"<li>{_e(r)}</li>" for r in case.rec.reasons) or "<li>no reason recorded</li>"
        figure = page.plot(case_figure(case), lazy=True, key=f"{case.device}::{case.id}")
        opened = " open" if index < OPEN_FIGURES else ""
        out.append(
            f'<details class="case attn" style="--c:{_color(case.status)}"{opened}><summary>'
            f'<div><span class="status">{_e(case.status)}</span>{_device_note(report, case)} '
            f"{_e(case.decisive_reason())}</div><div><code>{_e(case.command())}</code></div>"
            f'</summary><div class="body"><ul>{reasons}</ul>{_explain(case)}{figure}</div></details>'
        )
    return "\n".join(out)


def _explain(case: Case) -> str:
    """The profiler diff `perfguard explain` attached: per kernel, metric, head, base and change, duration
    first and then what moved most (moved rows in bold), with the ncu, GPU and revisions it came from."""
    e = case.rec.explain
    if e is None:
        return ""
    blocks = []
    for number, kernel in enumerate(e.kernels, 1):
        title = f"kernel {number} of {len(e.kernels)}: {kernel.title}"
        rows = "".join(
            ("<tr class=moved>" if row.moved else "<tr>")
            + "".join(f"<td>{_e(cell)}</td>" for cell in (row.label, row.head, row.base, row.change))
            + "</tr>"
            for row in kernel.rows()
        )
        blocks.append(
            f'<p><code>{_e(title)}</code></p><table class="explain"><tr><th>metric</th><th>head</th>'
            f"<th>base</th><th>change</th></tr>{rows}</table>"
        )
    return (
        f'<div class="explain"><h4>Why: Nsight Compute, head vs base</h4><p>{_e(e.headline())}</p>'
        f'<p class="muted">{_e(e.source())}</p>{"".join(blocks)}</div>'
    )


def _device_note(report: Report, case: Case) -> str:
    return f' <span class="muted">on {_e(case.device_name)}</span>' if len(report.devices) > 1 else ""


def _case_details(report: Report, case: Case, page: _Page) -> str:
    env = ", ".join(f"{k} {v}" for k, v in sorted(case.env.items())) or "not recorded"
    facts = [
        ("case", f"<code>{_e(case.id)}</code>"),
        ("workload", _e(case.rec.workload_desc or "-")),
        ("time (95% CI)", _e(format_time(case.rec.median_ns, case.rec.ci_ns))),
        ("TFLOP/s (95% CI)", _e(fmt_tflops(case))),
        (
            f"ratio vs {_e(case.against or 'reference')} (95% CI)",
            _e(format_ratio(case.rec.ratio, case.rec.ratio_ci)),
        ),
        ("MDE (95% power)", _e(format_mde(case.mde))),
        (
            "blocks, stop",
            _e(f"{case.rec.blocks if case.rec.blocks is not None else '-'}, {case.rec.stop_reason or '-'}"),
        ),
        ("environment", _e(env)),
        ("reproduce", f"<code>{_e(case.command())}</code>"),
    ]
    for g in case.gates:
        facts.append((f"{_e(g.name)} gate", _e(f"{g.status}: {g.reason or format_change(g.estimate, g.ci)}")))
    reasons = [r for r in case.rec.reasons if not any(r == g.reason for g in case.gates)]
    if reasons:
        facts.append(("notes", "<br>".join(_e(r) for r in reasons)))
    rows = "".join(f"<tr><td>{k}</td><td>{v}</td></tr>" for k, v in facts)
    summary = "".join(
        f'<span title="{_e(text)}">{_e(text)}</span>'
        for text in (
            case.rec.variant,
            case.shape,
            format_time(case.rec.median_ns, case.rec.ci_ns),
            fmt_tflops(case),
            gate_text(case) if any(g.estimate is not None for g in case.gates) else case.decisive_reason(),
            format_mde(case.mde),
            case.status,
        )
    )
    return (
        f'<details class="case" style="--c:{_color(case.status)}"><summary>{summary}</summary>'
        f'<div class="body"><table class="env">{rows}</table>{_explain(case)}'
        f"{page.plot(case_figure(case), lazy=True, key=f'{case.device}::{case.id}')}</div></details>"
    )


def _where(report: Report, device: str) -> str:
    """ " on NVIDIA L4" when the file holds several devices, so two grids of one test are told apart."""
    return f" on {report.devices.get(device, {}).get('name', device)}" if len(report.devices) > 1 else ""


def _figures(page: _Page, heading: str, figures: Sequence[Figure | None]) -> list[str]:
    """A section of figures, left out whole when there is nothing to draw (a run with nothing timed)."""
    drawn = [page.plot(fig) for fig in figures if fig is not None]
    return [f"<h2>{_e(heading)}</h2>", *drawn] if drawn else []


def render_html(doc: Mapping[str, Any], *, script: str | None = None) -> str:
    """The whole report as one HTML page. plotly.js (4.8 MB) is embedded once, so the page opens without a
    network, unless `script` names the file beside the page that holds it (write_html): then the page is
    tens of kilobytes and still needs no network."""
    plotly_js, template = _plotly_assets()
    plotly_tag = f'<script src="{_e(script)}"></script>' if script else f"<script>{plotly_js}</script>"
    report = build(doc)
    page = _Page()
    devices = " + ".join(str(d.get("name") or slug) for slug, d in report.devices.items()) or "unknown device"
    env_rows = "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in environment(report))
    errors = "".join(f"<li>{_e(e)}</li>" for e in report.errors)
    sections = [
        f"<h1>perfguard report: {_e(devices)}</h1>",
        f'<p class="chips">{_chips(report)}</p><p class="muted">{_e(counts_line(report))}</p>',
        f'<table class="env">{env_rows}</table>',
        f"<h2>Session errors</h2><ul>{errors}</ul>" if errors else "",
        "<h2>Failing and inconclusive cases</h2>",
        _attention(report, page),
    ]
    groups = report.tests()
    titled = [(f"{test}{_where(report, device)}", cases) for device, test, cases in groups]
    sections += _figures(page, "Per variant, over the grid", [grid_figure(c, t) for t, c in titled])
    sections += _figures(
        page,
        "Gates: change against the baseline or base revision, in the margin band",
        [gates_figure(c, t) for t, c in titled],
    )
    if groups:
        sections.append("<h2>All cases</h2>")
        head = "".join(
            f"<span>{h}</span>"
            for h in (
                "variant",
                "shape",
                "time (95% CI)",
                "TFLOP/s",
                "gates (95% CI) or why",
                "MDE",
                "verdict",
            )
        )
        for title, cases in titled:
            sections.append(f'<h3>{_e(title)}</h3><div class="head">{head}</div>')
            sections += [_case_details(report, case, page) for case in cases]
    config = json.dumps(_PLOT_CONFIG)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>perfguard: {_e(counts_line(report))}</title><style>{_CSS}</style>"
        f"{plotly_tag}</head>\n<body><main>\n"
        + "\n".join(s for s in sections if s)
        + f"\n</main>\n{page.scripts()}\n"
        + f"<script>var CONFIG = {config}, TEMPLATE = {template};{_JS}</script>\n</body></html>\n"
    )


def write_html(path: Path, doc: Mapping[str, Any]) -> None:
    """Render and write atomically: a reader never sees half a report. plotly.js goes to a file of its own
    beside the page (plotly_script_name), written once per plotly version and shared by every report in the
    folder: embedded, it made a one-case report 4.8 MB. Keep the two files together (the workflow uploads
    both); render_html without `script` gives the single-file page."""
    path = Path(path)
    name = plotly_script_name()
    page = render_html(doc, script=name)
    beside = path.parent / name
    if not beside.exists():  # named by plotly's version, written atomically: one there is this one
        write_file(beside, _plotly_assets()[0])
    write_file(path, page)
