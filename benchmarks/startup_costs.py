"""What a process pays before its first case, step by step: each step runs three times in a fresh
interpreter and prints its wall seconds (`PYTHONPATH=. python -m benchmarks.startup_costs`; the driver step
needs an NVIDIA driver). Recorded in benchmarks/results/two_gpu_h200_2026-11-27."""

import subprocess
import sys
import time

STEPS = {
    "python": "pass",
    "pytest": "import pytest",
    "torch": "import torch",
    "torch+dynamo": "import torch, torch._dynamo",
    "triton": "import triton",
    "plugin": "import pytest_perfguard.plugin",
    "torch cuda names": "import torch; [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]",
    "torch cuda context": "import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()",
    "driver cuInit+names": (
        "import ctypes; c = ctypes.CDLL('libcuda.so.1'); assert c.cuInit(0) == 0; n = ctypes.c_int();"
        "c.cuDeviceGetCount(ctypes.byref(n)); b = ctypes.create_string_buffer(256);"
        "[c.cuDeviceGetName(b, 256, i) for i in range(n.value)]"
    ),
}
for name, code in STEPS.items():
    for attempt in range(3):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=False)
        print(f"{name:>22} try {attempt + 1}: {time.perf_counter() - t:6.2f} s", flush=True)
