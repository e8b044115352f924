"""The CUDA kernels compile standalone for Ada and Hopper, and no kernel spills registers.

Runs on a CPU-only machine: only nvcc is needed (the test skips, saying so, without it). Register spills
are read from ptxas' ``-v`` report; a spill in a hot loop costs local-memory traffic that no benchmark
tolerance should have to absorb, so it fails here, before any GPU time is spent. Each file is compiled for
both architectures in one nvcc call (its host code once), and all files start at once on a thread pool, so
the module costs about one compile per core. Under xdist each worker that runs one of these tests starts
that pool: the reports go to a folder that the workers of the session share, under a file lock, so each file
is compiled once per session, not once per worker.
"""

from __future__ import annotations

import os
import pickle
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from filelock import FileLock

from kernels import cuda_ext

ARCHS = ("sm_89", "sm_90")
CASES = [(src, arch) for src in cuda_ext.CU_SOURCES for arch in ARCHS]
NVCC = cuda_ext.find_nvcc()

needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found (set CUDA_HOME or put nvcc on PATH)")


def _shared_reports(folder: Path, source: Path) -> dict[str, cuda_ext.CompileReport]:
    """``source`` compiled for ARCHS, by arch, unless another worker of this session has (or is doing it now)."""
    path = folder / f"{source.name}.pickle"
    with FileLock(f"{path}.lock"):
        if path.is_file():
            done: dict[str, cuda_ext.CompileReport] = pickle.loads(path.read_bytes())
            return done
        reports = {r.arch: r for r in cuda_ext.nvcc_compile_checks(ARCHS, source, NVCC)}
        path.write_bytes(pickle.dumps(reports))
        return reports


@pytest.fixture(scope="module")
def reports(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Future[dict[str, cuda_ext.CompileReport]]]]:
    """Every compilation submitted up front; each test waits only for its own file's."""
    # An xdist worker's base temp is a folder of the session's; without xdist the base temp is the session's.
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if hasattr(request.config, "workerinput") else base) / "nvcc-reports"
    folder.mkdir(exist_ok=True)
    # Two workers take the files from opposite ends, so neither waits on a lock the other holds.
    sources = cuda_ext.CU_SOURCES
    if getattr(request.config, "workerinput", {}).get("workerid", "gw0") != "gw0":
        sources = sources[::-1]
    pool = ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2))
    futures = {src.name: pool.submit(_shared_reports, folder, src) for src in sources}
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


@needs_nvcc
@pytest.mark.slow
@pytest.mark.parametrize(("source", "arch"), [(s.name, a) for s, a in CASES])
def test_compiles_without_spills(
    reports: dict[str, Future[dict[str, cuda_ext.CompileReport]]], source: str, arch: str
) -> None:
    report = reports[source].result()[arch]
    assert report.ok, f"nvcc failed on {source} for {arch}:\n{report.log[-3000:]}"
    assert report.kernels, f"ptxas reported no kernels for {source} ({arch}); log:\n{report.log[-2000:]}"
    spilling = report.spilling
    assert not spilling, f"register spills in {source} ({arch}):\n" + "\n".join(
        f"  {k.name}: {k.spill_stores} B stores, {k.spill_loads} B loads, {k.registers} registers" for k in spilling
    )


def test_parse_ptxas_reads_registers_and_spills() -> None:
    log = (
        "ptxas info    : Compiling entry function '_Z3fooPf' for 'sm_90'\n"
        "ptxas info    : Function properties for _Z3fooPf\n"
        "    8 bytes stack frame, 12 bytes spill stores, 16 bytes spill loads\n"
        "ptxas info    : Used 255 registers, used 1 barriers, 4096 bytes smem, 360 bytes cmem[0]\n"
        "ptxas info    : Compiling entry function '_Z3barv' for 'sm_90'\n"
        "ptxas info    : Function properties for _Z3barv\n"
        "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
        "ptxas info    : Used 32 registers, used 0 barriers\n"
    )
    assert cuda_ext.parse_ptxas(log) == [("_Z3fooPf", 255, 12, 16, 4096, 8), ("_Z3barv", 32, 0, 0, 0, 0)]


def test_ptxas_log_for_splits_a_two_architecture_log() -> None:
    """One nvcc call for two architectures writes each one's report in turn; each is read on its own."""
    log = (
        "ptxas info    : 0 bytes gmem\n"
        "ptxas info    : Compiling entry function '_Z3fooPf' for 'sm_89'\n"
        "ptxas info    : Function properties for _Z3fooPf\n"
        "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
        "ptxas info    : Used 96 registers, used 1 barriers\n"
        "ptxas info    : 0 bytes gmem\n"
        "ptxas info    : Compiling entry function '_Z3fooPf' for 'sm_90'\n"
        "ptxas info    : Function properties for _Z3fooPf\n"
        "    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n"
        "ptxas info    : Used 255 registers, used 1 barriers\n"
    )
    assert cuda_ext.parse_ptxas(cuda_ext.ptxas_log_for(log, "sm_89")) == [("_Z3fooPf", 96, 0, 0, 0, 0)]
    assert cuda_ext.parse_ptxas(cuda_ext.ptxas_log_for(log, "sm_90")) == [("_Z3fooPf", 255, 4, 4, 0, 8)]


def test_unavailable_reason_is_a_sentence_here() -> None:
    """On a machine without a usable GPU the reason is returned, not raised."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available() and torch.version.cuda is not None:
        pytest.skip("a CUDA device is present; this test is about machines without one")
    reason = cuda_ext.unavailable_reason()
    assert isinstance(reason, str) and reason
    expected = "torch built without CUDA" if torch.version.cuda is None else "no CUDA device"
    assert reason == expected


def test_unavailable_reason_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """Even a torch that blows up while being asked yields a reason instead of an exception."""
    torch = pytest.importorskip("torch")

    def boom() -> bool:
        raise RuntimeError("driver exploded")

    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", boom)
    reason = cuda_ext.unavailable_reason()
    assert reason is not None and "driver exploded" in reason


def test_wrappers_fail_clearly_without_cuda() -> None:
    """Calling a variant where the extension cannot build raises, and the reason says why beforehand."""
    torch = pytest.importorskip("torch")
    if torch.version.cuda is not None:
        pytest.skip("torch has CUDA here")
    assert cuda_ext.unavailable_reason() == "torch built without CUDA"
    q = torch.zeros(1, 1, 8, 64, dtype=torch.float16)
    with pytest.raises(RuntimeError, match="torch built without CUDA"):
        cuda_ext.cuda_wmma(q, q, q, True)


def test_two_trees_of_the_same_sources_build_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An A/B run loads kernels/ from the head's tree and from the base revision's: identical sources in two
    folders. Sharing one build folder and name made torch rename the second and rebuild both in every
    process; each tree keys its own build, and one tree's key is stable."""
    import importlib.util
    import shutil

    copy = tmp_path / "kernels"
    shutil.copytree(cuda_ext.CUDA_DIR.parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    spec = importlib.util.spec_from_file_location("_base_cuda_ext", copy / "cuda_ext.py")
    assert spec is not None and spec.loader is not None
    base = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, base)  # dataclasses look their module up there
    spec.loader.exec_module(base)
    flags = ["-O3"]
    assert copy / "cuda" == base.CUDA_DIR and base.CU_SOURCES[0].read_bytes() == cuda_ext.CU_SOURCES[0].read_bytes()
    assert base.build_key(flags, "2.x") != cuda_ext.build_key(flags, "2.x")
    assert cuda_ext.build_key(flags, "2.x") == cuda_ext.build_key(list(flags), "2.x")
    assert cuda_ext.build_key(flags, "2.x") != cuda_ext.build_key(flags, "2.y")
