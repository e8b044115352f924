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

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .figures import Figure, case_figure, gates_figure, grid_figure, status_color
from .formats import escaped, format_change, format_mde, format_ratio, format_time
from .merge import write_file
from .view import (
    Case,
    Report,
    build,
    counts_line,
    environment,
    fmt_tflops,
    gate_text,
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
        f'<span style="background:{status_color(status)}">{n} {escaped(status)}</span>' for status, n in report.counts()
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
        reasons = "".join(f"<li>{escaped(r)}</li>" for r in case.rec.reasons) or "<li>no reason recorded</li>"
        figure = page.plot(case_figure(case), lazy=True, key=f"{case.device}::{case.id}")
        opened = " open" if index < OPEN_FIGURES else ""
        out.append(
            f'<details class="case attn" style="--c:{status_color(case.status)}"{opened}><summary>'
            f'<div><span class="status">{escaped(case.status)}</span>{_device_note(report, case)} '
            f"{escaped(case.decisive_reason())}</div><div><code>{escaped(case.command())}</code></div>"
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
            + "".join(f"<td>{escaped(cell)}</td>" for cell in (row.label, row.head, row.base, row.change))
            + "</tr>"
            for row in kernel.rows()
        )
        blocks.append(
            f'<p><code>{escaped(title)}</code></p><table class="explain"><tr><th>metric</th><th>head</th>'
            f"<th>base</th><th>change</th></tr>{rows}</table>"
        )
    return (
        f'<div class="explain"><h4>Why: Nsight Compute, head vs base</h4><p>{escaped(e.headline())}</p>'
        f'<p class="muted">{escaped(e.source())}</p>{"".join(blocks)}</div>'
    )


def _device_note(report: Report, case: Case) -> str:
    return f' <span class="muted">on {escaped(case.device_name)}</span>' if len(report.devices) > 1 else ""


def _case_details(report: Report, case: Case, page: _Page) -> str:
    env = ", ".join(f"{k} {v}" for k, v in sorted(case.env.items())) or "not recorded"
    facts = [
        ("case", f"<code>{escaped(case.id)}</code>"),
        ("workload", escaped(case.rec.workload_desc or "-")),
        ("time (95% CI)", escaped(format_time(case.rec.median_ns, case.rec.ci_ns))),
        ("TFLOP/s (95% CI)", escaped(fmt_tflops(case))),
        (
            f"ratio vs {escaped(case.against or 'reference')} (95% CI)",
            escaped(format_ratio(case.rec.ratio, case.rec.ratio_ci)),
        ),
        ("MDE (95% power)", escaped(format_mde(case.mde))),
        (
            "blocks, stop",
            escaped(f"{case.rec.blocks if case.rec.blocks is not None else '-'}, {case.rec.stop_reason or '-'}"),
        ),
        ("environment", escaped(env)),
        ("reproduce", f"<code>{escaped(case.command())}</code>"),
    ]
    for g in case.gates:
        facts.append((f"{escaped(g.name)} gate", escaped(f"{g.status}: {g.reason or format_change(g.estimate, g.ci)}")))
    reasons = [r for r in case.rec.reasons if not any(r == g.reason for g in case.gates)]
    if reasons:
        facts.append(("notes", "<br>".join(escaped(r) for r in reasons)))
    rows = "".join(f"<tr><td>{k}</td><td>{v}</td></tr>" for k, v in facts)
    summary = "".join(
        f'<span title="{escaped(text)}">{escaped(text)}</span>'
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
        f'<details class="case" style="--c:{status_color(case.status)}"><summary>{summary}</summary>'
        f'<div class="body"><table class="env">{rows}</table>{_explain(case)}'
        f"{page.plot(case_figure(case), lazy=True, key=f'{case.device}::{case.id}')}</div></details>"
    )


def _where(report: Report, device: str) -> str:
    """ " on NVIDIA L4" when the file holds several devices, so two grids of one test are told apart."""
    return f" on {report.device_label(device)}" if len(report.devices) > 1 else ""


def _figures(page: _Page, heading: str, figures: Sequence[Figure | None]) -> list[str]:
    """A section of figures, left out whole when there is nothing to draw (a run with nothing timed)."""
    drawn = [page.plot(fig) for fig in figures if fig is not None]
    return [f"<h2>{escaped(heading)}</h2>", *drawn] if drawn else []


def render_html(doc: Mapping[str, Any], *, script: str | None = None) -> str:
    """The whole report as one HTML page. plotly.js (4.8 MB) is embedded once, so the page opens without a
    network, unless `script` names the file beside the page that holds it (write_html): then the page is
    tens of kilobytes and still needs no network."""
    plotly_js, template = _plotly_assets()
    plotly_tag = f'<script src="{escaped(script)}"></script>' if script else f"<script>{plotly_js}</script>"
    report = build(doc)
    page = _Page()
    devices = " + ".join(d.label for d in report.devices.values()) or "unknown device"
    env_rows = "".join(f"<tr><td>{escaped(k)}</td><td>{escaped(v)}</td></tr>" for k, v in environment(report))
    errors = "".join(f"<li>{escaped(e)}</li>" for e in report.errors)
    sections = [
        f"<h1>perfguard report: {escaped(devices)}</h1>",
        f'<p class="chips">{_chips(report)}</p><p class="muted">{escaped(counts_line(report))}</p>',
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
            sections.append(f'<h3>{escaped(title)}</h3><div class="head">{head}</div>')
            sections += [_case_details(report, case, page) for case in cases]
    config = json.dumps(_PLOT_CONFIG)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>perfguard: {escaped(counts_line(report))}</title><style>{_CSS}</style>"
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
