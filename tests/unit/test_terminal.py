"""What a person reads in the terminal: the 120-column table, shape labels, the progress line's rate limit,
and `perfguard compare` on real results files."""

from __future__ import annotations

import io
import json
import lzma
import re
import tarfile
from pathlib import Path
from typing import Any

import pytest

from pytest_perfguard.commands.cli import main
from pytest_perfguard.measure.timing import Progress
from pytest_perfguard.record import CaseRecord, Outcome
from pytest_perfguard.report.formats import shape_label
from pytest_perfguard.report.terminal import WIDTH, needs_a_look, terminal_lines
from pytest_perfguard.run.progress import ProgressLine, done_text

ROOT = Path(__file__).resolve().parents[2]
GPU_RAW = ROOT / "benchmarks" / "results" / "ab_2026-11-23" / "raw.tar.xz"
CPU_RESULTS = ROOT / "tests" / "data" / "cpu_results.json.xz"


def _gpu_doc(name: str) -> dict[str, Any]:
    """A results file of the recorded H200 A/B campaign, read from its archive."""
    with tarfile.open(GPU_RAW) as tar:
        member = tar.extractfile(f"./ab_h200/{name}")
        assert member is not None
        doc: dict[str, Any] = json.load(io.TextIOWrapper(member, encoding="utf-8"))
    return doc


def _records(doc: dict[str, Any]) -> list[CaseRecord]:
    return [CaseRecord.from_json(r) for r in doc["results"]]


@pytest.fixture(scope="module")
def gpu() -> list[CaseRecord]:
    return _records(_gpu_doc("aa_0.json"))


@pytest.fixture(scope="module")
def cpu() -> list[CaseRecord]:
    return _records(json.loads(lzma.decompress(CPU_RESULTS.read_bytes()).decode()))


# ------------------------------------------------------------------------------------------------- table


@pytest.mark.parametrize("which", ["cpu", "gpu"])
def test_table_fits_120_columns_with_the_cases_that_need_a_look_first(
    which: str, request: pytest.FixtureRequest
) -> None:
    records: list[CaseRecord] = request.getfixturevalue(which)
    lines = terminal_lines(records)
    assert max(len(line) for line in lines) <= WIDTH, [line for line in lines if len(line) > WIDTH]
    assert not any("…" in line for line in lines)  # the realistic shapes fit without cutting
    look = [r for r in records if needs_a_look(r)]
    assert look, "both files hold inconclusive cases"
    first_group = next(i for i, line in enumerate(lines) if line.startswith("test_attention_"))
    assert lines[2] == f"needs a look ({len(look)}):"
    for r in look:  # each with its node id and reason, above the passing cases
        at = next(i for i, line in enumerate(lines) if line.startswith(f"    {r.id}: "))
        assert at < first_group and lines[at - 1].startswith(r.variant) and "inconclusive" in lines[at - 1]
        assert "straddles" in " ".join(lines[at : at + 3])
    rows = [line for line in lines if not line.startswith("    ")]  # all but the reasons
    assert len(rows) <= sum(r.timed for r in records) + 8  # the skipped cases take one line, not one each


def test_skipped_cases_are_counted_by_reason_on_one_line(cpu: list[CaseRecord]) -> None:
    lines = terminal_lines(cpu)
    assert "skipped 25: 25 needs a CUDA GPU: torch.cuda.is_available() is False" in lines
    assert not any(line.startswith("triton_flash") for line in lines)


def test_verbose_table_has_every_column_skip_rows_and_reasons(cpu: list[CaseRecord]) -> None:
    lines = terminal_lines(cpu, verbose=True)
    assert "TFLOP/s [95% CI]" in lines[0] and "ratio vs against [95% CI]" in lines[0]
    assert sum("needs a CUDA GPU" in line for line in lines) == 25
    assert any(line.startswith("inconclusive: tests/perf/") for line in lines)


def test_gpu_table_shows_the_ab_gate(gpu: list[CaseRecord]) -> None:
    lines = terminal_lines(gpu)
    assert "Δ base rev" in lines[0]
    row = next(line for line in lines if line.startswith("cuda_scalar   B1 D64 H1 S128 "))
    assert re.search(r"72\.32 µs ±0\.2% +10\.4 ±0\.5% +-1\.4% ±0\.2 +\+0\.3% ±0\.1 +\+1\.9% +pass$", row), row


@pytest.mark.parametrize(
    ("params", "label"),
    [
        ({"B": 4, "H": 8, "S": 128, "D": 64}, "B4 H8 S128 D64"),
        ({"S": 2048, "D": 128, "dtype": "torch.bfloat16", "causal": True}, "S2048 D128 bf16 causal"),
        ({"S": 8, "dtype": "torch.float16", "causal": False, "window": None}, "S8 fp16"),
        ({"seqlen": 4096, "mode": "fwd"}, "seqlen:4096 fwd"),
    ],
)
def test_shape_labels_drop_noise(params: dict[str, Any], label: str) -> None:
    assert shape_label(CaseRecord(id="t", params=params)) == label


def test_a_case_without_parameters_is_labelled_by_its_workload() -> None:
    assert shape_label(CaseRecord(id="t", workload_desc="float16[1,2,8,16]")) == "float16[1,2,8,16]"


def test_a_failed_untimed_case_needs_a_look_with_its_reason() -> None:
    bad = CaseRecord(id="t.py::test_k[v-8]", test="test_k", variant="v", outcome=Outcome.FAILED, reasons=["boom"])
    lines = terminal_lines([bad])
    assert lines[2:4] == ["needs a look (1):", lines[3]] and lines[3].startswith("v ")
    assert lines[4] == "    t.py::test_k[v-8]: boom"


# ---------------------------------------------------------------------------------------------- progress


class FakeReporter:
    """The part of pytest's terminal reporter the progress line uses, recording what it writes."""

    def __init__(self) -> None:
        self.currentfspath: Any = "t.py"
        self.out: list[str] = []

    def rewrite(self, line: str, erase: bool = False) -> None:
        self.out.append("\r" + line)

    def write(self, text: str, flush: bool = False) -> None:
        self.out.append(text)


def test_progress_line_is_rate_limited_and_cleared() -> None:
    now = [0.0]
    reporter = FakeReporter()
    line = ProgressLine(reporter, live=True, rate=10.0, clock=lambda: now[0])
    update = line.callback("test_k[v-8]")
    assert update is not None
    widths = iter([0.5, 0.2, 0.1, 0.05, 0.02, 0.01])
    for t in (0.0, 0.03, 0.06, 0.1, 0.15, 0.21):  # drawn at 0.0, 0.1 and 0.21 only
        now[0] = t
        update(Progress(blocks=int(t * 100), elapsed_s=t, budget_s=5.0, target=0.01, widest=lambda: next(widths)))
    drawn = [text for text in reporter.out if text.startswith("\rperfguard:")]
    assert drawn == [
        "\rperfguard: 0 blocks  CI ±50.00% (target 1.00%)  0.0 s, 5.0 s left  test_k[v-8]",
        "\rperfguard: 10 blocks  CI ±20.00% (target 1.00%)  0.1 s, 4.9 s left  test_k[v-8]",
        "\rperfguard: 21 blocks  CI ±10.00% (target 1.00%)  0.2 s, 4.8 s left  test_k[v-8]",
    ]
    line.finished([])
    assert reporter.out[-2:] == ["\r", "\r"] and reporter.currentfspath == "t.py"


def test_progress_off_a_terminal_is_one_line_per_measured_case(cpu: list[CaseRecord]) -> None:
    reporter = FakeReporter()
    line = ProgressLine(reporter, live=False)
    assert line.callback("x") is None
    line.finished(cpu)
    texts = [t for t in reporter.out if t.startswith("perfguard:")]
    assert len(texts) == sum(r.timed for r in cpu) == 10
    assert texts[0].startswith("perfguard: test_attention_grid[sdpa] B1 D64 H1 S128: ")  # a file sorts params
    assert re.search(r": [\d.]+ [µm]?s ±[\d.]+%, \d+ blocks in [\d.]+ s \(\w+(\+remeasured:\w+)?\): \w", texts[0])
    skipped = next(r for r in cpu if not r.timed)
    assert done_text(skipped).endswith(": skipped")


# ----------------------------------------------------------------------------------------------- compare


def test_compare_answers_is_this_real(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "aa.json", tmp_path / "planted.json"
    a.write_text(json.dumps(_gpu_doc("aa_0.json")), encoding="utf-8")
    b.write_text(json.dumps(_gpu_doc("planted_0.02.json")), encoding="utf-8")
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("case "))
    assert re.search(r"B/A \[95% CI\] +MDE +B's A/B gate +verdict \(margin 5\.0%\)$", header)
    row = next(line for line in out.splitlines() if "test_attention_grid[cuda_scalar-B1-H1-S128]" in line)
    assert re.search(r"0\.998 \[0\.996, 1\.000\] +\+2\.1% +\+2\.6% \[\+2\.4, \+2\.8\] regressed +pass$", row), row
    assert "B's own A/B gate (head against its base revision in one process, the firmer evidence): " in out
    assert "is it real?" in out
    assert (
        "    pytest 'tests/perf/test_attention.py::test_attention_shapes[triton_flash-S239]' --perfguard "
        "--perfguard-case-budget 20" in out
    )
    assert "--perfguard-against 92a8e77f79ef" in out  # A's revision, for the cases B/A calls regressed or faster


def test_a_row_that_needs_a_look_gets_one_short_reason_and_v_gets_them_all() -> None:
    """The busy-neighbour guard on an H100 (2026-11-28): the row's reason said the disturbance twice and every
    note after it, four lines a case. The table says the first thing that decided it, once; -v says all."""
    raw = ROOT / "benchmarks" / "results" / "green_h100_2026-11-28" / "raw.json.xz"
    doc = json.loads(lzma.decompress(raw.read_bytes()))["D-H100x2/neighbour_nobaseline_busy"]
    records = [CaseRecord.from_json(r) for r in doc["results"]]
    lines = terminal_lines(records)
    below = [line for line in lines if re.match(r"    tests/|      \S", line)]
    assert len(below) == 2 * 2, below  # two cases, one reason each, wrapped once at 120 columns
    assert sum("shared with pid 844" in line for line in below) == 2
    verbose = "\n".join(terminal_lines(records, verbose=True))
    assert "disturbed in both measurements" in verbose and "disturbed in both measurements" not in "\n".join(lines)


def test_a_pass_that_could_hide_twice_its_margin_says_so_in_its_row() -> None:
    """A fresh H200's guard (2026-11-28): cuda_scalar S2048 causal passed every gate and was unverified, its
    MDE 14.6% past twice its 7.2% margin; its row said "undecided: measured 2 more time(s)", a note, not why.
    The row now names the MDE, as the unverified summary does."""
    raw = ROOT / "benchmarks" / "results" / "green_h200_2026-11-28b" / "raw_hostH.tar.xz"
    with tarfile.open(raw) as tar:
        member = tar.extractfile("raw/guard3.json")
        assert member is not None
        doc = json.loads(member.read())
    records = [CaseRecord.from_json(r) for r in doc["results"]]
    weak = [r for r in records if r.decision == "unverified"]
    assert [r.id.rsplit("[", 1)[1] for r in weak] == ["cuda_scalar-S2048-causal]"]
    text = " ".join(" ".join(line.split()) for line in terminal_lines(records))
    assert "its pass could hide a slowdown of +14.6% (its minimum detectable effect)" in text
    assert "undecided: measured 2 more" not in text
