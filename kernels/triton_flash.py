"""A fused FlashAttention-2-style forward kernel in Triton.

One program owns BLOCK_M query rows of one (batch, head) and streams the keys/values past them in BLOCK_N
tiles, keeping the running row max and row sum of an online softmax in float32 and the two products on tensor
cores (``tl.dot``), so the S x S scores never reach memory. The key loop is split in two stages so that only
the tiles that need a mask pay for it:

* stage 1, the unmasked tiles: every key tile strictly left of the diagonal block (causal), or every full key
  tile (non-causal), with no masks at all;
* stage 2, the masked tiles: the diagonal block (causal mask, which also hides keys past S for real rows), or
  the last partial key tile (non-causal, keys >= S masked).

Fully masked tiles (right of the diagonal) are never visited. Query rows past S are computed on zero-filled
inputs and never stored, which is why any S works (113, 239, 1023 ...). The same source runs under
``TRITON_INTERPRET=1`` on CPU tensors, which is how CPU-only CI checks it.

Load paths and options (measurements: benchmarks/results/python_kernels_h100_2026-11-21.md):

* pointer loads (cp.async pipelined), autotuned over CONFIGS: the default;
* tensor-descriptor (TMA) loads over the contiguous (B*H*S, D) view: faster than pointer loads at D=128 only,
  so D=128 on Hopper uses TMA with one fixed tile (TMA_FIXED), D=64 does not;
* LAZY rescaling (keep a stale row max until some row's max grows by more than 2^8, skipping most acc/l
  rescales; exact): slower (the data-dependent branch costs more than it saves), so it is available only
  with an explicit config and never autotuned.
"""

# Triton kernels branch on constexpr flags with if-statements, which read better than ternaries there.
# ruff: noqa: SIM108

from __future__ import annotations

import math
import os
from typing import Any

import torch

__all__ = [
    "CONFIGS",
    "DEFAULT_CONFIGS",
    "TMA_FIXED",
    "TritonConfig",
    "best_config",
    "best_path",
    "triton_flash",
    "unavailable_reason",
]

try:  # triton is optional: the module must import (and say why it cannot run) without it
    import triton
    import triton.language as tl
    import triton.testing

    _IMPORT_ERROR: str | None = None
except Exception as exc:  # pragma: no cover - depends on the environment
    triton = None
    tl = None
    _IMPORT_ERROR = f"triton is not importable: {exc}"

try:  # host-side tensor descriptors (TMA) arrived in triton 3.3; without them only pointer loads are used
    from triton.tools.tensor_descriptor import TensorDescriptor
except Exception:  # pragma: no cover - depends on the environment
    TensorDescriptor = None

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_HEAD_DIMS = (16, 32, 64, 128)

# (BLOCK_M, BLOCK_N, num_warps, num_stages). BLOCK_M must be a multiple of BLOCK_N (the causal diagonal block
# is visited as BLOCK_M // BLOCK_N key tiles). Chosen from ptxas reports (64x64 w4 s3, 128x64 w8 s3 and
# 64x32 w4 s3 have no register spills on sm_90 nor sm_89) and the tile sweep of ``benchmarks/attention.py
# --sweep-only`` (benchmarks/results/python_kernels_h100_2026-11-21.md). Shared memory per program on sm_90:
# D=64 41-66 KB, D=128 66-131 KB (Hopper has 227 KB); on sm_89 (Ada, L4: 99 KB per block) the same configs
# need 25-98 KB. A config that does not fit a device fails to compile there and the autotuner drops it.
TritonConfig = tuple[int, int, int, int]
CONFIGS: dict[int, tuple[TritonConfig, ...]] = {
    16: ((64, 64, 4, 3), (128, 64, 8, 3)),
    32: ((64, 64, 4, 3), (128, 64, 8, 3)),
    64: ((64, 64, 4, 3), (64, 64, 4, 2), (64, 64, 4, 4), (128, 64, 8, 3)),
    128: ((128, 64, 8, 3), (64, 64, 4, 3), (64, 32, 4, 3)),
}
# Head dims that use tensor-descriptor loads with one fixed tile on compute capability >= 9 (timed on an
# H100 only: benchmarks/results/python_kernels_h100_2026-11-21.md) for contiguous, aligned fp16/bf16 inputs,
# instead of autotuned pointer loads; TRITON_FLASH_TMA=0 turns this off.
TMA_FIXED: dict[int, TritonConfig] = {128: (64, 64, 4, 3)}
# The default without autotuning. The autotuner picks among configs from noisy timings, so two processes
# could run different kernels (A/A runs: benchmarks/results/h200_2026-11-21/README.md, section 3). A guarded
# kernel must be the same kernel in every run, so the default is one fixed config per head dim (the one the
# autotuner chose at the large grid shapes on the H100 and H200; D=128 with 2 stages so it fits the L4's
# 99 KB of shared memory); TRITON_FLASH_AUTOTUNE=1 brings autotuning back.
DEFAULT_CONFIGS: dict[int, TritonConfig] = {
    16: (64, 64, 4, 3),
    32: (64, 64, 4, 3),
    64: (64, 64, 4, 3),
    128: (64, 64, 4, 2),
}
# float32 inputs (exact products, twice the shared memory): one modest config per head dim, no autotuning.
_FP32_CONFIGS: dict[int, TritonConfig] = {
    16: (64, 32, 4, 2),
    32: (64, 32, 4, 2),
    64: (64, 32, 4, 2),
    128: (32, 32, 4, 2),
}
# The interpreter runs one program at a time in numpy: small tiles keep it quick and make even S=113 cross
# several tile boundaries and a multi-tile diagonal.
_INTERPRET_CONFIG: TritonConfig = (32, 16, 4, 1)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


if triton is not None:

    @triton.jit
    def _fold_tile(
        acc,
        l_i,
        m_i,
        q,
        k_base,
        v_base,
        desc_k,
        desc_v,
        kv_row0,
        start_n,
        stride_kn,
        stride_kd,
        stride_vn,
        stride_vd,
        offs_m,
        offs_d,
        N_CTX,
        qk_scale,
        BLOCK_N: tl.constexpr,
        MASKED: tl.constexpr,
        CAUSAL: tl.constexpr,
        FP32_DOT: tl.constexpr,
        USE_TMA: tl.constexpr,
        LAZY: tl.constexpr,
    ):
        """Fold one key tile into the running (acc, l_i, m_i); masks only when MASKED."""
        cols = start_n + tl.arange(0, BLOCK_N)
        if USE_TMA:
            # Rows past N_CTX belong to the next head (or are zero past the tensor): finite values whose
            # scores the mask below removes, and whose p is exactly 0 for the PV product.
            kt = desc_k.load([kv_row0 + start_n, 0]).T
        elif MASKED:
            kt = tl.load(
                k_base + cols[None, :] * stride_kn + offs_d[:, None] * stride_kd, mask=cols[None, :] < N_CTX, other=0.0
            )
        else:
            kt = tl.load(k_base + cols[None, :] * stride_kn + offs_d[:, None] * stride_kd)
        if FP32_DOT:
            qk = tl.dot(q.to(tl.float32), kt.to(tl.float32), input_precision="ieee")
        else:
            qk = tl.dot(q, kt)
        if MASKED:
            if CAUSAL:
                keep = offs_m[:, None] >= cols[None, :]
            else:
                keep = cols[None, :] < N_CTX
            # A finite fill, not -inf: a fully masked row of a tile then yields exp2(-huge) = 0 and
            # never inf - inf = nan.
            qk = qk * qk_scale + tl.where(keep, 0.0, -1.0e6)
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
        else:
            # Scale folded into the max and, below, one multiply-add per score instead of a multiply and a sub.
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        if LAZY:
            # Rescale only when some row's max grew by more than 8 (log2 units): otherwise p <= 2^8 against
            # the stale max, far from fp16/bf16 overflow, and the final acc / l uses that same max. The first
            # tile always rescales (m_i = -inf).
            if tl.max(m_ij - m_i, 0) > 8.0:
                alpha = tl.math.exp2(m_i - m_ij)
                acc = acc * alpha[:, None]
                l_i = l_i * alpha
                m_i = m_ij
        else:
            alpha = tl.math.exp2(m_i - m_ij)
            acc = acc * alpha[:, None]
            l_i = l_i * alpha
            m_i = m_ij
        if MASKED:
            p = tl.math.exp2(qk - m_i[:, None])
        else:
            p = tl.math.exp2(qk * qk_scale - m_i[:, None])
        l_i = l_i + tl.sum(p, 1)
        if USE_TMA:
            v = desc_v.load([kv_row0 + start_n, 0])
        elif MASKED:
            v = tl.load(
                v_base + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=cols[:, None] < N_CTX, other=0.0
            )
        else:
            v = tl.load(v_base + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd)
        if FP32_DOT:
            # p is still rounded to the input dtype first, exactly as on the tensor-core path.
            acc = tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(p.to(v.dtype), v, acc)
        return acc, l_i, m_i

    @triton.jit
    def _attn_tiles(
        acc,
        l_i,
        m_i,
        q,
        k_base,
        v_base,
        desc_k,
        desc_v,
        kv_row0,
        stride_kn,
        stride_kd,
        stride_vn,
        stride_vd,
        offs_m,
        offs_d,
        lo,
        hi,
        N_CTX,
        qk_scale,
        BLOCK_N: tl.constexpr,
        MASKED: tl.constexpr,
        CAUSAL: tl.constexpr,
        FP32_DOT: tl.constexpr,
        USE_TMA: tl.constexpr,
        LAZY: tl.constexpr,
    ):
        """Fold key tiles [lo, hi) into the running (acc, l_i, m_i)."""
        for start_n in range(lo, hi, BLOCK_N):
            start_n = tl.multiple_of(start_n, BLOCK_N)
            acc, l_i, m_i = _fold_tile(
                acc,
                l_i,
                m_i,
                q,
                k_base,
                v_base,
                desc_k,
                desc_v,
                kv_row0,
                start_n,
                stride_kn,
                stride_kd,
                stride_vn,
                stride_vd,
                offs_m,
                offs_d,
                N_CTX,
                qk_scale,
                BLOCK_N,
                MASKED,
                CAUSAL,
                FP32_DOT,
                USE_TMA,
                LAZY,
            )
        return acc, l_i, m_i

    # N_CTX, Z and H are not specialised on (divisibility by 16, == 1): that would multiply the compiled
    # variants per config by three for no measurable gain, since they only bound loops and masks.
    @triton.jit(do_not_specialize=["N_CTX", "Z", "H"])
    def _attn_fwd(
        Q,
        K,
        V,
        Out,
        desc_q,
        desc_k,
        desc_v,
        qk_scale,
        stride_qz,
        stride_qh,
        stride_qm,
        stride_qd,
        stride_kz,
        stride_kh,
        stride_kn,
        stride_kd,
        stride_vz,
        stride_vh,
        stride_vn,
        stride_vd,
        stride_oz,
        stride_oh,
        stride_om,
        stride_od,
        Z,
        H,
        N_CTX,
        HEAD_DIM: tl.constexpr,
        CAUSAL: tl.constexpr,
        FP32_DOT: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        USE_TMA: tl.constexpr,
        LAZY: tl.constexpr,
    ):
        """One program: BLOCK_M query rows of one (batch, head).

        USE_TMA: q/k/v come through 2-D tensor descriptors over the contiguous (B*H*S, D) view (Hopper's
        TMA engine) instead of pointer loads; the output is always a masked pointer store, because a
        descriptor store of a partial row block would spill into the next head.
        """
        # Heaviest causal blocks (last rows) first, so that the tail of the grid is made of light blocks.
        start_m = tl.num_programs(0) - 1 - tl.program_id(0)
        off_hz = tl.program_id(1)
        off_z = off_hz // H
        off_h = off_hz % H
        k_base = K + off_z.to(tl.int64) * stride_kz + off_h.to(tl.int64) * stride_kh
        v_base = V + off_z.to(tl.int64) * stride_vz + off_h.to(tl.int64) * stride_vh
        o_base = Out + off_z.to(tl.int64) * stride_oz + off_h.to(tl.int64) * stride_oh
        kv_row0 = off_hz * N_CTX

        offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, HEAD_DIM)
        row_ok = offs_m[:, None] < N_CTX
        if USE_TMA:
            q = desc_q.load([kv_row0 + start_m * BLOCK_M, 0])
        else:
            q_base = Q + off_z.to(tl.int64) * stride_qz + off_h.to(tl.int64) * stride_qh
            q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd, mask=row_ok, other=0.0)

        m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

        if CAUSAL:
            # Stage 1: key tiles strictly before this row block, all visible to every row, all < N_CTX.
            lo_diag = start_m * BLOCK_M
            acc, l_i, m_i = _attn_tiles(
                acc,
                l_i,
                m_i,
                q,
                k_base,
                v_base,
                desc_k,
                desc_v,
                kv_row0,
                stride_kn,
                stride_kd,
                stride_vn,
                stride_vd,
                offs_m,
                offs_d,
                0,
                lo_diag,
                N_CTX,
                qk_scale,
                BLOCK_N,
                False,
                CAUSAL,
                FP32_DOT,
                USE_TMA,
                LAZY,
            )
            # Stage 2: the diagonal block, masked; tiles past N_CTX are skipped altogether.
            hi_diag = tl.minimum(lo_diag + BLOCK_M, N_CTX)
            acc, l_i, m_i = _attn_tiles(
                acc,
                l_i,
                m_i,
                q,
                k_base,
                v_base,
                desc_k,
                desc_v,
                kv_row0,
                stride_kn,
                stride_kd,
                stride_vn,
                stride_vd,
                offs_m,
                offs_d,
                lo_diag,
                hi_diag,
                N_CTX,
                qk_scale,
                BLOCK_N,
                True,
                CAUSAL,
                FP32_DOT,
                USE_TMA,
                LAZY,
            )
        else:
            # Stage 1: every full key tile, unmasked; stage 2: the partial last tile, if any.
            full = (N_CTX // BLOCK_N) * BLOCK_N
            acc, l_i, m_i = _attn_tiles(
                acc,
                l_i,
                m_i,
                q,
                k_base,
                v_base,
                desc_k,
                desc_v,
                kv_row0,
                stride_kn,
                stride_kd,
                stride_vn,
                stride_vd,
                offs_m,
                offs_d,
                0,
                full,
                N_CTX,
                qk_scale,
                BLOCK_N,
                False,
                CAUSAL,
                FP32_DOT,
                USE_TMA,
                LAZY,
            )
            acc, l_i, m_i = _attn_tiles(
                acc,
                l_i,
                m_i,
                q,
                k_base,
                v_base,
                desc_k,
                desc_v,
                kv_row0,
                stride_kn,
                stride_kd,
                stride_vn,
                stride_vd,
                offs_m,
                offs_d,
                full,
                N_CTX,
                N_CTX,
                qk_scale,
                BLOCK_N,
                True,
                CAUSAL,
                FP32_DOT,
                USE_TMA,
                LAZY,
            )

        acc = acc / l_i[:, None]
        o_ptrs = o_base + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od
        tl.store(o_ptrs, acc.to(Out.dtype.element_ty), mask=row_ok)

    def _prune(configs: list[Any], named_args: dict[str, Any], **kwargs: Any) -> list[Any]:
        """Keep the configs made for this head dim, and no row block far larger than S."""
        d = int(kwargs["HEAD_DIM"] if "HEAD_DIM" in kwargs else named_args["HEAD_DIM"])
        s = int(named_args["N_CTX"])
        mine = [
            c for c in configs if (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) in CONFIGS[d]
        ]
        fitting = [c for c in mine if c.kwargs["BLOCK_M"] <= max(64, triton.next_power_of_2(s))]
        return fitting or mine

    def _all_configs() -> list[Any]:
        tiles = sorted({c for table in CONFIGS.values() for c in table})
        return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=st) for bm, bn, w, st in tiles]

    # Keyed on (S, D, causal) as asked, plus B and H because the best row block for B1H1S128 (a handful of
    # programs) is not the best for B8H8S128; the autotuner adds the dtypes itself.
    _attn_fwd_tuned = triton.autotune(
        configs=_all_configs(),
        key=["N_CTX", "HEAD_DIM", "CAUSAL", "Z", "H"],
        prune_configs_by={"early_config_prune": _prune},
        # Shorter than triton's default 25 ms warm-up + 100 ms per config: tuning a shape costs well under a
        # second, and configs closer than the shorter run can tell apart are equivalent anyway.
        do_bench=lambda fn, quantiles: triton.testing.do_bench(fn, warmup=5, rep=25, quantiles=quantiles),
    )(_attn_fwd)


def unavailable_reason() -> str | None:
    """Why ``triton_flash`` cannot run here, or None. Never raises."""
    try:
        if _IMPORT_ERROR is not None:
            return _IMPORT_ERROR
        if _interpreting():
            return None
        if not torch.cuda.is_available():
            return "no CUDA device, and TRITON_INTERPRET=1 is not set (the Triton interpreter runs on CPU)"
        major, minor = torch.cuda.get_device_capability()
        if major < 8:
            return f"needs compute capability >= 8.0 (bf16 tensor cores); this GPU is sm_{major}{minor}"
        return None
    except Exception as exc:  # pragma: no cover - defensive: a broken driver must not break collection
        return f"cannot query the device: {exc}"


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if q.dim() != 4 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(
            f"expected q, k, v of one shape (B, H, S, D); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in _DTYPES:
        raise ValueError(f"expected one dtype among {_DTYPES}; got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[-1] not in _HEAD_DIMS:
        raise ValueError(f"head dim {q.shape[-1]} is not supported; supported: {_HEAD_DIMS}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v on different devices: {q.device}, {k.device}, {v.device}")


def _tma_possible(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Tensor descriptors need contiguous 16-byte-aligned fp16/bf16 inputs, and Hopper+ (or the interpreter)."""
    if TensorDescriptor is None or q.dtype == torch.float32:
        return False
    if q.is_cuda and torch.cuda.get_device_capability(q.device)[0] < 9:
        return False
    return all(t.is_contiguous() and t.data_ptr() % 16 == 0 for t in (q, k, v))


def _use_tma_fixed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the default (no-config) call takes the fixed tensor-descriptor path."""
    if q.shape[-1] not in TMA_FIXED or not q.is_cuda or os.environ.get("TRITON_FLASH_TMA", "1") == "0":
        return False
    return _tma_possible(q, k, v)


def _descriptors(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_m: int, block_n: int) -> list[Any]:
    rows, dim = q.shape[0] * q.shape[1] * q.shape[2], q.shape[3]
    return [
        TensorDescriptor(t.view(rows, dim), shape=[rows, dim], strides=[dim, 1], block_shape=[bs, dim])
        for t, bs in ((q, block_m), (k, block_n), (v, block_n))
    ]


def triton_flash(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    config: TritonConfig | None = None,
    tma: bool = False,
    lazy: bool = False,
) -> torch.Tensor:
    """Fused attention forward.

    Without ``config``: the TMA_FIXED tile for its head dims on Hopper+, else DEFAULT_CONFIGS (autotuned
    pointer-load configs with TRITON_FLASH_AUTOTUNE=1: the first call per shape tunes, so warm up before
    timing or capturing a CUDA graph); fixed small tiles under the interpreter; one fixed config for float32.
    ``config`` = (BLOCK_M, BLOCK_N, num_warps, num_stages) skips autotuning; ``tma`` then loads through tensor
    descriptors (Hopper or newer, contiguous 16-byte-aligned inputs) and ``lazy`` turns on lazy rescaling.
    """
    if q.is_cuda and q.device.index is not None and q.device.index != torch.cuda.current_device():
        # Triton launches on the current device, not the tensors': a launch from cuda:0 with inputs on
        # cuda:1 fails ("cannot be accessed from Triton"). Make q's device current for the call.
        with torch.cuda.device(q.device):
            return triton_flash(q, k, v, causal, config, tma, lazy)
    reason = unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"triton_flash is unavailable: {reason}")
    _check(q, k, v)
    batch, heads, seq, dim = q.shape
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if seq == 0 or batch * heads == 0:
        return out
    # exp2 instead of exp: fold log2(e) into the scale once.
    qk_scale = (1.0 / math.sqrt(dim)) * 1.4426950408889634
    # Products in float32 (exact for fp16/bf16 operands): for float32 inputs, and for bf16 under the
    # interpreter, whose bf16 tl.dot returns garbage (triton 3.9); the GPU path keeps bf16 tensor cores.
    fp32_dot = q.dtype == torch.float32 or (_interpreting() and q.dtype == torch.bfloat16)
    if config is None and (q.dtype == torch.float32 or _interpreting()):
        config = _INTERPRET_CONFIG if _interpreting() else _FP32_CONFIGS[dim]
    if config is None and _use_tma_fixed(q, k, v):
        config, tma, lazy = TMA_FIXED[dim], True, False
    if config is None and os.environ.get("TRITON_FLASH_AUTOTUNE", "0") != "1":
        config = DEFAULT_CONFIGS[dim]
    strides = (*q.stride(), *k.stride(), *v.stride(), *out.stride())
    if config is not None:
        block_m, block_n, warps, stages = config
        if block_m % block_n:
            raise ValueError(f"BLOCK_M ({block_m}) must be a multiple of BLOCK_N ({block_n})")
        if tma and not _tma_possible(q, k, v):
            raise ValueError(
                "tma=True needs triton's TensorDescriptor and contiguous 16-byte-aligned fp16/bf16 "
                "inputs (and Hopper or newer on a GPU)"
            )
        descs = _descriptors(q, k, v, block_m, block_n) if tma else [None, None, None]
        fixed_grid = (triton.cdiv(seq, block_m), batch * heads)
        _attn_fwd[fixed_grid](
            q,
            k,
            v,
            out,
            *descs,
            qk_scale,
            *strides,
            batch,
            heads,
            seq,
            HEAD_DIM=dim,
            CAUSAL=causal,
            FP32_DOT=fp32_dot,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            USE_TMA=tma,
            LAZY=lazy,
            num_warps=warps,
            num_stages=stages,
        )
    else:

        def grid(meta: dict[str, Any]) -> tuple[int, int]:
            return (triton.cdiv(seq, meta["BLOCK_M"]), batch * heads)

        _attn_fwd_tuned[grid](
            q,
            k,
            v,
            out,
            None,
            None,
            None,
            qk_scale,
            *strides,
            batch,
            heads,
            seq,
            HEAD_DIM=dim,
            CAUSAL=causal,
            FP32_DOT=fp32_dot,
            USE_TMA=False,
            LAZY=False,
        )
    return out


def best_config(q: torch.Tensor, causal: bool) -> TritonConfig | None:
    """The config a default call uses for inputs like ``q`` (None before the first autotuned call)."""
    if triton is None:
        return None
    batch, heads, seq, dim = q.shape
    if q.is_cuda and _use_tma_fixed(q, q, q):
        return TMA_FIXED[dim]
    if os.environ.get("TRITON_FLASH_AUTOTUNE", "0") != "1":
        return DEFAULT_CONFIGS[dim]
    for key, cfg in _attn_fwd_tuned.cache.items():
        if key[:5] == (seq, dim, causal, batch, heads) and str(q.dtype) in key:
            return (cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"], cfg.num_warps, cfg.num_stages)
    return None


def best_path(q: torch.Tensor, causal: bool) -> str | None:
    """ "tma" (fixed tile) or "pointer" (autotuned): the load path a default call uses for inputs like ``q``."""
    if triton is None:
        return None
    return "tma" if q.is_cuda and _use_tma_fixed(q, q, q) else "pointer"
