"""Disturbance detection (NVML) and "not comparable" verdicts, with typed fakes instead of a GPU."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest

from pytest_perfguard.judge import verdict as vd
from pytest_perfguard.judge.baseline import BaselineEntry
from pytest_perfguard.judge.stats import Interval
from pytest_perfguard.measure.device import (
    CUDA_TIMING,
    SESSION_PIDS_ENV,
    UNHELD_TIMING,
    Disturbances,
    incomparable,
    manual_seed,
)
from pytest_perfguard.record import Gate


@dataclass
class _Proc:
    pid: int


def test_manual_seed_draws_what_torch_manual_seed_draws() -> None:
    """The plugin's cheaper seeding gives a test's input factory the numbers torch.manual_seed would."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(1234)
    expected = (torch.randn(3, 5), torch.randint(0, 100, (4,)))
    torch.manual_seed(99)
    manual_seed(1234)
    drawn = (torch.randn(3, 5), torch.randint(0, 100, (4,)))
    assert all(torch.equal(a, b) for a, b in zip(drawn, expected, strict=True))


class FakeNvml:
    """The few NVML calls Disturbances makes, with settable answers."""

    nvmlClocksThrottleReasonHwSlowdown = 0x8
    nvmlClocksThrottleReasonSwThermalSlowdown = 0x20
    nvmlClocksThrottleReasonHwThermalSlowdown = 0x40
    nvmlClocksThrottleReasonHwPowerBrakeSlowdown = 0x80

    def __init__(self, reasons: int = 0, pids: tuple[int, ...] = ()) -> None:
        self.reasons = reasons
        self.pids = pids

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: object) -> int:
        return self.reasons

    def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> list[_Proc]:
        return [_Proc(p) for p in self.pids]

    # Lookup: GPUs by NVML index (PCI order), each with its UUID.
    uuids: tuple[str, ...] = ("GPU-aaaa", "GPU-bbbb")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.uuids)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"handle {self.uuids[index]}"

    def nvmlDeviceGetHandleByUUID(self, uuid: bytes) -> str:
        if uuid.decode() not in self.uuids:
            raise LookupError(uuid)  # pynvml raises NVMLError_NotFound
        return f"handle {uuid.decode()}"


def test_clean_gpu_reports_nothing() -> None:
    assert Disturbances(index=0, handle=object(), nv=FakeNvml()).check() is None


def test_thermal_throttling_is_reported() -> None:
    d = Disturbances(index=1, handle=object(), nv=FakeNvml(reasons=0x40))
    assert d.check() == "GPU 1 throttled (HW thermal slowdown) during timing"


def test_another_compute_process_is_reported() -> None:
    d = Disturbances(index=0, handle=object(), nv=FakeNvml(pids=(999_999_999,)))
    message = d.check()
    assert message is not None and "other compute processes on GPU 0" in message


@pytest.mark.fresh_interpreter  # a test of the process tree: a fork's parent is its server, not its starter
def test_the_session_that_started_a_confirmation_is_not_foreign_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """A confirmation process shares the GPU with the pytest process that started it, that process's
    xdist siblings and their confirmation processes: they are waiting, not load. Others still count."""
    import subprocess
    import sys

    # A child that starts a grandchild, as a worker starts a confirmation process.
    spawn = (
        "import subprocess, sys, time; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); "
        "print(p.pid, flush=True); time.sleep(30)"
    )
    child = subprocess.Popen([sys.executable, "-c", spawn], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        grandchild = int(child.stdout.readline())
        monkeypatch.setenv(SESSION_PIDS_ENV, "424242")
        ours = Disturbances(index=0, handle=object(), nv=FakeNvml(pids=(424242, child.pid, grandchild)))
        assert ours.check() is None
        foreign = Disturbances(index=0, handle=object(), nv=FakeNvml(pids=(424242, 999_999_999)))
        message = foreign.check()
        assert message is not None and "999999999" in message and "424242" not in message
    finally:
        child.kill()
        child.wait()


def _entry(median: float = 1000.0, ratio: float = 1.0, backend: str = "flash") -> BaselineEntry:
    return BaselineEntry(
        case_id="t::c[x]",
        workload="w",
        workload_desc="float16[1]",
        env={"name": "GPU", "against_backend": backend},
        median_ns=median,
        ci_ns=(median * 0.999, median * 1.001),
        ratio=ratio,
        ratio_ci=(ratio * 0.999, ratio * 1.001),
        noise=0.005,
        runs=1,
        blocks=12,
        updated="2026-11-21",
    )


def _blocks(center: float, n: int = 20, seed: int = 1) -> list[float]:
    rng = random.Random(seed)
    return [center * math.exp(rng.gauss(0, 0.002)) for _ in range(n)]


def test_nvml_watches_the_gpu_cuda_measures_on_not_the_one_with_its_index() -> None:
    from pytest_perfguard.measure.device import nvml_handle

    nv = FakeNvml()
    # A worker pinned to the second GPU (CUDA_VISIBLE_DEVICES=1) sees it as cuda:0; NVML's index 0 is the first.
    assert nvml_handle(nv, "bbbb") == "handle GPU-bbbb"  # torch gives the UUID without NVML's prefix
    assert nvml_handle(nv, "GPU-aaaa") == "handle GPU-aaaa"
    assert nvml_handle(nv, "cccc") is None  # unknown to NVML, and two GPUs: no guessing by index
    assert nvml_handle(nv, None) is None
    single = FakeNvml()
    single.uuids = ("GPU-aaaa",)
    assert nvml_handle(single, None) == "handle GPU-aaaa"  # one GPU: the index cannot be wrong


def test_sdpa_backend_change_is_not_comparable_with_the_command_to_rebaseline() -> None:
    stored = _entry(backend="flash")
    why = incomparable(stored.env, {"name": "GPU", "against_backend": "cudnn"})
    assert why == ["SDPA backend flash \u2192 cudnn"]
    v = vd.decide(
        _blocks(2000.0),
        _blocks(1000.0, seed=2),
        stored,
        workload="w",
        policy=vd.Policy(),
        max_ratio=None,
        incomparable=why,
    )
    assert v.status == vd.NOT_COMPARABLE
    assert "not comparable: SDPA backend flash \u2192 cudnn" in v.gates[0].reason
    assert "--perfguard-update-baseline" in v.gates[0].reason


def test_disturbed_measurement_is_inconclusive_not_a_regression() -> None:
    stored = _entry()
    slow = vd.decide(_blocks(1500.0), None, stored, workload="w", policy=vd.Policy(), max_ratio=None, incomparable=[])
    assert slow.status == vd.REGRESSED
    disturbed = vd.decide(
        _blocks(1500.0),
        None,
        stored,
        workload="w",
        policy=vd.Policy(),
        max_ratio=None,
        incomparable=[],
        disturbances=["GPU 0 throttled (HW slowdown) during timing"],
    )
    assert disturbed.status == vd.INCONCLUSIVE


def test_margin_never_below_k_times_the_stored_noise() -> None:
    policy = vd.Policy(margin=0.02)
    assert policy.delta(0.001) == 0.02
    assert math.isclose(policy.delta(0.01), vd.NOISE_K * 0.01)
    assert math.isclose(vd.Policy(margin=0.02, noise_k=8.0).delta(0.01), 0.08)


def test_update_moves_and_gates_share_one_threshold() -> None:
    """A move the update joins to the sample is exactly one the guard would not fail: both thresholds are
    policy.sample_threshold, for every spread around the floor and the margin, and for one process too."""
    from dataclasses import replace

    from pytest_perfguard.judge import baseline as bl
    from pytest_perfguard.judge import update_rules
    from pytest_perfguard.judge.policy import NOISE_K, detectable_margin

    policy = vd.Policy(margin=0.05, noise_floor=0.005)
    for noise in (0.0, 0.001, 0.005, 0.0125, 0.02, 0.1):
        entry = replace(_entry(), noise=noise)
        assert update_rules.change_limit(entry, policy.margin, policy.noise_floor, NOISE_K) == policy.baseline_delta(
            entry
        )
        # one process: the k = 1 rule, never below what the entry can detect
        seen = detectable_margin(noise, 1, entry.half_width, policy.noise_floor)
        assert policy.baseline_delta(entry) == max(policy.delta(noise), seen)
    three = bl.BaselineEntry.from_samples(
        "t::c[x]",
        [bl.ProcessSample(t, (t, t), 1.0) for t in (1000.0, 1010.0, 990.0)],
        workload="w",
        workload_desc="",
        env={},
        updated="",
    )
    assert update_rules.change_limit(three, 0.05, 0.005, NOISE_K) == policy.baseline_delta(three) > 0.05


def _dec(half_width: float, confidence: float = 0.95) -> Interval:
    return Interval(0.0, -half_width, half_width, confidence, 20)


TAU = math.log1p(0.05)


def test_mde_is_tau_plus_half_width_plus_z_times_the_combined_sd() -> None:
    # h = 0.02 at 95%: s = 0.02 / 1.959964 = 0.010204; 3 runs: b = 0.01 * sqrt(1 + 1/3) = 0.011547;
    # sqrt(s^2 + b^2) = 0.015410; x = ln(1.05) + 0.02 + 1.644854 * 0.015410 = 0.094137; expm1(x) = 0.098710.
    assert vd.minimum_detectable_effect(_dec(0.02), TAU, 0.01, 3) == pytest.approx(0.098710, rel=1e-4)


def test_mde_grows_with_noise_and_half_width_and_shrinks_with_runs_up_to_the_window() -> None:
    by_noise = [vd.minimum_detectable_effect(_dec(0.01), TAU, n, 3) or 0.0 for n in (0.0, 0.005, 0.01, 0.05)]
    by_width = [vd.minimum_detectable_effect(_dec(h), TAU, 0.01, 3) or 0.0 for h in (0.0, 0.005, 0.02, 0.1)]
    assert by_noise == sorted(by_noise) and len(set(by_noise)) == 4
    assert by_width == sorted(by_width) and len(set(by_width)) == 4
    assert by_noise[0] > 0.05 and by_width[0] > 0.05  # never below the margin
    one, sixteen, many = (vd.minimum_detectable_effect(_dec(0.01), TAU, 0.01, k) or 0.0 for k in (1, 16, 50))
    assert one > sixteen == many  # the sample keeps at most policy.MAX_SAMPLES processes


def test_mde_counts_a_per_process_offset_beside_the_stored_noise() -> None:
    # The A/B gate's process offset (no stored noise): s = 0.010204, sqrt(s^2 + 0.01^2) = 0.014287;
    # x = ln(1.05) + 0.02 + 1.644854 * 0.014287 = 0.092290.
    assert vd.minimum_detectable_effect(_dec(0.02), TAU, 0.0, 1, process_sd=0.01) == pytest.approx(
        math.expm1(TAU + 0.02 + 1.644854 * math.hypot(0.02 / 1.959964, 0.01)), rel=1e-5
    )
    # Both terms add in quadrature: 3 runs of noise 0.01 (b = 0.011547) and an offset of 0.01.
    both = vd.minimum_detectable_effect(_dec(0.02), TAU, 0.01, 3, process_sd=0.01)
    b = math.hypot(0.01 * math.sqrt(4 / 3), 0.01)
    assert both == pytest.approx(math.expm1(TAU + 0.02 + 1.644854 * math.hypot(0.02 / 1.959964, b)), rel=1e-5)


def test_confirmation_in_a_fresh_process_raises_the_mde() -> None:
    once = vd.minimum_detectable_effect(_dec(0.02), TAU, 0.01, 3)
    twice = vd.minimum_detectable_effect(_dec(0.02), TAU, 0.01, 3, confirm=True)
    assert once is not None and twice is not None and twice > once
    # Caught twice with probability 0.95: each detection at sqrt(0.95), z = 1.954508 instead of 1.644854.
    assert twice == pytest.approx(math.expm1(TAU + 0.02 + 1.954508 * 0.015410), rel=1e-4)


def test_mde_is_none_without_a_baseline_or_a_bounded_interval() -> None:
    assert vd.minimum_detectable_effect(None, TAU, 0.01, 3) is None
    assert vd.minimum_detectable_effect(Interval(0.0, -math.inf, math.inf, 0.95, 2), TAU, 0.01, 3) is None
    with pytest.raises(ValueError, match="power"):
        vd.minimum_detectable_effect(_dec(0.02), TAU, 0.01, 3, power=1.0)
    v = vd.decide(_blocks(1000.0), None, None, workload="w", policy=vd.Policy(), max_ratio=None, incomparable=[])
    assert v.gates[0].mde is None and v.gates[0].to_json()["mde"] is None


def test_decide_sets_the_mde_of_the_baseline_and_ratio_gates() -> None:
    stored = _entry()
    args = (_blocks(1000.0), _blocks(1000.0, seed=2), stored)
    plain = vd.decide(*args, workload="w", policy=vd.Policy(), max_ratio=2.0, incomparable=[])
    confirmed = vd.decide(*args, workload="w", policy=vd.Policy(confirm=True), max_ratio=2.0, incomparable=[])
    mdes = {g.name: g.mde for g in plain.gates}
    assert set(mdes) == {"baseline", "ratio", "max_ratio"} and mdes["max_ratio"] is None
    for name in ("baseline", "ratio"):
        mde = mdes[name]
        assert mde is not None and 0.05 < mde < 0.2
        assert (next(g for g in confirmed.gates if g.name == name).mde or 0.0) > mde
    assert plain.gates[0].to_json()["mde"] == mdes["baseline"]


def test_the_case_mde_is_its_best_gate_unless_the_variant_is_its_own_reference() -> None:
    def gates(baseline: float | None, ratio: float | None) -> list[Gate]:
        return [
            Gate("baseline", vd.PASS, mde=baseline),
            Gate("ratio", vd.PASS, mde=ratio),
            Gate("max_ratio", vd.PASS),
        ]

    assert vd.case_mde(gates(0.11, 0.068), variant_is_against=False) == 0.068
    assert vd.case_mde(gates(0.063, 0.07), variant_is_against=False) == 0.063
    # sdpa against sdpa: a slowdown of SDPA moves both sides of the ratio, so the ratio gate cannot see it.
    assert vd.case_mde(gates(0.11, 0.068), variant_is_against=True) == 0.11
    assert vd.case_mde(gates(None, 0.068), variant_is_against=True) is None
    assert vd.case_mde(gates(None, None), variant_is_against=False) is None


def test_a_cuda_entry_timed_before_the_held_stream_is_not_comparable() -> None:
    current = {"name": "GPU", "timing": CUDA_TIMING}
    assert incomparable({"name": "GPU"}, current) == [f"timing method {UNHELD_TIMING} \u2192 {CUDA_TIMING}"]
    assert incomparable({"name": "GPU", "timing": CUDA_TIMING}, current) == []
    assert incomparable({"name": "cpu"}, {"name": "cpu"}) == []  # a CPU entry has no timing key either way


def test_a_process_timing_on_another_gpu_makes_it_current_and_a_missing_one_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, pytestconfig: pytest.Config
) -> None:
    """Inside a case the runner's device guard makes the case's GPU current; outside one (a kernel library's
    load, a warm-up) the process's current device is used, and on cuda:0 it opened a context on another
    worker's GPU. A process that times on cuda:N makes it current at configure; cuda:0 already is."""
    import torch

    from pytest_perfguard import plugin

    made_current: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: made_current.append(str(d)))
    assert plugin._pick_device(pytestconfig, "cuda:1", enabled=True) == "cuda:1"
    assert plugin._pick_device(pytestconfig, "cuda:0", enabled=True) == "cuda:0"
    assert made_current == ["cuda:1"]
    with pytest.raises(pytest.UsageError, match=r"cuda:5: this host has 2 CUDA device\(s\), cuda:0 to cuda:1"):
        plugin._pick_device(pytestconfig, "cuda:5", enabled=True)
