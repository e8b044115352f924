"""Disturbances on every device: the CPU watch's rule on readings recorded on a 2-core VM, the GPU's clock
below its steady state on fake NVML readings, the engine's hooks, and what a disturbance does to a verdict.

The readings come from a CPU attention case (math_attention against SDPA, fp16, B1 H1 S128) timed by the
plugin's engine on a 2-core VM, quiet and beside two busy-loop processes (the numbers of cpuwatch.py).
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_perfguard.judge import verdict as vd
from pytest_perfguard.judge.baseline import BaselineEntry
from pytest_perfguard.measure import cpuwatch as cw
from pytest_perfguard.measure.device import (
    CLOCK_FLOOR,
    FOREIGN_UTIL,
    QUIET_SPAN_S,
    Disturbances,
    process_name,
    steady_clock,
)
from pytest_perfguard.measure.timers import CpuTimer
from pytest_perfguard.measure.timing import MeasureConfig, measure
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


def test_a_check_whose_finding_fails_the_case_counts_any_wait_over_the_share() -> None:
    """The memo check's confirming rounds (floor 0): the one preemption a timing shrugs off is load there,
    and a wait under the share still is not."""
    assert cw.judge(window(40.0, 4.0, 36.0), floor_ns=0.0) is not None
    assert cw.judge(window(40.0, 1.0, 39.0), floor_ns=0.0) is None


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
    """A timers.Watch that logs its calls and reports what it is told to."""

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


# ------------------------------------------------------------------------ GPU: another process's work

FOREIGN, OTHER = 999_999_999, 999_999_998  # no such processes here: named by NVML, never our own


@dataclass(frozen=True)
class _Sample:
    """One of NVML's per-process utilisation samples (nvmlProcessUtilizationSample_t)."""

    pid: int
    timeStamp: int  # us, NVML's stamp
    smUtil: int
    memUtil: int
    encUtil: int = 0
    decUtil: int = 0


@dataclass(frozen=True)
class _Proc:
    pid: int


class NvmlError(Exception):
    """pynvml's NVMLError: `value` is NVML's return code (3 NotSupported, 6 NotFound)."""

    def __init__(self, value: int, text: str) -> None:
        super().__init__(text)
        self.value = value


class ProcNvml(ClockNvml):
    """ClockNvml, plus the processes on the GPU: those holding a compute context, the utilisation samples
    NVML has published, and the names NVML knows them by."""

    def __init__(self, supported: bool = True) -> None:
        super().__init__()
        self.supported = supported
        self.holders: list[int] = []
        self.samples: list[_Sample] = []
        self.names: dict[int, str] = {FOREIGN: "/usr/bin/python3", OTHER: "/opt/app/server"}
        self.asked: list[int] = []  # the lastSeenTimeStamp of each read

    def publish(self, t_us: int, pid: int, sm: int, mem: int = 0) -> None:
        self.samples.append(_Sample(pid, t_us, sm, mem))

    def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> list[object]:
        return [_Proc(pid) for pid in self.holders]

    def nvmlDeviceGetProcessUtilization(self, handle: object, last_seen: int) -> list[_Sample]:
        self.asked.append(last_seen)
        if not self.supported:
            raise NvmlError(3, "Not Supported")
        newest: dict[int, _Sample] = {}  # NVML answers with each process's newest sample alone
        for s in self.samples:
            if s.timeStamp > last_seen and s.timeStamp >= getattr(newest.get(s.pid), "timeStamp", 0):
                newest[s.pid] = s
        if not newest:
            raise NvmlError(6, "Not Found")
        return list(newest.values())

    def nvmlSystemGetProcessName(self, pid: int) -> bytes:
        if pid not in self.names:
            raise NvmlError(6, "Not Found")
        return self.names[pid].encode()


def _watch(nv: ProcNvml, **kw: Any) -> Disturbances:
    return Disturbances(index=0, handle=object(), nv=nv, **kw)


def test_a_process_that_only_holds_a_context_is_not_a_disturbance() -> None:
    """The H100 run that made every case inconclusive: another process kept an idle CUDA context open."""
    nv = ProcNvml()
    nv.holders = [FOREIGN]
    d = _watch(nv)
    d.start()
    assert d.block() is None and d.stop() == []
    nv.publish(100, FOREIGN, 0, 0)  # a driver that samples an idle context reads 0%
    nv.publish(200, FOREIGN, 1, 0)  # housekeeping under the threshold
    d.start()
    nv.publish(300, FOREIGN, 0, 0)
    assert d.block() is None and d.stop() == []


def test_a_busy_foreign_process_is_a_disturbance_naming_it_and_its_share() -> None:
    nv = ProcNvml()
    nv.holders = [FOREIGN]
    d = _watch(nv)
    d.start()
    nv.publish(100, os.getpid(), 97, 60)
    nv.publish(100, FOREIGN, 63, 20)
    assert d.block() == "GPU 0 shared with pid 999999999 (python3) at 63% SM, 20% memory while timed"
    nv.publish(200, FOREIGN, 41, 20)
    assert d.block() is not None  # every block that reads new work says so: the engine stops at the first
    assert d.stop() == []  # and the window reports it once
    nv.names.clear()
    d.start()
    nv.publish(300, FOREIGN, 2, 30)  # memory traffic alone (copies) is work too
    assert d.block() == "GPU 0 shared with pid 999999999 (unknown) at 2% SM, 30% memory while timed"


def test_several_busy_processes_are_named_busiest_first() -> None:
    nv = ProcNvml()
    d = _watch(nv)
    d.start()
    nv.publish(100, OTHER, 12)
    nv.publish(100, FOREIGN, 55)
    assert d.block() == (
        "GPU 0 shared with pid 999999999 (python3) at 55% SM, 0% memory and pid 999999998 (server) at 12% SM, "
        "0% memory while timed"
    )


def test_our_own_work_and_our_sessions_are_not_a_disturbance() -> None:
    """This process times; a process it started (an xdist worker, a confirmation process) waits on the
    device lock. A load a test starts itself is, by the same rule, never seen (_sibling)."""
    child = subprocess.Popen(["sleep", "30"])
    try:
        nv = ProcNvml()
        d = _watch(nv)
        d.start()
        nv.publish(100, os.getpid(), 99, 80)
        nv.publish(100, child.pid, 70, 10)
        assert d.block() is None and d.stop() == []
    finally:
        child.kill()
        child.wait()


@pytest.mark.fresh_interpreter  # a real interpreter runs the script: /proc names it, not a fork server
@pytest.mark.skipif(not os.path.exists("/proc/self/cmdline"), reason="names come from /proc")
def test_a_foreign_process_is_named_from_proc(tmp_path: Path) -> None:
    """A process outside this session (its starter exited, so it belongs to init) is named by its command
    and script."""
    script = tmp_path / "matmul_load.py"
    script.write_text("import time\ntime.sleep(30)\n")
    spawn = (
        "import subprocess, sys; "
        f"p = subprocess.Popen([sys.executable, {str(script)!r}], start_new_session=True, "
        "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print(p.pid)"
    )
    pid = int(subprocess.run([sys.executable, "-c", spawn], capture_output=True, text=True, check=True).stdout)
    try:
        deadline = time.monotonic() + 10
        while "matmul_load" not in Path(f"/proc/{pid}/cmdline").read_text() and time.monotonic() < deadline:
            time.sleep(0.01)  # the launcher may exec the interpreter after it started
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        assert process_name(pid) == f"{comm}: matmul_load.py"
        nv = ProcNvml()
        d = _watch(nv)
        d.start()
        nv.publish(100, pid, 63, 5)
        assert d.block() == f"GPU 0 shared with pid {pid} ({comm}: matmul_load.py) at 63% SM, 5% memory while timed"
    finally:
        os.kill(pid, signal.SIGKILL)


def test_where_nvml_cannot_tell_utilisation_a_context_held_counts_and_the_message_says_why() -> None:
    """MIG and old drivers answer NotSupported: the only sign left is a context held, which is load there
    (device-wide utilisation cannot help: our own timing keeps it near 100%)."""
    nv = ProcNvml(supported=False)
    d = _watch(nv)
    d.start()
    assert d.block() is None  # nobody else holds a context
    nv.holders = [os.getpid(), FOREIGN]
    assert d.block() == (
        "other compute processes on GPU 0 while timed: pid 999999999 (python3); NVML cannot tell what they do "
        "(its per-process utilisation: Not Supported), so a context held counts as load"
    )


# Variants that try to get past the rule.


def test_work_under_the_threshold_gets_past_and_at_it_does_not() -> None:
    """A documented limit: a process that never takes FOREIGN_UTIL% of a sample period is not seen."""
    nv = ProcNvml()
    d = _watch(nv)
    d.start()
    nv.publish(100, FOREIGN, FOREIGN_UTIL - 1, FOREIGN_UTIL - 1)
    assert d.block() is None
    nv.publish(200, FOREIGN, FOREIGN_UTIL, 0)
    assert d.block() is not None


def test_work_done_between_two_reads_is_seen_at_the_next_one() -> None:
    """A process that works only between our reads and is idle at each of them is still seen: its sample
    stays NVML's newest for it until the next read, as an idle process publishes none."""
    nv = ProcNvml()
    d = _watch(nv)
    d.start()
    assert d.block() is None
    nv.publish(150, FOREIGN, 80)  # busy between the blocks, idle when the next block reads
    message = d.block()
    assert message is not None and "pid 999999999 (python3) at 80% SM" in message
    assert nv.asked == [0, 0, 0]  # nothing was published before: every read asks from the start
    nv.publish(170, os.getpid(), 99)
    assert d.block() is None
    assert nv.asked[-1] == 150 and d.last_seen == 170  # the last time stamp is kept


def test_a_busy_sample_replaced_before_the_next_read_gets_past() -> None:
    """A documented limit: where a block outlasts NVML's sample period and a driver publishes idle samples,
    NVML's newest sample of the process, the idle one, is all the next read gets."""
    nv = ProcNvml()
    d = _watch(nv)
    d.start()
    nv.publish(150, FOREIGN, 80)
    nv.publish(350, FOREIGN, 0)
    assert d.block() is None


def test_work_before_the_window_is_not_the_windows_and_the_last_blocks_work_is() -> None:
    nv = ProcNvml()
    d = _watch(nv)
    nv.publish(100, FOREIGN, 90)  # before the timed blocks: start() reads past it
    d.start()
    assert d.block() is None
    nv.publish(200, FOREIGN, 30)  # during the last block, published after its reading
    assert d.stop() == ["GPU 0 shared with pid 999999999 (python3) at 30% SM, 0% memory while timed"]
    # A documented limit: a sample published after stop() is lost, and not blamed on the next window.
    nv.publish(300, FOREIGN, 30)
    d.start()
    assert d.block() is None and d.stop() == []


class GpuTime:
    """A clock in seconds and a sleep that advances it, while the driver publishes a sample for each busy
    process every `period` seconds, as NVML does in the background."""

    def __init__(self, nv: ProcNvml, period: float = 1 / 6) -> None:
        self.nv, self.period = nv, period
        self.now, self.next = 0.0, period
        self.loads: list[tuple[int, int, float, float]] = []  # pid, SM %, busy from, busy until (s)

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        while self.next <= self.now + 1e-9:
            for pid, sm, t0, t1 in self.loads:
                if t0 < self.next <= t1 + self.period:  # a period that overlapped the work
                    self.nv.publish(round(self.next * 1e6), pid, sm)
            self.next += self.period


def _gpu_time(period: float = 1 / 6, supported: bool = True) -> tuple[ProcNvml, GpuTime, Disturbances]:
    nv = ProcNvml(supported)
    t = GpuTime(nv, period)
    return nv, t, _watch(nv, clock=t.clock, sleep=t.sleep)


def test_wait_quiet_returns_once_the_foreign_process_has_gone_idle() -> None:
    nv, t, d = _gpu_time()
    nv.holders = [FOREIGN]  # it keeps its context after its work
    t.loads = [(FOREIGN, 70, 0.0, 2.0)]
    quiet, waited, seen = d.wait_quiet(10.0)
    assert quiet and 2.0 + QUIET_SPAN_S <= waited <= 2.0 + QUIET_SPAN_S + 1.0
    assert seen == "GPU 0 shared with pid 999999999 (python3) at 70% SM, 0% memory while waiting to re-measure"


def test_wait_quiet_gives_up_after_max_s_naming_the_process() -> None:
    _nv, t, d = _gpu_time()
    t.loads = [(FOREIGN, 70, 0.0, math.inf)]
    quiet, waited, seen = d.wait_quiet(5.0, poll_s=0.7)
    assert not quiet and waited == pytest.approx(5.0)  # the last poll falls on max_s, not past it
    assert "pid 999999999 (python3) at 70% SM" in seen


def test_wait_quiet_on_a_quiet_gpu_waits_one_sample_span_and_reports_nothing() -> None:
    nv, _t, d = _gpu_time()
    nv.holders = [FOREIGN]
    assert d.wait_quiet(10.0) == (True, QUIET_SPAN_S, "")
    assert d.wait_quiet(0.0) == (True, 0.0, "")  # no time to wait: the one clean poll decides


def test_wait_quiet_waits_out_throttling_too() -> None:
    nv, _t, d = _gpu_time()
    nv.reasons = 0x40
    assert d.wait_quiet(2.0) == (False, 2.0, "GPU 0 throttled (HW thermal slowdown) while waiting to re-measure")


def test_a_poll_between_slow_samples_is_not_taken_for_quiet() -> None:
    """A GPU publishing a sample a second, polled every half second: half the polls find no new sample.
    Quiet needs QUIET_SPAN_S of clean polls, which a busy process's next sample always breaks."""
    _nv, t, d = _gpu_time(period=1.0)
    t.loads = [(FOREIGN, 70, 0.0, math.inf)]
    quiet, _waited, seen = d.wait_quiet(6.0)
    assert not quiet and "pid 999999999" in seen


def test_a_load_that_pauses_past_the_wait_is_caught_by_the_next_measurement() -> None:
    """A documented limit of wait_quiet: a load idle for longer than QUIET_SPAN_S passes it; the watch of
    the re-measurement still sees it resume."""
    _nv, t, d = _gpu_time()
    t.loads = [(FOREIGN, 70, 0.0, 1.0), (FOREIGN, 70, 4.0, 9.0)]
    quiet, waited, _seen = d.wait_quiet(10.0)
    assert quiet and waited < 4.0
    d.start()
    t.sleep(4.5 - t.now)  # blocks timed while the load resumes
    message = d.block()
    assert message is not None and "pid 999999999 (python3) at 70% SM" in message


def test_wait_quiet_without_utilisation_waits_for_the_holders_to_exit() -> None:
    nv, _t, d = _gpu_time(supported=False)
    nv.holders = [FOREIGN]
    quiet, _waited, seen = d.wait_quiet(3.0)
    assert not quiet and seen.startswith("other compute processes on GPU 0 while waiting to re-measure: pid 999")
    nv.holders = []
    assert d.wait_quiet(3.0)[0]


def test_wait_quiet_needs_a_positive_poll() -> None:
    with pytest.raises(ValueError, match="poll_s must be positive"):
        _watch(ProcNvml()).wait_quiet(1.0, poll_s=0.0)
