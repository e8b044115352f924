"""The host's devices as an xdist controller needs them, without importing torch.

A controller runs no case: it hands each worker a GPU, prints the header and names the baseline file. On a
freshly started host with two H200s its imports (torch among them) took 7.3 s before its first worker
started, and every worker then imported torch again (benchmarks/results/two_gpu_h200_2026-11-27). Here the
CUDA driver answers where this process has not imported torch: it numbers and names GPUs as the CUDA runtime
under torch does (CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER are applied by the driver). Where torch is
imported, it answers.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import platform
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

CUDA_ERROR_NO_DEVICE = 100  # cuInit's answer where no GPU is visible (CUDA_VISIBLE_DEVICES="", none installed)


@dataclass(frozen=True)
class Gpu:
    name: str
    uuid: str  # as torch prints it: 8-4-4-4-12 hex digits, no "GPU-" prefix


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def timing_gpus(names: Sequence[str], first: int = 0) -> list[int]:
    """The GPUs a guarded run times on: every GPU of GPU `first`'s model. A case's baseline lives in its
    model's file, and xdist hands cases to workers in no fixed order: on a host of two models, a case would
    be timed on one model in one run and on the other in the next, and compared with nothing."""
    return [i for i, name in enumerate(names) if name == names[first]] if names else []


def device_index(device: str) -> int:
    """N of "cuda:N"; 0 for "cuda" (and "cpu")."""
    return int(device.partition(":")[2] or 0)


def gpu_names() -> list[str]:
    """The visible CUDA GPUs' names, by CUDA index; none without CUDA (or with a torch built without it)."""
    return [gpu.name for gpu in cuda_gpus()]


@functools.cache
def cuda_gpus() -> tuple[Gpu, ...]:
    """The visible CUDA GPUs, by CUDA index. No CUDA context is made."""
    torch = sys.modules.get("torch")
    if torch is not None:
        if not torch.cuda.is_available():
            return ()
        props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
        return tuple(Gpu(p.name, "".join(c for c in str(p.uuid) if c.isalnum() or c == "-")) for p in props)
    built = torch_cuda_build()
    if built is False:
        return ()
    gpus = _driver_gpus() if built else None
    if gpus is None:  # torch's build unread, or no driver library to ask (not Linux): torch answers
        import torch

        cuda_gpus.cache_clear()
        return cuda_gpus()
    return gpus


def torch_cuda_build() -> bool | None:
    """Whether the installed torch was built with CUDA, from its version.py, without importing it: a CPU
    build on a GPU host sees no GPU, and neither must the controller. None where that file says nothing."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return False
    try:
        text = (Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text(encoding="utf-8")
    except OSError:
        return None
    found = re.search(r"^cuda\s*(?::[^=\n]*)?=\s*(.+?)\s*$", text, re.MULTILINE)
    if found is None:
        return None
    return found.group(1) != "None"


def _driver_gpus() -> tuple[Gpu, ...] | None:
    """The driver's GPUs; None where its library does not load, or it fails other than finding no device."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    count, handle = ctypes.c_int(), ctypes.c_int()
    status = cuda.cuInit(0)
    if status == CUDA_ERROR_NO_DEVICE:
        return ()
    if status != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return None
    gpus = []
    for index in range(count.value):
        name, uuid = ctypes.create_string_buffer(256), ctypes.create_string_buffer(16)
        if cuda.cuDeviceGet(ctypes.byref(handle), index) != 0 or cuda.cuDeviceGetName(name, 256, handle) != 0:
            return None
        if cuda.cuDeviceGetUuid(uuid, handle) != 0:
            return None
        h = uuid.raw.hex()
        gpus.append(Gpu(name.value.decode(), f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"))
    return tuple(gpus)
