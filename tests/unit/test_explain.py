"""perfguard explain without a GPU: ncu's CSV, the head/base diff, the no-ncu message and the plumbing.

The CSV texts below follow what ``ncu --csv --page raw`` prints (program output first, a header, a units
row, one row per kernel launch; numbers with thousands separators) and the details-page layout (one row per
metric). A fake ``ncu`` on PATH checks the command explain builds and hands back such text.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from pytest_perfguard import explain as ex
from pytest_perfguard.cli import main

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
    (kernel,) = ex.parse_ncu_csv(HEAD)
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
    (kernel,) = ex.parse_ncu_csv(DETAILS)
    assert kernel.values == {"gpu__time_duration.sum": 4096.0, "sm__cycles_elapsed.avg.per_second": 1.98}


def test_output_without_a_table_is_an_error() -> None:
    with pytest.raises(ex.ExplainError, match="no ncu CSV table"):
        ex.parse_ncu_csv("==PROF== Disconnected\n")


def test_diff_table_shows_head_base_and_change() -> None:
    text = ex.diff_table(ex.parse_ncu_csv(HEAD), ex.parse_ncu_csv(BASE))
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
    two = ex.parse_ncu_csv(BASE) + ex.parse_ncu_csv(DETAILS)
    text = ex.diff_table(two, ex.parse_ncu_csv(BASE))
    assert "kernel 1 of 2: flash_fwd_kernel<128, 64, true>\n" in text
    assert "kernel 2 of 2: splitkv_combine (head only)" in text
    assert "total duration of 2 head / 1 base kernel launches" in text


def test_without_ncu_it_says_what_it_needs(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PATH", "")
    assert main(["explain", "-k", "test_x", "--against", "HEAD~1"]) == 2
    err = capsys.readouterr().err
    assert "needs Nsight Compute: the `ncu` command on PATH" in err
    assert "permission to read the GPU's performance counters" in err
    assert "ERR_NVGPUCTRPERM" in err and "perfguard explain -k CASE --against REV" in err


FAKE_NCU = '''#!{python}
"""A stand-in for ncu: checks the profiling command and writes raw-page CSV as the "report"."""
import sys
import tempfile
from pathlib import Path

args = sys.argv[1:]
if "--import" in args:
    print(Path(args[args.index("--import") + 1]).read_text())
    sys.exit(0)
for needed in ("--profile-from-start", "pytest_perfguard.explain_probe", "--metrics"):
    assert needed in args, needed
report = Path(args[args.index("--export") + 1] + ".ncu-rep")
src = Path("{head}" if report.name.startswith("head") else "{base}")
report.write_text(src.read_text())
Path(report.parent / (report.stem + ".cwd")).write_text(str(Path.cwd()))
'''


def test_explain_runs_ncu_at_head_and_in_the_base_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    (repo / "a.txt").write_text("a\n")
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "one"]):
        subprocess.run(["git", *args], cwd=repo, check=True, env=env, capture_output=True)
    (tmp_path / "head.csv").write_text(HEAD)
    (tmp_path / "base.csv").write_text(BASE)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ncu = bin_dir / "ncu"
    ncu.write_text(FAKE_NCU.format(python=sys.executable, head=tmp_path / "head.csv", base=tmp_path / "base.csv"))
    ncu.chmod(ncu.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PERFGUARD_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.chdir(repo)
    assert main(["explain", "-k", "test_x", "--against", "HEAD"]) == 0
    out = capsys.readouterr().out
    assert "head (working tree) vs HEAD (" in out and "+8.7%" in out
    (work,) = (tmp_path / "tmp").glob("perfguard-explain-*")
    assert Path((work / "head.cwd").read_text()) == repo.resolve()
    assert Path((work / "base.cwd").read_text()).parent == (tmp_path / "cache" / "base").resolve()


def test_clean_tree_without_against_says_to_pass_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    monkeypatch.delenv("PERFGUARD_AGAINST", raising=False)
    with pytest.raises(ex.ExplainError, match="pass --against REV"):
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
    result = pytester.runpytest_inprocess("-p", "pytest_perfguard.explain_probe", "-p", "no:xdist")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*-k selected 2 perf cases*make -k select exactly one*"])


PROBE_CONFTEST = """
from pathlib import Path
import torch

CALLS = []
torch.cuda.is_available = lambda: True
torch.cuda.synchronize = lambda *a, **k: None
torch.cuda.profiler.start = lambda: CALLS.append("start")
torch.cuda.profiler.stop = lambda: CALLS.append("stop")

def pytest_sessionfinish(session):
    Path("calls.txt").write_text(repr(CALLS))
"""


@pytest.mark.slow
def test_probe_calls_the_variant_once_between_profiler_start_and_stop(pytester: pytest.Pytester) -> None:
    """CUDA is faked (this runs on CPU): the warm-up calls come first, then one call inside the range."""
    pytester.makeconftest(PROBE_CONFTEST)
    pytester.makepyfile(
        test_one="""
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
    )
    result = pytester.runpytest_subprocess(
        "-p", "pytest_perfguard.explain_probe", "-p", "no:xdist", "--perfguard-device", "cpu", "-k", "v and 8"
    )
    result.assert_outcomes(passed=1)
    call = ("call", (8,), 2)
    assert (pytester.path / "calls.txt").read_text() == repr([call, call, call, "start", call, "stop"])
