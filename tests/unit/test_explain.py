"""perfguard explain without a GPU: ncu's CSV, the head/base diff, the no-ncu message, the plumbing, and the
explanation written into a results file and shown by the reports.

The CSV texts below follow what ``ncu --csv --page raw`` prints (program output first, a header, a units
row, one row per kernel launch; numbers with thousands separators) and the details-page layout (one row per
metric). A fake ``ncu`` on PATH checks the command explain builds and hands back such text.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_perfguard.commands.cli import main
from pytest_perfguard.commands.explain import command as ex
from pytest_perfguard.commands.explain import ncu as nc
from pytest_perfguard.explanation import DURATION, Explanation, KernelDiff, MetricDiff
from pytest_perfguard.jsonio import dumps
from pytest_perfguard.record import CaseRecord, Gate, Outcome, Status
from pytest_perfguard.report.results import ResultsError, read_results, results_document, write_results

pytest_plugins = ["pytester"]

_COLUMNS = (
    '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
    '"Device","CC","dram__bytes.sum.per_second","dram__throughput.avg.pct_of_peak_sustained_elapsed",'
    '"gpu__time_duration.sum","l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum",'
    '"l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum","launch__registers_per_thread",'
    '"launch__shared_mem_per_block_dynamic","lts__t_bytes.sum.per_second","lts__t_sector_hit_rate.pct",'
    '"lts__throughput.avg.pct_of_peak_sustained_elapsed","sm__cycles_elapsed.avg.per_second",'
    '"sm__maximum_warps_per_active_cycle_pct","sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",'
    '"sm__warps_active.avg.pct_of_peak_sustained_active"'
)
_UNITS = (
    '"","","","","","","","","","","","Tbyte/second","%","usecond","Kbyte","Kbyte","register/thread","Kbyte",'
    '"Tbyte/second","%","%","cycle/nsecond","%","%","%"'
)


def raw_csv(us: str, regs: str, spill: str, occ: str, hit: str, grid: str, ghz: str = "1.98") -> str:
    row = (
        f'"0","4711","python3","127.0.0.1","void flash_fwd_kernel<128, 64, true>(Params)","1","7",'
        f'"(128, 1, 1)","{grid}","0","9.0","1.21","36.40","{us}","{spill}","{spill}","{regs}","49.15","3.02",'
        f'"{hit}","41.20","{ghz}","25.00","55.10","{occ}"'
    )
    return "\n".join(["==PROF== Connected to process 4711", "collected 1 item", _COLUMNS, _UNITS, row, ""])


HEAD = raw_csv("1,041.60", "168", "12.29", "11.80", "61.30", "(64, 16, 1)", ghz="1.755")
BASE = raw_csv("958.40", "128", "0", "18.60", "80.10", "(128, 16, 1)")

DETAILS = "\n".join(
    [
        '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
        '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"',
        '"0","1","python3","h","splitkv_combine","1","7","(256, 1, 1)","(32, 1, 1)","0","9.0",'
        '"Command line profiler metrics","gpu__time_duration.sum","nsecond","4,096"',
        '"0","1","python3","h","splitkv_combine","1","7","(256, 1, 1)","(32, 1, 1)","0","9.0",'
        '"Command line profiler metrics","lts__t_sector_hit_rate.pct","%","n/a"',
        '"0","1","python3","h","splitkv_combine","1","7","(256, 1, 1)","(32, 1, 1)","0","9.0",'
        '"Command line profiler metrics","sm__cycles_elapsed.avg.per_second","Ghz","1.98"',
    ]
)


def test_raw_page_parses_to_canonical_units() -> None:
    (kernel,) = nc.parse_ncu_csv(HEAD)
    assert kernel.short == "flash_fwd_kernel<128, 64, true>"
    assert (kernel.block, kernel.grid) == ("(128,1,1)", "(64,16,1)")
    v = kernel.values
    assert v["gpu__time_duration.sum"] == pytest.approx(1041600.0)  # ns, thousands separator read
    assert v["sm__cycles_elapsed.avg.per_second"] == pytest.approx(1.755)  # GHz
    assert v["dram__bytes.sum.per_second"] == pytest.approx(1.21e12)
    assert v["l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum"] == pytest.approx(12290.0)
    assert v["launch__registers_per_thread"] == 168
    assert v["sm__warps_active.avg.pct_of_peak_sustained_active"] == pytest.approx(11.8)


def test_details_page_parses_and_skips_na() -> None:
    (kernel,) = nc.parse_ncu_csv(DETAILS)
    assert kernel.values == {"gpu__time_duration.sum": 4096.0, "sm__cycles_elapsed.avg.per_second": 1.98}


def test_output_without_a_table_is_an_error() -> None:
    with pytest.raises(nc.ExplainError, match="no ncu CSV table"):
        nc.parse_ncu_csv("==PROF== Disconnected\n")


def test_diff_table_shows_head_base_and_change() -> None:
    text = nc.diff_table(nc.parse_ncu_csv(HEAD), nc.parse_ncu_csv(BASE))
    lines = {line.split("  ")[0]: line for line in text.splitlines()}
    assert text.startswith("kernel 1 of 1: flash_fwd_kernel<128, 64, true>\n")
    assert "1.04 ms" in lines["duration"] and "958.40 us" in lines["duration"] and "+8.7%" in lines["duration"]
    assert "1.755 GHz" in lines["SM clock"] and "-11.4%" in lines["SM clock"]
    assert lines["registers / thread"].split()[-1] == "+40"
    assert lines["local loads (spills)"].split()[-2:] == ["was", "0"]
    assert lines["achieved occupancy"].split()[-2:] == ["-6.8", "pt"]
    assert lines["L2 hit rate"].split()[-2:] == ["-18.8", "pt"]
    assert lines["tensor pipe active"].split()[-1] == "same"
    assert lines["grid"].split()[-1] == "changed" and lines["block"].split()[-1] == "same"


def test_kernels_pair_by_name_when_launch_counts_differ() -> None:
    two = nc.parse_ncu_csv(BASE) + nc.parse_ncu_csv(DETAILS)
    text = nc.diff_table(two, nc.parse_ncu_csv(BASE))
    assert "kernel 1 of 2: flash_fwd_kernel<128, 64, true>\n" in text
    assert "kernel 2 of 2: splitkv_combine (head only)" in text
    assert "total duration of 2 head / 1 base kernel launches" in text


def test_without_ncu_it_says_what_it_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(nc, "DEFAULT_CUDA", tmp_path)  # a host whose /usr/local/cuda has ncu would find it
    assert main(["explain", "-k", "test_x", "--against", "HEAD~1"]) == 2
    err = capsys.readouterr().err
    assert "needs Nsight Compute: the `ncu` command on PATH, in $CUDA_HOME/bin" in err
    assert "permission to read the GPU's performance counters" in err
    assert "ERR_NVGPUCTRPERM" in err and "perfguard explain -k CASE --against REV" in err


def test_ncu_is_found_in_the_cuda_toolkit_when_not_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ncu = tmp_path / "cuda" / "bin" / "ncu"
    ncu.parent.mkdir(parents=True)
    ncu.write_text("#!/bin/sh\n")
    ncu.chmod(0o755)
    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(nc, "DEFAULT_CUDA", tmp_path / "nowhere")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    assert nc.find_ncu() == str(ncu)
    monkeypatch.delenv("CUDA_HOME")
    assert nc.find_ncu() is None
    monkeypatch.setattr(nc, "DEFAULT_CUDA", tmp_path / "cuda")
    assert nc.find_ncu() == str(ncu)
    assert nc.find_ncu(str(tmp_path / "missing")) is None


def test_usage_errors_say_what_to_pass(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain"]) == 2
    assert "say what to explain: -k CASE, or --regressed --results RESULTS" in capsys.readouterr().err
    assert main(["explain", "--regressed"]) == 2
    assert "--regressed needs --results RESULTS" in capsys.readouterr().err
    assert main(["explain", "-k", "x", "--regressed", "--results", "r.json"]) == 2
    assert "-k and --regressed: choose one" in capsys.readouterr().err


# ------------------------------------------------------------------ end to end with a fake ncu on PATH

FAKE_NCU = '''#!{python}
"""A stand-in for ncu: checks the profiling command, answers for the probe (which case, on which GPU), writes
raw-page CSV as the "report", and logs each profile it takes."""
import json
import os
import sys
from pathlib import Path

args = sys.argv[1:]
if args == ["--version"]:
    print("NVIDIA (R) Nsight Compute Command Line Profiler")
    print("Version 2025.1.1.0 (build 35) (public-release)")
    sys.exit(0)
if "--import" in args:
    print(Path(args[args.index("--import") + 1]).read_text())
    sys.exit(0)
probe = "pytest_perfguard.commands.explain.probe"
for needed in ("--profile-from-start", probe, "--metrics", "--perfguard-explain-out"):
    assert needed in args, needed
report = Path(args[args.index("--export") + 1] + ".ncu-rep")
side = "head" if report.stem.endswith("head") else "base"
if "--perfguard-explain-id" in args:
    case = args[args.index("--perfguard-explain-id") + 1]
else:
    case = os.environ["FAKE_NCU_CASE"]
with open(os.environ["FAKE_NCU_LOG"], "a") as log:
    log.write(side + " " + case + "\\n")
if os.environ.get("FAKE_NCU_FAIL") == "permission":
    print("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters")
    sys.exit(1)
probe = Path(args[args.index("--perfguard-explain-out") + 1])
probe.write_text(json.dumps({{"id": case, "device": "NVIDIA H100 80GB HBM3"}}))
report.write_text(Path(os.environ["FAKE_NCU_" + side.upper()]).read_text())
Path(report.parent / (report.stem + ".cwd")).write_text(str(Path.cwd()))
'''

CASE = "tests/perf/test_k.py::test_x[v-S64]"
DEVICE = {"name": "NVIDIA H100 80GB HBM3", "slug": "nvidia-h100-80gb-hbm3"}


def _git(cwd: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    return subprocess.run(["git", *args], cwd=cwd, check=True, env=env, capture_output=True, text=True).stdout.strip()


@dataclass
class Fake:
    """A git repository to explain in, a fake ncu on PATH, and the profiles it took ("head ID", "base ID")."""

    repo: Path
    tmp: Path
    log: Path

    @property
    def calls(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.is_file() else []

    def work(self) -> Path:
        (work,) = self.tmp.glob("perfguard-explain-*")
        return work


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Fake:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.txt").write_text("a\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "one")
    (tmp_path / "head.csv").write_text(HEAD)
    (tmp_path / "base.csv").write_text(BASE)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ncu = bin_dir / "ncu"
    ncu.write_text(FAKE_NCU.format(python=sys.executable))
    ncu.chmod(ncu.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PERFGUARD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PERFGUARD_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("FAKE_NCU_HEAD", str(tmp_path / "head.csv"))
    monkeypatch.setenv("FAKE_NCU_BASE", str(tmp_path / "base.csv"))
    monkeypatch.setenv("FAKE_NCU_LOG", str(tmp_path / "calls.txt"))
    monkeypatch.setenv("FAKE_NCU_CASE", CASE)
    monkeypatch.delenv("FAKE_NCU_FAIL", raising=False)
    monkeypatch.delenv("PERFGUARD_AGAINST", raising=False)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.chdir(repo)
    return Fake(repo=repo, tmp=tmp_path / "tmp", log=tmp_path / "calls.txt")


def _record(case_id: str, verdict: Status, estimate: float = 1.2) -> CaseRecord:
    gate = Gate("ab", verdict, estimate, estimate - 0.01, estimate + 0.01)
    return CaseRecord(
        id=case_id,
        test="test_x",
        variant=case_id.split("[")[1].split("-")[0],
        outcome=Outcome.FAILED if verdict is Status.REGRESSED else Outcome.PASSED,
        verdict=verdict,
        reasons=[f"A/B {verdict}"],
        median_ns=1000.0,
        ci_ns=(990.0, 1010.0),
        blocks=20,
        gates=[gate],
    )


def _results(path: Path, records: list[CaseRecord], run: dict[str, Any] | None = None) -> Path:
    write_results(path, results_document(records, DEVICE, {"margin": 0.05}, run or {}))
    return path


def test_explain_runs_ncu_at_head_and_in_the_base_tree(fake: Fake, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "-k", "test_x", "--against", "HEAD"]) == 0
    out = capsys.readouterr().out
    assert "head (working tree) vs HEAD (" in out and "+8.7%" in out
    assert "Nsight Compute 2025.1.1.0 on NVIDIA H100 80GB HBM3, clocks not locked" in out
    assert fake.calls == [f"head {CASE}", f"base {CASE}"]
    work = fake.work()
    assert Path((work / "head.cwd").read_text()) == fake.repo.resolve()
    assert Path((work / "base.cwd").read_text()).parent == (fake.tmp.parent / "cache" / "base").resolve()


def test_explain_writes_into_the_record_and_changes_nothing_else(
    fake: Fake, capsys: pytest.CaptureFixture[str]
) -> None:
    other = "tests/perf/test_k.py::test_x[w-S64]"
    path = _results(fake.repo / "r.json", [_record(CASE, Status.REGRESSED), _record(other, Status.PASS, 1.0)])
    before = path.read_text()
    assert main(["explain", "-k", "v and S64", "--against", "HEAD", "--results", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"attached to its record in {path}" in out and f"perfguard report {path} --html" in out
    after = json.loads(path.read_text())
    explained = after["results"][0].pop("explain")
    assert dumps(after) == before  # the record gained one field; not a byte else moved
    e = read_results(path).by_id()[CASE].explain
    assert e is not None and e.to_json() == explained
    assert (e.against, e.base_sha, e.head_sha) == ("HEAD", _git(fake.repo, "rev-parse", "HEAD"), e.base_sha)
    assert (e.device, e.ncu, e.clock_control, e.head_dirty) == (
        "NVIDIA H100 80GB HBM3",
        "Nsight Compute 2025.1.1.0",
        "none",
        False,
    )
    (kernel,) = e.kernels
    assert kernel.value("launch__registers_per_thread", "head") == 168
    assert kernel.value("launch__registers_per_thread", "base") == 128
    assert (kernel.head_grid, kernel.base_grid) == ("(64,16,1)", "(128,16,1)")


def test_the_reports_show_the_diff_under_the_explained_case(fake: Fake, tmp_path: Path) -> None:
    path = _results(fake.repo / "r.json", [_record(CASE, Status.REGRESSED)])
    assert main(["explain", "-k", "v", "--against", "HEAD", "--results", str(path)]) == 0
    md = tmp_path / "summary.md"
    assert main(["report", str(path), "--markdown", str(md)]) == 0
    text = md.read_text()
    why = text.index("#### Why: Nsight Compute, head vs base")
    assert text.index("#### Failing and inconclusive") < why < text.index("<details><summary>All 1 cases")
    assert "<b>regressed</b> v · S64: duration +8.7% (1.04 ms vs 958.40 us); moved most: " in text
    assert "Nsight Compute 2025.1.1.0 on NVIDIA H100 80GB HBM3, clocks not locked; head " in text
    table = text[text.index("| metric | head | base | change |") :].split("</details>")[0].splitlines()[2:]
    labels = [row.split("|")[1].strip().strip("*") for row in table if row.startswith("|")]
    assert labels[0] == "duration"  # first, the thing to explain; then what moved most
    assert labels.index("local loads (spills)") < labels.index("registers / thread") < labels.index("L2 hit rate")
    assert labels.index("L2 hit rate") < labels.index("tensor pipe active")  # unchanged: last
    assert "| **registers / thread** | **168** | **128** | **+40** |" in table
    assert "| tensor pipe active | 55.1% | 55.1% | same |" in table

    pytest.importorskip("plotly")
    page = tmp_path / "report.html"
    assert main(["report", str(path), "--html", str(page)]) == 0
    html = page.read_text()
    assert html.count("<h4>Why: Nsight Compute, head vs base</h4>") == 2  # the attention card and the case
    assert "<tr class=moved><td>registers / thread</td><td>168</td><td>128</td><td>+40</td></tr>" in html
    assert "<tr><td>tensor pipe active</td><td>55.1%</td><td>55.1%</td><td>same</td></tr>" in html
    assert "<code>kernel 1 of 1: flash_fwd_kernel&lt;128, 64, true&gt;</code>" in html
    assert "Nsight Compute 2025.1.1.0 on NVIDIA H100 80GB HBM3" in html


def test_regressed_explains_worst_first_within_the_limit_then_the_rest(
    fake: Fake, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = [f"tests/perf/test_k.py::test_x[{v}-S64]" for v in ("a", "b", "c", "d")]
    records = [
        _record(ids[0], Status.REGRESSED, 1.1),
        _record(ids[1], Status.REGRESSED, 1.5),
        _record(ids[2], Status.PASS, 1.0),
        _record(ids[3], Status.REGRESSED, 1.3),
    ]
    path = _results(fake.repo / "r.json", records, {"git_sha": "0" * 40})
    sha = _git(fake.repo, "rev-parse", "HEAD")
    assert main(["explain", "--regressed", "--results", str(path), "--against", sha, "--max-cases", "2"]) == 0
    out = capsys.readouterr().out
    assert fake.calls == [f"head {ids[1]}", f"base {ids[1]}", f"head {ids[3]}", f"base {ids[3]}"]
    assert f"1 more regressed case(s) not explained (--max-cases 2): {ids[0]}" in out
    assert f"measured 000000000000, the working tree is at {sha[:12]}" in out
    by_id = read_results(path).by_id()
    assert [by_id[i].explain is not None for i in ids] == [False, True, False, True]

    fake.log.unlink()
    assert main(["explain", "--regressed", "--results", str(path), "--against", sha]) == 0
    out = capsys.readouterr().out
    assert fake.calls == [f"head {ids[0]}", f"base {ids[0]}"]  # the rest were explained against this base
    assert f"{ids[1]}: already explained against {sha[:12]}" in out
    assert all(read_results(path).by_id()[i].explain is not None for i in (ids[0], ids[1], ids[3]))


def test_regressed_defaults_to_the_base_the_run_compared_with(fake: Fake, capsys: pytest.CaptureFixture[str]) -> None:
    sha = _git(fake.repo, "rev-parse", "HEAD")
    path = _results(fake.repo / "r.json", [_record(CASE, Status.REGRESSED)], {"base_sha": sha, "against": "main"})
    assert main(["explain", "--regressed", "--results", str(path)]) == 0
    assert f"vs {sha} ({sha[:12]})" in capsys.readouterr().out
    explanation = read_results(path).by_id()[CASE].explain
    assert explanation is not None and explanation.base_sha == sha


def test_no_permission_for_the_counters_is_said_and_stops_the_run(
    fake: Fake, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = [CASE, "tests/perf/test_k.py::test_x[w-S64]"]
    path = _results(fake.repo / "r.json", [_record(i, Status.REGRESSED) for i in ids])
    before = path.read_bytes()
    monkeypatch.setenv("FAKE_NCU_FAIL", "permission")
    assert main(["explain", "--regressed", "--results", str(path), "--against", "HEAD"]) == 2
    err = capsys.readouterr().err
    assert "ERR_NVGPUCTRPERM" in err and "NVreg_RestrictProfilingToAdminUsers=0" in err and "SYS_ADMIN" in err
    assert len(fake.calls) == 1  # no other case would fare better: stop at once
    assert path.read_bytes() == before


def _newer(path: Path) -> None:
    obj = json.loads(path.read_text())
    obj["schema_version"] = 99
    path.write_text(json.dumps(obj))


BAD_FILES = {
    "truncated": (lambda p: p.write_text(p.read_text()[:200]), "the file ends early"),
    "newer schema": (_newer, "written by a newer pytest-perfguard (schema 99 > 1): upgrade pytest-perfguard"),
    "bad explanation": (
        lambda p: p.write_text(p.read_text().replace('"id":', '"explain": {"ncu": 1}, "id":', 1)),
        f"record {CASE!r}: field 'explain': missing field 'against'",
    ),
    "merged": (
        lambda p: merge_files_to(p),
        "a merged file (perfguard merge); explain writes into one run's results file",
    ),
}


def merge_files_to(path: Path) -> None:
    from pytest_perfguard.report.merge import merge_files, write_merged

    single = path.with_name("single.json")
    path.replace(single)
    write_merged(path, merge_files([single]))


@pytest.mark.parametrize("kind", list(BAD_FILES))
def test_a_bad_results_file_is_refused_before_profiling_and_never_written(
    fake: Fake, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _results(fake.repo / "r.json", [_record(CASE, Status.REGRESSED)])
    spoil, message = BAD_FILES[kind]
    spoil(path)
    before = path.read_bytes()
    for args in (["-k", "v"], ["--regressed"]):
        assert main(["explain", *args, "--against", "HEAD", "--results", str(path)]) == 1
        err = capsys.readouterr().err
        assert str(path) in err and message in err
    assert fake.calls == []  # nothing profiled
    assert path.read_bytes() == before


def test_a_case_the_results_file_lacks_is_refused_before_the_base_profile(
    fake: Fake, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _results(fake.repo / "r.json", [_record("tests/perf/test_k.py::test_x[w-S64]", Status.REGRESSED)])
    before = path.read_bytes()
    assert main(["explain", "-k", "v", "--against", "HEAD", "--results", str(path)]) == 1
    assert f"has no record of {CASE}" in capsys.readouterr().err
    assert fake.calls == [f"head {CASE}"]
    assert path.read_bytes() == before


def test_attach_keeps_what_others_attached_and_refuses_a_file_gone_bad(tmp_path: Path) -> None:
    ids = [CASE, "tests/perf/test_k.py::test_x[w-S64]"]
    path = _results(tmp_path / "r.json", [_record(i, Status.REGRESSED) for i in ids])
    kernels = nc.kernel_diffs(nc.parse_ncu_csv(HEAD), nc.parse_ncu_csv(BASE))
    first = Explanation("HEAD~1", "a" * 40, "b" * 40, True, "GPU", "Nsight Compute 1", "base", kernels)
    second = Explanation("main", "c" * 40, None, False, "GPU", "Nsight Compute 1", "none", kernels[:0])
    ex.attach(path, ids[0], first)
    ex.attach(path, ids[1], second)
    by_id = read_results(path).by_id()
    assert (by_id[ids[0]].explain, by_id[ids[1]].explain) == (first, second)  # round trip, both kept
    assert "clocks locked to base; head bbbbbbbbbbbb (working tree with uncommitted changes)" in first.source()
    assert first.source().endswith("vs base HEAD~1 = aaaaaaaaaaaa")
    _newer(path)
    before = path.read_bytes()
    with pytest.raises(ResultsError, match="newer pytest-perfguard"):
        ex.attach(path, ids[0], second)
    assert path.read_bytes() == before


def test_rows_put_duration_first_then_what_moved_most() -> None:
    metrics = (
        MetricDiff("a", "L2 hit rate", "pct", 61.3, 80.1),  # -18.8 pt of 80: 0.23
        MetricDiff("b", "tensor pipe active", "pct", 0.6, 0.2),  # small percentages: 0.4 pt of the 5 pt floor
        MetricDiff("c", "registers / thread", "count", 168, 128),  # 0.24
        MetricDiff("d", "DRAM throughput", "rate", None, 1e12),  # one side missing: last
        MetricDiff(DURATION, "duration", "time", 1000.0, 1000.0),  # same, but always first
        MetricDiff("e", "local loads (spills)", "bytes", 512.0, 0.0),  # appeared: 1
    )
    kernel = KernelDiff("k", "k", "(1,1,1)", "(1,1,1)", "(128,1,1)", "(256,1,1)", metrics)
    rows = kernel.rows()
    assert [r.label for r in rows] == [
        "duration",
        "local loads (spills)",
        "block",
        "registers / thread",
        "L2 hit rate",
        "tensor pipe active",
        "grid",
        "DRAM throughput",
    ]
    assert [r.change for r in rows][:4] == ["same", "was 0", "changed", "+40"]
    assert [r.moved for r in rows] == [False, True, True, True, True, True, False, False]


# ----------------------------------------------------------------------------------------------- the probe


def test_clean_tree_without_against_says_to_pass_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    monkeypatch.delenv("PERFGUARD_AGAINST", raising=False)
    with pytest.raises(nc.ExplainError, match="pass --against REV"):
        ex.default_against(tmp_path)


def test_probe_wants_exactly_one_case(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_two="""
        import torch
        from pytest_perfguard import perf_case

        def ref(x):
            return x

        @perf_case(variants={"a": ref, "b": ref}, reference=ref)
        def test_x():
            return (torch.ones(2),), {}
        """
    )
    result = pytester.runpytest_inprocess("-p", "pytest_perfguard.commands.explain.probe", "-p", "no:xdist")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*-k selected 2 perf cases*make -k select exactly one*"])
    result = pytester.runpytest_inprocess(
        "-p",
        "pytest_perfguard.commands.explain.probe",
        "-p",
        "no:xdist",
        "--perfguard-explain-id",
        "test_two.py::test_x[c]",
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    expected = "no collected perf case has the id test_two.py::test_x[c] (its test has test_two.py::test_x[a], "
    assert expected in result.stderr.str()


PROBE_CONFTEST = """
from pathlib import Path
import torch

CALLS = []
torch.cuda.is_available = lambda: True
torch.cuda.synchronize = lambda *a, **k: None
torch.cuda.get_device_name = lambda *a: "Fake GPU"
torch.cuda.profiler.start = lambda: CALLS.append("start")
torch.cuda.profiler.stop = lambda: CALLS.append("stop")

def pytest_sessionfinish(session):
    Path("calls.txt").write_text(repr(CALLS))
"""

PROBE_TEST = """
import pytest
import torch
from conftest import CALLS
from pytest_perfguard import perf_case

def variant(x, scale):
    CALLS.append(("call", tuple(x.shape), scale))
    return x

def ref(x, scale):
    return x

@perf_case(variants={"v": variant, "w": variant}, reference=ref)
@pytest.mark.parametrize("n", [4, 8])
def test_x(n):
    return (torch.ones(n),), {"scale": 2}
"""


@pytest.mark.slow
def test_probe_calls_the_variant_once_between_profiler_start_and_stop(pytester: pytest.Pytester) -> None:
    """CUDA is faked (this runs on CPU): the warm-up calls come first, then one call inside the range."""
    pytester.makeconftest(PROBE_CONFTEST)
    pytester.makepyfile(test_one=PROBE_TEST)
    out = pytester.path / "probe.json"
    result = pytester.runpytest_subprocess(
        "-p",
        "pytest_perfguard.commands.explain.probe",
        "-p",
        "no:xdist",
        "--perfguard-device",
        "cpu",
        "-k",
        "v and 8",
        "--perfguard-explain-out",
        str(out),
    )
    result.assert_outcomes(passed=1)
    call = ("call", (8,), 2)
    assert (pytester.path / "calls.txt").read_text() == repr([call, call, call, "start", call, "stop"])
    assert json.loads(out.read_text()) == {"id": "test_one.py::test_x[v-8]", "device": "Fake GPU"}


RUNNING_NCU = '''#!{python}
"""A stand-in for ncu that runs the program it would profile (pytest with the probe), then writes the CSV."""
import os
import subprocess
import sys
from pathlib import Path

args = sys.argv[1:]
if args == ["--version"]:
    print("Version 2025.1.1.0 (build 35) (public-release)")
    sys.exit(0)
if "--import" in args:
    print(Path(args[args.index("--import") + 1]).read_text())
    sys.exit(0)
start = next(i for i, a in enumerate(args) if a.endswith("perfguard_pytest.py")) - 1
proc = subprocess.run(args[start:], capture_output=True, text=True)
print(proc.stdout + proc.stderr)
report = Path(args[args.index("--export") + 1] + ".ncu-rep")
if proc.returncode == 0:
    report.write_text(Path(os.environ["FAKE_NCU_" + ("HEAD" if report.stem.endswith("head") else "BASE")]).read_text())
sys.exit(proc.returncode)
'''


@pytest.mark.slow
def test_explain_runs_the_probe_from_a_checkout_where_the_plugin_is_not_installed(
    fake: Fake, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real probe in the pytest that explain starts, under an ncu that runs it. With entry points off,
    as in a checkout on PYTHONPATH, the plugin is loaded by name (-p), or no perf case would be collected."""
    (fake.repo / "conftest.py").write_text(PROBE_CONFTEST)
    (fake.repo / "test_perf.py").write_text(PROBE_TEST)
    _git(fake.repo, "add", "-A")
    _git(fake.repo, "commit", "-qm", "perf case")
    ncu = fake.tmp.parent / "bin" / "ncu"
    ncu.write_text(RUNNING_NCU.format(python=sys.executable))
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    ids = ["test_perf.py::test_x[v-8]", "test_perf.py::test_x[w-4]"]
    CPU = ["-p", "no:xdist", "--perfguard-device", "cpu"]  # CUDA is faked: there is no device to pick
    path = _results(fake.tmp.parent / "r.json", [_record(ids[0], Status.REGRESSED), _record(ids[1], Status.PASS)])
    assert main(["explain", "--regressed", "--results", str(path), "--against", "HEAD", *CPU]) == 0
    assert main(["explain", "-k", "w and 4", "--results", str(path), "--against", "HEAD", *CPU]) == 0
    by_id = read_results(path).by_id()
    for case_id in ids:
        explanation = by_id[case_id].explain
        assert explanation is not None and explanation.device == "Fake GPU", capsys.readouterr()
