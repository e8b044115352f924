"""Every cheat in cheats.py fails through the whole plugin, with a message that names what was seen, and
the honest kernels beside them pass. CPU, the real CPU timer; the GPU-only cheat skips with its reason.

Which layer catches what: the correctness gate catches a wrong value, a partial write, an input written in
place, a non-Tensor output and lower precision; the integrity checks (integrity.py) catch what only shows
while timed: a background thread, caches, stale buffers, a kernel that detects the timer, a patched timer,
a silent fallback and a shortcut on a constant input (an honest kernel fed the same constant passes).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.real_timer  # the integrity checks time with the real clock

CHEATS = (Path(__file__).parent / "cheats.py").read_text()

CASES = """
import pytest
import torch
from pytest_perfguard import Variant, perf_case
import cheats as c

NOT_SDPA = ["scaled_dot_product"]


@perf_case(
    variants={
        "honest": Variant(c.attention, not_kernels=NOT_SDPA),
        "sdpa": c.sdpa,
        "side_stream": Variant(c.side_stream(), requires="cuda"),
        "background_thread": c.background_thread(),
        "cache_by_pointer": c.cache_by_pointer(),
        "stale_buffer": c.stale_buffer(),
        "partial_write": c.partial_write,
        "mutate_input": c.mutate_input,
        "silent_fallback": Variant(c.silent_fallback, not_kernels=NOT_SDPA),
        "lazy_output": c.lazy_output,
        "timed_differently": c.timed_differently(),
        "skip_other_copies": c.skip_other_copies(),
        "value_memo": c.value_memo(),
        "version_memo": c.version_memo(),
        "flip_switch": c.flip_switch,
    },
    reference=c.reference,
    against=c.sdpa,
    flops=lambda: 4 * 2 * 32 * 32 * 16,
)
def test_attn(perfguard_device):
    q, k, v = (torch.randn(1, 2, 32, 16, device=perfguard_device) for _ in range(3))
    return (q, k, v), {"causal": True}


@perf_case(variants={"honest16": c.attention, "fp8_inside": c.fp8_inside}, reference=c.reference)
def test_half(perfguard_device):
    q, k, v = (torch.randn(1, 2, 64, 64, device=perfguard_device, dtype=torch.float16) for _ in range(3))
    return (q, k, v), {"causal": False}


@perf_case(variants={"honest_degenerate": c.attention, "degenerate_shortcut": c.degenerate_shortcut},
           reference=c.reference)
def test_degenerate(perfguard_device):
    # S=96: honest attention costs several times the shortcut's fixed overhead on a loaded CPU (at S=32 it
    # was 1.8x, close enough to the 1.5x bar for a busy 2-core machine to hide the shortcut once)
    q = torch.zeros(1, 2, 96, 16, device=perfguard_device)
    k, v = (torch.randn(1, 2, 96, 16, device=perfguard_device) for _ in range(2))
    return (q, k, v), {"causal": False}
"""

PATCHES = """
import torch
from pytest_perfguard import perf_case
import cheats as c


@perf_case(
    variants={"honest": c.attention, "patch_clock": c.patch_clock(), "patch_engine": c.patch_engine()},
    reference=c.reference,
)
def test_patched(perfguard_device):
    q, k, v = (torch.randn(1, 2, 32, 16, device=perfguard_device) for _ in range(3))
    return (q, k, v), {"causal": True}
"""

# variant -> (verdict, pattern its message must match)
EXPECTED = {
    "background_thread": ("flagged", r"timed output wrong.*NaN"),
    "cache_by_pointer": (r"flagged|incorrect", r"timed output wrong.*stale, cached|atol/rtol bound failed"),
    "stale_buffer": (r"flagged|incorrect", r"timed output wrong|atol/rtol bound failed"),
    "partial_write": ("incorrect", r"atol/rtol bound failed|NaN/Inf"),
    "mutate_input": ("incorrect", r"input arg0 was modified in place"),
    "silent_fallback": ("flagged", r"silent fallback: the variant ran aten::\w*scaled_dot_product"),
    "lazy_output": ("incorrect", r"returned LazyTensor, expected a plain torch.Tensor"),
    "timed_differently": ("flagged", r"timed output wrong"),
    "fp8_inside": ("incorrect", r"native-precision bound failed"),
    "degenerate_shortcut": (
        "flagged",
        r"shortcut on degenerate input: arg0 holds one value \(0\) in all 3072 elements; the variant takes "
        r"[\d.e+]+ us per call on it vs [\d.e+]+ us on random data of the same shape",
    ),
    "skip_other_copies": ("flagged", r"timed output wrong on input copy \d+ of \d+ \(seed \d+\)"),
    "value_memo": ("flagged", r"memo on seen inputs: on new input values its timed samples read"),
    # its key (address, version) repeats when a later seed's input takes a freed one's memory: then it is wrong
    "version_memo": (r"flagged|incorrect", r"memo on seen inputs: on new input values|atol/rtol bound failed"),
    "flip_switch": (
        "flagged",
        r"global state changed: .*flash_sdp_enabled\(\): True -> False \(in the correctness calls\)",
    ),
    "patch_clock": ("flagged", r"patched timer: time\.perf_counter_ns"),
    "patch_engine": ("flagged", r"patched timer: .*pytest_perfguard\.measure\.timers\._CpuSample\.__call__"),
}
HONEST = {"honest", "sdpa", "honest16", "honest_degenerate"}


def _run(pytester: pytest.Pytester, source: str) -> tuple[pytest.RunResult, dict[str, dict]]:
    pytester.makepyfile(cheats=CHEATS, test_cases=source)
    (pytester.path / ".ci" / "baselines").mkdir(parents=True)
    with pytest.MonkeyPatch.context() as mp:
        # An update in this process alone: the further processes of a multi-process update measure only the
        # cases that passed here (the honest ones), and have tests of their own (tests/test_stored_baseline.py).
        mp.setenv("PERFGUARD_UPDATE_PROCESSES", "1")
        result = pytester.runpytest_subprocess(
            "-p",
            "no:xdist",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            "--perfguard",
            "--perfguard-device",
            "cpu",
            "--perfguard-case-budget",
            "1",
            "--perfguard-update-baseline",
            # The suite's other worker loads the CPU by design: the honest cases must be recorded whatever it
            # does (the CPU watch has tests of its own, tests/test_disturbed.py).
            "--perfguard-no-cpu-watch",
            "--perfguard-json",
            "out/results.json",
        )
    doc = json.loads((pytester.path / "out" / "results.json").read_text())
    by_variant = {r["variant"]: r for r in doc["results"]}
    return result, by_variant


def _baseline_ids(pytester: pytest.Pytester) -> set[str]:
    files = list((pytester.path / ".ci" / "baselines").glob("*.json"))
    return {k for f in files for k in json.loads(f.read_text()).get("cases", {})}


def _check(records: dict[str, dict], stored: set[str]) -> None:
    for name, record in records.items():
        if name in HONEST:
            assert record["outcome"] == "passed", (name, record.get("reasons"))
            assert record["verdict"] != "flagged" and record.get("checks_s") is not None
            assert record.get("gbps") and record.get("bytes")
            continue
        verdict, pattern = EXPECTED[name]
        message = " ".join(record.get("reasons", []))
        assert record["outcome"] == "failed", (name, message)
        assert re.fullmatch(verdict, record["verdict"]), (name, record["verdict"], message)
        assert re.search(pattern, message), (name, message)
        assert record["id"] not in stored, f"a baseline was written from {name}"


def test_every_cpu_cheat_fails_and_the_honest_kernels_pass(pytester: pytest.Pytester) -> None:
    result, records = _run(pytester, CASES)
    assert records["side_stream"]["outcome"] == "skipped"
    assert "needs a CUDA GPU" in records["side_stream"]["reasons"][0]
    del records["side_stream"]
    assert set(records) == HONEST | set(EXPECTED) - {"patch_clock", "patch_engine"}
    stored = _baseline_ids(pytester)
    _check(records, stored)
    assert {records[n]["id"] for n in HONEST} <= stored  # honest cases are recorded, flagged ones never
    # an honest kernel fed a constant q is timed on a randomised copy too, and passes
    assert any(re.search(r"(no|not a) shortcut$", n) for n in records["honest_degenerate"]["notes"])
    result.stdout.fnmatch_lines(["background_thread: flagged: timed output wrong*"])


def test_a_patched_timer_is_flagged(pytester: pytest.Pytester) -> None:
    _, records = _run(pytester, PATCHES)
    assert set(records) == {"honest", "patch_clock", "patch_engine"}
    _check(records, _baseline_ids(pytester))
