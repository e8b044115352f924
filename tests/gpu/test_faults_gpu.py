"""Faults that only a GPU can produce: a sticky CUDA error and a real out-of-memory, end to end.

Skipped without CUDA. On a GPU host: `pytest tests/gpu -p no:xdist` (the xdist test starts its own workers).
"""

from __future__ import annotations

import json

import pytest
import torch

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (sticky errors and OOM are GPU faults)"
)

SUITE = """
import pytest
import torch
from pytest_perfguard import perf_case

def reference(x):
    return x * 2

def good(x):
    return x * 2

def device_assert(x):
    # An out-of-range gather trips a device-side assert: a sticky error, every later CUDA call fails.
    idx = torch.full((4,), 10**9, device=x.device, dtype=torch.long)
    return x[idx]

def huge(x):
    return torch.empty(1 << 50, dtype=torch.uint8, device=x.device)  # 1 PiB

@perf_case(variants={"a_good": good, "b_oom": huge, "c_sticky": device_assert, "d_after": good},
           reference=reference, against=good)
@pytest.mark.parametrize("n", [4096])
def test_double(n, perfguard_device):
    return (torch.randn(n, device=perfguard_device),), {}
"""


def test_oom_and_sticky_error_on_a_real_gpu(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    (pytester.path / ".ci" / "baselines").mkdir(parents=True)
    result = pytester.runpytest_subprocess(
        "-p",
        "no:xdist",
        "-p",
        "no:cacheprovider",
        "-rs",
        "--perfguard-update-baseline",
        "--perfguard-json",
        "r.json",
        "--perfguard-case-budget",
        "1",
    )
    out = result.stdout.str()
    result.stdout.fnmatch_lines(["*b_oom: CUDA out of memory in correctness check (inputs float32[[]4096[]])*"])
    result.stdout.fnmatch_lines(["*c_sticky: correctness check raised*"])
    result.stdout.fnmatch_lines(["*not run: CUDA context poisoned by test_suite.py::test_double[[]c_sticky-4096[]]*"])
    result.stdout.fnmatch_lines(["*no baseline written: the CUDA context was poisoned*"])
    assert "regressed" not in out
    assert not list((pytester.path / ".ci" / "baselines").glob("*.json"))
    doc = json.loads((pytester.path / "r.json").read_text())
    by_variant = {r["variant"]: r for r in doc["results"]}
    assert by_variant["a_good"]["outcome"] == "passed"
    assert by_variant["d_after"]["outcome"] == "not run"


def test_under_xdist_the_poisoned_worker_is_replaced_and_the_rest_is_judged(pytester: pytest.Pytester) -> None:
    """Two workers on the GPU: the worker whose case trips a device-side assert exits after reporting it,
    and xdist's fresh worker (a new CUDA context) runs the cases that were queued behind it."""
    pytester.makepyfile(test_suite=SUITE.replace('"b_oom": huge, ', "").replace("[4096]", "[4096, 8192, 16384]"))
    (pytester.path / ".ci" / "baselines").mkdir(parents=True)
    result = pytester.runpytest_subprocess(
        "-n",
        "2",
        "-p",
        "no:cacheprovider",
        "-rs",
        "--perfguard",
        "--perfguard-json",
        "r.json",
        "--perfguard-case-budget",
        "1",
    )
    out = result.stdout.str()
    result.assert_outcomes(passed=6, failed=3)
    result.stdout.fnmatch_lines(["*c_sticky: correctness check raised*"])
    result.stdout.fnmatch_lines(["*replacing crashed worker*"])
    assert "not run" not in out and "crashed while running" not in out and "regressed" not in out
    doc = json.loads((pytester.path / "r.json").read_text())
    outcomes = sorted((r["variant"], r["outcome"]) for r in doc["results"])
    assert outcomes == sorted(
        [(v, "passed") for v in ("a_good", "d_after") for _ in range(3)] + [("c_sticky", "failed")] * 3
    )
