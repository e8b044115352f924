"""What machine the numbers came from, and whether it was disturbed while they were taken.

A baseline is only comparable on the same device model with the same software stack: the fingerprint
lists what moves timings (GPU model and capability, torch, triton, CUDA, the SDPA backend that ran).
NVML, when present, reports clock throttling, another process's work on the GPU and an SM clock below the
steady state during a measurement; each makes a verdict inconclusive rather than a regression (on CPU,
cpuwatch.py watches the host).
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..slugs import device_slug
from .visible import cpu_model, cuda_gpus, device_index

# Keys whose change makes stored timings incomparable. The driver is recorded but not compared: it
# rarely moves kernel time, and machines of one model in a runner pool often differ in it.
COMPARED_KEYS = ("name", "capability", "torch", "triton", "cuda", "against_backend", "timing", "mode")
# How the variant's calls were timed: "cuda-graph" (replayed, device time alone), "cuda-stream" (its capture
# failed: launched from Python on every timed call) or "cpu". A variant that stops capturing is timed another
# way, with host code in every call: a change of workload, never a speed-up. Entries from before the key were
# CUDA graph replays where they carry the timing key.
MODE_NAMES = {"cuda-graph": "CUDA graph replay", "cuda-stream": "stream launches (graph capture failed)", "cpu": "cpu"}
# How a CUDA case is timed (timers._CudaGraphSample), stored with every entry: figures taken another way are
# not compared. Entries from before the key timed each replay from an idle stream, so their small cases carry
# the host's launch latency divided by the calls per sample, and their long ones one input placement.
CUDA_TIMING = "cuda graph, stream held, 8+ input copies, each in every block"
UNHELD_TIMING = "cuda graph, stream idle"


def _triton_version() -> str | None:
    try:
        import triton

        return str(triton.__version__)
    except Exception:
        return None


def manual_seed(seed: int) -> None:
    """Seed the generators a test's inputs are drawn from: the CPU's and, where there is one, CUDA's.

    torch.manual_seed also queues the seeding of every other backend (XPU, MTIA; CUDA before it starts) and
    formats the caller's stack for each: 1 to 3 ms a call from inside a pytest run, once per input copy.
    """
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def nvml() -> Any:
    """The initialised pynvml module, or None where it is not installed or finds no driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:
        return None


def fingerprint(device: str) -> dict[str, Any]:
    """The device dictionary stored in baselines and results. `device` is "cpu" or "cuda[:i]"."""
    info: dict[str, Any] = {"torch": torch.__version__, "triton": _triton_version()}
    if device.startswith("cuda") and torch.cuda.is_available():
        dev = torch.device(device)
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        info.update(
            kind="cuda",
            name=props.name,
            capability=f"{props.major}.{props.minor}",
            sm_count=props.multi_processor_count,
            l2_bytes=int(getattr(props, "L2_cache_size", 0) or 0),
            memory_bytes=int(props.total_memory),
            cuda=torch.version.cuda,
            driver=None,
        )
        nv = nvml()
        if nv is not None:
            with contextlib.suppress(Exception):
                info["driver"] = _text(nv.nvmlSystemGetDriverVersion())
        info["slug"] = device_slug(props.name)
    else:
        name = cpu_model()
        info.update(kind="cpu", name=name, capability=None, cores=os.cpu_count(), cuda=None, driver=None)
        info["slug"] = "cpu-" + device_slug(name)
    return info


@functools.cache
def lock_name(device: str) -> str:
    """What the device lock is named after: a GPU's UUID, so that processes which number one GPU differently
    (CUDA_VISIBLE_DEVICES) take one lock for it, and two GPUs both called cuda:0 take two."""
    if not device.startswith("cuda"):
        return device
    gpus, index = cuda_gpus(), device_index(device)
    return "gpu-" + gpus[index].uuid if index < len(gpus) else device


SESSION_PIDS_ENV = "PERFGUARD_SESSION_PIDS"  # set for a confirmation process: the session it belongs to


def session_pids() -> set[int]:
    """Processes that make up this test session: this one, an xdist worker's controller, and those a
    confirmation process inherits from the process that started it."""
    pids = {os.getpid()}
    if os.environ.get("PYTEST_XDIST_WORKER"):
        pids.add(os.getppid())
    for part in os.environ.get(SESSION_PIDS_ENV, "").split(","):
        if part.strip().isdigit():
            pids.add(int(part))
    return pids


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _sibling(pid: int) -> bool:
    """True for processes of this test session or started by it: xdist workers, confirmation processes
    (of this worker or of another). They hold a CUDA context, not load: while one of them times, the others
    wait on the device lock."""
    ours = session_pids()
    current: int | None = pid
    for _ in range(5):  # the process and four ancestors: worker -> confirmation is two levels
        if current is None or current <= 1:
            return False
        if current in ours:
            return True
        current = _parent(current)
    return False


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def process_name(pid: int, nv: Any = None) -> str:
    """What a message calls a process: its command and first argument from /proc ("python3: load.py"),
    else NVML's name for it (a process of another PID namespace has no /proc entry here), else "unknown"."""
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as fh:
            comm = fh.read().strip()
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            args = fh.read().decode(errors="replace").split("\0")[1:]
    except OSError:
        comm, args = "", []
    if comm:
        first = " ".join(next((a for a in args if a and not a.startswith("-")), "").split())
        if "/" in first and " " not in first:
            first = os.path.basename(first)
        if len(first) > 40:
            first = first[:37] + "..."
        return f"{comm}: {first}" if first else comm
    try:
        name = _text(nv.nvmlSystemGetProcessName(pid)).strip()
    except Exception:
        name = ""
    return os.path.basename(name) or name or "unknown"


def incomparable(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Human-readable differences that make a stored figure incomparable with the current one."""
    out = []
    for key in COMPARED_KEYS:
        if key == "timing" and key in current:
            was = stored.get(key, UNHELD_TIMING)  # an entry older than the key
        elif key == "mode" and key not in stored and "timing" in stored and key in current:
            was = "cuda-graph"  # a CUDA entry older than the key: every such entry was a graph replay
        elif key in stored:
            was = stored[key]
        else:
            continue
        if was != current.get(key):
            label = {"against_backend": "SDPA backend", "timing": "timing method", "mode": "timed by"}.get(key, key)
            if key == "mode":
                was, now = MODE_NAMES.get(str(was), was), MODE_NAMES.get(str(current.get(key)), current.get(key))
                out.append(f"{label} {was} \u2192 {now}")
            else:
                out.append(f"{label} {was} \u2192 {current.get(key)}")
    return out


def nvml_handle(nv: Any, uuid: str | None) -> Any:
    """NVML's handle for the GPU that CUDA knows by this UUID, or None. NVML numbers GPUs in PCI order and
    ignores CUDA_VISIBLE_DEVICES, so a CUDA index can name another GPU there (an xdist worker pinned to its
    own GPU sees it as cuda:0); the index is used only when NVML sees a single GPU."""
    if uuid:
        try:
            # bytes: older pynvml passes the argument straight to ctypes' c_char_p
            return nv.nvmlDeviceGetHandleByUUID((uuid if uuid.startswith("GPU-") else "GPU-" + uuid).encode())
        except Exception:
            pass
    try:
        if int(nv.nvmlDeviceGetCount()) == 1:
            return nv.nvmlDeviceGetHandleByIndex(0)
    except Exception:
        pass
    return None


# A busy GPU whose SM clock reads under this share of its steady clock (the applications clock it holds
# under load) was slowed by something the throttle reasons may not name: nvbench drops such samples (75% of
# the default clock). A fresh H100 held 1980 MHz, its maximum, throughout every measurement and idled at
# 345 MHz between processes (benchmarks/results/fresh_machine_2026-11-25).
CLOCK_FLOOR = 0.75
# A clock reading counts only when NVML saw the GPU busy for at least this % of its last sample period: an
# idle GPU lowers its clock by design.
BUSY_UTIL = 50
_GPU_IDLE = 0x1  # nvmlClocksThrottleReasonGpuIdle
_SW_POWER_CAP = 0x4  # nvmlClocksThrottleReasonSwPowerCap: a power-bound kernel's steady state, not a disturbance


def steady_clock(nv: Any, handle: Any) -> tuple[int, str] | None:
    """The SM clock (MHz) a busy GPU holds, and what NVML calls it: its applications clock, else the default
    one, else its maximum; None where NVML tells none."""
    sm = getattr(nv, "NVML_CLOCK_SM", 1)
    for name, label in (
        ("nvmlDeviceGetApplicationsClock", "applications clock"),
        ("nvmlDeviceGetDefaultApplicationsClock", "default applications clock"),
        ("nvmlDeviceGetMaxClockInfo", "maximum clock"),
    ):
        try:
            mhz = int(getattr(nv, name)(handle, sm))
        except Exception:
            continue
        if mhz > 0:
            return mhz, label
    return None


# A process of another session shares the GPU when NVML saw its kernels keep the SMs, or its traffic the
# memory, busy for at least this % of one of its sample periods while a case was timed. A process that only
# holds a context (a notebook, a server between requests, a test session's sleeping worker) takes no time from
# ours: on an H100 (driver 580) it had no sample at all, and a matmul loop beside the timing read 47-99% SM
# (benchmarks/idle_context_gpu.py). 5% is a choice, not a measurement: NVML reports whole percents, and a
# share this size, time-sliced with our kernels, is what a regression margin of a few percent cannot absorb.
FOREIGN_UTIL = 5
# NVML publishes each process's utilisation once per sample period (every 0.2 s, within about 20 ms, on that
# H100; 1/6 s to 1 s by product, says nvidia-smi): a GPU is quiet only once the polls of this long saw no
# foreign work, so that the periods which had some were published.
QUIET_SPAN_S = 1.0
_NVML_SUCCESS, _NVML_NOT_FOUND = 0, 6  # pynvml raises these when no sample is newer than the one asked for


@dataclass
class Disturbances:
    """Watches one GPU through NVML during a measurement (a timers.Watch): throttling, another process's work
    on it, and an SM clock below the steady state while the GPU is busy. `clock` and `sleep` pace wait_quiet;
    tests pass fakes.

    Another process's work is read from NVML's per-process utilisation samples, stamped in us of the wall
    clock. A read returns each process's newest sample newer than the last stamp seen; a process that only
    holds a context has none. Reading once per block sees every sample where blocks are shorter than NVML's
    sample period, so work done between two reads is seen at the next one. What still gets past: a process
    under FOREIGN_UTIL in every sample; a busy sample replaced by a newer, idle one of the same process before
    the next read (blocks longer than the sample period); the period NVML has not published when the window
    stops (up to one at its end); a light load beside our heavy kernels (NVML gives a time-sliced period to
    some processes only: on an H100 a 2048^2 matmul loop beside an 8192^2 one had one sample in 4 s); a
    process of this test session or started by it (_sibling); and where NVML cannot tell a process's
    utilisation (MIG, old drivers), a context held counts as load, as it did before."""

    index: int
    handle: Any = None
    nv: Any = None
    seen: list[str] = field(default_factory=list)
    steady: tuple[int, str] | None = None  # steady_clock(), read once
    low: list[int] = field(default_factory=list)  # busy SM clocks under the floor, this window
    readings: int = 0  # busy clock readings, this window
    last_seen: int = 0  # the newest NVML process sample read (NVML's time stamp, us)
    shared: bool = False  # another process's work was reported in this window
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep

    @classmethod
    def open(cls, device: str) -> Disturbances | None:
        if not device.startswith("cuda"):
            return None
        nv = nvml()
        if nv is None:
            return None
        dev = torch.device(device)
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        try:
            uuid: str | None = str(torch.cuda.get_device_properties(index).uuid)
        except Exception:
            uuid = None
        handle = nvml_handle(nv, uuid)
        return None if handle is None else cls(index=index, handle=handle, nv=nv, steady=steady_clock(nv, handle))

    def start(self) -> None:
        self.low, self.readings, self.shared = [], 0, False
        self._process_use()  # what was published before the window is not the window's: read past it

    def block(self) -> str | None:
        return self.check()

    def stop(self) -> list[str]:
        out = []
        if not self.shared:  # the samples of the last block's time are published after its reading
            late = self._shared("while timed")
            if late is not None:
                out.append(late)
        if self.low and self.steady is not None:
            mhz, label = self.steady
            out.append(
                f"GPU {self.index} ran below its steady clock while busy: SM clock down to {min(self.low)} MHz in "
                f"{len(self.low)} of {self.readings} block(s), under {CLOCK_FLOOR:.0%} of its {mhz} MHz {label}, "
                "with no power cap to explain it"
            )
        return out

    def check(self) -> str | None:
        """One reading; returns a description of a disturbance, or None when the GPU looked clean. A clock
        below the steady state is counted here and judged over the window (stop)."""
        reasons = self._reasons()
        throttled = self._throttled(reasons, "during timing")
        if throttled is not None:
            return throttled
        self._read_clock(reasons)
        shared = self._shared("while timed")
        self.shared = self.shared or shared is not None
        return shared

    def wait_quiet(self, max_s: float, poll_s: float = 0.5) -> tuple[bool, float, str]:
        """Polls every `poll_s` until no other process works on the GPU and no throttle reason is raised, for
        QUIET_SPAN_S in a row, or until `max_s` has passed: the runner's wait before it re-measures a disturbed
        case, so that the second measurement does not meet the same load.

        Returns whether the GPU is quiet, the seconds waited, and the last disturbance seen ("" if none was).
        At `max_s` a GPU whose last poll was clean counts as quiet, even if for less than QUIET_SPAN_S: the
        re-measurement's own watch still judges it. A load that pauses for longer than QUIET_SPAN_S and then
        resumes gets past this wait, not past that watch. Where NVML cannot tell a process's utilisation, the
        wait is for the other compute processes to exit."""
        if poll_s <= 0:
            raise ValueError(f"wait_quiet: poll_s must be positive, not {poll_s}")
        start = self.clock()
        seen, clean_since = "", None
        while True:
            now = self.clock()
            waited = now - start
            problem = self._throttled(self._reasons(), "while waiting to re-measure") or self._shared(
                "while waiting to re-measure"
            )
            if problem is not None:
                seen, clean_since = problem, None
            elif clean_since is None:
                clean_since = now
            if clean_since is not None and (now - clean_since >= QUIET_SPAN_S or waited >= max_s):
                return True, waited, seen
            if waited >= max_s:
                return False, waited, seen
            self.sleep(min(poll_s, max_s - waited))

    def _reasons(self) -> int:
        try:
            return int(self.nv.nvmlDeviceGetCurrentClocksThrottleReasons(self.handle))
        except Exception:
            return 0

    def _throttled(self, reasons: int, when: str) -> str | None:
        nv = self.nv
        bad = {
            "HW slowdown": getattr(nv, "nvmlClocksThrottleReasonHwSlowdown", 0x8),
            "SW thermal slowdown": getattr(nv, "nvmlClocksThrottleReasonSwThermalSlowdown", 0x20),
            "HW thermal slowdown": getattr(nv, "nvmlClocksThrottleReasonHwThermalSlowdown", 0x40),
            "HW power brake": getattr(nv, "nvmlClocksThrottleReasonHwPowerBrakeSlowdown", 0x80),
        }
        for label, bit in bad.items():
            if reasons & int(bit):
                return f"GPU {self.index} throttled ({label}) {when}"
        return None

    def _process_use(self) -> dict[int, tuple[int, int]] | str:
        """Each process's highest SM and memory utilisation (%) in the NVML samples published since the last
        read, or why NVML could not tell (NotSupported under MIG and on old drivers)."""
        read = getattr(self.nv, "nvmlDeviceGetProcessUtilization", None)
        if read is None:
            return "this pynvml has no nvmlDeviceGetProcessUtilization"
        try:
            samples = read(self.handle, self.last_seen)
        except Exception as exc:
            if getattr(exc, "value", None) in (_NVML_SUCCESS, _NVML_NOT_FOUND):
                return {}  # no process did anything NVML sampled since the last read
            return f"its per-process utilisation: {str(exc) or type(exc).__name__}"
        use: dict[int, tuple[int, int]] = {}
        for s in samples:
            self.last_seen = max(self.last_seen, int(s.timeStamp))
            sm, mem = use.get(int(s.pid), (0, 0))
            use[int(s.pid)] = (max(sm, int(s.smUtil)), max(mem, int(s.memUtil)))
        return use

    def _shared(self, when: str) -> str | None:
        """Another process's work on the GPU since the last read, named, or None."""
        use = self._process_use()
        if isinstance(use, str):
            return self._held(use, when)
        me = os.getpid()
        busy = sorted(
            (
                (pid, sm, mem)
                for pid, (sm, mem) in use.items()
                if max(sm, mem) >= FOREIGN_UTIL and pid != me and not _sibling(pid)
            ),
            key=lambda p: (-max(p[1], p[2]), p[0]),
        )
        if not busy:
            return None
        named = " and ".join(
            f"pid {pid} ({process_name(pid, self.nv)}) at {sm}% SM, {mem}% memory" for pid, sm, mem in busy[:3]
        )
        more = f" (and {len(busy) - 3} more)" if len(busy) > 3 else ""
        return f"GPU {self.index} shared with {named}{more} {when}"

    def _held(self, why: str, when: str) -> str | None:
        """The fallback where NVML cannot say what a process does: holding a compute context counts."""
        try:
            procs = self.nv.nvmlDeviceGetComputeRunningProcesses(self.handle)
            others = [int(p.pid) for p in procs if int(p.pid) != os.getpid() and not _sibling(int(p.pid))]
        except Exception:
            others = []
        if not others:
            return None
        named = ", ".join(f"pid {pid} ({process_name(pid, self.nv)})" for pid in others[:5])
        return (
            f"other compute processes on GPU {self.index} {when}: {named}; NVML cannot tell what they do "
            f"({why}), so a context held counts as load"
        )

    def _read_clock(self, reasons: int) -> None:
        """Counts a busy reading, and keeps its SM clock when it is under the floor."""
        nv = self.nv
        if self.steady is None or reasons & (_GPU_IDLE | _SW_POWER_CAP):
            return
        try:
            mhz = int(nv.nvmlDeviceGetClockInfo(self.handle, getattr(nv, "NVML_CLOCK_SM", 1)))
        except Exception:
            return
        try:
            busy = int(nv.nvmlDeviceGetUtilizationRates(self.handle).gpu) >= BUSY_UTIL
        except Exception:
            busy = True  # no utilisation counter (MIG): timing keeps the GPU busy
        if not busy:
            return
        self.readings += 1
        if mhz < CLOCK_FLOOR * self.steady[0]:
            self.low.append(mhz)
