// KV-split FlashAttention (flash-decoding style) for small B*H.
//
// With few heads, one CTA per (head, query tile) leaves most SMs idle. Here
// the keys are cut into chunks of whole 64-key tiles; CTA (head, tile, split)
// runs the tensor-core kernel over its chunk only and writes unnormalised fp32
// partials (acc, m, l) to a workspace. The combine kernel merges the chunks of
// each row with the usual rescaling by exp2(m_s - M).
//
// Causal: a chunk that starts after the last row of a query tile is skipped
// by its CTA and never read; the combine reads chunk s for row i only when
// chunk s starts at or before key i, so every chunk it reads holds at least
// one visible key and a finite m.
#include "attention.h"
#include "flash_mma.cuh"

namespace {

// The split kernel runs the same tile configurations as cuda_wmma.
template <int D, bool kCausal>
using SplitCfg = typename pg::flash::DefaultCfg<D, kCausal>::type;

constexpr int kMaxSplits = 64;
// A chunk shorter than this many KV tiles costs more in partial writes and the
// combine launch than it gains in parallelism (measured: S=128..256 shapes).
constexpr int kMinTilesPerSplit = 4;

struct Geometry {
  int block_m, block_n, ctas_per_sm;
};

template <int D, bool kCausal>
Geometry geometry_of() {
  using C = SplitCfg<D, kCausal>;
  return Geometry{C::kBlockM, C::kBlockN, C::kMinBlocks};
}

Geometry geometry(int D, int causal) {
  if (D == 64) return causal ? geometry_of<64, true>() : geometry_of<64, false>();
  return causal ? geometry_of<128, true>() : geometry_of<128, false>();
}

int tiles_per_split(int S, int D, int causal, int num_splits) {
  const int bn = geometry(D, causal).block_n;
  const int n_tiles = (S + bn - 1) / bn;
  return (n_tiles + num_splits - 1) / num_splits;
}

template <typename T, int D>
__global__ void __launch_bounds__(256)
    combine_kernel(const float* __restrict__ ws_acc, const float2* __restrict__ ws_ml, T* __restrict__ o,
                   int BH, int S, int num_splits, int chunk_keys, int causal) {
  constexpr int kThreadsPerRow = D / 4;  // one float4 per thread
  constexpr int kRowsPerBlock = 256 / kThreadsPerRow;
  const size_t rows = static_cast<size_t>(BH) * S;
  const size_t grow = static_cast<size_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kThreadsPerRow;
  if (grow >= rows) return;
  const int i = static_cast<int>(grow % S);  // query index within its head
  const int c = (threadIdx.x % kThreadsPerRow) * 4;
  const size_t split_stride = rows;

  float M = -INFINITY;
  float L = 0.f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s = 0; s < num_splits; ++s) {
    const int first_key = s * chunk_keys;
    if (first_key >= S || (causal && first_key > i)) break;
    const size_t idx = s * split_stride + grow;
    const float2 ml = ws_ml[idx];
    if (ml.x == -INFINITY) continue;  // defensive: no visible key in this chunk
    const float M_new = fmaxf(M, ml.x);
    const float a = exp2f(M - M_new);  // rescale what was merged so far
    const float b = exp2f(ml.x - M_new);
    const float4 x = *reinterpret_cast<const float4*>(ws_acc + idx * D + c);
    acc.x = acc.x * a + x.x * b;
    acc.y = acc.y * a + x.y * b;
    acc.z = acc.z * a + x.z * b;
    acc.w = acc.w * a + x.w * b;
    L = L * a + ml.y * b;
    M = M_new;
  }
  const float inv = L > 0.f ? 1.f / L : 0.f;
  T* dst = o + grow * D + c;
  const uint32_t lo = pg::pack2<T>(acc.x * inv, acc.y * inv);
  const uint32_t hi = pg::pack2<T>(acc.z * inv, acc.w * inv);
  *reinterpret_cast<uint2*>(dst) = make_uint2(lo, hi);
}

template <typename T, int D>
cudaError_t dispatch(const void* q, const void* k, const void* v, void* o, float* workspace, int BH, int S,
                     int causal, int num_splits, cudaStream_t stream) {
  using CC = SplitCfg<D, true>;
  using CF = SplitCfg<D, false>;
  auto p = pg::flash::make_params<T>(q, k, v, o, BH, S, D);
  if (num_splits <= 1) {  // nothing to split: the plain kernel writes O directly
    if (causal) return pg::flash::launch_flash<T, CC, true, false>(p, 1, stream);
    return pg::flash::launch_flash<T, CF, false, false>(p, 1, stream);
  }
  if (workspace == nullptr) return cudaErrorInvalidValue;
  const size_t rows = static_cast<size_t>(BH) * S;
  p.ws_acc = workspace;
  p.ws_ml = reinterpret_cast<float2*>(workspace + static_cast<size_t>(num_splits) * rows * D);
  p.tiles_per_split = tiles_per_split(S, D, causal, num_splits);
  cudaError_t err = causal ? pg::flash::launch_flash<T, CC, true, true>(p, num_splits, stream)
                           : pg::flash::launch_flash<T, CF, false, true>(p, num_splits, stream);
  if (err != cudaSuccess) return err;
  constexpr int kRowsPerBlock = 256 / (D / 4);
  const size_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  if (blocks > 0x7fffffffULL) return cudaErrorInvalidValue;
  combine_kernel<T, D><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(
      p.ws_acc, p.ws_ml, static_cast<T*>(o), BH, S, num_splits, p.tiles_per_split * geometry(D, causal).block_n, causal);
  return cudaGetLastError();
}

}  // namespace

extern "C" int pg_attn_splitkv_num_splits(int B, int H, int S, int D, int causal, int num_sms,
                                          int requested) {
  if (S <= 0 || B <= 0 || H <= 0 || (D != 64 && D != 128)) return 1;
  const Geometry g = geometry(D, causal);
  const int n_tiles = (S + g.block_n - 1) / g.block_n;
  int want = requested;
  if (want <= 0) {
    // Split only when the plain grid cannot fill one wave of resident CTAs, and
    // then into about one wave (measured on B1 H2 S8192: 3 splits beat 5).
    const long long base = static_cast<long long>(B) * H * ((S + g.block_m - 1) / g.block_m);
    const long long wave = static_cast<long long>(num_sms > 0 ? num_sms : 132) * g.ctas_per_sm;
    const long long target = wave;
    want = base >= wave ? 1 : static_cast<int>((target + base - 1) / base);
    const int max_by_length = n_tiles / kMinTilesPerSplit;
    if (want > max_by_length) want = max_by_length;
  }
  want = want < 1 ? 1 : (want > kMaxSplits ? kMaxSplits : want);
  if (want > n_tiles) want = n_tiles;
  // Whole tiles per chunk; drop splits that would be empty.
  const int per = tiles_per_split(S, D, causal, want);
  return (n_tiles + per - 1) / per;
}

extern "C" size_t pg_attn_splitkv_workspace_bytes(int B, int H, int S, int D, int num_splits) {
  if (num_splits <= 1) return 0;
  const size_t rows = static_cast<size_t>(B) * H * S;
  return static_cast<size_t>(num_splits) * rows * (static_cast<size_t>(D) + 2) * sizeof(float);
}

extern "C" cudaError_t pg_attn_splitkv(const void* q, const void* k, const void* v, void* o, float* workspace,
                                       int B, int H, int S, int D, int dtype, int causal, int num_splits,
                                       cudaStream_t stream) {
  if (B <= 0 || H <= 0 || S <= 0) return cudaSuccess;
  const int BH = B * H;
  if (dtype == PG_DTYPE_FP16) {
    if (D == 64) return dispatch<__half, 64>(q, k, v, o, workspace, BH, S, causal, num_splits, stream);
    if (D == 128) return dispatch<__half, 128>(q, k, v, o, workspace, BH, S, causal, num_splits, stream);
  } else if (dtype == PG_DTYPE_BF16) {
    if (D == 64) return dispatch<__nv_bfloat16, 64>(q, k, v, o, workspace, BH, S, causal, num_splits, stream);
    if (D == 128) return dispatch<__nv_bfloat16, 128>(q, k, v, o, workspace, BH, S, causal, num_splits, stream);
  }
  return cudaErrorInvalidValue;
}
