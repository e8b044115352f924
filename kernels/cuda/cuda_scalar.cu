// Minimal FlashAttention: one warp per query row, online softmax in fp32.
//
// Kept deliberately simple; it is the correctness baseline the faster kernels
// are compared against. Each lane owns D/32 output dimensions; the q.k dot
// product of every key is reduced across the warp with shuffles.
#include "attention.h"
#include "common.cuh"

namespace {

constexpr int kWarpsPerBlock = 4;

template <typename T, int D>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    scalar_attn_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                       T* __restrict__ o, int S, float scale_log2, int causal) {
  constexpr int kPer = D / 32;  // dims per lane: 2 or 4
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= S) return;
  const size_t head = static_cast<size_t>(blockIdx.y) * S * D;
  const T* qh = q + head;
  const T* kh = k + head;
  const T* vh = v + head;

  float qr[kPer];
  float acc[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    qr[i] = pg::to_float(qh[static_cast<size_t>(row) * D + lane * kPer + i]) * scale_log2;
    acc[i] = 0.f;
  }
  float m = -INFINITY;
  float l = 0.f;
  const int n_keys = causal ? row + 1 : S;
  for (int j = 0; j < n_keys; ++j) {
    const T* kr = kh + static_cast<size_t>(j) * D + lane * kPer;
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < kPer; ++i) s += qr[i] * pg::to_float(kr[i]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    // s is already in log2 units: exp(x * scale) == exp2(x * scale * log2(e)).
    const float m_new = fmaxf(m, s);
    const float corr = exp2f(m - m_new);
    const float p = exp2f(s - m_new);
    l = l * corr + p;
    const T* vr = vh + static_cast<size_t>(j) * D + lane * kPer;
#pragma unroll
    for (int i = 0; i < kPer; ++i) acc[i] = acc[i] * corr + p * pg::to_float(vr[i]);
    m = m_new;
  }
  const float inv_l = 1.f / l;
  T* orow = o + head + static_cast<size_t>(row) * D + lane * kPer;
#pragma unroll
  for (int i = 0; i < kPer; ++i) orow[i] = pg::from_float<T>(acc[i] * inv_l);
}

template <typename T, int D>
cudaError_t launch(const void* q, const void* k, const void* v, void* o, int B, int H, int S, int causal,
                   cudaStream_t stream) {
  const dim3 grid((S + kWarpsPerBlock - 1) / kWarpsPerBlock, B * H);
  const float scale_log2 = pg::kLog2e / sqrtf(static_cast<float>(D));
  scalar_attn_kernel<T, D><<<grid, kWarpsPerBlock * 32, 0, stream>>>(
      static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<T*>(o), S,
      scale_log2, causal);
  return cudaGetLastError();
}

}  // namespace

extern "C" cudaError_t pg_attn_scalar(const void* q, const void* k, const void* v, void* o, int B, int H,
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
