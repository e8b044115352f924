"""The perfguard command: show, compare, migrate, validate; messages, exit codes, no tracebacks."""

from __future__ import annotations

import argparse
import hashlib
import json
import math
from pathlib import Path
from typing import Any

import pytest

from pytest_perfguard.commands.cli import change_ci, compare_threshold, judge, main
from pytest_perfguard.judge.baseline import SCHEMA_VERSION, BaselineEntry, BaselineFile
from pytest_perfguard.judge.storage import read_baseline, write_baseline
from pytest_perfguard.record import CaseRecord, Correctness
from pytest_perfguard.report.formats import format_ratio, format_time
from pytest_perfguard.report.results import ResultsError, read_results

DEVICE: dict[str, Any] = {
    "slug": "nvidia-h100-80gb-hbm3",
    "name": "NVIDIA H100 80GB HBM3",
    "kind": "cuda",
    "capability": "9.0",
    "torch": "2.11.0+cu130",
    "sdpa_backend": "flash",
}
CASE = "tests/perf/test_attention.py::test_attention[triton_flash-8-8-128-64]"


def entry(case_id: str, median: float, **changes: Any) -> BaselineEntry:
    fields: dict[str, Any] = {
        "case_id": case_id,
        "workload": hashlib.sha256(case_id.encode()).hexdigest(),
        "workload_desc": "q,k,v float16[8,8,128,64] causal=True",
        "env": {"torch": "2.11.0+cu130"},
        "median_ns": median,
        "ci_ns": (median * 0.9975, median * 1.0030),
        "ratio": 1.02,
        "ratio_ci": (1.01, 1.03),
        "noise": 0.004,
        "runs": 1,
        "blocks": 24,
        "updated": "2026-11-21",
    }
    fields.update(changes)
    return BaselineEntry(**fields)


def make_baseline(path: Path, device: dict[str, Any] | None = None) -> Path:
    cases = {CASE: entry(CASE, 9123.4), "t.py::slow": entry("t.py::slow", 2.5e6, ratio=None, ratio_ci=None)}
    write_baseline(BaselineFile(path=path, exists=False, device=device or dict(DEVICE), cases=cases))
    return path


def record(case_id: str, median: float | None, half: float = 0.005, **changes: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": case_id,
        "variant": "triton_flash",
        "workload_desc": "q,k,v float16[8,8,128,64]",
        "median_ns": median,
        "ci_ns": None if median is None else [median * math.exp(-half), median * math.exp(half)],
        "ratio": None,
        "ratio_ci": None,
        "blocks": 20,
        "stop_reason": "ci-width",
        "tflops": 12.5,
        "verdict": "pass",
        "reasons": [],
    }
    out.update(changes)
    return out


def make_results(path: Path, records: list[dict[str, Any]], device: dict[str, Any] | None = None) -> Path:
    obj = {
        "schema_version": 1,
        "kind": "perfguard-results",
        "device": device or dict(DEVICE),
        "results": records,
    }
    path.write_text(json.dumps(obj))
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return status, out, err


# ------------------------------------------------------------------------------------------- formatting


def test_format_time_units() -> None:
    assert format_time(812.0) == "812.0 ns"
    assert format_time(9123.4, (9100.0, 9150.0)) == "9.123 µs [9.100, 9.150]"
    assert format_time(47_000.0) == "47.00 µs"
    assert format_time(2.5e6) == "2.500 ms"
    assert format_time(3.2e9) == "3.200 s"
    assert format_ratio(None, None) == "-"
    assert format_ratio(1.02, (1.01, 1.03)) == "1.020 [1.010, 1.030]"


def test_change_ci_combines_log_half_widths() -> None:
    a = CaseRecord("x", variant="v", median_ns=1000.0, ci_ns=(1000 * math.exp(-0.03), 1000 * math.exp(0.03)), blocks=1)
    b = CaseRecord("x", variant="v", median_ns=1100.0, ci_ns=(1100 * math.exp(-0.04), 1100 * math.exp(0.04)), blocks=1)
    result = change_ci(a, b)
    assert result is not None
    change, ci = result
    assert change == pytest.approx(1.1)
    assert ci is not None
    assert ci[0] == pytest.approx(1.1 * math.exp(-0.05))
    assert ci[1] == pytest.approx(1.1 * math.exp(0.05))


def _timed(median: float, half: float, ratio: float | None = None) -> CaseRecord:
    ci = (median * math.exp(-half), median * math.exp(half))
    ratio_ci = None if ratio is None else (ratio * math.exp(-half), ratio * math.exp(half))
    return CaseRecord("x", variant="v", median_ns=median, ci_ns=ci, ratio=ratio, ratio_ci=ratio_ci, blocks=10)


@pytest.mark.parametrize(
    ("b_median", "half", "status"),
    [
        (1060.0, 0.005, "regressed"),
        (940.0, 0.005, "faster"),
        (1001.0, 0.005, "pass"),
        (1010.0, 0.03, "inconclusive"),
        (1025.0, 0.005, "inconclusive"),
    ],
)
def test_judge_has_the_plugins_three_outcomes(b_median: float, half: float, status: str) -> None:
    assert str(judge(_timed(1000.0, half), _timed(b_median, half), 0.02).status) == status


def test_judge_never_calls_a_slowdown_faster() -> None:
    """Issue 26: A ran while the host was busy (its time and `against`'s both inflated); B is 30% slower
    than A against `against`, yet its time reads 0.76 of A's. The ratio gate sees the slowdown."""
    a, b = _timed(1.3e6, 0.01, ratio=1.0), _timed(0.99e6, 0.01, ratio=1.3)
    verdict = judge(a, b, compare_threshold(0.05, {"kind": "cpu"}, {"kind": "cpu"}))
    assert [str(g.status) for g in verdict.gates] == ["faster", "regressed"]
    assert str(verdict.status) == "regressed"


def test_compare_threshold_is_the_plugins_one_process_rule() -> None:
    assert compare_threshold(0.05, {"kind": "cpu"}, {"kind": "cpu"}) == pytest.approx(0.20)
    assert compare_threshold(0.05, {"kind": "cuda"}, {"kind": "cuda"}) == pytest.approx(0.05)
    assert compare_threshold(0.01, {"kind": "cuda"}, {"kind": "cuda"}) == pytest.approx(0.02)


# ------------------------------------------------------------------------------------------------- show


def test_show_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = make_baseline(tmp_path / "nvidia-h100-80gb-hbm3.json")
    status, out, err = run(capsys, "show", str(path))
    assert status == 0, err
    assert "device: NVIDIA H100 80GB HBM3 (capability 9.0, kind cuda, sdpa_backend flash, torch 2.11.0+cu130)" in out
    assert CASE in out
    assert "9.123 µs [9.101, 9.151]" in out
    assert "1.020 [1.010, 1.030]" in out
    assert "2.500 ms" in out
    assert "0.40%" in out
    for header in ["case", "workload", "time", "ratio", "noise", "runs", "updated"]:
        assert header in out
    assert "2026-11-21" in out


def test_show_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_baseline(tmp_path / "nvidia-h100-80gb-hbm3.json")
    make_baseline(tmp_path / "nvidia-l4.json", {"slug": "nvidia-l4", "name": "NVIDIA L4"})
    (tmp_path / "nvidia-l4.json.lock").write_text("")
    (tmp_path / "notes.txt").write_text("not json")
    status, out, _ = run(capsys, "show", str(tmp_path))
    assert status == 0
    assert "device: NVIDIA H100" in out and "device: NVIDIA L4" in out
    assert out.index("nvidia-h100") < out.index("nvidia-l4.json")


def test_show_bad_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = make_baseline(tmp_path / "a.json")
    bad = tmp_path / "b.json"
    bad.write_text('{"schema_version": 1, "device": {"slug": "x", "name": "x"}, "cases": {"c": {}}}')
    status, out, err = run(capsys, "show", str(tmp_path))
    assert status == 1
    assert str(good) in out
    assert err.startswith("perfguard: error: ") and str(bad) in err and "missing field 'workload'" in err


def test_show_missing_and_empty(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(capsys, "show", str(tmp_path / "nope.json"))
    assert status == 1 and "no such baseline file or folder" in err
    status, out, _ = run(capsys, "show", str(tmp_path))
    assert status == 0 and "no baseline files" in out


def test_show_legacy_says_migrate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "nvidia-l4.json"
    path.write_text(json.dumps({"schema_version": 0, "cases": {"t.py::a": {"median_ms": 0.5257}}}))
    status, out, _ = run(capsys, "show", str(path))
    assert status == 0
    assert f"migrated in memory; rewrite with `perfguard migrate {path}`" in out
    assert "525.7 µs" in out


# ---------------------------------------------------------------------------------------------- compare


def compare_files(tmp_path: Path, b_device: dict[str, Any] | None = None) -> tuple[Path, Path]:
    a = make_results(
        tmp_path / "a.json",
        [
            record("slower", 9000.0),
            record("faster", 1e6),
            record("same", 5000.0),
            record("noisy", 5000.0, half=0.2),
            record("untimed", None, verdict="incorrect", reasons=["max error 0.3 > 0.02"]),
            record("only-a", 100.0),
        ],
    )
    b = make_results(
        tmp_path / "b.json",
        [
            record("slower", 9500.0),
            record("faster", 0.9e6),
            record("same", 5005.0),
            record("noisy", 5200.0, half=0.2),
            record("untimed", 100.0),
            record("only-b", 100.0),
        ],
        b_device,
    )
    return a, b


def test_compare(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = compare_files(tmp_path)
    status, out, _ = run(capsys, "compare", str(a), str(b), "--margin", "0.02")
    assert status == 0
    lines = {line.split()[0]: line for line in out.splitlines() if line.split()}
    assert lines["slower"].rstrip().endswith("regressed")
    assert "1.056 [" in lines["slower"]
    assert lines["faster"].rstrip().endswith("faster")
    assert lines["same"].rstrip().endswith("pass")
    assert lines["noisy"].rstrip().endswith("inconclusive")
    assert lines["untimed"].rstrip().endswith("not timed (A incorrect)")
    assert "only in A (1): only-a" in out
    assert "only in B (1): only-b" in out
    assert "1 regressed of 5 compared" in out
    assert "not comparable" not in out


def test_compare_fail_on_regression(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = compare_files(tmp_path)
    status, _, _ = run(capsys, "compare", str(a), str(b), "--fail-on-regression", "--margin", "0.02")
    assert status == 1
    status, _, _ = run(capsys, "compare", str(a), str(a), "--fail-on-regression")
    assert status == 0
    # a wide margin turns the 5.6% slowdown into a pass
    status, out, _ = run(capsys, "compare", str(a), str(b), "--fail-on-regression", "--margin", "0.1")
    assert status == 0 and "0 regressed of 5" in out


def test_compare_fails_a_slowdown_hidden_by_a_noisy_host(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 26: B/A 0.761 on a noisy CPU host was called "faster" and --fail-on-regression exited 0, while
    the time against `against` (timed in the same run) had grown by 30%."""
    cpu = {"slug": "cpu-amd-epyc", "name": "AMD EPYC", "kind": "cpu", "torch": "2.13.0+cpu"}
    ratio = {"ratio": 1.0, "ratio_ci": [0.99, 1.01]}
    a = make_results(tmp_path / "a.json", [record("k", 1.3e6, half=0.01, **ratio)], cpu)
    b = make_results(tmp_path / "b.json", [record("k", 0.99e6, half=0.01, ratio=1.3, ratio_ci=[1.29, 1.31])], cpu)
    status, out, _ = run(capsys, "compare", str(a), str(b), "--fail-on-regression")
    assert status == 1
    row = next(line for line in out.splitlines() if line.startswith("k "))
    assert row.rstrip().endswith("regressed") and "faster" not in row
    assert "margin: 20.0%, not the 5.0% asked" in out


def test_compare_warns_other_device(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = {
        **DEVICE,
        "name": "NVIDIA L4",
        "slug": "nvidia-l4",
        "torch": "2.12.0",
        "sdpa_backend": "efficient",
    }
    a, b = compare_files(tmp_path, other)
    status, out, _ = run(capsys, "compare", str(a), str(b))
    assert status == 0
    warning = next(line for line in out.splitlines() if line.startswith("warning: not comparable: "))
    assert "name 'NVIDIA H100 80GB HBM3' vs 'NVIDIA L4'" in warning
    assert "torch '2.11.0+cu130' vs '2.12.0'" in warning
    assert "sdpa_backend 'flash' vs 'efficient'" in warning


def test_compare_flags_env_difference(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = make_results(tmp_path / "a.json", [record("x", 1000.0, env={"sdpa_backend": "flash"})])
    b = make_results(tmp_path / "b.json", [record("x", 1000.0, env={"sdpa_backend": "math"})])
    _, out, _ = run(capsys, "compare", str(a), str(b))
    assert "pass (env differs)" in out


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("", "empty"),
        ('{"schema_version": 1, "kind": "perfguard-results"', "ends early"),
        ('{"schema_version": 1, "kind": "other"}', "'kind' must be 'perfguard-results'"),
        ('{"schema_version": 1, "device": {}, "cases": {}}', "is a baseline file, not a results file"),
        ('{"schema_version": 9, "kind": "perfguard-results"}', "newer pytest-perfguard (schema 9 > 1)"),
        (
            '{"schema_version": 1, "kind": "perfguard-results", "device": {"slug": "a", "name": "a"}, "results": [{}]}',
            "missing field 'id'",
        ),
    ],
)
def test_compare_bad_file(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, needle: str) -> None:
    a = make_results(tmp_path / "a.json", [record("x", 1.0)])
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    status, _, err = run(capsys, "compare", str(a), str(bad))
    assert status == 1
    assert str(bad) in err and needle in err, err


def test_compare_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = make_results(tmp_path / "a.json", [record("x", 1.0)])
    status, _, err = run(capsys, "compare", str(a), str(tmp_path / "none.json"))
    assert status == 1 and "no such results file" in err


def test_compare_bad_margin(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = make_results(tmp_path / "a.json", [record("x", 1.0)])
    status, _, err = run(capsys, "compare", str(a), str(a), "--margin", "-1")
    assert status == 2 and "--margin" in err


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"median_ns": -1.0}, "median_ns"),
        ({"ci_ns": [2.0, 3.0]}, "low <= median_ns"),
        ({"median_ns": None}, "'ci_ns' must be null"),
        ({"reasons": "slow"}, "'reasons' must be a list of strings"),
        ({"tflops": -1.0}, "tflops"),
        ({"verdict": 3}, "'verdict' must be a string"),
    ],
)
def test_read_results_validates_records(tmp_path: Path, change: dict[str, Any], needle: str) -> None:
    path = make_results(tmp_path / "r.json", [record("x", 1000.0, **change)])
    with pytest.raises(ResultsError, match="record 'x'") as info:
        read_results(path)
    assert needle in str(info.value) and str(path) in str(info.value)


def test_read_results_skipped_record_has_few_fields(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    skipped = {"id": "x", "variant": "triton", "outcome": "skipped", "reasons": ["needs CUDA"]}
    path = make_results(tmp_path / "r.json", [skipped, record("y", 1000.0)])
    results = read_results(path)
    first = results.by_id()["x"]
    assert (first.median_ns, first.blocks, first.verdict, first.reasons) == (None, None, None, ["needs CUDA"])
    status, out, _ = run(capsys, "compare", str(path), str(path))
    assert status == 0 and "not timed (A skipped, B skipped)" in out
    timed_without_ci = make_results(tmp_path / "t.json", [{"id": "x", "variant": "v", "median_ns": 5.0}])
    with pytest.raises(ResultsError, match="missing field 'ci_ns'"):
        read_results(timed_without_ci)


def test_read_results_duplicate_id_and_extras(tmp_path: Path) -> None:
    path = make_results(tmp_path / "r.json", [record("x", 1.0), record("x", 2.0)])
    with pytest.raises(ResultsError, match="'x' appears twice"):
        read_results(path)
    correctness = {"passed": True, "seeds": [7], "max_abs": 0.001}
    path = make_results(tmp_path / "r.json", [record("x", 1.0, env={"a": "b"}, correctness=correctness)])
    results = read_results(path)
    assert results.results[0].env == {"a": "b"}
    assert results.results[0].correctness == Correctness(passed=True, seeds=[7], max_abs=0.001)
    # the correctness summary is typed: a field the plugin never writes is refused, naming it
    path = make_results(tmp_path / "r.json", [record("x", 1.0, correctness={"passed": True, "max_err": 0.001})])
    with pytest.raises(ResultsError, match=r"record 'x': unknown correctness field\(s\) \['max_err'\]"):
        read_results(path)


# ------------------------------------------------------------------------------------ migrate / validate


def test_migrate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "nvidia-l4.json"
    path.write_text(json.dumps({"schema_version": 0, "device": "NVIDIA L4", "cases": {"t.py::a": {"median_us": 47}}}))
    status, out, _ = run(capsys, "migrate", str(path))
    assert status == 0 and f"migrated from schema 0 to {SCHEMA_VERSION}" in out
    assert json.loads(path.read_text())["schema_version"] == SCHEMA_VERSION
    assert read_baseline(path).cases["t.py::a"].median_ns == 47_000.0
    status, out, _ = run(capsys, "migrate", str(path))
    assert status == 0 and f"already schema {SCHEMA_VERSION}, nothing to do" in out


def test_migrate_bad_and_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"cases": {"a": {"median_ms": 1}}}')
    before = bad.read_bytes()
    status, _, err = run(capsys, "migrate", str(bad), str(tmp_path / "none.json"))
    assert status == 1
    assert "missing 'schema_version'" in err and '"schema_version": 0' in err
    assert "none.json: no such baseline file" in err
    assert bad.read_bytes() == before


def test_validate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = make_baseline(tmp_path / "good.json")
    results = make_results(tmp_path / "results.json", [record("x", 1.0)])
    status, out, err = run(capsys, "validate", str(good), str(results))
    assert status == 0, err
    assert f"ok: {good} (baseline, 2 cases)" in out
    assert f"ok: {results} (results, 1 record)" in out

    conflicted = tmp_path / "conflict.json"
    conflicted.write_text(good.read_text().replace('\n  "device"', '\n<<<<<<< HEAD\n  "device"', 1))
    status, out, err = run(capsys, "validate", str(good), str(conflicted), str(tmp_path / "none.json"))
    assert status == 1
    assert f"ok: {good}" in out
    assert "unresolved merge conflict at line" in err and str(conflicted) in err
    assert "none.json: no such file" in err


def test_validate_accepts_what_merge_writes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 26: validate called the merged file a bad baseline and said to restore it from git."""
    other = {**DEVICE, "name": "NVIDIA L4", "slug": "nvidia-l4"}
    a = make_results(tmp_path / "a.json", [record("x", 1000.0)])
    b = make_results(tmp_path / "b.json", [record("y", 1100.0), record("z", 5.0)], other)
    merged = tmp_path / "all.json"
    status, _, err = run(capsys, "merge", str(a), str(b), "-o", str(merged))
    assert status == 0, err
    status, out, err = run(capsys, "validate", str(merged))
    assert status == 0, err
    assert f"ok: {merged} (merged results, 2 runs, 3 records)" in out
    merged.write_text(merged.read_text().replace('"runs"', '"rounds"', 1))
    status, _, err = run(capsys, "validate", str(merged))
    assert status == 1 and "'runs' must be a non-empty JSON list" in err and "git checkout" not in err


def test_validate_folder_and_legacy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_baseline(tmp_path / "a.json")
    legacy = tmp_path / "b.json"
    legacy.write_text(json.dumps({"schema_version": 0, "cases": {"t.py::a": {"median_ms": 1}}}))
    status, out, _ = run(capsys, "validate", str(tmp_path))
    assert status == 0
    assert f"schema 0: rewrite with `perfguard migrate {legacy}`" in out


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2
    with pytest.raises(SystemExit) as info:
        main(["compare", "only-one.json"])
    assert info.value.code == 2
    capsys.readouterr()


def test_version_and_help_say_what_the_command_does(capsys: pytest.CaptureFixture[str]) -> None:
    from pytest_perfguard import __version__
    from pytest_perfguard.commands.cli import build_parser

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.strip() == f"perfguard {__version__}"
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0 and "baselines" in out and "bisect a slowdown" in out and "pytest --perfguard" in out
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert {"show", "compare", "validate", "merge", "report", "history", "bisect", "explain"} <= set(commands)
    for command in commands:
        with pytest.raises(SystemExit) as info:
            main([command, "--help"])
        assert info.value.code == 0, command
    capsys.readouterr()


def test_compare_defaults_to_the_plugins_margin() -> None:
    from pytest_perfguard.commands.cli import build_parser
    from pytest_perfguard.settings import BY_NAME

    args = build_parser().parse_args(["compare", "a.json", "b.json"])
    assert args.margin == BY_NAME["margin"].default == 0.05


def test_show_finds_the_project_baselines_from_a_folder_below(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`perfguard show` from tests/ said ".ci/baselines: no such baseline file or folder" although the plugin
    finds that folder from any folder of the project."""
    (tmp_path / ".ci" / "baselines").mkdir(parents=True)
    stored = make_baseline(tmp_path / ".ci" / "baselines" / "nvidia-l4.json")
    (tmp_path / "tests").mkdir()
    monkeypatch.chdir(tmp_path / "tests")
    status, out, _ = run(capsys, "show", ".ci/baselines")
    assert status == 0 and str(stored) in out
