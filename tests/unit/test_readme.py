"""The README's legend says what every column of the table and every verdict means, and which of pass,
fail or unverified each one makes of the run: a verdict or a column added without a line there fails here."""

from __future__ import annotations

import re
from pathlib import Path

from pytest_perfguard.judge.policy import decision
from pytest_perfguard.record import Status
from pytest_perfguard.report.terminal import SHORT_HEADERS

README = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")


def _legend() -> tuple[dict[str, str], dict[str, str]]:
    match = re.search(r"<!-- legend:start -->\n(.*?)\n<!-- legend:end -->", README, re.S)
    assert match, "README.md needs its legend between <!-- legend:start --> and <!-- legend:end -->"
    columns, verdicts = {}, {}
    for line in match.group(1).splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        name = cells[0].strip("`")
        if len(cells) == 2 and not set(name) <= {"-"} and name != "column":
            columns[name] = cells[1]
        elif len(cells) == 3 and not set(name) <= {"-"} and name != "verdict":
            verdicts[name] = cells[2]
    return columns, verdicts


def test_every_column_of_the_table_is_in_the_legend() -> None:
    columns, _ = _legend()
    shown = {h for h in SHORT_HEADERS if h not in ("variant", "shape", "verdict")} | {"host +", "Δ base rev"}
    assert shown <= set(columns), shown - set(columns)


def test_every_verdict_is_in_the_legend_with_what_it_makes_of_the_run() -> None:
    _, verdicts = _legend()
    assert set(verdicts) == {s.value for s in Status}
    for status in Status:
        failed = verdicts[status.value] == "fail"
        timed = status is not Status.CORRECT
        made = decision(status.value, failed, timed, 0.01, 0.05) or "pass"
        assert made == verdicts[status.value], status
