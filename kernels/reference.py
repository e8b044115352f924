"""The plain math attention path: the correctness oracle and the FLOP convention.

Run on float64 copies it is the oracle every kernel is checked against; run in the inputs' own dtype it is
"PyTorch's native-precision path", whose error against the oracle sets FlashAttention's error bound.
It is deliberately naive (materialised scores, no fusion) so that nothing in it can hide a kernel bug.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

__all__ = ["AttentionFn", "attention_flops", "math_attention"]

# What every kernel in this package is: fn(q, k, v, causal) -> out, on (B, H, S, D) tensors.
AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool], torch.Tensor]


def math_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v, every step in the inputs' dtype (no upcast), on any device.

    Causal is the top-left mask: query i sees keys j <= i. The masked softmax is computed with ``-inf`` fill;
    no row is ever fully masked because query i always sees key 0.
    """
    if q.dim() != 4 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(
            f"expected q, k, v of one shape (B, H, S, D); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if causal:
        s_q, s_k = scores.shape[-2], scores.shape[-1]
        mask = torch.ones(s_q, s_k, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, v)


def attention_flops(B: int, H: int, S: int, D: int, causal: bool) -> int:
    """FLOPs of one forward pass, counting the two matmuls only (2 FLOPs per multiply-add).

    QK^T and PV cost 2*S*S*D each per head: 4*B*H*S*S*D. Causal halves it (the convention FlashAttention's
    and Triton's benchmarks use, rather than the exact S*(S+1)/2 count), so causal and non-causal TFLOP/s
    figures read on one scale. Softmax and scaling are not counted.
    """
    flops = 4 * B * H * S * S * D
    return flops // 2 if causal else flops
