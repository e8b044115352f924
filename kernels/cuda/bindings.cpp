// Torch binding of the CUDA attention kernels.
//
// Validates tensors here, once, so the kernels can assume contiguous,
// 16-byte aligned (B, H, S, D) inputs of one supported dtype; allocates the
// output with torch::empty and launches on the current stream.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/python.h>  // not torch/extension.h, whose torch/all.h is a third of this file's compile time

#include <cstdint>
#include <string>

#include "attention.h"

namespace {

using Launcher = cudaError_t (*)(const void*, const void*, const void*, void*, int, int, int, int, int, int,
                                 cudaStream_t);

void check_input(const torch::Tensor& t, const char* name, const torch::Tensor& q) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor, got device ", t.device());
  TORCH_CHECK(t.device() == q.device(), name, " is on ", t.device(), " but q is on ", q.device());
  TORCH_CHECK(t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16, name,
              " must be float16 or bfloat16, got ", t.scalar_type());
  TORCH_CHECK(t.scalar_type() == q.scalar_type(), name, " has dtype ", t.scalar_type(), " but q has ",
              q.scalar_type());
  TORCH_CHECK(t.dim() == 4, name, " must be 4-D (B, H, S, D), got ", t.dim(), "-D");
  TORCH_CHECK(t.sizes() == q.sizes(), name, " has shape ", t.sizes(), " but q has ", q.sizes(),
              " (these kernels need Sq == Sk and equal head counts)");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous; call .contiguous() first");
  TORCH_CHECK(reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 16 == 0, name,
              " must be 16-byte aligned (a view with a storage offset?); call .clone() first");
}

struct Dims {
  int B, H, S, D, dtype;
};

Dims check_qkv(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  check_input(q, "q", q);
  check_input(k, "k", q);
  check_input(v, "v", q);
  const int64_t D = q.size(3);
  TORCH_CHECK(D == 64 || D == 128, "head dim D must be 64 or 128, got ", D);
  TORCH_CHECK(q.size(0) * q.size(1) <= 65535, "B * H must be <= 65535, got ", q.size(0) * q.size(1));
  TORCH_CHECK(q.size(2) <= (int64_t{1} << 24), "sequence length must be <= 2^24, got ", q.size(2));
  return Dims{static_cast<int>(q.size(0)), static_cast<int>(q.size(1)), static_cast<int>(q.size(2)),
              static_cast<int>(D), q.scalar_type() == at::kHalf ? PG_DTYPE_FP16 : PG_DTYPE_BF16};
}

void check_launch(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, what, " launch failed: ", cudaGetErrorString(err));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

torch::Tensor run(Launcher fn, const char* what, const torch::Tensor& q, const torch::Tensor& k,
                  const torch::Tensor& v, bool causal) {
  const Dims d = check_qkv(q, k, v);
  const c10::cuda::CUDAGuard guard(q.device());
  torch::Tensor o = torch::empty(q.sizes(), q.options());
  if (o.numel() == 0) return o;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  check_launch(fn(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), d.B, d.H, d.S, d.D, d.dtype,
                  causal ? 1 : 0, stream),
               what);
  return o;
}

torch::Tensor scalar(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, bool causal) {
  return run(pg_attn_scalar, "cuda_scalar", q, k, v, causal);
}

torch::Tensor tiled(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, bool causal) {
  return run(pg_attn_tiled, "cuda_tiled", q, k, v, causal);
}

torch::Tensor wmma(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, bool causal) {
  return run(pg_attn_wmma, "cuda_wmma", q, k, v, causal);
}

int num_sms(const torch::Tensor& q) {
  int n = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, q.device().index()));
  return n;
}

int64_t splitkv_num_splits(const torch::Tensor& q, bool causal, int64_t num_splits) {
  TORCH_CHECK(q.dim() == 4, "q must be 4-D (B, H, S, D), got ", q.dim(), "-D");
  TORCH_CHECK(q.is_cuda(), "q must be a CUDA tensor, got device ", q.device());
  return pg_attn_splitkv_num_splits(static_cast<int>(q.size(0)), static_cast<int>(q.size(1)),
                                    static_cast<int>(q.size(2)), static_cast<int>(q.size(3)), causal ? 1 : 0,
                                    num_sms(q), static_cast<int>(num_splits));
}

torch::Tensor splitkv(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, bool causal,
                      int64_t num_splits) {
  const Dims d = check_qkv(q, k, v);
  TORCH_CHECK(num_splits <= 65535, "num_splits must be <= 65535, got ", num_splits);
  const c10::cuda::CUDAGuard guard(q.device());
  torch::Tensor o = torch::empty(q.sizes(), q.options());
  if (o.numel() == 0) return o;
  const int splits = pg_attn_splitkv_num_splits(d.B, d.H, d.S, d.D, causal ? 1 : 0, num_sms(q),
                                                static_cast<int>(num_splits));
  const size_t bytes = pg_attn_splitkv_workspace_bytes(d.B, d.H, d.S, d.D, splits);
  torch::Tensor ws;
  float* ws_ptr = nullptr;
  if (bytes > 0) {
    // Through the caching allocator, so repeated calls (and graph capture) allocate nothing new.
    ws = torch::empty({static_cast<int64_t>(bytes / sizeof(float))}, q.options().dtype(at::kFloat));
    ws_ptr = ws.data_ptr<float>();
  }
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  check_launch(pg_attn_splitkv(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), ws_ptr, d.B, d.H, d.S,
                               d.D, d.dtype, causal ? 1 : 0, splits, stream),
               "cuda_splitkv");
  return o;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "CUDA FlashAttention forward kernels (scalar, tiled, tensor-core, KV-split)";
  m.def("scalar", &scalar, "one warp per query row", py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("causal"));
  m.def("tiled", &tiled, "shared-memory tiles on CUDA cores", py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("causal"));
  m.def("wmma", &wmma, "tensor cores (mma.sync), cp.async double buffering", py::arg("q"), py::arg("k"),
        py::arg("v"), py::arg("causal"));
  m.def("splitkv", &splitkv, "KV-split tensor-core kernel plus combine; num_splits <= 0 picks one",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("causal"), py::arg("num_splits") = -1);
  m.def("splitkv_num_splits", &splitkv_num_splits, "KV splits cuda_splitkv uses for this shape",
        py::arg("q"), py::arg("causal"), py::arg("num_splits") = -1);
}
