"""Whether the host disturbed a CPU measurement: other processes' load, stolen time, CPU time against wall time.

On CPU a kernel's time is wall time. When more threads want a CPU than there are cores, the timed threads
wait in the run queue and the wait is read as the kernel's time; on a virtual machine the hypervisor may
also take the CPU away (steal). Over the timed blocks of one measurement the watch reads:

- run-queue wait: how long this process's threads were runnable but not running, against how long they
  ran (Linux, /proc/self/task/*/schedstat): the load of other processes, as this one felt it;
- the timing thread's CPU time against wall time (every OS): what it lost, for whatever reason;
- steal: the share of all CPUs' time the hypervisor took (Linux, /proc/stat);
- involuntary context switches (getrusage) and the tasks runnable on the host (/proc/loadavg), reported.

The run-queue wait decides where the host has it: it counts waiting for a CPU only, so a kernel that
sleeps or waits on I/O by design is not called disturbed. Elsewhere the timing thread's CPU time does.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

# The rule, from CPU attention cases (math_attention against SDPA, fp16, B1 H1 S128 and B4 H8 S128) timed by
# measure() on two cores, quiet and beside two busy-loop processes (2026-11-26; a 2-core VM, and two cores of
# an otherwise idle 16-core host by taskset). Share of the process's runnable time spent waiting for a CPU:
#   quiet, one intra-op thread     0.004-0.07% (idle host), 0.1-1.0% (the VM)
#   quiet, two intra-op threads    0.004-2.3% (idle host; 2.3% in the process's first measurement)
#   two busy processes, one thread 50% (idle host), 39-45% (the VM); cases read +8% and +140-170% slow
#   two busy processes, two        67%; cases read 47-320x slow (intra-op threads spinning for each other)
#   one busy process, one thread   0.0%: two runnable on two cores, and the times did not move
# Steal stayed under 1.6% throughout. The limit sits between, well clear of the quiet readings.
RUN_WAIT_LIMIT = 0.05  # the process's threads waited for a CPU over this share of their runnable time
RUN_WAIT_FLOOR_NS = 5e6  # ... and over this many ns: one preemption in a short window is no load
STEAL_LIMIT = 0.05  # the hypervisor took more than this share of all CPUs' time
CPU_FLOOR = 0.80  # without run-queue counters: the timing thread ran less than this share of the window
# A process whose threads kept this share of its usable cores busy waited for its own threads (more of them
# than cores): the same in every run, not a disturbance. Another process's load would have taken cores.
SELF_BOUND = 0.90
RUNNABLE_EVERY_NS = 20e6  # sample the host's runnable tasks at most this often (a read costs ~20 us)

# Bound at import: a kernel that patches the time module (integrity.patched_timers flags it) cannot move
# the watch's readings too.
_wall_ns = time.perf_counter_ns
_thread_ns = time.thread_time_ns


@dataclass(frozen=True)
class Counters:
    """The counters at one moment; None where this host does not have them."""

    wall_ns: int
    thread_cpu_ns: int  # the calling (timing) thread's CPU time
    run_wait_ns: int | None = None  # summed over this process's threads: runnable, waiting for a CPU
    on_cpu_ns: int | None = None  # summed over this process's threads: running (the same counters)
    involuntary: int | None = None  # this process's involuntary context switches
    steal_ticks: int | None = None  # all CPUs' time taken by the hypervisor
    all_ticks: int | None = None  # all CPUs' time, in the same ticks


@dataclass(frozen=True)
class Window:
    """What the host did to one timed window: the difference of two readings."""

    wall_ns: float
    thread_cpu_ns: float
    run_wait_ns: float | None
    on_cpu_ns: float | None
    involuntary: int | None
    steal: float | None  # a share of all CPUs' time
    runnable: float | None  # the host's runnable tasks, on average over the samples (this thread included)
    cores: int

    @classmethod
    def between(cls, a: Counters, b: Counters, runnable: list[int], cores: int) -> Window:
        def diff(x: int | None, y: int | None) -> float | None:
            return None if x is None or y is None else float(y - x)

        steal, ticks = diff(a.steal_ticks, b.steal_ticks), diff(a.all_ticks, b.all_ticks)
        involuntary = diff(a.involuntary, b.involuntary)
        return cls(
            wall_ns=float(b.wall_ns - a.wall_ns),
            thread_cpu_ns=float(b.thread_cpu_ns - a.thread_cpu_ns),
            run_wait_ns=diff(a.run_wait_ns, b.run_wait_ns),
            on_cpu_ns=diff(a.on_cpu_ns, b.on_cpu_ns),
            involuntary=None if involuntary is None else int(involuntary),
            steal=steal / ticks if steal is not None and ticks else None,
            runnable=sum(runnable) / len(runnable) if runnable else None,
            cores=cores,
        )

    @property
    def waiting(self) -> float | None:
        """The share of the process's runnable time (waiting + running, summed over its threads) spent waiting
        for a CPU: a thread that sleeps or waits on I/O adds to neither, and a kernel on four threads is
        judged on all four, however many cores it keeps busy."""
        if self.run_wait_ns is None or self.on_cpu_ns is None:
            return None
        runnable = self.run_wait_ns + self.on_cpu_ns
        return self.run_wait_ns / runnable if runnable > 0 else 0.0

    @property
    def self_bound(self) -> bool:
        """The process's own threads kept (nearly) every usable core busy: its wait is its own."""
        return self.on_cpu_ns is not None and self.on_cpu_ns >= SELF_BOUND * self.cores * self.wall_ns

    @property
    def cpu_share(self) -> float:
        return self.thread_cpu_ns / self.wall_ns if self.wall_ns > 0 else 1.0


def judge(w: Window, floor_ns: float = RUN_WAIT_FLOOR_NS) -> str | None:
    """The disturbance this window shows, with its numbers, or None when the host let the timing run.
    `floor_ns`: the least wait that counts (a timing judges a long window and ignores one preemption; a check
    whose finding would fail the case counts any wait over the share, see CpuWatch.floor_ns)."""
    if w.wall_ns <= 0:
        return None
    problems = []
    waiting = w.waiting
    if waiting is not None and w.run_wait_ns is not None and w.on_cpu_ns is not None:
        if waiting > RUN_WAIT_LIMIT and w.run_wait_ns > floor_ns and not w.self_bound:
            problems.append(
                f"its threads waited for a CPU {waiting:.0%} of the time they could run ({_ms(w.run_wait_ns)} "
                f"waiting, {_ms(w.on_cpu_ns)} running, in {_ms(w.wall_ns)} of timing; over {RUN_WAIT_LIMIT:.0%} "
                "is load from other processes, or a container's CPU quota)"
            )
    elif w.cpu_share < CPU_FLOOR and w.wall_ns - w.thread_cpu_ns > floor_ns:
        problems.append(
            f"the timing thread ran {w.cpu_share:.0%} of {_ms(w.wall_ns)} of timing (under {CPU_FLOOR:.0%}: "
            "other processes' load, or a kernel that waits; this host has no run-queue counters to tell them apart)"
        )
    if w.steal is not None and w.steal > STEAL_LIMIT:
        problems.append(f"the hypervisor stole {w.steal:.1%} of the CPUs' time (over {STEAL_LIMIT:.0%})")
    if not problems:
        return None
    return "CPU contended while timing: " + "; ".join(problems) + "; " + _context(w)


def _context(w: Window) -> str:
    """The other readings, for a reader who wants to know where the load came from."""
    parts = [f"the timing thread ran {w.cpu_share:.0%} of the wall time"]
    if w.runnable is not None:
        parts.append(f"{w.runnable:.1f} tasks runnable on {w.cores} cores")
    if w.involuntary is not None:
        parts.append(f"{w.involuntary} involuntary context switches")
    if w.steal is not None and w.steal <= STEAL_LIMIT:
        parts.append(f"steal {w.steal:.1%}")
    return ", ".join(parts)


def _ms(ns: float) -> str:
    return f"{ns / 1e9:.2f} s" if ns >= 1e9 else f"{ns / 1e6:.0f} ms"


# ------------------------------------------------------------------------------------------- readings


def _schedstat() -> tuple[int, int] | None:
    """(on-CPU, run-queue wait) in ns, summed over this process's threads (/proc/self/task/*/schedstat), or None."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    on_cpu = wait = 0
    seen = False
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat", "rb") as fh:
                fields = fh.read().split()
            on_cpu, wait, seen = on_cpu + int(fields[0]), wait + int(fields[1]), True
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended between the listing and the read
    return (on_cpu, wait) if seen else None


def _steal_ticks() -> tuple[int, int] | None:
    """The hypervisor's share of all CPUs' time so far (/proc/stat's `cpu` line): (steal, all), in ticks."""
    try:
        with open("/proc/stat", "rb") as fh:
            fields = [int(x) for x in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    if len(fields) < 8:
        return None
    return fields[7], sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest is in user)


def _involuntary() -> int | None:
    try:
        import resource
    except ImportError:  # Windows
        return None
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw)


def read_counters() -> Counters:
    steal, sched = _steal_ticks(), _schedstat()
    return Counters(
        wall_ns=_wall_ns(),
        thread_cpu_ns=_thread_ns(),
        run_wait_ns=sched[1] if sched else None,
        on_cpu_ns=sched[0] if sched else None,
        involuntary=_involuntary(),
        steal_ticks=steal[0] if steal else None,
        all_ticks=steal[1] if steal else None,
    )


def read_runnable() -> int | None:
    """The host's runnable tasks now (/proc/loadavg's fourth field, "running/total"), or None."""
    try:
        with open("/proc/loadavg", "rb") as fh:
            return int(fh.read().split()[3].split(b"/")[0])
    except (OSError, IndexError, ValueError):
        return None


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity, under taskset or a container's cpuset), else all."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows
        return os.cpu_count() or 1


def unwatched(c: Counters) -> str | None:
    """What this host does not let the watch see, for the record's notes; None on Linux."""
    missing = [what for what, value in (("run-queue wait", c.run_wait_ns), ("steal", c.steal_ticks)) if value is None]
    if not missing:
        return None
    return (
        f"CPU watch: no {' or '.join(missing)} counters on this host ({sys.platform}); the timing thread's CPU "
        f"time against wall time decides whether the timing was disturbed"
    )


@dataclass
class CpuWatch:
    """The timers.Watch of a CPU measurement. `read`, `runnable` and `cores` are injectable, so that the rule
    is tested on recorded readings."""

    read: Callable[[], Counters] = read_counters
    runnable: Callable[[], int | None] = read_runnable
    cores: int = field(default_factory=usable_cores)
    # The least wait that counts as load. A timing's window is long and one preemption in it is no load; a
    # check whose short window would fail the case (copies.seen_values' confirming rounds) passes 0: a
    # finding that fails a case must not rest on rounds that waited for a CPU.
    floor_ns: float = RUN_WAIT_FLOOR_NS
    first: Counters | None = None
    window: Window | None = None  # the last window, once stopped
    _samples: list[int] = field(default_factory=list)
    _sampled_ns: int = 0

    def start(self) -> None:
        self._samples = []
        self.window = None
        self.first = self.read()
        self._sample()

    def block(self) -> str | None:
        """Samples the host's runnable tasks now and then; the load is judged over the whole window (stop):
        one block is too short to tell a time slice from load."""
        if self.first is not None and _wall_ns() - self._sampled_ns >= RUNNABLE_EVERY_NS:
            self._sample()
        return None

    def stop(self) -> list[str]:
        if self.first is None:
            return []
        self.window = Window.between(self.first, self.read(), self._samples, self.cores)
        problem = judge(self.window, self.floor_ns)
        return [problem] if problem else []

    def _sample(self) -> None:
        self._sampled_ns = _wall_ns()
        n = self.runnable()
        if n is not None:
            self._samples.append(n)

    @property
    def unwatched(self) -> str | None:
        return unwatched(self.first) if self.first is not None else None
