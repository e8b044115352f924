"""Disturbances on every device: the CPU watch's rule on readings recorded on a 2-core VM, the GPU's clock
below its steady state on fake NVML readings, the engine's hooks, and what a disturbance does to a verdict.

The readings come from a CPU attention case (math_attention against SDPA, fp16, B1 H1 S128) timed by the
plugin's engine on a 2-core VM, quiet and beside two busy-loop processes (the numbers of cpuwatch.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

from pytest_perfguard.judge import verdict as vd
from pytest_perfguard.judge.baseline import BaselineEntry
from pytest_perfguard.measure import cpuwatch as cw
from pytest_perfguard.measure.device import CLOCK_FLOOR, Disturbances, steady_clock
from pytest_perfguard.measure.timing import CpuTimer, MeasureConfig, measure
from pytest_perfguard.record import Status

# --------------------------------------------------------------------------------------------- CPU rule


def window(
    wall_ms: float,
    wait_ms: float | None,
    on_cpu_ms: float | None,
    thread_ms: float | None = None,
    *,
    steal: float | None = 0.003,
    runnable: float | None = 1.3,
    involuntary: int | None = 37,
) -> cw.Window:
    """A timed window in ms; the timing thread ran `thread_ms` (by default all the process ran)."""
    thread = thread_ms if thread_ms is not None else on_cpu_ms
    assert thread is not None
    return cw.Window(
        wall_ns=wall_ms * 1e6,
        thread_cpu_ns=thread * 1e6,
        run_wait_ns=None if wait_ms is None else wait_ms * 1e6,
        on_cpu_ns=None if on_cpu_ms is None else on_cpu_ms * 1e6,
        involuntary=involuntary,
        steal=steal,
        runnable=runnable,
        cores=2,
    )


# Recorded windows: wall, run-queue wait and on-CPU time summed over the process's threads, the timing
# thread's CPU time (ms), steal, mean runnable tasks, involuntary context switches.
QUIET = [
    window(2994.5, 29.9, 2960.5, steal=0.0033, runnable=1.3),  # the VM, S128, one intra-op thread
    window(4649.2, 5.8, 4635.2, steal=0.0022, runnable=2.4),  # the VM, B4 H8 S128
    window(643.8, 29.0, 1248.7, 643.8, steal=0.0, runnable=2.0),  # idle host, two intra-op threads
    window(1959.3, 1.5, 1957.5, steal=0.0, runnable=1.0),  # idle host, B4 H8 S128, one thread
]
LOADED = [
    window(4972.4, 1956.0, 3009.0, steal=0.0070, runnable=3.2, involuntary=460),  # the VM, two busy processes
    window(4812.6, 2181.7, 2630.2, steal=0.0042, runnable=3.3, involuntary=590),
    window(1988.3, 995.4, 992.9, steal=0.0, runnable=3.0, involuntary=236),  # idle host, two busy processes
    window(1344.4, 1792.9, 895.3, 448.4, steal=0.0, runnable=4.0, involuntary=224),  # ... two intra-op threads
]


@pytest.mark.parametrize("w", QUIET)
def test_a_quiet_host_is_not_a_disturbance(w: cw.Window) -> None:
    assert cw.judge(w) is None


@pytest.mark.parametrize("w", LOADED)
def test_busy_processes_beside_the_timing_are_a_disturbance_with_their_numbers(w: cw.Window) -> None:
    message = cw.judge(w)
    assert message is not None and w.waiting is not None
    assert message.startswith(f"CPU contended while timing: its threads waited for a CPU {w.waiting:.0%} of the time")
    assert (
        f"in {w.wall_ns / 1e9:.2f} s of timing; over 5% is load from other processes, or a container's CPU" in message
    )
    assert f"the timing thread ran {w.cpu_share:.0%} of the wall time" in message
    assert f"{w.runnable:.1f} tasks runnable on 2 cores" in message
    assert f"{w.involuntary} involuntary context switches" in message


def test_the_wait_is_judged_against_the_time_the_threads_could_run() -> None:
    """Two intra-op threads on an idle host: 29 ms of wait is 4.5% of the wall time but 2.3% of the 1.28 s
    the threads could run; beside two busy processes the same case waited 67% of it."""
    quiet, loaded = QUIET[2], LOADED[3]
    assert quiet.waiting == pytest.approx(0.0227, abs=1e-3)
    assert loaded.waiting == pytest.approx(0.667, abs=1e-3)


def test_a_process_that_outnumbers_the_cores_with_its_own_threads_is_not_disturbed() -> None:
    """Eight intra-op threads on two idle cores wait for each other, the same in every run; beside a busy
    process the same threads get less than the two cores, and that is load."""
    alone = window(1000.0, 5900.0, 1990.0, 1000.0)
    assert alone.self_bound and (alone.waiting or 0.0) > 0.7
    assert cw.judge(alone) is None
    beside = window(1000.0, 6900.0, 1330.0, 660.0)
    assert not beside.self_bound and cw.judge(beside) is not None


def test_one_preemption_in_a_short_window_is_not_load() -> None:
    """4 ms of wait in a 40 ms window is 10%, but one time slice: the block medians shrug it off."""
    assert cw.judge(window(40.0, 4.0, 36.0)) is None
    assert cw.judge(window(40.0, 12.0, 28.0)) is not None  # three slices of the window are load


def test_stolen_time_is_a_disturbance_even_without_run_queue_wait() -> None:
    message = cw.judge(window(2000.0, 2.0, 1990.0, steal=0.12))
    assert message is not None and "the hypervisor stole 12.0% of the CPUs' time (over 5%)" in message
    assert cw.judge(window(2000.0, 2.0, 1990.0, steal=0.016)) is None  # the most seen under load here


def test_without_run_queue_counters_the_timing_threads_cpu_time_decides() -> None:
    quiet = window(2994.5, None, None, 2960.5, steal=None, runnable=None, involuntary=None)
    loaded = window(4972.4, None, None, 3009.0, steal=None, runnable=None, involuntary=None)
    assert cw.judge(quiet) is None
    message = cw.judge(loaded)
    assert message is not None and "the timing thread ran 61% of 4.97 s of timing (under 80%" in message
    assert "no run-queue counters" in message


def test_a_kernel_that_sleeps_is_not_load_where_the_run_queue_is_counted() -> None:
    """Waiting on I/O or a sleep neither runs nor waits for a CPU: only the run queue is load."""
    assert cw.judge(window(2000.0, 3.0, 500.0)) is None


# ------------------------------------------------------------------------------------------ CPU watch


class Host:
    """Counters as the host would give them: each window advances them by its (wall, wait, on-CPU) ms."""

    def __init__(self, *windows: tuple[float, float, float]) -> None:
        self.windows = list(windows)
        self.now = cw.Counters(0, 0, run_wait_ns=0, on_cpu_ns=0, involuntary=0, steal_ticks=0, all_ticks=0)
        self.reads = 0

    def read(self) -> cw.Counters:
        self.reads += 1
        if self.reads % 2 == 0:  # a stop: the window has passed
            wall, wait, cpu = (int(x * 1e6) for x in self.windows.pop(0))
            c = self.now
            assert c.run_wait_ns is not None and c.on_cpu_ns is not None
            assert c.involuntary is not None and c.all_ticks is not None
            self.now = cw.Counters(
                wall_ns=c.wall_ns + wall,
                thread_cpu_ns=c.thread_cpu_ns + cpu,
                run_wait_ns=c.run_wait_ns + wait,
                on_cpu_ns=c.on_cpu_ns + cpu,
                involuntary=c.involuntary + 10,
                steal_ticks=0,
                all_ticks=c.all_ticks + 400,
            )
        return self.now


def test_the_watch_judges_each_window_on_its_own() -> None:
    host = Host((4972.4, 1956.0, 3009.0), (2994.5, 29.9, 2960.5))
    watch = cw.CpuWatch(read=host.read, runnable=lambda: 3, cores=2)
    watch.start()
    assert watch.block() is None
    problems = watch.stop()
    assert len(problems) == 1
    assert "waited for a CPU 39% of the time they could run (1.96 s waiting, 3.01 s running, in 4.97 s" in problems[0]
    assert "3.0 tasks runnable on 2 cores" in problems[0] and "steal 0.0%" in problems[0]
    watch.start()  # the re-measurement: the load has gone
    assert watch.stop() == []
    assert watch.window is not None and watch.window.waiting == pytest.approx(0.01, abs=1e-3)
    assert watch.unwatched is None


def test_a_host_without_proc_says_what_is_not_watched() -> None:
    bare = cw.Counters(wall_ns=0, thread_cpu_ns=0)
    assert cw.unwatched(bare) == (
        f"CPU watch: no run-queue wait or steal counters on this host ({sys.platform}); the timing thread's CPU "
        "time against wall time decides whether the timing was disturbed"
    )


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="Linux counters")
def test_this_linux_host_gives_every_counter() -> None:
    c = cw.read_counters()
    assert c.run_wait_ns is not None and c.on_cpu_ns is not None and c.on_cpu_ns > 0
    assert c.steal_ticks is not None and c.involuntary is not None
    assert cw.read_runnable() is not None


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity (Linux)")
def test_a_busy_process_on_the_timing_threads_cpu_is_seen() -> None:
    """The real counters: this thread and a busy loop pinned to one CPU share it about half and half, so the
    wait is far past the limit whatever else the machine runs."""
    cpu = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    spin = f"import os; os.sched_setaffinity(0, {{{cpu}}}); print('pinned', flush=True)\nwhile True: pass"
    busy = subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True)
    try:
        os.sched_setaffinity(0, {cpu})
        assert busy.stdout is not None and busy.stdout.readline() == "pinned\n"
        watch = cw.CpuWatch()
        watch.start()
        end = time.perf_counter() + 0.5
        while time.perf_counter() < end:
            sum(range(1000))
        problems = watch.stop()
    finally:
        os.sched_setaffinity(0, before)
        busy.kill()
        busy.wait()
    assert watch.window is not None and (watch.window.waiting or 0.0) > 0.2, watch.window
    assert len(problems) == 1 and problems[0].startswith("CPU contended while timing")


# ------------------------------------------------------------------------------------------- engine


@dataclass
class Recorder:
    """A timing.Watch that logs its calls and reports what it is told to."""

    problem_at_stop: str | None = None
    problem_at_block: int | None = None
    calls: list[str] | None = None

    def start(self) -> None:
        self.log("start")

    def block(self) -> str | None:
        self.log("block")
        n = self.calls.count("block") if self.calls else 0
        return "GPU 0 throttled (HW slowdown) during timing" if n == self.problem_at_block else None

    def stop(self) -> list[str]:
        self.log("stop")
        return [self.problem_at_stop] if self.problem_at_stop else []

    def log(self, what: str) -> None:
        self.calls = [*(self.calls or []), what]


class FakeClock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def _measure(watch: Recorder) -> list[str]:
    clock = FakeClock()

    def call() -> None:
        clock.now += 10_000

    cfg = MeasureConfig(target=0.01, budget_s=5.0, min_blocks=12)
    m = measure(lambda _i: call, None, CpuTimer(clock), cfg, watch=watch)
    return m.notes


def test_the_watch_spans_the_timed_blocks_and_its_findings_are_the_measurements_disturbances() -> None:
    watch = Recorder(problem_at_stop="CPU contended while timing: ...", problem_at_block=3)
    notes = _measure(watch)
    assert watch.calls is not None
    assert watch.calls[0] == "start" and watch.calls[-1] == "stop"
    # the measurement stops at the block that saw the problem: it is re-measured or inconclusive anyway
    assert watch.calls.count("block") == 3 and watch.calls.count("start") == 1
    assert notes == ["GPU 0 throttled (HW slowdown) during timing", "CPU contended while timing: ..."]
    clean = Recorder()
    assert _measure(clean) == []
    assert clean.calls is not None and clean.calls.count("block") == 12


# ------------------------------------------------------------------------------------ GPU clock rule


@dataclass
class _Util:
    gpu: int


class ClockNvml:
    """NVML's clock, throttle and utilisation readings of one GPU, settable per reading."""

    NVML_CLOCK_SM = 1

    def __init__(self, app: int | None = 1755, maximum: int = 1980) -> None:
        self.app, self.maximum = app, maximum
        self.sm, self.util, self.reasons = 1755, 100, 0

    def nvmlDeviceGetApplicationsClock(self, handle: object, kind: int) -> int:
        if self.app is None:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return self.app

    def nvmlDeviceGetDefaultApplicationsClock(self, handle: object, kind: int) -> int:
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")

    def nvmlDeviceGetMaxClockInfo(self, handle: object, kind: int) -> int:
        return self.maximum

    def nvmlDeviceGetClockInfo(self, handle: object, kind: int) -> int:
        return self.sm

    def nvmlDeviceGetUtilizationRates(self, handle: object) -> _Util:
        return _Util(self.util)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: object) -> int:
        return self.reasons

    def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> list[object]:
        return []


def _gpu(nv: ClockNvml) -> Disturbances:
    return Disturbances(index=0, handle=object(), nv=nv, steady=steady_clock(nv, object()))


def _window(d: Disturbances, nv: ClockNvml, readings: list[tuple[int, int, int]]) -> list[str]:
    """One timed window: a block per (SM MHz, utilisation %, throttle reasons)."""
    d.start()
    for nv.sm, nv.util, nv.reasons in readings:
        assert d.block() is None  # a low clock is judged over the window, not per block
    return d.stop()


def test_a_busy_gpu_below_its_steady_clock_is_a_disturbance() -> None:
    nv = ClockNvml()
    d = _gpu(nv)
    assert d.steady == (1755, "applications clock")
    problems = _window(d, nv, [(1755, 100, 0), (1020, 97, 0), (1200, 99, 0), (1980, 100, 0)])
    assert problems == [
        "GPU 0 ran below its steady clock while busy: SM clock down to 1020 MHz in 2 of 4 block(s), under 75% "
        "of its 1755 MHz applications clock, with no power cap to explain it"
    ]
    assert _window(d, nv, [(1755, 100, 0)] * 4) == []  # the next window starts afresh


def test_boost_and_the_drift_under_load_stay_above_the_floor() -> None:
    """A fresh H100 fell from 1980 to about 1770 MHz under load: its steady state, not a disturbance."""
    nv = ClockNvml(app=1980)
    assert CLOCK_FLOOR * 1980 < 1770
    assert _window(_gpu(nv), nv, [(1980, 100, 0), (1770, 100, 0), (1785, 100, 0)]) == []


def test_an_idle_or_power_capped_gpu_is_not_below_its_steady_state() -> None:
    nv = ClockNvml()
    d = _gpu(nv)
    assert _window(d, nv, [(345, 0, 0), (345, 20, 0)]) == []  # idle: NVML saw little work
    assert _window(d, nv, [(900, 100, 0x1)]) == []  # NVML says idle
    assert _window(d, nv, [(1100, 100, 0x4)]) == []  # a power-bound kernel at the power cap: its steady state
    assert d.readings == 0


def test_without_an_applications_clock_the_maximum_is_the_reference() -> None:
    nv = ClockNvml(app=None, maximum=2040)
    d = _gpu(nv)
    assert d.steady == (2040, "maximum clock")
    problems = _window(d, nv, [(1400, 100, 0)])
    assert len(problems) == 1 and "under 75% of its 2040 MHz maximum clock" in problems[0]


def test_thermal_throttling_is_still_reported_per_block() -> None:
    nv = ClockNvml()
    d = _gpu(nv)
    d.start()
    nv.reasons = 0x40
    assert d.block() == "GPU 0 throttled (HW thermal slowdown) during timing"


# --------------------------------------------------------------------------------------- the verdict


def _entry(median: float = 1000.0) -> BaselineEntry:
    return BaselineEntry(
        case_id="t::c[x]",
        workload="w",
        workload_desc="float32[1]",
        env={},
        median_ns=median,
        ci_ns=(median * 0.999, median * 1.001),
        ratio=None,
        ratio_ci=None,
        noise=0.005,
        runs=1,
        blocks=12,
        updated="2026-11-26",
    )


def _decide(center: float, disturbances: list[str], stored: BaselineEntry | None) -> vd.Verdict:
    blocks = [center * (1 + 0.001 * ((i % 5) - 2)) for i in range(20)]
    return vd.decide(
        blocks,
        None,
        stored,
        workload="w",
        policy=vd.Policy(),
        max_ratio=None,
        incomparable=[],
        disturbances=disturbances,
    )


@pytest.mark.parametrize(("center", "clean"), [(1000.0, vd.PASS), (1500.0, vd.REGRESSED), (500.0, vd.FASTER)])
def test_a_disturbed_measurement_is_never_pass_fail_or_faster(center: float, clean: Status) -> None:
    assert _decide(center, [], _entry()).status == clean
    disturbed = _decide(center, ["CPU contended while timing: ..."], _entry())
    assert disturbed.status == vd.INCONCLUSIVE
    assert disturbed.gates[0].status == clean  # the gate still says what the numbers said


def test_a_disturbance_leaves_a_stored_figure_that_cannot_be_compared_not_comparable() -> None:
    """What no timing decides stays; a case without a baseline (every case of an update), or whose max_ratio
    gate would pass, is inconclusive."""
    assert _decide(1000.0, [], None).status == vd.NO_BASELINE
    assert _decide(1000.0, ["x"], None).status == vd.INCONCLUSIVE
    changed = vd.decide(
        [1000.0] * 20,
        None,
        _entry(),
        workload="w2",
        policy=vd.Policy(),
        max_ratio=None,
        incomparable=[],
        disturbances=["x"],
    )
    assert changed.status == vd.NOT_COMPARABLE
    blocks = [1000.0 + i for i in range(20)]
    v = vd.decide(
        blocks,
        blocks,
        None,
        workload="w",
        policy=vd.Policy(),
        max_ratio=2.0,
        incomparable=[],
        disturbances=["x"],
    )
    assert v.status == vd.INCONCLUSIVE
