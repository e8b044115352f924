// Tensor-core FlashAttention forward: one CTA per (head, query tile); the tile
// configuration per (D, causal, S) is chosen in flash_mma.cuh, which holds the
// kernel body (shared with the KV-split variant).
#include "attention.h"
#include "flash_mma.cuh"

namespace {

template <typename T, int D>
cudaError_t dispatch(const void* q, const void* k, const void* v, void* o, int BH, int S, int causal,
                     cudaStream_t stream) {
  const auto p = pg::flash::make_params<T>(q, k, v, o, BH, S, D);
  if (D == 64 && causal && S <= pg::flash::kSmallCausalMaxS) {
    return pg::flash::launch_flash<T, pg::flash::SmallCausalCfg64, true, false>(p, 1, stream);
  }
  using CausalCfg = typename pg::flash::DefaultCfg<D, true>::type;
  using FullCfg = typename pg::flash::DefaultCfg<D, false>::type;
  if (causal) return pg::flash::launch_flash<T, CausalCfg, true, false>(p, 1, stream);
  return pg::flash::launch_flash<T, FullCfg, false, false>(p, 1, stream);
}

}  // namespace

extern "C" cudaError_t pg_attn_wmma(const void* q, const void* k, const void* v, void* o, int B, int H, int S,
                                    int D, int dtype, int causal, cudaStream_t stream) {
  if (B <= 0 || H <= 0 || S <= 0) return cudaSuccess;
  const int BH = B * H;
  if (dtype == PG_DTYPE_FP16) {
    if (D == 64) return dispatch<__half, 64>(q, k, v, o, BH, S, causal, stream);
    if (D == 128) return dispatch<__half, 128>(q, k, v, o, BH, S, causal, stream);
  } else if (dtype == PG_DTYPE_BF16) {
    if (D == 64) return dispatch<__nv_bfloat16, 64>(q, k, v, o, BH, S, causal, stream);
    if (D == 128) return dispatch<__nv_bfloat16, 128>(q, k, v, o, BH, S, causal, stream);
  }
  return cudaErrorInvalidValue;
}
