"""Disturbance detection (NVML) and "not comparable" verdicts, with typed fakes instead of a GPU."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest

from pytest_perfguard import verdict as vd
from pytest_perfguard.baseline import BaselineEntry
from pytest_perfguard.device import SESSION_PIDS_ENV, Disturbances, incomparable


@dataclass
class _Proc:
    pid: int


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


def test_clean_gpu_reports_nothing() -> None:
    assert Disturbances(index=0, handle=object(), nv=FakeNvml()).check() is None


def test_thermal_throttling_is_reported() -> None:
    d = Disturbances(index=1, handle=object(), nv=FakeNvml(reasons=0x40))
    assert d.check() == "GPU 1 throttled (HW thermal slowdown) during timing"


def test_another_compute_process_is_reported() -> None:
    d = Disturbances(index=0, handle=object(), nv=FakeNvml(pids=(999_999_999,)))
    message = d.check()
    assert message is not None and "other compute processes on GPU 0" in message


def test_the_session_that_started_a_confirmation_is_not_foreign_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """A confirmation process shares the GPU with the pytest process that started it, that process's
    xdist siblings and their confirmation processes: they are waiting, not load. Others still count."""
    import subprocess
    import sys

    # A child that starts a grandchild, as a worker starts a confirmation process.
    spawn = "import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); print(p.pid, flush=True); time.sleep(30)"
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
        case_id="t::c[x]", workload="w", workload_desc="float16[1]", env={"name": "GPU", "against_backend": backend},
        median_ns=median, ci_ns=(median * 0.999, median * 1.001), ratio=ratio, ratio_ci=(ratio * 0.999, ratio * 1.001),
        noise=0.005, runs=3, blocks=12, updated="2026-11-21",
    )


def _blocks(center: float, n: int = 20, seed: int = 1) -> list[float]:
    rng = random.Random(seed)
    return [center * math.exp(rng.gauss(0, 0.002)) for _ in range(n)]


def test_sdpa_backend_change_is_not_comparable_with_the_command_to_rebaseline() -> None:
    stored = _entry(backend="flash")
    why = incomparable(stored.env, {"name": "GPU", "against_backend": "cudnn"})
    assert why == ["SDPA backend flash \u2192 cudnn"]
    v = vd.decide(_blocks(2000.0), _blocks(1000.0, seed=2), stored, workload="w", env={}, policy=vd.Policy(),
                  max_ratio=None, incomparable=why)
    assert v.status == vd.NOT_COMPARABLE
    assert "not comparable: SDPA backend flash \u2192 cudnn" in v.gates[0].reason
    assert "--perfguard-update-baseline" in v.gates[0].reason


def test_disturbed_measurement_is_inconclusive_not_a_regression() -> None:
    stored = _entry()
    slow = vd.decide(_blocks(1500.0), None, stored, workload="w", env={}, policy=vd.Policy(), max_ratio=None,
                     incomparable=[])
    assert slow.status == vd.REGRESSED
    disturbed = vd.decide(_blocks(1500.0), None, stored, workload="w", env={}, policy=vd.Policy(), max_ratio=None,
                          incomparable=[], disturbances=["GPU 0 throttled (HW slowdown) during timing"])
    assert disturbed.status == vd.INCONCLUSIVE


def test_margin_never_below_k_times_the_stored_noise() -> None:
    policy = vd.Policy(margin=0.02)
    assert policy.delta(0.001) == 0.02
    assert math.isclose(policy.delta(0.01), vd.NOISE_K * 0.01)
