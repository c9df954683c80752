// Rotary position embedding on CUDA (declared in rotary.h), float32, bfloat16 and float16
// storage, float32 arithmetic. The math mirrors cpu/rotary.cpp.
//
// A row (b, h, t) has W = D - half work items: items i < half rotate the pair (i, i + half),
// items i >= half copy channel i + half (the channels past the rotated ones). A block of
// 32 x kRowsPerBlock threads takes kRowsPerBlock rows at a time (grid-strided over the rows),
// one warp per row stepping over its items, so that a warp reads and writes contiguous
// channels and a row's (b, h, t) and position are worked out once per thread, not per item.
// Memory bound: each element is read and written once.
#include "cuda/rotary.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernel_utils.cuh"

namespace pygpt::cuda {
namespace {

using detail::from_float;
using detail::to_float;

constexpr int kRowsPerBlock = 8;         // warps per block, one row each
constexpr int64_t kMaxBlocks = 1 << 16;  // the row loop is grid-strided beyond this

template <typename S>
__global__ void __launch_bounds__(detail::kWarpSize * kRowsPerBlock)
    rotary_kernel(const S* x, const S* cos, const S* sin, const int64_t* positions, S* y,
                  RotaryShape s) {
  const int64_t rows = s.B * s.H * s.T, width = s.D - s.half;
  const float sign = s.inverse ? -1.0f : 1.0f;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.y; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const int64_t t = row % s.T, h = row / s.T % s.H, b = row / (s.T * s.H);
    const S* xr = x + b * s.x_b + h * s.x_h + t * s.x_t;
    S* yr = y + b * s.y_b + h * s.y_h + t * s.y_t;
    const int64_t at = positions[b * s.pos_b + t * s.pos_t] * s.half;
    const S* c = cos + at;
    const S* sn = sin + at;
    for (int64_t i = threadIdx.x; i < width; i += detail::kWarpSize) {
      if (i >= s.half) {  // a channel past the rotated ones
        yr[i + s.half] = xr[i + s.half];
        continue;
      }
      const float ci = to_float(c[i]), si = sign * to_float(sn[i]);
      const float a = to_float(xr[i]), bb = to_float(xr[i + s.half]);
      yr[i] = from_float<S>(a * ci - bb * si);
      yr[i + s.half] = from_float<S>(bb * ci + a * si);
    }
  }
}

template <typename S>
cudaError_t launch_typed(const void* x, const void* cos, const void* sin,
                         const int64_t* positions, void* y, const RotaryShape& s,
                         cudaStream_t stream) {
  const int64_t blocks = detail::ceil_div(s.B * s.H * s.T, kRowsPerBlock);
  const unsigned grid = static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
  return detail::launch(rotary_kernel<S>, dim3(grid), dim3(detail::kWarpSize, kRowsPerBlock), 0,
                        stream, static_cast<const S*>(x), static_cast<const S*>(cos),
                        static_cast<const S*>(sin), positions, static_cast<S*>(y), s);
}

}  // namespace

cudaError_t rotary(DType dtype, const void* x, const void* cos, const void* sin,
                   const int64_t* positions, void* y, const RotaryShape& s, cudaStream_t stream) {
  if (s.B < 0 || s.H < 0 || s.T < 0 || s.half < 0 || 2 * s.half > s.D) {
    return cudaErrorInvalidValue;
  }
  if (s.B * s.H * s.T == 0 || s.D == 0) return cudaSuccess;
  return detail::with_storage(dtype, [&](auto* type) {
    return launch_typed<std::remove_pointer_t<decltype(type)>>(x, cos, sin, positions, y, s,
                                                               stream);
  });
}

}  // namespace pygpt::cuda
