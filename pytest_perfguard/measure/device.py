"""What machine the numbers came from, and whether it was disturbed while they were taken.

A baseline is only comparable on the same device model with the same software stack: the fingerprint
lists what moves timings (GPU model and capability, torch, triton, CUDA, the SDPA backend that ran).
NVML, when present, reports clock throttling, other compute processes and an SM clock below the steady
state during a measurement; each makes a verdict inconclusive rather than a regression (on CPU,
cpuwatch.py watches the host).
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from ..judge.baseline import device_slug
from .visible import cpu_model, cuda_gpus, device_index

# Keys whose change makes stored timings incomparable. The driver is recorded but not compared: it
# rarely moves kernel time, and machines of one model in a runner pool often differ in it.
COMPARED_KEYS = ("name", "capability", "torch", "triton", "cuda", "against_backend", "timing")
# How a CUDA case is timed (timing._CudaGraphSample), stored with every entry: figures taken another way are
# not compared. Entries from before the key timed each replay from an idle stream, so their small cases carry
# the host's launch latency divided by the calls per sample, and their long ones one input placement.
CUDA_TIMING = "cuda graph, stream held, 8+ input copies"
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


def incomparable(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Human-readable differences that make a stored figure incomparable with the current one."""
    out = []
    for key in COMPARED_KEYS:
        if key == "timing" and key in current:
            was = stored.get(key, UNHELD_TIMING)  # an entry older than the key
        elif key in stored:
            was = stored[key]
        else:
            continue
        if was != current.get(key):
            label = {"against_backend": "SDPA backend", "timing": "timing method"}.get(key, key)
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


@dataclass
class Disturbances:
    """Watches one GPU through NVML during a measurement (a timing.Watch): throttling, foreign compute
    processes, and an SM clock below the steady state while the GPU is busy."""

    index: int
    handle: Any = None
    nv: Any = None
    seen: list[str] = field(default_factory=list)
    steady: tuple[int, str] | None = None  # steady_clock(), read once
    low: list[int] = field(default_factory=list)  # busy SM clocks under the floor, this window
    readings: int = 0  # busy clock readings, this window

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
        self.low, self.readings = [], 0

    def block(self) -> str | None:
        return self.check()

    def stop(self) -> list[str]:
        if not self.low or self.steady is None:
            return []
        mhz, label = self.steady
        return [
            f"GPU {self.index} ran below its steady clock while busy: SM clock down to {min(self.low)} MHz in "
            f"{len(self.low)} of {self.readings} block(s), under {CLOCK_FLOOR:.0%} of its {mhz} MHz {label}, "
            "with no power cap to explain it"
        ]

    def check(self) -> str | None:
        """One reading; returns a description of a disturbance, or None when the GPU looked clean. A clock
        below the steady state is counted here and judged over the window (stop)."""
        nv = self.nv
        try:
            reasons = int(nv.nvmlDeviceGetCurrentClocksThrottleReasons(self.handle))
        except Exception:
            reasons = 0
        bad = {
            "HW slowdown": getattr(nv, "nvmlClocksThrottleReasonHwSlowdown", 0x8),
            "SW thermal slowdown": getattr(nv, "nvmlClocksThrottleReasonSwThermalSlowdown", 0x20),
            "HW thermal slowdown": getattr(nv, "nvmlClocksThrottleReasonHwThermalSlowdown", 0x40),
            "HW power brake": getattr(nv, "nvmlClocksThrottleReasonHwPowerBrakeSlowdown", 0x80),
        }
        for label, bit in bad.items():
            if reasons & int(bit):
                return f"GPU {self.index} throttled ({label}) during timing"
        self._read_clock(reasons)
        try:
            procs = nv.nvmlDeviceGetComputeRunningProcesses(self.handle)
            others = [int(p.pid) for p in procs if int(p.pid) != os.getpid() and not _sibling(int(p.pid))]
        except Exception:
            others = []
        if others:
            return f"other compute processes on GPU {self.index} during timing (pids {others[:5]})"
        return None

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
