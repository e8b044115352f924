"""The guarded attention suite: every kernel variant against SDPA, on the seeds' grid and awkward shapes.

Plain `pytest` checks every variant against the float64 oracle; `pytest --perfguard` also times each one
interleaved with SDPA and applies the baseline and ratio gates. Shapes too large for a CPU run carry a
GPU-only mark, so the CPU job stays minutes long while the GPU job covers the whole grid.
"""

from __future__ import annotations

import pytest
import torch

from kernels import KERNELS, attention_flops, cuda_ext, math_attention, sdpa, sdpa_backend, triton_flash
from pytest_perfguard import Variant, perf_case

# What each kernel needs to run; an unmet requirement skips the variant with its reason.
_CUDA = ["cuda", cuda_ext.unavailable_reason]
REQUIRES = {
    "triton_flash": ["cuda", triton_flash.unavailable_reason],
    **{name: _CUDA for name in cuda_ext.VARIANTS},
}
# sdpa is also the reference, timed against itself: an A/A control in every run. Every other variant is its
# own kernel: a profile that shows SDPA in it is a silent fallback, and fails the case.
VARIANTS = {
    name: Variant(fn, requires=REQUIRES.get(name), not_kernels=[] if name == "sdpa" else ["scaled_dot_product"])
    for name, fn in KERNELS.items()
}

ON_GPU = torch.cuda.is_available()
gpu_only = pytest.mark.skipif(not ON_GPU, reason="shape too large for the CPU run; covered on GPU")

# The seeds' benchmark grid (D=64, fp16, causal), plus shapes that fill a large GPU.
GRID = [
    pytest.param(1, 1, 128, 64, id="B1-H1-S128"),
    pytest.param(4, 8, 128, 64, id="B4-H8-S128"),
    pytest.param(8, 8, 128, 64, id="B8-H8-S128", marks=gpu_only),
    pytest.param(8, 8, 256, 64, id="B8-H8-S256", marks=gpu_only),
    pytest.param(16, 8, 512, 64, id="B16-H8-S512", marks=gpu_only),
    pytest.param(4, 16, 2048, 64, id="B4-H16-S2048", marks=gpu_only),
    pytest.param(8, 16, 4096, 64, id="B8-H16-S4096", marks=gpu_only),
]


@perf_case(
    variants=VARIANTS,
    reference=math_attention,
    against=sdpa,
    against_backend=sdpa_backend,  # recorded, so a torch upgrade that changes it is "not comparable"
    flops=lambda B, H, S, D: attention_flops(B, H, S, D, causal=True),
)
@pytest.mark.parametrize(("B", "H", "S", "D"), GRID)
def test_attention_grid(B: int, H: int, S: int, D: int, perfguard_device: str) -> tuple:
    q, k, v = (torch.randn(B, H, S, D, device=perfguard_device, dtype=torch.float16) for _ in range(3))
    return (q, k, v), {"causal": True}


# The seeds' correctness shapes (sequence 128 to 2048, causal and not) and the ones that break kernels:
# batch 1, S not a multiple of any tile, D = 128, bf16.
SHAPES = [
    pytest.param(1, 2, 113, 64, True, torch.float16, id="S113-causal"),
    pytest.param(1, 2, 239, 64, False, torch.float16, id="S239"),
    pytest.param(2, 2, 128, 128, True, torch.bfloat16, id="S128-D128-bf16-causal"),
    pytest.param(1, 2, 1023, 128, False, torch.float16, id="S1023-D128", marks=gpu_only),
    pytest.param(2, 4, 512, 64, False, torch.bfloat16, id="S512-bf16", marks=gpu_only),
    pytest.param(1, 4, 2048, 64, True, torch.float16, id="S2048-causal", marks=gpu_only),
    pytest.param(1, 4, 2048, 128, False, torch.bfloat16, id="S2048-D128-bf16", marks=gpu_only),
]


@perf_case(
    variants=VARIANTS,
    reference=math_attention,
    against=sdpa,
    against_backend=sdpa_backend,  # recorded, so a torch upgrade that changes it is "not comparable"
    flops=lambda B, H, S, D, causal: attention_flops(B, H, S, D, causal=causal),
)
@pytest.mark.parametrize(("B", "H", "S", "D", "causal", "dtype"), SHAPES)
def test_attention_shapes(
    B: int, H: int, S: int, D: int, causal: bool, dtype: torch.dtype, perfguard_device: str
) -> tuple:
    q, k, v = (torch.randn(B, H, S, D, device=perfguard_device, dtype=dtype) for _ in range(3))
    return (q, k, v), {"causal": causal}
