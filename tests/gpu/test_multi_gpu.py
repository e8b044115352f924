"""A case runs on its own GPU, every step of it: issue 28's failure on a two-GPU host, end to end.

On the worker that owned cuda:1, graph captures, events and Triton launches used the current device,
cuda:0: replays wrote nothing the integrity check read, and Triton refused cuda:1's pointers. The suite
below notes, at every Python call of its variants (correctness, warm-up, capture, the base revision's
twin) and of a requirement check (the head's, and the base twin's in its own thread), the current device,
the current stream's device and whether a capture is under way, and fails any call made with another
device current than its tensors'. A Triton kernel with no device guard of its own and an output allocated
on the current device break the way the report saw.

Needs two GPUs, and the plugin installed (the runs it starts load it through its entry point) or named by
`PYTEST_PLUGINS=pytest_perfguard.plugin` with the checkout on `PYTHONPATH`. On such a host, from the
repository root: `python -m pytest tests/gpu/test_multi_gpu.py -p no:xdist -v` (each test starts its own
runs, with and without xdist workers).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import torch

pytest_plugins = ["pytester"]
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.real_timer,  # real timings: the runs share the device locks of every other run here
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.device_count() < 2,
        reason="needs two CUDA GPUs: the case's device must differ from the process's default cuda:0",
    ),
]

SUITE = """
import pytest
import torch
from pytest_perfguard import Variant, perf_case

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

# (what, current device, tensors' device, current stream's device, capturing): read by conftest.py. The set
# lives in a module that is not committed, so this module and the base revision's copy of it share it.
from seen import SEEN


def _note(what, x):
    current = torch.cuda.current_device()
    SEEN.add((what, current, x.device.index, torch.cuda.current_stream().device.index,
              torch.cuda.is_current_stream_capturing()))
    assert current == x.device.index, f"{{what}} called with cuda:{{current}} current, its tensors on {{x.device}}"


def reference(x):
    return x * 2


def plain(x):
    _note("plain", x)
    return x * 2


def current_alloc(x):
    # The output on the current device, as code that writes device="cuda" does.
    _note("current_alloc", x)
    out = torch.empty(x.shape, dtype=x.dtype, device="cuda")
    return torch.mul(x, 2, out=out)


def slow(x):
    _note("slow", x)
    return x * 2 {slow}


if triton is not None:
    @triton.jit
    def _double(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        tl.store(out_ptr + i, tl.load(x_ptr + i, mask=m) * 2, mask=m)


def triton_double(x):
    # No device guard: Triton launches on the current device, as a user's kernel may.
    _note("triton", x)
    out = torch.empty_like(x)
    _double[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
    return out


def _no_triton():
    # Checked for this copy and, in a thread beside it, for the base revision's: each with the case's device
    # current, since a check may build or query the device.
    current, copy = torch.cuda.current_device(), "head" if __name__ == "test_suite" else "base"
    SEEN.add((f"requires {{copy}}", current, current, torch.cuda.current_stream().device.index, False))
    return None if triton is not None else "needs triton"


VARIANTS = {{
    "plain": plain,
    "current_alloc": current_alloc,
    "slow": slow,
    "triton": Variant(triton_double, requires=["cuda", _no_triton]),
}}


@perf_case(variants=VARIANTS, reference=reference, against=plain)
@pytest.mark.parametrize("n", [1 << 20, 1 << 22])
def test_double(n, perfguard_device):
    return (torch.randn(n, device=perfguard_device),), {{}}
"""

CONFTEST = """
import json
import os
import sys
from pathlib import Path


def pytest_sessionfinish(session):
    mod = sys.modules.get("seen")
    if mod is not None and mod.SEEN:
        Path(f"seen-{os.getpid()}.json").write_text(json.dumps(sorted(mod.SEEN)))
"""

# The planted slowdown of `slow` in the working tree, against HEAD's `x * 2`: four more kernels over x.
PLANTED = "* 1.0 + 0.0 * x * 1.0"


def _git(path: Path, *args: str) -> None:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    subprocess.run(["git", *args], cwd=path, check=True, capture_output=True, env={**os.environ, **env})


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    """The suite committed as the base revision; the working tree plants the slowdown in `slow`."""
    pytest.importorskip("triton", reason="the suite's kernel without a device guard is a Triton kernel")
    pytester.makepyfile(test_suite=SUITE.format(slow=""))
    pytester.makeconftest(CONFTEST)
    (pytester.path / "seen.py").write_text("SEEN = set()\n")  # not committed: one set for head and base
    (pytester.path / ".gitignore").write_text("seen.py\nseen-*.json\n*.json\n__pycache__/\n.ci/\n")
    _git(pytester.path, "init", "-q", "-b", "main")
    _git(pytester.path, "add", "-A")
    _git(pytester.path, "commit", "-qm", "base")
    (pytester.path / "test_suite.py").write_text(SUITE.format(slow=PLANTED))
    return pytester


def _run(p: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, dict[str, dict[str, Any]]]:
    for old in p.path.glob("seen-*.json"):
        old.unlink()
    result = p.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--perfguard",
        "--perfguard-against",
        "HEAD",
        "--perfguard-case-budget",
        "2",
        "--perfguard-json",
        "r.json",
        *args,
    )
    doc = json.loads((p.path / "r.json").read_text())
    return result, {r["id"]: r for r in doc["results"]}


def _devices(p: pytest.Pytester) -> list[int]:
    """The device of each process that ran cases (xdist workers, fresh confirmation processes), once every
    call in it is found to have had its tensors' device current and on the current stream; and over all of
    them, every variant was captured in a CUDA graph."""
    captured: set[str] = set()
    noted: set[str] = set()
    devices = []
    for path in sorted(p.path.glob("seen-*.json")):
        entries = [tuple(x) for x in json.loads(path.read_text())]
        assert entries, f"{path.name}: no variant call was noted"
        seen = {(current, tensors, stream) for _, current, tensors, stream, _ in entries}
        assert len(seen) == 1, f"{path.name}: calls saw more than one device: {sorted(seen)}"
        ((current, tensors, stream),) = seen
        assert current == tensors == stream, f"{path.name}: {entries[:5]}"
        devices.append(int(current))
        captured |= {what for what, *_, capturing in entries if capturing}
        noted |= {str(entry[0]) for entry in entries}
    assert {"plain", "current_alloc", "slow", "triton"} <= captured, f"calls captured in a graph: {sorted(captured)}"
    assert {"requires head", "requires base"} <= noted, f"requirement checks noted: {sorted(noted)}"
    return devices


def _verdicts(records: dict[str, dict[str, Any]]) -> dict[str, tuple[str, str]]:
    return {i: (r["outcome"], r.get("verdict", "")) for i, r in records.items()}


def _check_verdicts(records: dict[str, dict[str, Any]]) -> None:
    """The A/A cases pass, timed in a CUDA graph with their timed outputs checked; the planted one regresses."""
    for case_id, r in records.items():
        reasons = " | ".join(r.get("reasons", []))
        assert r.get("mode") == "cuda-graph", (case_id, r.get("mode"), reasons)
        assert "timed output wrong" not in reasons and "flagged" not in reasons, (case_id, reasons)
        assert r.get("checks", {}).get("timed outputs") is not None, case_id
        ab = next((g for g in r.get("gates", []) if g["gate"] == "ab"), None)
        assert ab is not None and ab["status"] not in ("no base", "new", "not comparable"), (case_id, reasons)
        if "[slow-" in case_id:
            assert r["verdict"] == "regressed", (case_id, reasons)
        else:
            assert r["outcome"] == "passed" and r["verdict"] in ("pass", "inconclusive"), (case_id, reasons)


def test_every_step_of_a_case_pinned_to_cuda1_runs_on_cuda1(suite: pytest.Pytester) -> None:
    """One process whose default device is cuda:0 runs every case on cuda:1."""
    result, records = _run(suite, "-p", "no:xdist", "--perfguard-device", "cuda:1")
    assert len(records) == 8, result.stdout.str()
    _check_verdicts(records)
    assert set(_devices(suite)) == {1}
    result.stdout.fnmatch_lines(["perfguard: GPUs used: cuda:1 (*)", "*= perfguard: * (cuda:1), torch *"])


def _same_model() -> None:
    if torch.cuda.get_device_name(0) != torch.cuda.get_device_name(1):
        pytest.skip("cuda:0 and cuda:1 are different models: a guarded run times on one model only")


def test_two_workers_use_both_gpus_and_each_step_runs_on_its_workers(suite: pytest.Pytester) -> None:
    """`-n 2`: worker gw1 owns cuda:1; its cases run there, as gw0's run on cuda:0."""
    _same_model()
    result, records = _run(suite, "-n", "2")
    assert len(records) == 8, result.stdout.str()
    result.stdout.fnmatch_lines(["perfguard: GPUs used: cuda:0, cuda:1 (*), one xdist worker each"])
    _check_verdicts(records)
    assert set(_devices(suite)) == {0, 1}


def test_two_workers_give_the_verdicts_of_one_process(suite: pytest.Pytester) -> None:
    """The same verdicts with `-n 2` (both GPUs timing at once) as with `-n 0` (one GPU, one case at a
    time): the planted slowdown regresses in both, the A/A cases do not."""
    _same_model()
    t0 = time.monotonic()
    _, alone = _run(suite, "-n", "0")
    t1 = time.monotonic()
    _, paired = _run(suite, "-n", "2")
    t2 = time.monotonic()
    # Wall times for the record (issue 28 asks for -n 2 at 0.6x of -n 0 on a full suite; this one is small).
    print(f"wall time: -n 0 {t1 - t0:.1f} s, -n 2 {t2 - t1:.1f} s, ratio {(t2 - t1) / (t1 - t0):.2f}")
    _check_verdicts(alone)
    _check_verdicts(paired)
    failing = {"regressed", "flagged", "error", "incorrect", "timeout"}

    def failed(records: dict[str, dict[str, Any]]) -> dict[str, bool]:
        return {i: r.get("verdict") in failing for i, r in records.items()}

    assert failed(alone) == failed(paired), (_verdicts(alone), _verdicts(paired))
