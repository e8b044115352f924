"""The "cuBLAS hybrid": two library matmuls around a float32 softmax.

This is what a hand-written kernel has to beat before it is worth keeping: QK^T and PV go to cuBLAS (or the
CPU BLAS) in the inputs' dtype, and only the softmax is done in float32 so that fp16/bf16 scores neither
overflow nor lose the small probabilities. Three kernels plus the mask, and the S x S scores live in memory.
"""

from __future__ import annotations

import math

import torch

__all__ = ["torch_hybrid"]


def torch_hybrid(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """matmul (input dtype) -> masked softmax in float32 -> matmul (input dtype)."""
    if q.dim() != 4 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(
            f"expected q, k, v of one shape (B, H, S, D); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    scores = torch.matmul(q, k.transpose(-2, -1)).float()
    scores.mul_(1.0 / math.sqrt(q.shape[-1]))
    if causal:
        s = scores.shape[-1]
        future = torch.ones(s, s, dtype=torch.bool, device=q.device).triu_(1)
        scores.masked_fill_(future, float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(q.dtype)
    return torch.matmul(probs, v)
