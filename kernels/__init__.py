"""Attention kernel variants, all with the signature ``fn(q, k, v, causal) -> out`` on (B, H, S, D) tensors.

Plain functions: nothing here knows about the test plugin. ``KERNELS`` maps each name to its function;
``cuda_ext.unavailable_reason`` and ``triton_flash.unavailable_reason`` say why a variant cannot run here.
The guarded suite (``tests/perf/test_attention.py``) wraps each one with what it requires.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from . import cuda_ext, triton_flash
from .reference import attention_flops, math_attention
from .sdpa import make_sdpa, sdpa, sdpa_backend
from .torch_hybrid import torch_hybrid

KERNELS: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool], torch.Tensor]] = {
    "sdpa": sdpa,
    "torch_hybrid": torch_hybrid,
    "triton_flash": triton_flash.triton_flash,
    **cuda_ext.VARIANTS,
}

__all__ = [
    "KERNELS",
    "attention_flops",
    "cuda_ext",
    "make_sdpa",
    "math_attention",
    "sdpa",
    "sdpa_backend",
    "torch_hybrid",
    "triton_flash",
]
