// Host launchers of the CUDA attention kernels.
//
// Plain C ABI so the kernels build and link without torch; the torch binding
// (bindings.cpp) only validates tensors and forwards raw pointers.
//
// Layout: q, k, v, o are contiguous (B, H, S, D) arrays of 16-bit floats.
// dtype: PG_DTYPE_FP16 or PG_DTYPE_BF16. D must be 64 or 128. Softmax scale
// is 1/sqrt(D); causal is the top-left mask (query i sees keys j <= i).
#pragma once

#include <cuda_runtime.h>
#include <stddef.h>

#define PG_DTYPE_FP16 0
#define PG_DTYPE_BF16 1

#ifdef __cplusplus
extern "C" {
#endif

cudaError_t pg_attn_scalar(const void* q, const void* k, const void* v, void* o, int B, int H, int S,
                           int D, int dtype, int causal, cudaStream_t stream);

cudaError_t pg_attn_tiled(const void* q, const void* k, const void* v, void* o, int B, int H, int S,
                          int D, int dtype, int causal, cudaStream_t stream);

cudaError_t pg_attn_wmma(const void* q, const void* k, const void* v, void* o, int B, int H, int S,
                         int D, int dtype, int causal, cudaStream_t stream);

// Number of KV splits the split kernel would use (requested <= 0 picks one
// from the SM count so that small B*H still fills the GPU).
int pg_attn_splitkv_num_splits(int B, int H, int S, int D, int causal, int num_sms, int requested);

// Bytes of fp32 workspace the split kernel needs for num_splits splits.
size_t pg_attn_splitkv_workspace_bytes(int B, int H, int S, int D, int num_splits);

cudaError_t pg_attn_splitkv(const void* q, const void* k, const void* v, void* o, float* workspace,
                            int B, int H, int S, int D, int dtype, int causal, int num_splits,
                            cudaStream_t stream);

#ifdef __cplusplus
}
#endif
