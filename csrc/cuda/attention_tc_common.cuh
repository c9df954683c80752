// What the tensor-core attention forward (attention_tc.cu) and backward
// (attention_tc_backward.cu) share: the visibility rule, the swizzled shared-memory tile layout
// and its asynchronous loader, the reuse of accumulators as an A operand, the pointer
// alignment the launchers require, and the constants of the exp2-based softmax.
// Framework-free: CUDA headers only. Internal to csrc/cuda/attention_tc*.cu.
#pragma once

#include <cstdint>

#include "cuda/tensor_core.cuh"

namespace pygpt::cuda::tc {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ float neg_inf() { return -__int_as_float(0x7f800000); }

// How many keys (a prefix) query i of a batch row with Lq real queries and Lk real keys sees:
// all Lk, or with the bottom-right causal mask keys j <= i + Lk - Lq; none past Lq.
__device__ __forceinline__ int64_t visible_keys(int64_t i, int64_t Lq, int64_t Lk, bool causal) {
  if (i >= Lq) return 0;
  if (!causal) return Lk;
  const int64_t n = i + 1 + Lk - Lq;
  return n < 0 ? 0 : n > Lk ? Lk : n;
}

// Element offset of chunk `chunk` (8 elements, 16 bytes) of row `row` in a swizzled (rows x D)
// tile of 16-bit elements: chunk c of row r lies at chunk position c ^ (r % 8). Every row is a
// multiple of 128 bytes, so unswizzled the 8 rows one ldmatrix phase reads would all start in the
// same bank; swizzled, they read 8 different chunks, 32 different banks.
template <int D>
__device__ __forceinline__ int swizzled(int row, int chunk) {
  return row * D + ((chunk ^ (row & 7)) << 3);
}

// Starts copying rows [0, rows) of a (rows x D) global tile into a swizzled shared tile, rows at
// or past `valid` zero-filled without reading them (their source address is src itself, valid
// whenever any row is; with valid <= 0 nothing is read at all).
template <int D, int kThreads>
__device__ __forceinline__ void load_tile_async(uint16_t* dst, const uint16_t* src, int64_t valid,
                                                int rows) {
  constexpr int kChunks = D / 8;
  for (int c = threadIdx.x; c < rows * kChunks; c += kThreads) {
    const int r = c / kChunks, chunk = c % kChunks;
    const bool real = r < valid;
    detail::cp_async_16(dst + swizzled<D>(r, chunk),
                        real ? src + static_cast<int64_t>(r) * D + chunk * 8 : src, real ? 16 : 0);
  }
}

// The A fragment (16 x 16, rounded to T) that is the C fragments of two adjacent n-blocks
// (16 x 8 each, float): lane (g, t) holds C elements (g | g + 8, 2t, 2t + 1) of each, exactly
// the A elements it needs over the 16 columns (see attention_tc.cu's top), so no data moves.
template <typename T>
__device__ __forceinline__ void a_from_c_pair(const float (&lo)[4], const float (&hi)[4],
                                              uint32_t (&a)[4]) {
  a[0] = detail::pack2<T>(lo[0], lo[1]);
  a[1] = detail::pack2<T>(lo[2], lo[3]);
  a[2] = detail::pack2<T>(hi[0], hi[1]);
  a[3] = detail::pack2<T>(hi[2], hi[3]);
}

// Whether a pointer is 16-byte aligned, as the 16-byte copies and paired stores need.
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace pygpt::cuda::tc
