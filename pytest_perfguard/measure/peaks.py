"""What a GPU can do at most: peak compute and memory bandwidth, and the physics check built on them.

A time that implies more FLOP/s or bytes/s than the device can deliver is not a fast kernel: it is a
timer that does not see the work (events on the wrong stream, work left to a background thread). The
peaks are upper bounds, so the check only ever rejects the impossible.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Peak:
    """Datasheet peaks of one GPU model: dense (no sparsity) tensor fp16/bf16, plain fp32, DRAM bandwidth."""

    tensor_tflops: float
    fp32_tflops: float
    gbps: float
    source: str


# NVIDIA datasheets, dense figures (the datasheets print the 2:4-sparsity ones, twice these, with a footnote):
# L4: nvidia.com/en-us/data-center/l4 (L4 datasheet). A100: nvidia.com/en-us/data-center/a100 (A100 datasheet,
# table "Specifications"). H100: nvidia.com/en-us/data-center/h100 (H100 datasheet, SXM / PCIe / NVL columns).
# H200: nvidia.com/en-us/data-center/h200 (H200 datasheet, SXM / NVL columns). B200: nvidia.com/en-us/data-center/hgx
# (HGX B200 specifications, per GPU). Keys are matched against torch's device name, longest key first.
PEAKS: dict[str, Peak] = {
    "L4": Peak(121.0, 30.3, 300.0, "L4 datasheet"),
    "A100-SXM4-40GB": Peak(312.0, 19.5, 1555.0, "A100 datasheet (SXM 40GB)"),
    "A100-SXM4-80GB": Peak(312.0, 19.5, 2039.0, "A100 datasheet (SXM 80GB)"),
    "A100-PCIE-40GB": Peak(312.0, 19.5, 1555.0, "A100 datasheet (PCIe 40GB)"),
    "A100 80GB PCIe": Peak(312.0, 19.5, 1935.0, "A100 datasheet (PCIe 80GB)"),
    "H100 80GB HBM3": Peak(989.4, 67.0, 3350.0, "H100 datasheet (SXM)"),
    "H100 SXM": Peak(989.4, 67.0, 3350.0, "H100 datasheet (SXM)"),
    "H100 PCIe": Peak(756.0, 51.0, 2000.0, "H100 datasheet (PCIe)"),
    "H100 NVL": Peak(835.0, 60.0, 3900.0, "H100 datasheet (NVL)"),
    "H200": Peak(989.4, 67.0, 4800.0, "H200 datasheet (SXM)"),
    "H200 NVL": Peak(835.0, 60.0, 4800.0, "H200 datasheet (NVL)"),
    "B200": Peak(2250.0, 75.0, 8000.0, "HGX B200 specifications"),
}

# Dense fp16 tensor FLOP per clock per SM, by compute capability: the datasheet peak divided by SM count and
# boost clock (A100 312e12 / (108 x 1.41 GHz) = 2048; H100 SXM 989.4e12 / (132 x 1.83 GHz) = 4096; L4 121e12 /
# (58 x 2.04 GHz) = 1024). Used only for GPUs missing from PEAKS, with the clock and memory from NVML.
TENSOR_FLOP_PER_CLOCK_SM: dict[tuple[int, int], int] = {(8, 0): 2048, (8, 9): 1024, (9, 0): 4096}
FP32_FLOP_PER_CLOCK_SM: dict[tuple[int, int], int] = {(8, 0): 128, (8, 9): 256, (9, 0): 256}


@dataclass(frozen=True)
class DeviceSpec:
    """What the fallback needs from a device: its name and, where NVML has them, clocks and bus width."""

    name: str
    capability: tuple[int, int] | None = None
    sm_count: int | None = None
    max_sm_clock_mhz: float | None = None
    max_mem_clock_mhz: float | None = None
    mem_bus_bits: int | None = None


def _from_table(name: str) -> Peak | None:
    """The longest key found in `name` as a whole word: "L4" is not the L40S, "H200" not the GH200."""
    for key in sorted(PEAKS, key=len, reverse=True):
        if re.search(rf"(?<![a-z0-9]){re.escape(key.lower())}(?![a-z0-9])", name.lower()):
            return PEAKS[key]
    return None


def peak_for(spec: DeviceSpec) -> Peak | None:
    """The device's peaks: the datasheet table by name, else computed from SM count, clock and bus width
    (per-SM throughput by architecture), else None: an unknown GPU is not checked."""
    known = _from_table(spec.name)
    if known is not None:
        return known
    cap = spec.capability
    if (
        cap in TENSOR_FLOP_PER_CLOCK_SM
        and spec.sm_count
        and spec.max_sm_clock_mhz
        and spec.max_mem_clock_mhz
        and spec.mem_bus_bits
    ):
        assert cap is not None
        clock = spec.max_sm_clock_mhz * 1e6
        tensor = spec.sm_count * clock * TENSOR_FLOP_PER_CLOCK_SM[cap] / 1e12
        fp32 = spec.sm_count * clock * FP32_FLOP_PER_CLOCK_SM[cap] / 1e12
        gbps = spec.max_mem_clock_mhz * 1e6 * 2 * spec.mem_bus_bits / 8 / 1e9  # double data rate
        return Peak(tensor, fp32, gbps, f"computed from NVML clocks for sm{cap[0]}{cap[1]}")
    return None


def device_spec(index: int, nvml: Callable[[], Any] | None = None) -> DeviceSpec:
    """The spec of CUDA device `index`, with NVML's maximum clocks where NVML is available."""
    import torch

    props = torch.cuda.get_device_properties(index)
    spec = DeviceSpec(props.name, (props.major, props.minor), props.multi_processor_count)
    nv = nvml() if nvml is not None else None
    if nv is None:
        return spec
    try:
        uuid = str(props.uuid)
        handle = next(
            h
            for h in (nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount()))
            if uuid in str(nv.nvmlDeviceGetUUID(h))
        )
        return DeviceSpec(
            spec.name,
            spec.capability,
            spec.sm_count,
            float(nv.nvmlDeviceGetMaxClockInfo(handle, nv.NVML_CLOCK_SM)),
            float(nv.nvmlDeviceGetMaxClockInfo(handle, nv.NVML_CLOCK_MEM)),
            int(nv.nvmlDeviceGetMemoryBusWidth(handle)),
        )
    except Exception:
        return spec


@functools.cache
def device_peak(index: int) -> tuple[str, Peak | None]:
    """CUDA device `index`'s name and peaks, looked up once per process: a fact of the hardware, and NVML's
    queries are not free."""
    from .device import nvml

    spec = device_spec(index, nvml)
    return spec.name, peak_for(spec)


def impossible_speed(peak: Peak, *, tflops: float | None, gbps: float | None) -> str | None:
    """The flag's message when a throughput exceeds the device's peak, else None.

    Compute is held to the dense tensor peak, the highest non-fp8 figure of the device, whatever the dtype:
    the check rejects only what no kernel can do.
    """
    if tflops is not None and math.isfinite(tflops) and tflops > peak.tensor_tflops:
        return (
            f"impossible speed: {tflops:.4g} TFLOP/s exceeds this GPU's peak {peak.tensor_tflops:.4g}: "
            "the timer does not see the work"
        )
    if gbps is not None and math.isfinite(gbps) and gbps > peak.gbps:
        return (
            f"impossible speed: {gbps:.4g} GB/s exceeds this GPU's peak {peak.gbps:.4g}: "
            "the timer does not see the work"
        )
    return None


def percent_of_peak(
    peak: Peak, *, tflops: float | None, gbps: float | None, dtype: str
) -> tuple[float | None, float | None]:
    """(% of peak compute, % of peak bandwidth). Half precision is compared with the tensor peak, the rest with fp32."""
    compute_peak = peak.tensor_tflops if dtype in ("float16", "bfloat16") else peak.fp32_tflops
    pc = 100 * tflops / compute_peak if tflops else None
    pb = 100 * gbps / peak.gbps if gbps else None
    return pc, pb
