"""End to end: a guarded run writes its results file, and `perfguard report` turns it into the HTML report
and the Markdown summary, the regression first, with its command.

Timing runs on a fake nanosecond clock that the kernels advance, so the verdicts are deterministic.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from pytest_perfguard.commands.cli import main
from pytest_perfguard.report.writers import WRITERS
from pytest_perfguard.settings import BY_NAME

pytest_plugins = ["pytester"]

SUITE = """
import os
import random
import pytest
import torch
from pytest_perfguard import perf_case

class Clock:
    ns = 0
    def __call__(self):
        return self.ns

CLOCK = Clock()
NOISE = random.Random(7)
SLOW = float(os.environ.get("PLANTED", "1.0"))

def oracle(x):
    return x * 2

def kernel(ns):
    def run(x):
        CLOCK.ns += int(ns * NOISE.lognormvariate(0.0, 0.005))
        return x * 2
    return run

@perf_case(variants={"lean": kernel(2000 * SLOW), "wide": kernel(5000)}, reference=oracle, against=kernel(1000),
           flops=lambda n: 2.0 * n, clock=CLOCK)
@pytest.mark.parametrize("n", [64, 256])
def test_double(n, perfguard_device):
    return (torch.randn(n, dtype=torch.float64),), {}
"""


def _run(p: pytest.Pytester, *args: str, planted: str = "1.0") -> pytest.RunResult:
    # An update in this process alone: the multi-process update has tests of its own (tests/test_stored_baseline.py)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PLANTED", planted)
        mp.setenv("PERFGUARD_UPDATE_PROCESSES", "1")
        return p.runpytest_inprocess("-p", "no:xdist", "-p", "no:cacheprovider", "--perfguard-case-budget", "5", *args)


def test_a_planted_regression_leads_the_html_and_markdown(
    pytester: pytest.Pytester, capsys: pytest.CaptureFixture[str]
) -> None:
    pytester.makepyfile(test_suite=SUITE)
    (pytester.path / ".ci" / "baselines").mkdir(parents=True)
    _run(pytester, "--perfguard-update-baseline").assert_outcomes(passed=4)
    # --perfguard-no-confirm: the fresh-process confirmation is the plugin's business, not the report's
    result = _run(pytester, "--perfguard", "--perfguard-no-confirm", "--perfguard-json", "r.json", planted="1.5")
    result.assert_outcomes(passed=2, failed=2)

    results = pytester.path / "r.json"
    md, html = pytester.path / "out" / "summary.md", pytester.path / "out" / "report.html"
    args = ["report", str(results), "--markdown", str(md)]
    has_plotly = True
    try:
        import plotly  # noqa: F401
    except ImportError:
        has_plotly = False
    assert main(args + (["--html", str(html)] if has_plotly else [])) == 0
    capsys.readouterr()

    text = md.read_text()
    assert "**2 regressed · 2 pass of 4 cases**" in text
    rows = [line for line in text.splitlines() if line.startswith("| **regressed**")]
    assert len(rows) == 2 and all("lean" in row for row in rows)
    assert "`pytest 'test_suite.py::test_double[lean-64]' --perfguard`" in text
    chart = re.search(r"```mermaid\n(.*?)```", text, re.S)
    assert chart is not None and 'x-axis ["n64", "n256"]' in chart.group(1)  # the shape label, as in the table
    assert len(re.findall(r"^  line \[", chart.group(1), re.M)) == 2

    if has_plotly:
        page = html.read_text()
        first_failure = page.index("Failing and inconclusive cases")
        assert page.index("test_double[lean-64]", first_failure) < page.index("Per variant, over the grid")
        specs = re.findall(r'<script type="application/json" id="spec-\d+">(.*?)</script>', page, re.S)
        figures = [json.loads(s) for s in specs]
        # one grid figure (lean, wide, timed against the reference), one gates figure, one per case
        assert len(figures) == 2 + 4
        assert {t.get("name") for f in figures for t in f["data"]} >= {"lean", "wide", "margin band"}


def test_the_plugin_writes_the_files_it_is_asked_for_as_the_command_does(
    pytester: pytest.Pytester, capsys: pytest.CaptureFixture[str]
) -> None:
    """The plugin and `perfguard report` write through one table of formats: the same file either way."""
    pytest.importorskip("plotly")
    pytester.makepyfile(test_suite=SUITE)
    result = _run(
        pytester,
        "--perfguard",
        "--perfguard-allow-missing",
        "--perfguard-json",
        "r.json",
        "--perfguard-html",
        "out/r.html",
    )
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(
        ["*perfguard: results written to r.json*", "*perfguard: HTML report written to out*r.html*"]
    )
    again = pytester.path / "again.html"
    assert main(["report", str(pytester.path / "r.json"), "--html", str(again)]) == 0
    assert f"{again}: HTML report written; open it in a browser" in capsys.readouterr().out
    assert (pytester.path / "out" / "r.html").read_text() == again.read_text()


def test_each_format_is_written_by_the_plugin_or_the_command_and_the_plugin_names_a_path() -> None:
    for writer in WRITERS.values():
        assert writer.setting or writer.flag, writer.name
        assert not writer.setting or BY_NAME[writer.setting].kind == "path", writer.name


def test_a_missing_extra_stops_the_run_before_anything_is_measured(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    lacking = replace(WRITERS["html"], needs="perfguard_no_such_module")
    assert lacking.missing() == "needs perfguard_no_such_module: pip install 'pytest-perfguard[report]'"
    monkeypatch.setitem(WRITERS, "html", lacking)
    pytester.makepyfile(test_suite=SUITE)
    result = _run(pytester, "--perfguard", "--perfguard-html", "r.html")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: --perfguard-html needs perfguard_no_such_module: pip install 'pytest-perfguard[report]', "
            "or drop --perfguard-html."
        ]
    )
