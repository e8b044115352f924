"""Attention kernel variants, all with the signature ``fn(q, k, v, causal) -> out`` on (B, H, S, D) tensors.

``VARIANTS`` maps each name to a ``pytest_perfguard.Variant`` carrying what it needs to run, so the guarded
suite and the benchmarks skip an unavailable variant with its reason instead of failing on it.
"""

from __future__ import annotations

from pytest_perfguard import Variant

from . import cuda_ext, triton_flash
from .reference import attention_flops, math_attention
from .sdpa import make_sdpa, sdpa, sdpa_backend
from .torch_hybrid import torch_hybrid

# The ratio gate records which SDPA backend ran, so a torch upgrade that changes it is "not comparable".
sdpa.perfguard_backend = sdpa_backend  # type: ignore[attr-defined]

_CUDA = ["cuda", cuda_ext.unavailable_reason]

VARIANTS: dict[str, Variant] = {
    "sdpa": Variant(sdpa),  # the reference timed against itself: an A/A control in every run
    "torch_hybrid": Variant(torch_hybrid),
    "triton_flash": Variant(triton_flash.triton_flash, requires=["cuda", triton_flash.unavailable_reason]),
    "cuda_scalar": Variant(cuda_ext.cuda_scalar, requires=_CUDA),
    "cuda_tiled": Variant(cuda_ext.cuda_tiled, requires=_CUDA),
    "cuda_wmma": Variant(cuda_ext.cuda_wmma, requires=_CUDA),
    "cuda_splitkv": Variant(cuda_ext.cuda_splitkv, requires=_CUDA),
}

__all__ = ["VARIANTS", "attention_flops", "make_sdpa", "math_attention", "sdpa", "sdpa_backend", "torch_hybrid"]
