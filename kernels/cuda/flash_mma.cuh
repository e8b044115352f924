// Tensor-core FlashAttention forward (mma.sync m16n8k16), shared by the
// cuda_wmma and cuda_splitkv kernels.
//
// A CTA owns kBlockM query rows of one head; each warp owns kMT m-tiles of 16
// rows and keeps their Q fragments in registers. K/V tiles of kBlockN keys are
// double-buffered in shared memory with cp.async: tile i+1 streams in while
// tile i is multiplied.
// Shared rows are swizzled (16-byte chunk c of row r sits at c ^ (r & 7)), so
// both the cp.async stores and the ldmatrix reads are free of bank conflicts.
// Softmax statistics stay in fp32 registers in log2 units (exp2 + one FMA);
// P is re-packed from the S accumulators into A fragments without touching
// shared memory.
//
// kSplit: the CTA covers only a chunk of the keys (blockIdx.z) and writes the
// unnormalised fp32 accumulator and (m, l) of each row to a workspace; a
// combine kernel merges the chunks.
#pragma once

#include "common.cuh"

namespace pg {
namespace flash {
// Internal linkage: cuda_wmma.cu and cuda_splitkv.cu each get their own kernel
// instances and launchers instead of one merged copy whose handle might not be
// the one the shared-memory attribute was set on.
namespace {

// Tile configuration. Each warp owns kMT m-tiles of 16 query rows, so every
// K/V fragment read by ldmatrix feeds kMT mma instructions.
template <int D_, int kWarps_, int kMT_, int kBlockN_, int kMinBlocks_>
struct Cfg {
  static constexpr int D = D_;
  static constexpr int kWarps = kWarps_;
  static constexpr int kMT = kMT_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kMinBlocks = kMinBlocks_;
  static constexpr int kRowsPerWarp = 16 * kMT;
  static constexpr int kBlockM = kWarps * kRowsPerWarp;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kSmemBytes = (kBlockM * D + 4 * kBlockN * D) * 2;
};

// The configurations the cuda_wmma and cuda_splitkv entry points use, picked
// by timing candidates (benchmarks/results/cuda_kernels_h100_2026-11-21.md):
//  D=64:  4 warps x 32 rows (K/V fragments feed two m-tiles), 2 CTAs/SM.
//  D=128: causal 4 warps x 16 rows (BM=64, 2 CTAs/SM, finer causal tiles);
//         non-causal 8 warps x 16 rows (BM=128, 1 CTA/SM).
template <int D, bool kCausal>
struct DefaultCfg;
template <bool kCausal>
struct DefaultCfg<64, kCausal> {
  using type = Cfg<64, 4, 2, 64, 2>;
};
// D=64 causal with S <= 1024: 64-row CTAs (4 warps x 16 rows, 4 CTAs/SM) give
// more, finer-grained CTAs and beat the 128-row tiles there (timings:
// benchmarks/results/cuda_kernels_h100_2026-11-21.md).
using SmallCausalCfg64 = Cfg<64, 4, 1, 64, 4>;
constexpr int kSmallCausalMaxS = 1024;

template <>
struct DefaultCfg<128, true> {
  using type = Cfg<128, 4, 1, 64, 2>;
};
template <>
struct DefaultCfg<128, false> {
  using type = Cfg<128, 8, 1, 64, 1>;
};

template <typename T>
struct Params {
  const T* q;
  const T* k;
  const T* v;
  T* o;
  float* ws_acc;   // split mode: [splits][BH][S][D]
  float2* ws_ml;   // split mode: [splits][BH][S] (m in log2 units, l)
  int S;
  int BH;
  int tiles_per_split;  // split mode: KV tiles per chunk
  int m_tiles;          // query tiles per head
  int group_heads;      // launch order: heads per L2-resident group (see flash_fwd_kernel)
  float scale_log2;
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;  // 0 source bytes: zero-fill the destination
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma16816<__half>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                                 uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 2^x on the SFU; flush-to-zero is fine for probabilities (and exp2(-inf) = 0).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Element offset of 16-byte chunk `chunk` of row `row` in a swizzled tile.
template <int D>
__device__ __forceinline__ int swz(int row, int chunk) {
  return row * D + ((chunk ^ (row & 7)) << 3);
}

// Asynchronously copy rows [row0, row0 + ROWS) of a (S, D) head into a
// swizzled tile; rows past S are zero-filled so they cannot inject NaN.
template <typename T, int D, int ROWS, int THREADS>
__device__ __forceinline__ void load_tile_async(T* dst, const T* __restrict__ src, int row0, int S) {
  constexpr int kChunks = D / 8;
  static_assert(ROWS * kChunks % THREADS == 0, "tile must split evenly over the threads");
  const uint32_t base = smem_u32(dst);
#pragma unroll
  for (int it = 0; it < ROWS * kChunks / THREADS; ++it) {
    const int idx = it * THREADS + threadIdx.x;
    const int r = idx / kChunks;
    const int c = idx % kChunks;
    const bool valid = row0 + r < S;
    const T* g = src + (valid ? static_cast<size_t>(row0 + r) * D + c * 8 : 0);
    cp_async16(base + swz<D>(r, c) * 2, g, valid);
  }
}

template <typename T, typename C, bool kCausal, bool kSplit>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks) flash_fwd_kernel(Params<T> p) {
  constexpr int D = C::D;
  constexpr int kBlockM = C::kBlockM;
  constexpr int kBlockN = C::kBlockN;
  constexpr int kThreads = C::kThreads;
  constexpr int kMT = C::kMT;
  constexpr int kNT = kBlockN / 8;    // S n-tiles per m-tile
  constexpr int kDT = D / 8;          // O n-tiles per m-tile
  constexpr int kKQ = D / 16;         // k-steps of Q.K^T
  constexpr int kKV = kBlockN / 16;   // k-steps of P.V

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sK = sQ + kBlockM * D;           // 2 buffers of kBlockN * D
  T* sV = sK + 2 * kBlockN * D;       // 2 buffers of kBlockN * D

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  // Launch order: heads are taken in groups whose K/V fit in L2 together, and
  // within a group the heaviest (last, for causal) query tiles of all its heads
  // go first. Grouping keeps K/V re-reads in L2 on long sequences; heavy-first
  // shortens the tail of the last wave.
  const int per_group = p.group_heads * p.m_tiles;
  const int group = blockIdx.x / per_group;
  const int idx = blockIdx.x - group * per_group;
  const int heads_in_group = min(p.group_heads, p.BH - group * p.group_heads);
  const int bh = group * p.group_heads + idx % heads_in_group;
  const int m_tile = p.m_tiles - 1 - idx / heads_in_group;
  const int m0 = m_tile * kBlockM;
  const int S = p.S;
  const size_t head = static_cast<size_t>(bh) * S * D;
  const T* qh = p.q + head;
  const T* kh = p.k + head;
  const T* vh = p.v + head;

  const int n_tiles_all = (S + kBlockN - 1) / kBlockN;
  int t_begin = 0;
  int t_end = kCausal ? (min(S, m0 + kBlockM) + kBlockN - 1) / kBlockN : n_tiles_all;
  if (kSplit) {
    t_begin = blockIdx.z * p.tiles_per_split;
    t_end = min(t_end, t_begin + p.tiles_per_split);
    // Chunk fully masked for this query tile: the combine never reads it.
    if (t_begin >= t_end) return;
  }

  const int warp_row0 = m0 + warp * C::kRowsPerWarp;  // first row of this warp
  const int warp_row_last = warp_row0 + C::kRowsPerWarp - 1;

  load_tile_async<T, D, kBlockM, kThreads>(sQ, qh, m0, S);
  cp_async_commit();
  load_tile_async<T, D, kBlockN, kThreads>(sK, kh, t_begin * kBlockN, S);
  cp_async_commit();
  load_tile_async<T, D, kBlockN, kThreads>(sV, vh, t_begin * kBlockN, S);
  cp_async_commit();

  cp_async_wait<2>();
  __syncthreads();
  uint32_t qf[kMT][kKQ][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int kk = 0; kk < kKQ; ++kk) {
      const int r = warp * C::kRowsPerWarp + mt * 16 + (lane & 15);
      ldmatrix_x4(qf[mt][kk], smem_u32(sQ + swz<D>(r, 2 * kk + (lane >> 4))));
    }
  }

  float o[kMT][kDT][4];
  float m_r[kMT][2];
  float l_r[kMT][2];  // per-thread partial row sums, reduced across the quad at the end
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int i = 0; i < kDT; ++i) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.f;
    m_r[mt][0] = m_r[mt][1] = -INFINITY;
    l_r[mt][0] = l_r[mt][1] = 0.f;
  }
  const float sl2 = p.scale_log2;

  for (int t = t_begin; t < t_end; ++t) {
    const int buf = (t - t_begin) & 1;
    const int n0 = t * kBlockN;
    cp_async_wait<1>();  // K tile t landed (V tile t may still be in flight)
    __syncthreads();     // ... for every thread; buffers of tile t-1 are free
    if (t + 1 < t_end) {
      load_tile_async<T, D, kBlockN, kThreads>(sK + (buf ^ 1) * kBlockN * D, kh, n0 + kBlockN, S);
      cp_async_commit();
      load_tile_async<T, D, kBlockN, kThreads>(sV + (buf ^ 1) * kBlockN * D, vh, n0 + kBlockN, S);
      cp_async_commit();
    } else {
      cp_async_commit();
      cp_async_commit();
    }
    const T* tK = sK + buf * kBlockN * D;
    const T* tV = sV + buf * kBlockN * D;
    // Warps whose rows all precede the tile (causal) skip the math but keep the barriers.
    const bool active = !kCausal || n0 <= warp_row_last;

    uint32_t pa[kMT][kKV][4];
    if (active) {
      float s[kMT][kNT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int i = 0; i < kNT; ++i) s[mt][i][0] = s[mt][i][1] = s[mt][i][2] = s[mt][i][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < kKQ; ++kk) {
#pragma unroll
        for (int np = 0; np < kNT / 2; ++np) {
          uint32_t b[4];
          const int r = np * 16 + (lane & 7) + ((lane >> 4) << 3);
          ldmatrix_x4(b, smem_u32(tK + swz<D>(r, 2 * kk + ((lane >> 3) & 1))));
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            mma16816<T>(s[mt][2 * np], qf[mt][kk], b[0], b[1]);
            mma16816<T>(s[mt][2 * np + 1], qf[mt][kk], b[2], b[3]);
          }
        }
      }
      // Mask keys past S, and (causal) keys after the row, only on edge tiles.
      const bool edge = n0 + kBlockN > S || (kCausal && n0 + kBlockN - 1 > warp_row0);
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        const int row_a = warp_row0 + mt * 16 + (lane >> 2);
        const int row_b = row_a + 8;
        if (edge) {
#pragma unroll
          for (int i = 0; i < kNT; ++i) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int col = n0 + i * 8 + 2 * (lane & 3) + e;
              if (col >= S || (kCausal && col > row_a)) s[mt][i][e] = -INFINITY;
              if (col >= S || (kCausal && col > row_b)) s[mt][i][2 + e] = -INFINITY;
            }
          }
        }
        float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
        for (int i = 0; i < kNT; ++i) {
          mx_a = fmaxf(mx_a, fmaxf(s[mt][i][0], s[mt][i][1]));
          mx_b = fmaxf(mx_b, fmaxf(s[mt][i][2], s[mt][i][3]));
        }
#pragma unroll
        for (int off = 1; off < 4; off <<= 1) {
          mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, off));
          mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, off));
        }
        const float mn_a = fmaxf(m_r[mt][0], mx_a * sl2);
        const float mn_b = fmaxf(m_r[mt][1], mx_b * sl2);
        // A row with no visible key yet keeps m = -inf; use 0 so exp2 gives 0, not NaN.
        const float mu_a = mn_a == -INFINITY ? 0.f : mn_a;
        const float mu_b = mn_b == -INFINITY ? 0.f : mn_b;
        const float c_a = fast_exp2(m_r[mt][0] - mu_a);
        const float c_b = fast_exp2(m_r[mt][1] - mu_b);
        m_r[mt][0] = mn_a;
        m_r[mt][1] = mn_b;
        float sum_a = 0.f, sum_b = 0.f;
#pragma unroll
        for (int i = 0; i < kNT; ++i) {
          s[mt][i][0] = fast_exp2(fmaf(s[mt][i][0], sl2, -mu_a));
          s[mt][i][1] = fast_exp2(fmaf(s[mt][i][1], sl2, -mu_a));
          s[mt][i][2] = fast_exp2(fmaf(s[mt][i][2], sl2, -mu_b));
          s[mt][i][3] = fast_exp2(fmaf(s[mt][i][3], sl2, -mu_b));
          sum_a += s[mt][i][0] + s[mt][i][1];
          sum_b += s[mt][i][2] + s[mt][i][3];
        }
        l_r[mt][0] = l_r[mt][0] * c_a + sum_a;
        l_r[mt][1] = l_r[mt][1] * c_b + sum_b;
#pragma unroll
        for (int i = 0; i < kDT; ++i) {
          o[mt][i][0] *= c_a;
          o[mt][i][1] *= c_a;
          o[mt][i][2] *= c_b;
          o[mt][i][3] *= c_b;
        }
#pragma unroll
        for (int kk = 0; kk < kKV; ++kk) {
          pa[mt][kk][0] = pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
          pa[mt][kk][1] = pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
          pa[mt][kk][2] = pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
          pa[mt][kk][3] = pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
        }
      }
    }

    cp_async_wait<2>();  // V tile t landed (tile t+1 may still be in flight)
    __syncthreads();
    if (active) {
#pragma unroll
      for (int kk = 0; kk < kKV; ++kk) {
#pragma unroll
        for (int dp = 0; dp < kDT / 2; ++dp) {
          uint32_t b[4];
          const int r = kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
          ldmatrix_x4_trans(b, smem_u32(tV + swz<D>(r, 2 * dp + (lane >> 4))));
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            mma16816<T>(o[mt][2 * dp], pa[mt][kk], b[0], b[1]);
            mma16816<T>(o[mt][2 * dp + 1], pa[mt][kk], b[2], b[3]);
          }
        }
      }
    }
  }
  cp_async_wait<0>();

#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
      l_r[mt][0] += __shfl_xor_sync(0xffffffffu, l_r[mt][0], off);
      l_r[mt][1] += __shfl_xor_sync(0xffffffffu, l_r[mt][1], off);
    }
  }

  if (kSplit) {
    // Unnormalised partials; the combine kernel rescales by exp2(m - M).
    const size_t ws_row = (static_cast<size_t>(blockIdx.z) * p.BH + bh) * S;
    const int col = 2 * (lane & 3);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = warp_row0 + mt * 16 + (lane >> 2) + 8 * h;
        if (row < S) {
          float* dst = p.ws_acc + (ws_row + row) * D + col;
#pragma unroll
          for (int i = 0; i < kDT; ++i) {
            *reinterpret_cast<float2*>(dst + i * 8) = make_float2(o[mt][i][2 * h], o[mt][i][2 * h + 1]);
          }
          if ((lane & 3) == 0) p.ws_ml[ws_row + row] = make_float2(m_r[mt][h], l_r[mt][h]);
        }
      }
    }
    return;
  }

  // Normalise, stage this warp's rows in its own slice of sQ (its Q already
  // lives in registers), then write full 16-byte vectors to global memory.
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float l = l_r[mt][h];
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const int lr = warp * C::kRowsPerWarp + mt * 16 + (lane >> 2) + 8 * h;
#pragma unroll
      for (int i = 0; i < kDT; ++i) {
        *reinterpret_cast<uint32_t*>(sQ + swz<D>(lr, i) + 2 * (lane & 3)) =
            pack2<T>(o[mt][i][2 * h] * inv, o[mt][i][2 * h + 1] * inv);
      }
    }
  }
  __syncwarp();
  constexpr int kChunks = D / 8;
  T* oh = p.o + head;
#pragma unroll
  for (int it = 0; it < C::kRowsPerWarp * kChunks / 32; ++it) {
    const int idx = it * 32 + lane;
    const int r = idx / kChunks;
    const int c = idx % kChunks;
    const int row = warp_row0 + r;
    if (row < S) {
      *reinterpret_cast<uint4*>(oh + static_cast<size_t>(row) * D + c * 8) =
          *reinterpret_cast<const uint4*>(sQ + swz<D>(warp * C::kRowsPerWarp + r, c));
    }
  }
}

// p.group_heads <= 0 picks the group size from the L2 size (half of it for K/V).
template <typename T, typename C, bool kCausal, bool kSplit>
cudaError_t launch_flash(const Params<T>& p, int num_splits, cudaStream_t stream) {
  constexpr int kSmem = C::kSmemBytes;
  auto kernel = flash_fwd_kernel<T, C, kCausal, kSplit>;
  // Opt in to > 48 KB of dynamic shared memory (a cheap attribute write; legal
  // during CUDA-graph capture, and FlashAttention does the same per launch).
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (kSmem > 48 * 1024) {
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    if (err != cudaSuccess) return err;
  }
  Params<T> q = p;
  q.m_tiles = (p.S + C::kBlockM - 1) / C::kBlockM;
  if (q.group_heads <= 0) {
    // The largest power of two of heads whose K/V fit in half the L2 (all heads
    // when they all fit). Powers of two keep the groups equal on the usual head
    // counts, which is faster (benchmarks/results/cuda_kernels_h100_2026-11-21.md).
    int l2 = 0;
    if (cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev) != cudaSuccess || l2 <= 0) l2 = 32 << 20;
    const long long kv_bytes = 4LL * p.S * C::D;  // K and V of one head, 16-bit
    const long long g_max = (l2 / 2) / (kv_bytes > 0 ? kv_bytes : 1);
    int g = 1;
    if (g_max >= p.BH) {
      g = p.BH;
    } else {
      while (2LL * g <= g_max) g *= 2;
    }
    q.group_heads = g;
  }
  const long long ctas = static_cast<long long>(q.m_tiles) * p.BH;
  if (ctas > 0x7fffffffLL || num_splits > 65535) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(ctas), 1, num_splits);
  kernel<<<grid, C::kThreads, kSmem, stream>>>(q);
  return cudaGetLastError();
}

template <typename T>
inline Params<T> make_params(const void* q, const void* k, const void* v, void* o, int BH, int S, int D) {
  Params<T> p{};
  p.q = static_cast<const T*>(q);
  p.k = static_cast<const T*>(k);
  p.v = static_cast<const T*>(v);
  p.o = static_cast<T*>(o);
  p.S = S;
  p.BH = BH;
  p.scale_log2 = kLog2e / sqrtf(static_cast<float>(D));
  return p;
}

}  // namespace
}  // namespace flash
}  // namespace pg
