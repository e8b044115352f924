"""The report of a results file: Markdown summary, HTML page, `perfguard merge` and `perfguard report`.

They read a real results file (tests/data/h200_planted_results.json.xz: an H200 guard run against a baseline
planted 5% slower), so the fields are the ones the plugin writes, not a hand-made imitation.
"""

from __future__ import annotations

import copy
import json
import lzma
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_perfguard.commands.cli import main
from pytest_perfguard.report.markdown import markdown_summary
from pytest_perfguard.report.merge import MERGED_KIND, merge_files, read_runs
from pytest_perfguard.report.results import ResultsError, RunInfo, read_results
from pytest_perfguard.report.view import build

DATA = Path(__file__).resolve().parents[1] / "data" / "h200_planted_results.json.xz"
ATTENTION = 11  # 8 regressed + 3 inconclusive in the file


@pytest.fixture
def doc() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(lzma.decompress(DATA.read_bytes()).decode())
    return loaded


def write(path: Path, obj: Any) -> Path:
    path.write_text(json.dumps(obj))
    return path


def as_device(doc: dict[str, Any], name: str, slug: str) -> dict[str, Any]:
    other = copy.deepcopy(doc)
    other["device"] = {**other["device"], "name": name, "slug": slug}
    return other


# ------------------------------------------------------------------------------------------------- model


def test_cases_come_failing_first_then_inconclusive_with_a_command(doc: dict[str, Any]) -> None:
    report = build(doc)
    statuses = [c.status for c in report.cases]
    assert statuses == ["regressed"] * 8 + ["inconclusive"] * 3 + ["pass"]
    assert report.counts() == [("regressed", 8), ("inconclusive", 3), ("pass", 1)]
    first = report.cases[0]
    assert first.command() == f"pytest '{first.id}' --perfguard"
    undecided = report.attention()[-1]
    assert undecided.command().endswith("--perfguard --perfguard-case-budget 20")
    # The decisive reason of a regression is its regressed gate's, even when another gate is listed first.
    scalar = next(c for c in report.cases if c.id.endswith("[cuda_scalar-B8-H8-S128]"))
    assert scalar.decisive_reason().startswith("ratio vs baseline ratio")
    # A time regression not confirmed in a fresh process is inconclusive: the reason says so.
    sdpa = next(c for c in report.cases if c.id.endswith("[sdpa-B1-H1-S128]"))
    assert sdpa.status == "inconclusive" and sdpa.decisive_reason().startswith("not confirmed")


def test_git_sha_is_read_from_the_file_never_from_git(doc: dict[str, Any]) -> None:
    assert build(doc).git_shas == []
    doc["run"] = {"git_sha": "0123456789abcdef"}
    assert build(doc).git_shas == ["0123456789abcdef"]
    del doc["run"]
    doc["device"]["git_sha"] = "fedcba"
    assert build(doc).git_shas == ["fedcba"]


def test_the_run_information_is_typed_strict_and_read_from_older_files_device(
    doc: dict[str, Any], tmp_path: Path
) -> None:
    """What a run measured and compared with reaches every reader as RunInfo fields: a value of the wrong
    type is an error naming the field, not a revision that reads "None" somewhere downstream."""
    doc["run"] = {"git_sha": "0123456789ab", "git_dirty": "d1", "against": "origin/main", "base_sha": "fedcba"}
    info = read_results(write(tmp_path / "r.json", doc)).info
    assert info == RunInfo(git_sha="0123456789ab", git_dirty="d1", against="origin/main", base_sha="fedcba")
    assert info.commit == "0123456789ab + uncommitted changes (d1)"
    doc["run"] = {}
    doc["device"]["git_sha"] = "olderfile"  # files of older versions kept the commit in their device
    assert read_results(write(tmp_path / "r.json", doc)).info == RunInfo(git_sha="olderfile")
    doc["run"] = {"base_sha": 12}
    with pytest.raises(ResultsError, match="run field 'base_sha' must be a string or null, got int"):
        read_results(write(tmp_path / "r.json", doc))


# ---------------------------------------------------------------------------------------------- markdown


def test_markdown_puts_attention_first_then_a_folded_table_then_a_chart(doc: dict[str, Any]) -> None:
    text = markdown_summary(doc)
    assert text.startswith("### perfguard: NVIDIA H200\n")
    assert "**8 regressed · 3 inconclusive · 1 pass of 12 cases**" in text
    attention = text.index("#### Failing and inconclusive")
    table = text.index("<details><summary>All 12 cases</summary>")
    chart = text.index("```mermaid")
    assert attention < table < chart
    rows = [line for line in text[attention:table].splitlines() if line.startswith("| **")]
    assert (
        len(rows) == ATTENTION and rows[0].startswith("| **regressed**") and rows[-1].startswith("| **inconclusive**")
    )
    assert "`pytest 'tests/perf/test_attention.py::test_attention_grid[" in rows[0]
    assert "</details>" in text[table:chart]
    assert "**SDPA backend** cudnn" in text and "**git SHA** not recorded" in text
    assert markdown_summary(doc, notes=["perfguard: results written to r.json"]).endswith(
        "\n- perfguard: results written to r.json\n"
    )


def test_mermaid_chart_has_one_line_per_variant_and_a_named_legend(doc: dict[str, Any]) -> None:
    text = markdown_summary(doc)
    block = re.search(r"```mermaid\n(.*?)```", text, re.S)
    assert block is not None
    chart = block.group(1)
    assert "\nxychart-beta\n" in chart
    assert 'x-axis ["B1 D64 H1 S128", "B4 D64 H8 S128", "B8 D64 H8 S128", "B16 D64 H8 S512"]' in chart
    lines = re.findall(r"^  line \[(.*)\]$", chart, re.M)
    assert len(lines) == 3
    for values in lines:
        assert all(re.fullmatch(r"-?\d+\.\d{3}", v) for v in values.split(", ")), values  # no exponents
    assert "plotColorPalette" in chart
    # The reference is drawn last, in black; the legend names each line with its colour.
    assert "🟦 cuda_scalar · 🟧 triton_flash · ⬛ sdpa" in text
    assert 'y-axis "log2(time / sdpa)"' in chart  # cuda_scalar is ~10x sdpa: a linear axis would flatten the rest


def test_markdown_escapes_table_cells_and_fits_a_comment(doc: dict[str, Any]) -> None:
    doc["results"][0]["reasons"] = ["a | b"]
    doc["results"][0]["gates"] = []
    doc["results"][0]["verdict"] = "error"
    text = markdown_summary(doc)
    assert "a \\| b" in text
    many = copy.deepcopy(doc)
    many["results"] = [{**r, "id": f"{r['id']}-{i}"} for i in range(40) for r in doc["results"]]
    short = markdown_summary(many, limit=20_000)
    assert len(short) <= 20_000
    assert "rows left out to fit a comment" in short


def test_markdown_of_a_run_with_only_skips_says_so() -> None:
    device = {"slug": "cpu", "name": "CPU"}
    skipped = {
        "id": "t.py::test_x[cuda-S8]",
        "variant": "cuda",
        "outcome": "skipped",
        "reasons": ["needs a CUDA GPU"],
    }
    text = markdown_summary({"kind": "perfguard-results", "schema_version": 1, "device": device, "results": [skipped]})
    assert "No case failed and none was inconclusive." in text
    assert "1 skipped of 1 cases" in text
    assert "```mermaid" not in text  # nothing was timed: no chart


# ------------------------------------------------------------------------------------------------- HTML


def test_html_is_self_contained_with_summary_cases_and_figures(doc: dict[str, Any]) -> None:
    pytest.importorskip("plotly")
    from plotly.offline import get_plotlyjs

    from pytest_perfguard.report.html import render_html

    page = render_html(doc)
    assert page.startswith("<!DOCTYPE html>")
    assert page.count(get_plotlyjs()) == 1  # plotly.js embedded once
    ours = page.replace(get_plotlyjs(), "")
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", ours), "the report must not load anything at view time"
    assert "<script src" not in ours and "<link" not in ours
    assert "8 regressed" in page and "3 inconclusive" in page and "1 pass" in page
    attention = page.index("Failing and inconclusive cases")
    grid = page.index("Per variant, over the grid")
    assert attention < grid
    assert page.index("pytest &#x27;tests/perf/test_attention.py::test_attention_grid[") > attention
    for fact in ("NVIDIA H200", "2.11.0+cu130", "3.6.0", "13.0", "cudnn", "git SHA"):
        assert fact in page
    specs = re.findall(r'<script type="application/json" id="spec-\d+">(.*?)</script>', page, re.S)
    # grid + gates figure, and one figure per case (a case shown twice is stored once)
    assert len(specs) == 2 + 12
    figures = [json.loads(s) for s in specs]
    names = {t.get("name") for f in figures for t in f["data"]}
    assert {"cuda_scalar", "triton_flash", "sdpa", "margin band"} <= names
    case = next(f for f in figures if any(t.get("name") == "sdpa (reference)" for t in f["data"]))
    assert len(case["data"][0]["y"]) == 40  # the block medians, as points


def test_html_escapes_what_the_file_says(doc: dict[str, Any]) -> None:
    pytest.importorskip("plotly")
    from pytest_perfguard.report.html import render_html

    doc["results"][0]["reasons"] = ["<script>alert(1)</script>"]
    doc["results"][0]["id"] = "t.py::test_x[</script><b>]"
    page = render_html(doc)
    assert "<script>alert(1)" not in page
    assert "</script><b>" not in page


def test_write_html_is_atomic_and_names_a_missing_plotly(
    doc: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("plotly")
    from pytest_perfguard.report import html as html_report

    out = tmp_path / "r" / "report.html"
    html_report.write_html(out, doc)
    assert out.read_text().endswith("</html>\n")
    script = html_report.plotly_script_name()
    # no temp file left behind; plotly.js beside the page, once, whatever the number of reports
    html_report.write_html(out.with_name("second.html"), doc)
    assert sorted(p.name for p in out.parent.iterdir()) == sorted(["report.html", "second.html", script])
    page = out.read_text()
    assert f'<script src="{script}"></script>' in page and len(page) < 1_500_000, len(page)
    monkeypatch.setitem(sys.modules, "plotly.offline", None)
    with pytest.raises(html_report.ReportDependencyError, match=r"pip install 'pytest-perfguard\[report\]'"):
        html_report.render_html(doc)


# ------------------------------------------------------------------------------------------------ merge


RUN = {"git_sha": "a" * 40, "against": "main", "base_sha": "b" * 40}  # what a run under --perfguard-against says


def other_cases(doc: dict[str, Any]) -> dict[str, Any]:
    """The same records under other case ids: another runner's share of the suite."""
    other = copy.deepcopy(doc)
    for record in other["results"]:
        record["id"] = record["id"].replace("::", "::l4_", 1)
    return other


def test_merge_keeps_devices_apart_and_records_sources(doc: dict[str, Any], tmp_path: Path) -> None:
    a = write(tmp_path / "h200.json", doc)
    b = write(tmp_path / "l4.json", as_device(other_cases(doc), "NVIDIA L4", "nvidia-l4"))
    merged = merge_files([a, b])
    assert merged["kind"] == MERGED_KIND
    assert [run["source"] for run in merged["runs"]] == [str(a), str(b)]
    report = build(merged)
    assert len(report.cases) == 24 and {c.device for c in report.cases} == {"nvidia-h200", "nvidia-l4"}
    # A merged file merges again, and reads back run by run under the strict loader.
    out = tmp_path / "all.json"
    assert main(["merge", str(a), str(b), "-o", str(out)]) == 0
    runs = read_runs(out)
    assert [r.slug for r in runs] == ["nvidia-h200", "nvidia-l4"]
    text = markdown_summary(json.loads(out.read_text()))
    assert "### perfguard: NVIDIA H200 + NVIDIA L4" in text
    assert "(NVIDIA L4)" in text  # attention rows say which device


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d, p: p.write_text(json.dumps(d)[:5000]), r"bad\.json"),
        (
            lambda d, p: write(p, {**d, "schema_version": 2}),
            r"results schemas differ \(.*good\.json is results schema 1, "
            r".*bad\.json is results schema 2\)",
        ),
        (lambda d, p: write(p, d), r"bad\.json: case '.*' on device 'nvidia-h200' is also in .*good\.json"),
        (lambda d, p: p.write_text(""), r"bad\.json: the results file is empty"),
        (
            lambda d, p: write(p, as_device(d, "NVIDIA L4", "nvidia-l4")),
            r"bad\.json: case '.*' ran on device 'nvidia-l4' here and on 'nvidia-h200' in .*good\.json; "
            r"a case runs on one runner kind only",
        ),
        (
            lambda d, p: write(p, {**other_cases(d), "run": {**RUN, "git_sha": "0" * 40}}),
            r"bad\.json: results of commit 000000000000, but .*good\.json has aaaaaaaaaaaa; "
            r"merge the results of one commit",
        ),
        (
            lambda d, p: write(p, {**other_cases(d), "run": {**RUN, "base_sha": "1" * 40}}),
            r"bad\.json: results of base revision 111111111111, but .*good\.json has bbbbbbbbbbbb",
        ),
        (
            lambda d, p: write(p, other_cases(d)),
            r"bad\.json: records no commit \(it ran outside a git checkout, or with an older pytest-perfguard\), "
            r"but .*good\.json has commit aaaaaaaaaaaa; merge the results of one commit",
        ),
        (
            lambda d, p: write(p, {**other_cases(d), "run": {"git_sha": RUN["git_sha"]}}),
            r"bad\.json: was not run against a base revision \(no --perfguard-against\), "
            r"but .*good\.json has base revision bbbbbbbbbbbb",
        ),
        (
            lambda d, p: write(p, {**other_cases(d), "run": {"git_sha": RUN["git_sha"], "against": "main"}}),
            r"bad\.json: has no base revision \(its --perfguard-against main did not resolve\)",
        ),
    ],
    ids=[
        "truncated",
        "schema-mismatch",
        "same-case-same-device",
        "empty-file",
        "same-case-other-device",
        "other-commit",
        "other-base",
        "no-commit",
        "no-base",
        "unresolved-base",
    ],
)
def test_merge_refuses_bad_input_naming_the_file(
    doc: dict[str, Any], tmp_path: Path, make: Any, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    good = write(tmp_path / "good.json", {**doc, "run": RUN})
    bad = tmp_path / "bad.json"
    make(doc, bad)
    out = tmp_path / "out.json"
    assert main(["merge", str(good), str(bad), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert re.search(message, err), err
    assert "Traceback" not in err
    assert not out.exists()  # nothing half-written


def test_merge_refuses_a_schema_it_does_not_know(
    doc: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    newer = write(tmp_path / "newer.json", {**doc, "schema_version": 99})
    assert main(["merge", str(newer), "-o", str(tmp_path / "out.json")]) == 1
    err = capsys.readouterr().err
    assert f"{newer}: written by a newer pytest-perfguard (schema 99 > 1): upgrade pytest-perfguard" in err
    merged = write(tmp_path / "merged.json", {"kind": MERGED_KIND, "schema_version": 7, "runs": [doc]})
    assert main(["merge", str(merged), "-o", str(tmp_path / "out.json")]) == 1
    assert f"{merged}: merged by a newer pytest-perfguard (merged schema 7 > 1)" in capsys.readouterr().err


def test_an_empty_merge_is_an_error(doc: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = write(tmp_path / "empty.json", {**doc, "results": []})
    assert main(["merge", str(empty), "-o", str(tmp_path / "out.json")]) == 1
    assert "nothing to merge: " + str(empty) + " hold no results" in capsys.readouterr().err


# -------------------------------------------------------------------------------------------------- CLI


def test_report_cli_writes_html_and_markdown(
    doc: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("plotly")
    src = write(tmp_path / "r.json", doc)
    html, md = tmp_path / "out" / "r.html", tmp_path / "out" / "r.md"
    assert main(["report", str(src), "--html", str(html), "--markdown", str(md)]) == 0
    assert html.read_text().startswith("<!DOCTYPE html>")
    assert md.read_text() == markdown_summary(doc)
    assert main(["report", str(src), "--markdown", "-"]) == 0
    assert capsys.readouterr().out.endswith(markdown_summary(doc))


def test_report_cli_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path / "r.json")]) == 2
    assert "add --html FILE and/or --markdown FILE" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "missing.json"), "--markdown", "-"]) == 1
    assert "missing.json: no such results file" in capsys.readouterr().err


@pytest.mark.fresh_interpreter
def test_the_cli_does_not_import_torch_or_plotly() -> None:
    """`perfguard` runs in jobs that have neither (the comment workflow, a laptop with the results file)."""
    code = (
        "import sys; from pytest_perfguard.commands import cli; from pytest_perfguard.report import merge, markdown; "
        "cli.build_parser(); print('torch' in sys.modules, 'plotly' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60).stdout
    assert out.split() == ["False", "False"]
