// Small device utilities shared by the attention kernels (16-bit <-> fp32).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace pg {

template <typename T>
struct Vec2;
template <>
struct Vec2<__half> {
  using type = __half2;
};
template <>
struct Vec2<__nv_bfloat16> {
  using type = __nv_bfloat162;
};

__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

__device__ __forceinline__ float2 to_float2(__half2 x) { return __half22float2(x); }
__device__ __forceinline__ float2 to_float2(__nv_bfloat162 x) { return __bfloat1622float2(x); }

// Two fp32 values packed into one 32-bit register of 16-bit floats (low = a).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float a, float b);
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float a, float b) {
  __half2 h = __floats2half2_rn(a, b);
  return *reinterpret_cast<uint32_t*>(&h);
}
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float a, float b) {
  __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<uint32_t*>(&h);
}

// Unpack one 32-bit register of two 16-bit floats.
template <typename T>
__device__ __forceinline__ float2 unpack2(uint32_t x) {
  typename Vec2<T>::type h = *reinterpret_cast<typename Vec2<T>::type*>(&x);
  return to_float2(h);
}

constexpr float kLog2e = 1.4426950408889634f;

}  // namespace pg
