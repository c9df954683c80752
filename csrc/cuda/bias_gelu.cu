// Bias + GELU on CUDA (declared in bias_gelu.h), float32, bfloat16 and float16 storage,
// float32 arithmetic with the device's erff and expf; the math mirrors cpu/bias_gelu.cpp (the tanh GELU
// too as h * sigmoid(2u)). The kernels are templates over the GELU (ErfGelu, TanhGelu), chosen
// once per launch.
//
// Forward: elementwise, grid-strided, 16-byte vectors when C is a multiple of the vector width
// and the pointers are aligned (else scalar).
// Backward: dx elementwise and the bias gradient, the column sums of dx, in two deterministic
// stages (no atomics):
//   stage 1: a (32 x kRows)-thread block per 32 columns and per group of rows: lane x owns a
//            column, lanes y stride over the group's rows (a warp reads 32 consecutive elements
//            of a row), and the block folds its y lanes in a fixed order into one partial row of
//            workspace = float[G][C], G = the row groups;
//   stage 2: a (32 x kRows)-thread block per 32 columns sums the G partials in a fixed order.
// G depends on N only, so bias_gelu_backward_workspace_bytes(N, C) is exact and results are
// bitwise reproducible.
#include "cuda/bias_gelu.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "cuda/kernel_utils.cuh"

namespace pygpt::cuda {
namespace {

using detail::ceil_div;
using detail::from_float;
using detail::is_aligned;
using detail::load_pack;
using detail::store_pack;
using detail::to_float;

constexpr int kCols = 32, kRows = 8;       // backward block shape
constexpr int64_t kRowsPerGroup = 64;      // rows per backward block, until ...
constexpr int64_t kMaxGroups = 1024;       // ... this many groups (G) exist
constexpr int kForwardThreads = 256;
constexpr int64_t kMaxGrid = 1 << 20;      // elementwise loops are grid-strided beyond this
constexpr float kSqrtHalf = 0.70710678118654752440f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;
constexpr float kSqrt2OverPi = 0.79788456080286535588f;
constexpr float kCubic = 0.044715f;  // the tanh GELU's cubic coefficient

// The exact GELU, h * Phi(h).
struct ErfGelu {
  static __device__ __forceinline__ float value(float h) {
    return h * 0.5f * (1.0f + erff(h * kSqrtHalf));
  }
  // gelu'(h) = Phi(h) + h * phi(h).
  static __device__ __forceinline__ float derivative(float h) {
    return 0.5f * (1.0f + erff(h * kSqrtHalf)) + h * kInvSqrt2Pi * expf(-0.5f * h * h);
  }
};

// The tanh GELU, h * (1 + tanh(u)) / 2 = h * s, s = sigmoid(2u) = 1 / (1 + e^-2u),
// u = sqrt(2 / pi) (h + 0.044715 h^3): no cancellation in 1 + tanh(u) for negative h.
struct TanhGelu {
  static __device__ __forceinline__ float sigmoid_2u(float h) {
    return 1.0f / (1.0f + expf(-2.0f * kSqrt2OverPi * (h + kCubic * h * h * h)));
  }
  static __device__ __forceinline__ float value(float h) { return h * sigmoid_2u(h); }
  // gelu'(h) = s + h * s * (1 - s) * 2 du/dh, du/dh = sqrt(2 / pi) (1 + 3 * 0.044715 h^2).
  static __device__ __forceinline__ float derivative(float h) {
    const float s = sigmoid_2u(h);
    return s + h * (s * (1.0f - s)) * (2.0f * kSqrt2OverPi * (1.0f + 3.0f * kCubic * h * h));
  }
};

int64_t backward_groups(int64_t N) {
  const int64_t g = ceil_div(N, kRowsPerGroup);
  return g < kMaxGroups ? g : kMaxGroups;
}

// Packs of VEC elements; VEC > 1 needs C % VEC == 0 and 16-byte aligned pointers.
template <typename Gelu, typename S, int VEC>
__global__ void __launch_bounds__(kForwardThreads)
    forward_kernel(const S* x, const S* bias, S* y, int64_t packs, int C) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < packs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t at = i * VEC;
    float v[VEC], b[VEC];
    load_pack<VEC>(x + at, v);
    load_pack<VEC>(bias + at % C, b);
#pragma unroll
    for (int e = 0; e < VEC; ++e) v[e] = Gelu::value(v[e] + b[e]);
    store_pack<VEC>(y + at, v);
  }
}

// Stage 1; part (G, C) or null when no bias gradient is wanted.
template <typename Gelu, typename S>
__global__ void __launch_bounds__(kCols* kRows)
    backward_kernel(const S* grad_y, const S* x, const S* bias, S* dx, float* part, int64_t N,
                    int C, int64_t rows_per_group) {
  __shared__ float fold[kRows][kCols + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kCols + tx;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * rows_per_group;
  const int64_t last = first + rows_per_group < N ? first + rows_per_group : N;
  float acc = 0.0f;
  if (j < C) {
    const float b = to_float(bias[j]);
    for (int64_t row = first + ty; row < last; row += kRows) {
      const int64_t at = row * C + j;
      const float d = to_float(grad_y[at]) * Gelu::derivative(to_float(x[at]) + b);
      dx[at] = from_float<S>(d);
      acc += d;
    }
  }
  if (part == nullptr) return;
  fold[ty][tx] = acc;
  __syncthreads();
  if (ty != 0 || j >= C) return;
  for (int k = 1; k < kRows; ++k) acc += fold[k][tx];
  part[static_cast<int64_t>(blockIdx.y) * C + j] = acc;
}

// Stage 2: dbias[j] = the sum of part[0..G)[j], in a fixed order.
template <typename S>
__global__ void __launch_bounds__(kCols* kRows)
    reduce_kernel(const float* part, S* dbias, int64_t G, int C) {
  __shared__ float fold[kRows][kCols + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kCols + tx;
  float acc = 0.0f;
  if (j < C) {
    for (int64_t p = ty; p < G; p += kRows) acc += part[p * C + j];
  }
  fold[ty][tx] = acc;
  __syncthreads();
  if (ty != 0 || j >= C) return;
  for (int k = 1; k < kRows; ++k) acc += fold[k][tx];
  dbias[j] = from_float<S>(acc);
}

template <typename Gelu, typename S>
cudaError_t forward_typed(const S* x, const S* bias, S* y, int64_t N, int C,
                          cudaStream_t stream) {
  constexpr int V = detail::kVec16<S>;
  const bool vec = C % V == 0 && is_aligned(x, 16) && is_aligned(bias, 16) && is_aligned(y, 16);
  const int64_t packs = N * C / (vec ? V : 1);
  int64_t grid = ceil_div(packs, kForwardThreads);
  grid = grid < kMaxGrid ? grid : kMaxGrid;
  return detail::launch(vec ? forward_kernel<Gelu, S, V> : forward_kernel<Gelu, S, 1>,
                        static_cast<unsigned>(grid), kForwardThreads, 0, stream, x, bias, y, packs,
                        C);
}

template <typename Gelu, typename S>
cudaError_t backward_typed(const S* grad_y, const S* x, const S* bias, S* dx, S* dbias,
                           int64_t N, int C, void* workspace, cudaStream_t stream) {
  if (dbias != nullptr && workspace == nullptr) return cudaErrorInvalidValue;
  const int64_t G = backward_groups(N);
  float* part = dbias != nullptr ? static_cast<float*>(workspace) : nullptr;
  const dim3 block(kCols, kRows);
  const unsigned col_blocks = static_cast<unsigned>(ceil_div(C, kCols));
  cudaError_t err = detail::launch(backward_kernel<Gelu, S>,
                                   dim3(col_blocks, static_cast<unsigned>(G)),
                                   block, 0, stream, grad_y, x, bias, dx, part, N, C,
                                   ceil_div(N, G));
  if (err != cudaSuccess || dbias == nullptr) return err;
  return detail::launch(reduce_kernel<S>, col_blocks, block, 0, stream, part, dbias, G, C);
}

template <typename Gelu>
cudaError_t forward_dtype(DType dtype, const void* x, const void* bias, void* y, int64_t N, int c,
                          cudaStream_t stream) {
  return detail::with_storage(dtype, [&](auto* type) {
    using S = std::remove_pointer_t<decltype(type)>;
    return forward_typed<Gelu>(static_cast<const S*>(x), static_cast<const S*>(bias),
                               static_cast<S*>(y), N, c, stream);
  });
}

template <typename Gelu>
cudaError_t backward_dtype(DType dtype, const void* grad_y, const void* x, const void* bias,
                           void* dx, void* dbias, int64_t N, int c, void* workspace,
                           cudaStream_t stream) {
  return detail::with_storage(dtype, [&](auto* type) {
    using S = std::remove_pointer_t<decltype(type)>;
    return backward_typed<Gelu>(static_cast<const S*>(grad_y), static_cast<const S*>(x),
                                static_cast<const S*>(bias), static_cast<S*>(dx),
                                static_cast<S*>(dbias), N, c, workspace, stream);
  });
}

}  // namespace

cudaError_t bias_gelu_forward(DType dtype, const void* x, const void* bias, void* y, int64_t N,
                              int64_t C, GeluApproximation approximate, cudaStream_t stream) {
  if (N < 0 || C < 0 || C > INT_MAX) return cudaErrorInvalidValue;
  if (N == 0 || C == 0) return cudaSuccess;
  const int c = static_cast<int>(C);
  switch (approximate) {
    case GeluApproximation::kNone:
      return forward_dtype<ErfGelu>(dtype, x, bias, y, N, c, stream);
    case GeluApproximation::kTanh:
      return forward_dtype<TanhGelu>(dtype, x, bias, y, N, c, stream);
  }
  return cudaErrorInvalidValue;
}

size_t bias_gelu_backward_workspace_bytes(int64_t N, int64_t C) {
  if (N <= 0 || C <= 0) return 0;
  return static_cast<size_t>(backward_groups(N)) * static_cast<size_t>(C) * sizeof(float);
}

cudaError_t bias_gelu_backward(DType dtype, const void* grad_y, const void* x, const void* bias,
                               void* dx, void* dbias, int64_t N, int64_t C, void* workspace,
                               GeluApproximation approximate, cudaStream_t stream) {
  if (N < 0 || C < 0 || C > INT_MAX) return cudaErrorInvalidValue;
  if (!known_dtype(dtype)) return cudaErrorInvalidValue;
  if (approximate != GeluApproximation::kNone && approximate != GeluApproximation::kTanh)
    return cudaErrorInvalidValue;
  if (C == 0) return cudaSuccess;
  if (N == 0) {  // a sum over no rows: a zero bias gradient
    const size_t bytes = static_cast<size_t>(C) * dtype_bytes(dtype);
    return dbias != nullptr ? cudaMemsetAsync(dbias, 0, bytes, stream) : cudaSuccess;
  }
  const int c = static_cast<int>(C);
  if (approximate == GeluApproximation::kTanh) {
    return backward_dtype<TanhGelu>(dtype, grad_y, x, bias, dx, dbias, N, c, workspace, stream);
  }
  return backward_dtype<ErfGelu>(dtype, grad_y, x, bias, dx, dbias, N, c, workspace, stream);
}

}  // namespace pygpt::cuda
