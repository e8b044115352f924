"""The degenerate-input rule through the whole plugin: a constant input (an all-ones weight, a zero bias) is
no failure by itself; a kernel that is faster on it than on random data of the same shape, or right only
for its value, is flagged. The checks' one-time warm-up is reported once per process, never in a case.

Timing is driven by a fake clock that the kernels advance themselves, so the verdicts are deterministic.
"""

from __future__ import annotations

import json

import pytest

pytest_plugins = ["pytester"]

MODES = {"no-xdist": ["-p", "no:xdist"], "n2": ["-n", "2"]}

CASES = """
import torch
import torch.nn.functional as F
from pytest_perfguard import Variant, perf_case


class FakeClock:
    def __init__(self):
        self.t = 0

    def __call__(self):
        return self.t


CLOCK = FakeClock()


def layer_norm(x, w, b):
    return F.layer_norm(x, x.shape[-1:], w, b)


def kernel(ns_on_ones, ns, ignore_weight=False):
    def run(x, w, b):
        CLOCK.t += ns_on_ones if bool((w == 1).all()) else ns
        return layer_norm(x, torch.ones_like(w) if ignore_weight else w, b)

    return run


@perf_case(
    variants={
        "honest": Variant(kernel(100_000, 100_000), not_kernels=["scaled_dot_product"]),
        "shortcut_on_ones": kernel(10_000, 100_000),
        "ignores_weight": kernel(100_000, 100_000, ignore_weight=True),
    },
    reference=layer_norm,
    clock=CLOCK,
)
def test_layer_norm(perfguard_device):
    x = torch.randn(8, 64, dtype=torch.float64, device=perfguard_device)
    w = torch.ones(64, dtype=torch.float64, device=perfguard_device)  # the usual initial weight and bias
    b = torch.zeros(64, dtype=torch.float64, device=perfguard_device)
    return (x, w, b), {}
"""


@pytest.mark.parametrize("mode", list(MODES))
def test_constant_weights_pass_and_a_shortcut_on_them_is_flagged(pytester: pytest.Pytester, mode: str) -> None:
    pytester.makepyfile(test_cases=CASES)
    (pytester.path / ".ci" / "baselines").mkdir(parents=True)
    args = [*MODES[mode], "-p", "no:cacheprovider", "--perfguard", "--perfguard-device", "cpu"]
    args += ["--perfguard-case-budget", "5", "--perfguard-json", "out/results.json"]
    run = pytester.runpytest_subprocess if mode == "n2" else pytester.runpytest_inprocess
    result = run(*args)
    result.assert_outcomes(passed=1, failed=2)
    doc = json.loads((pytester.path / "out" / "results.json").read_text())
    records = {r["variant"]: r for r in doc["results"]}

    honest = records["honest"]
    assert honest["outcome"] == "passed" and honest["verdict"] != "flagged"
    assert any(
        n.startswith("degenerate input: arg1 holds one value (1) in all 64 elements; arg2 holds one value (0)")
        and n.endswith("no shortcut")
        for n in honest["notes"]
    ), honest["notes"]
    # every check's cost is in the record, and checks_s is their sum; the profiler's first start is not
    assert {"patched timer", "silent fallback", "timed outputs", "degenerate input"} <= set(honest["checks"])
    assert honest["checks_s"] == pytest.approx(sum(honest["checks"].values()), abs=1e-3)
    assert honest["checks"]["silent fallback"] < 1.0

    shortcut = records["shortcut_on_ones"]
    assert shortcut["outcome"] == "failed" and shortcut["verdict"] == "flagged"
    assert shortcut["reasons"][0].startswith(
        "shortcut on degenerate input: arg1 holds one value (1) in all 64 elements; arg2 holds one value (0) in all "
        "64 elements; the variant takes 10 us per call on it vs 100 us on random data of the same shape"
    )
    wrong = records["ignores_weight"]
    assert wrong["outcome"] == "failed" and wrong["verdict"] == "flagged"
    assert "on a randomised copy of the same shape the variant's output fails the check" in wrong["reasons"][0]

    # The profiler's first session is paid once per process that runs cases, before the first one.
    warmups = doc["run"]["warmup"]
    assert len(warmups) == (1 if mode == "no-xdist" else 2) and all(w["profiler_s"] > 0 for w in warmups)
    result.stdout.fnmatch_lines(
        ["*shortcut_on_ones: flagged: shortcut on degenerate input*", "perfguard: one-time warm-up of the checks*"]
    )
