// Helpers shared by the CUDA kernels (attention, layer norm, cross-entropy): how they are launched
// and reach dynamic shared memory, element conversion and deterministic warp reductions; for the
// row-wise ones (layer norm, cross-entropy) also 16-byte vector loads and stores and thread-group
// reductions.
// Framework-free: cuda_runtime.h, cuda_bf16.h and cuda_fp16.h only. Internal to csrc/cuda/*.cu.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common.h"

namespace pygpt::cuda::detail {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;

template <typename T>
struct Identity {
  using type = T;
};

// kernel<<<grid, block, shared_bytes, stream>>>(args...), written as the runtime call it stands
// for, so that the sources also compile as plain C++ against the host emulator that runs the
// native CUDA tests without a GPU (tests/native/cuda/emulator). Returns the launch's error,
// cleared from cudaGetLastError so that it is reported once, by the launcher.
template <typename... Params>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                   cudaStream_t stream, typename Identity<Params>::type... args) {
  void* arg_pointers[] = {static_cast<void*>(&args)...};
  const cudaError_t err = cudaLaunchKernel(kernel, grid, block, arg_pointers, shared_bytes, stream);
  if (err != cudaSuccess) cudaGetLastError();
  return err;
}

// The block's dynamic shared memory (the launch's shared_bytes), 16-byte aligned.
template <typename T>
__device__ __forceinline__ T* dynamic_shared() {
#ifdef PYGPT_CUDA_EMULATOR
  return pygpt_emulated_dynamic_shared<T>();
#else
  extern __shared__ float4 pygpt_dynamic_shared[];
  return reinterpret_cast<T*>(pygpt_dynamic_shared);
#endif
}

// Storage types: float for kFloat32, the raw bits (uint16_t) for kBFloat16 and __half for
// kFloat16, so that every element type is trivially copyable and the arithmetic is always float32.
// a * b rounded to float on its own, never fused with the addition that follows into an FMA: a
// value that is used twice (summed over a row, then subtracted from that sum's mean) must be the
// same number both times, or the difference of equals carries the product's rounding error.
__device__ __forceinline__ float rounded_product(float a, float b) { return __fmul_rn(a, b); }

// A 16-bit storage type's value from its bits, and the bits of a float rounded to it (to nearest
// even, NaN kept): both exact where the value fits.
template <typename S>
__device__ __forceinline__ float bits_to_float(uint32_t bits);
template <>
__device__ __forceinline__ float bits_to_float<uint16_t>(uint32_t bits) {
  return __uint_as_float(bits << 16);
}
template <>
__device__ __forceinline__ float bits_to_float<__half>(uint32_t bits) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
}

template <typename S>
__device__ __forceinline__ uint16_t float_to_bits(float v);
template <>
__device__ __forceinline__ uint16_t float_to_bits<uint16_t>(float v) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}
template <>
__device__ __forceinline__ uint16_t float_to_bits<__half>(float v) {
  return __half_as_ushort(__float2half_rn(v));
}

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(uint16_t bits) { return bits_to_float<uint16_t>(bits); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

template <typename S>
__device__ __forceinline__ S from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ uint16_t from_float<uint16_t>(float v) {
  return float_to_bits<uint16_t>(v);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}

// f(static_cast<S*>(nullptr)) for dtype's storage type S, so that a launcher names its typed
// kernels once for all three; cudaErrorInvalidValue for a dtype no kernel takes.
template <typename F>
cudaError_t with_storage(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32: return f(static_cast<float*>(nullptr));
    case DType::kBFloat16: return f(static_cast<uint16_t*>(nullptr));
    case DType::kFloat16: return f(static_cast<__half*>(nullptr));
  }
  return cudaErrorInvalidValue;
}

// Elements of S in one 16-byte vector.
template <typename S>
constexpr int kVec16 = static_cast<int>(16 / sizeof(S));

// N consecutive elements of S as floats. With sizeof(S) * N == 16 this is one 16-byte access
// (ld.global.v4 / st.global.v4) and p must be a 16-byte aligned pointer to global memory;
// otherwise N scalar accesses. 16-bit pairs share a 32-bit word little-endian: element 2k in
// the low half.
template <int N, typename S>
__device__ __forceinline__ void load_pack(const S* p, float (&out)[N]) {
  if constexpr (sizeof(S) * N == 16) {
    const uint4 w = *reinterpret_cast<const uint4*>(p);
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if constexpr (std::is_same_v<S, float>) {
        out[k] = __uint_as_float(words[k]);
      } else {
        out[2 * k] = bits_to_float<S>(words[k] & 0xffffu);
        out[2 * k + 1] = bits_to_float<S>(words[k] >> 16);
      }
    }
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) out[k] = to_float(p[k]);
  }
}

template <int N, typename S>
__device__ __forceinline__ void store_pack(S* p, const float (&in)[N]) {
  if constexpr (sizeof(S) * N == 16) {
    uint32_t words[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if constexpr (std::is_same_v<S, float>) {
        words[k] = __float_as_uint(in[k]);
      } else {
        words[k] = static_cast<uint32_t>(float_to_bits<S>(in[2 * k])) |
                   static_cast<uint32_t>(float_to_bits<S>(in[2 * k + 1])) << 16;
      }
    }
    // __stwb is st.global.wb.v4 (the default write-back policy): a plain uint4 assignment is
    // sometimes split into four 4-byte stores by nvcc 13 when the address carries a 64-bit row
    // offset computed in an enclosing loop.
    __stwb(reinterpret_cast<uint4*>(p), make_uint4(words[0], words[1], words[2], words[3]));
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) p[k] = from_float<S>(in[k]);
  }
}

inline bool is_aligned(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

struct SumOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a + b;
  }
  __device__ __forceinline__ float2 operator()(float2 a, float2 b) const {
    return make_float2(a.x + b.x, a.y + b.y);
  }
};

struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

__device__ __forceinline__ float shfl_xor(float v, int m) {
  return __shfl_xor_sync(kFullMask, v, m);
}
__device__ __forceinline__ double shfl_xor(double v, int m) {
  return __shfl_xor_sync(kFullMask, v, m);
}
__device__ __forceinline__ long long shfl_xor(long long v, int m) {
  return __shfl_xor_sync(kFullMask, v, m);
}
__device__ __forceinline__ float2 shfl_xor(float2 v, int m) {
  return make_float2(__shfl_xor_sync(kFullMask, v.x, m), __shfl_xor_sync(kFullMask, v.y, m));
}

// Butterfly reduction over the whole warp (all 32 lanes must call it). Every lane ends with the
// same bits: at each level the two partners combine the same pair of values with a commutative op.
template <typename T, typename Op>
__device__ __forceinline__ T warp_allreduce(T v, Op op) {
#pragma unroll
  for (int m = kWarpSize / 2; m > 0; m /= 2) v = op(v, shfl_xor(v, m));
  return v;
}

// Reduces v over each group of `group` consecutive threads of the block, where group is 32 or a
// multiple of 32 dividing blockDim.x. Every thread of a group gets the group's result, the same
// bits for all (the warps' results are folded left to right in a fixed order): deterministic.
// When group > 32 it synchronises the block, so every thread of the block must call it (with the
// same group). smem: blockDim.x / 32 entries of T, reused by consecutive calls.
template <typename T, typename Op>
__device__ __forceinline__ T group_allreduce(T v, Op op, int group, T* smem) {
  v = warp_allreduce(v, op);
  if (group == kWarpSize) return v;
  __syncthreads();  // the previous call's readers are done with smem
  if ((threadIdx.x & (kWarpSize - 1)) == 0) smem[threadIdx.x / kWarpSize] = v;
  __syncthreads();
  const int warps = group / kWarpSize;
  const int first = static_cast<int>(threadIdx.x) / group * warps;
  T acc = smem[first];
  for (int w = 1; w < warps; ++w) acc = op(acc, smem[first + w]);
  return acc;
}

// Smallest power of two >= n, at least lo and at most hi.
inline int pow2_at_least(int64_t n, int lo, int hi) {
  int p = lo;
  while (p < hi && p < n) p *= 2;
  return p;
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace pygpt::cuda::detail
