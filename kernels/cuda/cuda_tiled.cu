// Tiled FlashAttention on CUDA cores.
//
// A CTA owns BLOCK_M query rows; K/V tiles of BLOCK_N keys are staged in
// shared memory with 16-byte loads and reused by all rows. Each warp owns
// BLOCK_M / 8 rows; lane j scores key j of the tile, so the row max is one
// warp shuffle reduction per row. P goes through shared memory (broadcast
// reads) for the P.V product, where each lane owns D/32 output dimensions.
#include "attention.h"
#include "common.cuh"

namespace {

constexpr int kBlockM = 64;
constexpr int kBlockN = 32;  // one key per lane
constexpr int kWarps = 8;
constexpr int kRowsPerWarp = kBlockM / kWarps;
constexpr int kThreads = kWarps * 32;

template <int D>
struct Smem {
  static constexpr int kStride = D + 8;  // +16 bytes: 16-byte row reads hit distinct banks
};

// Copy rows [row0, row0 + rows) of a (S, D) head into shared memory with
// 16-byte vectors; rows past S are zero so they cannot inject NaN.
template <typename T, int D>
__device__ __forceinline__ void load_tile(T* __restrict__ dst, const T* __restrict__ src, int row0, int rows,
                                          int S) {
  constexpr int kChunks = D / 8;
  for (int idx = threadIdx.x; idx < rows * kChunks; idx += kThreads) {
    const int r = idx / kChunks;
    const int c = idx % kChunks;
    uint4 val = make_uint4(0u, 0u, 0u, 0u);
    if (row0 + r < S) val = *reinterpret_cast<const uint4*>(src + static_cast<size_t>(row0 + r) * D + c * 8);
    *reinterpret_cast<uint4*>(dst + r * Smem<D>::kStride + c * 8) = val;
  }
}

template <typename T>
__device__ __forceinline__ float dot8(uint4 a, uint4 b) {
  const uint32_t* pa = reinterpret_cast<const uint32_t*>(&a);
  const uint32_t* pb = reinterpret_cast<const uint32_t*>(&b);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 x = pg::unpack2<T>(pa[i]);
    const float2 y = pg::unpack2<T>(pb[i]);
    s = fmaf(x.x, y.x, s);
    s = fmaf(x.y, y.y, s);
  }
  return s;
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads, 2)
    tiled_attn_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                      T* __restrict__ o, int S, float scale_log2, int causal) {
  constexpr int kStride = Smem<D>::kStride;
  constexpr int kPer = D / 32;
  __shared__ __align__(16) T sQ[kBlockM * kStride];
  __shared__ __align__(16) T sK[kBlockN * kStride];
  __shared__ __align__(16) T sV[kBlockN * kStride];
  __shared__ __align__(16) float sP[kWarps][kRowsPerWarp][kBlockN];

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int m0 = blockIdx.x * kBlockM;
  const size_t head = static_cast<size_t>(blockIdx.y) * S * D;
  const T* qh = q + head;
  const T* kh = k + head;
  const T* vh = v + head;

  load_tile<T, D>(sQ, qh, m0, kBlockM, S);

  float m[kRowsPerWarp];
  float l[kRowsPerWarp];  // per-lane partial sums, reduced once at the end
  float acc[kRowsPerWarp][kPer];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.f;
#pragma unroll
    for (int i = 0; i < kPer; ++i) acc[r][i] = 0.f;
  }
  const int row_base = m0 + warp * kRowsPerWarp;
  const int kv_end = causal ? min(S, m0 + kBlockM) : S;

  for (int n0 = 0; n0 < kv_end; n0 += kBlockN) {
    __syncthreads();  // previous tile fully consumed
    load_tile<T, D>(sK, kh, n0, kBlockN, S);
    load_tile<T, D>(sV, vh, n0, kBlockN, S);
    __syncthreads();

    // Scores: lane scores key n0 + lane against the warp's rows.
    float s[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) s[r] = 0.f;
#pragma unroll 2
    for (int c = 0; c < D / 8; ++c) {
      const uint4 kv = *reinterpret_cast<const uint4*>(sK + lane * kStride + c * 8);
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const uint4 qv = *reinterpret_cast<const uint4*>(sQ + (warp * kRowsPerWarp + r) * kStride + c * 8);
        s[r] += dot8<T>(qv, kv);
      }
    }
    const int key = n0 + lane;
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const bool masked = key >= S || (causal && key > row_base + r);
      s[r] = masked ? -INFINITY : s[r] * scale_log2;
      float mx = s[r];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const float m_new = fmaxf(m[r], mx);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // row fully masked so far
      const float corr = exp2f(m[r] - m_use);
      const float p = exp2f(s[r] - m_use);
      m[r] = m_new;
      l[r] = l[r] * corr + p;
#pragma unroll
      for (int i = 0; i < kPer; ++i) acc[r][i] *= corr;
      sP[warp][r][lane] = p;
    }
    __syncwarp();

    // O += P V: lane owns dims [lane * kPer, lane * kPer + kPer).
#pragma unroll 1
    for (int j = 0; j < kBlockN; j += 4) {
      float vv[4][kPer];
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        const T* vr = sV + (j + jj) * kStride + lane * kPer;
#pragma unroll
        for (int i = 0; i < kPer; i += 2) {
          const float2 f = pg::unpack2<T>(*reinterpret_cast<const uint32_t*>(vr + i));
          vv[jj][i] = f.x;
          vv[jj][i + 1] = f.y;
        }
      }
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const float4 p4 = *reinterpret_cast<const float4*>(&sP[warp][r][j]);
#pragma unroll
        for (int i = 0; i < kPer; ++i) {
          acc[r][i] = fmaf(p4.x, vv[0][i], acc[r][i]);
          acc[r][i] = fmaf(p4.y, vv[1][i], acc[r][i]);
          acc[r][i] = fmaf(p4.z, vv[2][i], acc[r][i]);
          acc[r][i] = fmaf(p4.w, vv[3][i], acc[r][i]);
        }
      }
    }
    __syncwarp();
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    float sum = l[r];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    const int row = row_base + r;
    if (row < S) {
      const float inv = 1.f / sum;
      T* orow = o + head + static_cast<size_t>(row) * D + lane * kPer;
#pragma unroll
      for (int i = 0; i < kPer; i += 2) {
        *reinterpret_cast<uint32_t*>(orow + i) = pg::pack2<T>(acc[r][i] * inv, acc[r][i + 1] * inv);
      }
    }
  }
}

template <typename T, int D>
cudaError_t launch(const void* q, const void* k, const void* v, void* o, int B, int H, int S, int causal,
                   cudaStream_t stream) {
  const dim3 grid((S + kBlockM - 1) / kBlockM, B * H);
  const float scale_log2 = pg::kLog2e / sqrtf(static_cast<float>(D));
  tiled_attn_kernel<T, D><<<grid, kThreads, 0, stream>>>(static_cast<const T*>(q), static_cast<const T*>(k),
                                                         static_cast<const T*>(v), static_cast<T*>(o), S,
                                                         scale_log2, causal);
  return cudaGetLastError();
}

}  // namespace

extern "C" cudaError_t pg_attn_tiled(const void* q, const void* k, const void* v, void* o, int B, int H,
                                     int S, int D, int dtype, int causal, cudaStream_t stream) {
  if (B <= 0 || H <= 0 || S <= 0) return cudaSuccess;
  if (B * H > 65535) return cudaErrorInvalidValue;
  if (dtype == PG_DTYPE_FP16) {
    if (D == 64) return launch<__half, 64>(q, k, v, o, B, H, S, causal, stream);
    if (D == 128) return launch<__half, 128>(q, k, v, o, B, H, S, causal, stream);
  } else if (dtype == PG_DTYPE_BF16) {
    if (D == 64) return launch<__nv_bfloat16, 64>(q, k, v, o, B, H, S, causal, stream);
    if (D == 128) return launch<__nv_bfloat16, 128>(q, k, v, o, B, H, S, causal, stream);
  }
  return cudaErrorInvalidValue;
}
