"""Sample a GPU's clocks, power state and throttle reasons with NVML into a CSV, until killed.

Run it beside a perf run to see what the device did while the run measured (what made the first process on
a freshly started machine slow: benchmarks/results/fresh_machine_2026-11-25/README.md):

    python benchmarks/nvml_trace.py --out benchmarks/out/nvml.csv --interval 0.1 &
    pytest tests/perf --perfguard ...
    kill %1
"""

from __future__ import annotations

import argparse
import csv
import signal
import sys
import time
from typing import Any

FIELDS = (
    "t_s",
    "gpu",
    "pstate",
    "sm_mhz",
    "mem_mhz",
    "power_w",
    "temp_c",
    "util_pct",
    "throttle",
    "procs",
)


def sample(nv: Any, handle: Any, index: int, t0: float) -> dict[str, Any]:
    def safe(fn: Any, *args: Any) -> Any:
        try:
            return fn(handle, *args)
        except Exception:
            return None

    power = safe(nv.nvmlDeviceGetPowerUsage)
    util = safe(nv.nvmlDeviceGetUtilizationRates)
    procs = safe(nv.nvmlDeviceGetComputeRunningProcesses)
    return {
        "t_s": round(time.time() - t0, 3),
        "gpu": index,
        "pstate": safe(nv.nvmlDeviceGetPerformanceState),
        "sm_mhz": safe(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM),
        "mem_mhz": safe(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_MEM),
        "power_w": None if power is None else round(power / 1000.0, 1),
        "temp_c": safe(nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU),
        "util_pct": None if util is None else util.gpu,
        "throttle": safe(nv.nvmlDeviceGetCurrentClocksThrottleReasons),
        "procs": None if procs is None else len(procs),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the CSV to write (one row per GPU per sample)")
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between samples")
    parser.add_argument("--t0", type=float, default=None, help="epoch seconds that t_s counts from")
    args = parser.parse_args(argv)
    import pynvml as nv

    nv.nvmlInit()
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
    t0 = args.t0 if args.t0 is not None else time.time()
    stop = False

    def end(*_: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, end)
    signal.signal(signal.SIGINT, end)
    with open(args.out, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=FIELDS)
        writer.writeheader()
        while not stop:
            for i, h in enumerate(handles):
                writer.writerow(sample(nv, h, i, t0))
            fh.flush()
            time.sleep(args.interval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
