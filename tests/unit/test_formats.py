"""One set of formatters (report/formats.py) for every output: the terminal table, the Markdown summary, the
HTML report and the `perfguard` command print one case with the same words and figures, and list cases in
one status order."""

from __future__ import annotations

import ast
import html
import json
import lzma
from pathlib import Path
from typing import Any

import pytest

from pytest_perfguard.commands.cli import change_ci, main
from pytest_perfguard.record import CaseRecord, Outcome, Status
from pytest_perfguard.report import formats
from pytest_perfguard.report.formats import (
    STATUS_ORDER,
    format_change,
    format_mde,
    format_ratio,
    format_time,
    plus_minus,
    shape_label,
    status_rank,
)
from pytest_perfguard.report.markdown import markdown_summary
from pytest_perfguard.report.terminal import terminal_lines

ROOT = Path(__file__).resolve().parents[2]
CPU_RESULTS = ROOT / "tests" / "data" / "cpu_results.json.xz"
PACKAGE = ROOT / "pytest_perfguard"


@pytest.fixture
def doc() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(lzma.decompress(CPU_RESULTS.read_bytes()).decode())
    return loaded


def _timed(doc: dict[str, Any]) -> list[CaseRecord]:
    return [CaseRecord.from_json(r) for r in doc["results"] if r.get("median_ns") is not None]


def test_figures_read_the_same_in_every_unit_and_range() -> None:
    assert format_time(float("nan")) == format_ratio(float("inf")) == format_mde(None) == "-"
    assert format_ratio(0.9978, (0.9959, 0.9997)) == "0.998 [0.996, 1.000]"
    assert format_ratio(24.1) == "24.10" and format_ratio(123.45) == "123.5"  # about four figures, as times
    assert format_change(1.031, (1.028, 1.034)) == "+3.1% [+2.8, +3.4]" == format_change(1.031, [1.028, 1.034])
    assert format_change(0.95, (None, 1.0)) == "-5.0%"
    assert format_mde(0.019) == "+1.9%"
    assert formats.significant(4.0) == "4.00" and formats.significant(24.13) == "24.1"
    assert formats.significant(12345.6) == "12346"


def test_a_shape_is_labelled_by_its_parameters_else_its_id_else_its_workload() -> None:
    with_params = CaseRecord(id="t.py::test_x[v-4-128]", variant="v", params={"B": 4, "S": 128})
    assert shape_label(with_params) == "B4 S128"
    assert shape_label(CaseRecord(id="t.py::test_x[v-S64]", variant="v")) == "S64"  # a file without params
    assert shape_label(CaseRecord(id="t.py::test_x[v]", variant="v", workload_desc="float16[1,8]")) == "float16[1,8]"


def test_one_case_reads_the_same_in_the_terminal_markdown_and_html(doc: dict[str, Any]) -> None:
    """The shape label and the figures of a case are the same strings in all three outputs."""
    records = _timed(doc)
    table = "\n".join(terminal_lines(records, verbose=True))
    summary = markdown_summary(doc)
    page = None
    if _has_plotly():
        from pytest_perfguard.report.html import render_html

        page = render_html(doc)
    for r in records:
        shape, time, ratio, mde = (
            shape_label(r),
            format_time(r.median_ns, r.ci_ns),
            format_ratio(r.ratio, r.ratio_ci),
            format_mde(r.mde),
        )
        # the terminal has 120 columns: the time with the larger side of its CI, the rest as everywhere
        rows = [line for line in table.splitlines() if line.startswith(f"{r.test} ") and f" {r.variant} " in line]
        row = next(line for line in rows if f" {shape} " in line)
        for text in (f"{format_time(r.median_ns)} {plus_minus(r.median_ns, r.ci_ns)}", ratio, mde):
            assert f" {text} " in row, (r.id, text, row)
        row = next(
            line
            for line in summary.splitlines()
            if line.startswith(f"| {r.verdict} | {r.test} | {r.variant} | {shape} |")
        )
        for text in (time, ratio, mde):
            assert f"| {_md(text)} |" in row, (r.id, text, row)
        for text in (shape, time, ratio, mde) if page is not None else ():
            assert html.escape(text) in page, (r.id, text)


def test_the_compare_command_writes_times_and_ratios_as_the_reports_do(
    doc: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    assert main(["compare", str(path), str(path)]) == 0
    out = capsys.readouterr().out
    for r in _timed(doc):
        row = next(line for line in out.splitlines() if line.startswith(r.id + " "))
        change = change_ci(r, r)
        assert change is not None
        assert f"  {format_time(r.median_ns, r.ci_ns)}  " in row and f"  {format_ratio(*change)}  " in row, row
        assert f"  {format_mde(r.mde)}  " in row, row


def test_every_output_lists_what_needs_a_look_in_one_status_order(doc: dict[str, Any]) -> None:
    """The terminal's "needs a look" rows and the Markdown's attention list follow STATUS_ORDER."""

    def case(variant: str, verdict: Status, outcome: Outcome) -> dict[str, Any]:
        return {"id": f"t.py::test_k[{variant}-1]", "test": "test_k", "variant": variant, "verdict": str(verdict),
                "outcome": str(outcome), "reasons": [f"{verdict} here"]}  # fmt: skip

    doc["results"] = [
        case("a", Status.INCONCLUSIVE, Outcome.PASSED),
        case("b", Status.REGRESSED, Outcome.FAILED),
        case("c", Status.ERROR, Outcome.FAILED),
    ]
    lines = terminal_lines([CaseRecord.from_json(r) for r in doc["results"]])
    assert lines[2] == "needs a look (3):"
    assert [line.split()[0] for line in lines[3::2][:3]] == ["b", "c", "a"]  # regressed, error, inconclusive
    summary = markdown_summary(doc)
    assert summary.index("b-1") < summary.index("c-1") < summary.index("a-1")
    assert sorted(["inconclusive", "error", "regressed"], key=status_rank) == ["regressed", "error", "inconclusive"]
    assert set(STATUS_ORDER) >= {str(s) for s in Status} | {str(o) for o in Outcome if o is not Outcome.PASSED}


def test_no_module_but_formats_defines_a_formatter() -> None:
    """The pairs that drifted apart (format_time/fmt_time, two shape_labels, two status orders) stay one."""
    names = {"format_time", "fmt_time", "format_ratio", "fmt_ratio", "shape_label", "fmt_change", "fmt_mde"}
    names |= {"STATUS_ORDER", "NEEDS_A_LOOK", "plus_minus", "format_change", "format_mde"}
    found = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "formats.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and node.name in names:
                found.append(f"{path.relative_to(ROOT)}: def {node.name}")
            elif isinstance(node, ast.Assign):
                found += [
                    f"{path.relative_to(ROOT)}: {t.id} ="
                    for t in node.targets
                    if isinstance(t, ast.Name) and t.id in names
                ]
    assert not found, found


def _md(text: str) -> str:
    """As the Markdown summary writes a cell: brackets escaped, so that no link can open."""
    return text.replace("[", "\\[").replace("]", "\\]")


def _has_plotly() -> bool:
    try:
        import plotly  # noqa: F401
    except ImportError:
        return False
    return True
