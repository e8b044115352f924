"""What a test name, parameter, variant, reason or device name contributes to the HTML report, the step
summary and the PR comment is shown as text, never as markup, a link or a mention (issue 27, finding 6).

The payloads are the ones that got through before: an ``<a href>`` in a variant became a live link in
Plotly's legend and axis, and the Markdown passed raw ``<details>``, ``@mentions`` and ``[x](javascript:…)``.
"""

from __future__ import annotations

import copy
import json
import lzma
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_perfguard.report.markdown import markdown_summary

DATA = Path(__file__).resolve().parents[1] / "data" / "h200_planted_results.json.xz"

LINK = '<a href="https://evil.example/">click</a>'
IMG = "<img src=x onerror=alert(1)>"
DETAILS = "<details open><summary>hidden</summary>"
MENTION = "@octocat"
JS_LINK = "[x](javascript:alert(1))"
TICKS = "``` tail"


@pytest.fixture
def hostile() -> dict[str, Any]:
    """The real results file, its first variant renamed to a link and every case's shape made an image tag,
    with the other payloads in reasons, a gate's reason and the device name."""
    doc: dict[str, Any] = json.loads(lzma.decompress(DATA.read_bytes()).decode())
    doc = copy.deepcopy(doc)
    first = doc["results"][0]["variant"]
    for rec in doc["results"]:
        variant = LINK if rec["variant"] == first else rec["variant"]
        shape = rec["id"].split("[", 1)[1].rstrip("]")  # the whole parameter part: ids stay unique
        rec["id"] = f"t.py::test_x[{variant}-{IMG}{TICKS}-{shape}]"
        rec["params"] = {"kind": f"{IMG}{TICKS}", **(rec.get("params") or {})}  # the shape label reads these
        rec["variant"] = variant
        rec["reasons"] = [f"{DETAILS} {MENTION} {JS_LINK}", *rec.get("reasons", [])]
        for gate in rec.get("gates") or []:
            gate["reason"] = f"{MENTION} {JS_LINK} {gate.get('reason', '')}"
    doc["device"]["name"] = f"{MENTION} {LINK}"
    return doc


def _strings(obj: Any) -> Iterator[str]:
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _strings(value)
    elif isinstance(obj, list):
        for value in obj:
            yield from _strings(value)


def test_plotly_labels_are_escaped(hostile: dict[str, Any]) -> None:
    pytest.importorskip("plotly")
    from pytest_perfguard.report.html import render_html

    page = render_html(hostile)
    specs = [json.loads(s) for s in re.findall(r'<script type="application/json" id="spec-\d+">(.*?)</script>', page)]
    assert specs
    for text in _strings(specs):
        # plotly.js renders <a>, <b>, <br>, ... in names, categories and titles: no payload tag may reach it
        assert "<a " not in text and "<img" not in text and "<details" not in text, text
    names = {trace.get("name") for spec in specs for trace in spec["data"]}
    assert '&lt;a href="https://evil.example/"&gt;click&lt;/a&gt;' in names
    categories = [c for spec in specs for c in spec["layout"].get("xaxis", {}).get("categoryarray", [])]
    assert categories and all("&lt;img" in c for c in categories)
    assert LINK not in page and IMG not in page


def test_markdown_shows_payloads_as_text(hostile: dict[str, Any]) -> None:
    text = markdown_summary(hostile)
    # inside a code span (the reproduce command) text is shown as it is and nothing is rendered
    outside = re.sub(r"(`+) .*? \1", "", text)
    for payload in (LINK, IMG, DETAILS, MENTION, JS_LINK):
        assert payload not in outside, payload
    assert "&lt;details open&gt;" in text
    assert "@\u200doctocat" in text
    assert "\\[x\\](javascript:alert(1))" in text
    # no raw tag of a payload anywhere, and no unescaped "[" that could open a link
    assert not re.search(r"<(a|img|details open)\b", outside)
    assert not re.search(r"(?<!\\)\[x\]", outside)


def test_a_backtick_run_cannot_end_the_reproduce_code_span(hostile: dict[str, Any]) -> None:
    text = markdown_summary(hostile)
    row = next(line for line in text.splitlines() if line.startswith("| **") and "pytest " in line)
    code = row.rsplit("|", 2)[-2].strip()
    assert code.startswith("```` ") and code.endswith(" ````"), code  # one longer than the ``` inside


def test_the_mermaid_block_stays_one_block(hostile: dict[str, Any]) -> None:
    for rec in hostile["results"]:
        rec["test"] = 'test_x"\n```\n# injected'  # the chart's title
    text = markdown_summary(hostile)
    block = re.search(r"```mermaid\n(.*?)\n```\n", text, re.S)
    assert block is not None
    assert "# injected" not in text.split(block.group(0))[1].split("\n")[0]
    assert all(not line.startswith("```") for line in block.group(1).splitlines())
