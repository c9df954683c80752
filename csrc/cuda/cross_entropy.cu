// Fused softmax cross-entropy on CUDA (declared in cross_entropy.h), float32, bfloat16 and
// float16 logits, float32 arithmetic. The math mirrors cpu/cross_entropy.cpp, non-finite rows
// included: a row holding NaN or +inf gets lse NaN (and NaN gradients), a row of only -inf gets
// lse -inf.
//
// Forward, kernel 1 (rows): a unit of U threads per row, U = 32 (a warp; 8 rows per 256-thread
// block) for V <= 2048, growing to 512 threads (the whole block) for V > 16384, about 64 logits
// per thread. Each thread streams its share of the row once with 16-byte loads (4 in flight),
// keeping an online (max, sum of exp(x - max)) pair that is rescaled when the max grows; the row
// start need not be aligned (a scalar head up to the first 16-byte boundary and a scalar tail),
// so any V and row_stride work and nothing is staged in shared memory (no size limit on V).
// The unit then reduces the pairs (max, then the rescaled sums, in a fixed order), and thread 0
// writes lse and the row's loss term lse - logit[target] (0 for an ignored row) to
// workspace[row]. With label smoothing s > 0 (a second instantiation; s == 0 runs the unsmoothed
// kernel unchanged) each thread also sums its logits in the same sweep, the unit reduces that sum
// together with the rescaled exp sums (one float2 reduction), and the term is
// (1 - s) * (lse - logit[target]) + s * (lse - sum / V). Kernel 2 (one 1024-thread block) sums
// the terms of non-ignored rows in double in a fixed order, counts them and writes the mean (NaN
// when the count is 0): deterministic.
//
// Backward, kernel 1 (one block): counts the non-ignored targets and stores
// scale = *grad_loss / count (0 when count is 0) in workspace[0], on device. Kernel 2: one pass,
// 256-thread blocks over (row, segment of the row) work items, grad = (exp(x - lse) - s / V -
// (1 - s) [j == target]) * scale with expf (full precision), zeros for ignored rows (with s = 0
// the subtracted constants are exactly 0 and 1); 16-byte loads and stores
// when the logits row and the gradient row share their alignment (always for row_stride == V,
// including in place), scalar accesses otherwise. Each element is read and written by the same
// thread, so grad_logits may alias logits when row_stride == V.
#include "cuda/cross_entropy.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "cuda/kernel_utils.cuh"

namespace pygpt::cuda {
namespace {

using detail::ceil_div;
using detail::group_allreduce;
using detail::load_pack;
using detail::MaxOp;
using detail::store_pack;
using detail::SumOp;
using detail::to_float;

constexpr int kUnroll = 4;               // 16-byte vectors in flight per thread
constexpr int kPerThread = 64;           // logits per thread the forward unit size aims for
constexpr int kForwardMaxUnit = 512;     // threads per row at most
constexpr int kMinBlock = 256;           // small units are packed into blocks of this size
constexpr int kBackwardThreads = 256;    // threads per (row, segment) work item
constexpr int kCountThreads = 1024;      // single-block count / loss kernels
constexpr int64_t kMaxGrid = 1 << 20;    // grid-strided beyond this

struct Plan {
  int unit, block, rows;
};

Plan forward_plan(int64_t V) {
  const int unit =
      detail::pow2_at_least(ceil_div(V, kPerThread), detail::kWarpSize, kForwardMaxUnit);
  const int block = unit > kMinBlock ? unit : kMinBlock;
  return {unit, block, block / unit};
}

// Folds values v[0..K)[0..L) into the running (m, s): s = sum of exp(x - m) over what was seen.
// bad records a NaN or +inf (the row's lse is then NaN). -inf values contribute nothing; while
// everything seen is -inf, m stays -inf and s 0.
template <int K, int L>
__device__ __forceinline__ void lse_fold(float& m, float& s, bool& bad, const float (&v)[K][L]) {
  float block_max = -INFINITY;
#pragma unroll
  for (int k = 0; k < K; ++k) {
#pragma unroll
    for (int e = 0; e < L; ++e) {
      bad |= !(v[k][e] < INFINITY);
      block_max = fmaxf(block_max, v[k][e]);
    }
  }
  const float new_max = fmaxf(m, block_max);
  if (new_max == -INFINITY) return;
  float acc = m == new_max ? s : s * expf(m - new_max);  // m = -inf gives 0 * 0
#pragma unroll
  for (int k = 0; k < K; ++k) {
#pragma unroll
    for (int e = 0; e < L; ++e) acc += expf(v[k][e] - new_max);
  }
  s = acc;
  m = new_max;
}

// Elements before the first 16-byte boundary of p (at most n).
template <typename S>
__device__ __forceinline__ int head_elements(const S* p, int n) {
  const int mis = static_cast<int>(reinterpret_cast<uintptr_t>(p) % 16 / sizeof(S));
  const int head = (detail::kVec16<S> - mis) % detail::kVec16<S>;
  return head < n ? head : n;
}

// kSmooth: label smoothing s = label_smoothing > 0, which also needs each row's sum of logits.
template <typename S, bool kSmooth>
__global__ void __launch_bounds__(kForwardMaxUnit)
    forward_rows(const S* logits, int64_t row_stride, const int64_t* targets, int64_t N, int V,
                 int64_t ignore_index, float label_smoothing, float* lse, float* row_loss,
                 int unit) {
  constexpr int VEC = detail::kVec16<S>;
  __shared__ float red[32];
  const int rows = blockDim.x / unit;
  const int u = threadIdx.x / unit, t = threadIdx.x % unit;
  const int step = unit * kUnroll;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * rows; base < N;
       base += static_cast<int64_t>(gridDim.x) * rows) {
    const int64_t row = base + u;
    const bool active = row < N;  // all units take part in the block's reductions
    const S* xr = logits + (active ? row : 0) * row_stride;
    float m = -INFINITY, s = 0.0f;
    float logit_sum = 0.0f;  // kSmooth only
    bool bad = false;
    if (active) {
      const int head = head_elements(xr, V);
      const int nvec = (V - head) / VEC;
      const int tail = head + nvec * VEC;
      if (t < head) {
        const float one[1][1] = {{to_float(xr[t])}};
        lse_fold(m, s, bad, one);
        if constexpr (kSmooth) logit_sum += one[0][0];
      }
      if (t < V - tail) {
        const float one[1][1] = {{to_float(xr[tail + t])}};
        lse_fold(m, s, bad, one);
        if constexpr (kSmooth) logit_sum += one[0][0];
      }
      const S* body = xr + head;
      for (int v0 = t; v0 < nvec; v0 += step) {
        float vals[kUnroll][VEC];
#pragma unroll
        for (int k = 0; k < kUnroll; ++k) {
          const int vi = v0 + k * unit;
          if (vi < nvec) {
            load_pack<VEC>(body + static_cast<int64_t>(vi) * VEC, vals[k]);
            if constexpr (kSmooth) {
#pragma unroll
              for (int e = 0; e < VEC; ++e) logit_sum += vals[k][e];
            }
          } else {
#pragma unroll
            for (int e = 0; e < VEC; ++e) vals[k][e] = -INFINITY;
          }
        }
        lse_fold(m, s, bad, vals);
      }
    }
    const float row_max = group_allreduce(bad ? INFINITY : m, MaxOp{}, unit, red);
    const bool finite_max = row_max > -INFINITY && row_max < INFINITY;
    const float scaled = finite_max && m > -INFINITY ? s * expf(m - row_max) : 0.0f;
    float row_sum;
    if constexpr (kSmooth) {
      __shared__ float2 red2[32];
      const float2 sums = group_allreduce(make_float2(scaled, logit_sum), SumOp{}, unit, red2);
      row_sum = sums.x;
      logit_sum = sums.y;
    } else {
      row_sum = group_allreduce(scaled, SumOp{}, unit, red);
    }
    if (active && t == 0) {
      // row_sum >= 1 (the maximum's own term is exp(0)) when the max is finite.
      const float l = row_max == INFINITY ? __int_as_float(0x7fc00000)
                      : row_max == -INFINITY ? -INFINITY
                                             : row_max + logf(row_sum);
      lse[row] = l;
      const int64_t target = targets[row];
      // The binding validates targets; one out of [0, V) anyway gives NaN, never a stray read.
      float term = __int_as_float(0x7fc00000);
      if (target == ignore_index) {
        term = 0.0f;
      } else if (target >= 0 && target < V) {
        term = l - to_float(xr[target]);
        if constexpr (kSmooth) {
          term = (1.0f - label_smoothing) * term +
                 label_smoothing * (l - logit_sum / static_cast<float>(V));
        }
      }
      row_loss[row] = term;
    }
  }
}

// *loss = mean of row_loss over the rows whose target is not ignore_index (NaN when none).
__global__ void __launch_bounds__(kCountThreads)
    finish_loss(const float* row_loss, const int64_t* targets, int64_t N, int64_t ignore_index,
                float* loss) {
  __shared__ double red_sum[32];
  __shared__ long long red_count[32];
  double sum = 0.0;
  long long count = 0;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
    if (targets[i] != ignore_index) {
      sum += static_cast<double>(row_loss[i]);
      ++count;
    }
  }
  sum = group_allreduce(sum, SumOp{}, blockDim.x, red_sum);
  count = group_allreduce(count, SumOp{}, blockDim.x, red_count);
  if (threadIdx.x == 0) {
    *loss = count > 0 ? static_cast<float>(sum / static_cast<double>(count))
                      : __int_as_float(0x7fc00000);
  }
}

// *scale = *grad_loss / (number of non-ignored targets), 0 when there are none.
__global__ void __launch_bounds__(kCountThreads)
    backward_scale(const int64_t* targets, int64_t N, int64_t ignore_index,
                   const float* grad_loss, float* scale) {
  __shared__ long long red_count[32];
  long long count = 0;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) count += targets[i] != ignore_index;
  count = group_allreduce(count, SumOp{}, blockDim.x, red_count);
  if (threadIdx.x == 0) {
    *scale = count > 0 ? static_cast<float>(static_cast<double>(*grad_loss) /
                                            static_cast<double>(count))
                       : 0.0f;
  }
}

// Work item = (row, segment of kSegment elements): see the file comment. nseg = ceil(V /
// kSegment) segments per row. kSmooth: label smoothing s > 0, uniform = s / V and
// target_offset = (1 - s) + s / V (without, the constants 0 and 1 are compiled in).
template <typename S, bool kSmooth>
__global__ void __launch_bounds__(kBackwardThreads)
    backward_rows(const S* logits, int64_t row_stride, const int64_t* targets, const float* lse,
                  const float* scale_ptr, int64_t N, int V, int64_t ignore_index, float uniform,
                  float target_offset, S* grad, int64_t nseg) {
  constexpr int VEC = detail::kVec16<S>;
  constexpr int kSegmentVecs = kBackwardThreads * kUnroll;
  constexpr int kSegment = kSegmentVecs * VEC;
  const float scale = *scale_ptr;
  const int t = threadIdx.x;
  const int64_t items = N * nseg;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t row = item / nseg;
    const int seg = static_cast<int>(item - row * nseg);
    const S* in = logits + row * row_stride;
    S* out = grad + row * static_cast<int64_t>(V);
    const int64_t target64 = targets[row];
    const bool ignored = target64 == ignore_index;
    const float l = ignored ? 0.0f : lse[row];
    const bool finite = isfinite(l);
    const bool read = !ignored && finite;  // otherwise the row is constant: 0 or NaN
    const float fill = ignored ? 0.0f : __int_as_float(0x7fc00000);
    const int target = ignored ? -1 : static_cast<int>(target64);
    // The gradient of element j from its logit x (a read row) or the row's constant.
    auto value = [&](float x, int j) {
      if (!read) return fill;
      const float p = expf(x - l);
      if constexpr (kSmooth) return (j == target ? p - target_offset : p - uniform) * scale;
      return (j == target ? p - 1.0f : p) * scale;
    };
    const uintptr_t in_mis = reinterpret_cast<uintptr_t>(in) % 16;
    const uintptr_t out_mis = reinterpret_cast<uintptr_t>(out) % 16;
    if (in_mis == out_mis) {
      const int head = head_elements(out, V);
      const int nvec = (V - head) / VEC;
      const int tail = head + nvec * VEC;
      if (seg == 0 && t < head) {
        out[t] = detail::from_float<S>(value(read ? to_float(in[t]) : 0.0f, t));
      }
      if (seg == nseg - 1 && t < V - tail) {
        const int j = tail + t;
        out[j] = detail::from_float<S>(value(read ? to_float(in[j]) : 0.0f, j));
      }
      const S* body_in = in + head;
      S* body_out = out + head;
      const int v0 = seg * kSegmentVecs + t;
      float vals[kUnroll][VEC];
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const int vi = v0 + k * kBackwardThreads;
        if (read && vi < nvec) {
          load_pack<VEC>(body_in + static_cast<int64_t>(vi) * VEC, vals[k]);
        } else {
#pragma unroll
          for (int e = 0; e < VEC; ++e) vals[k][e] = 0.0f;
        }
      }
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const int vi = v0 + k * kBackwardThreads;
        if (vi >= nvec) continue;
        const int j0 = head + vi * VEC;
        float g[VEC];
#pragma unroll
        for (int e = 0; e < VEC; ++e) g[e] = value(vals[k][e], j0 + e);
        store_pack<VEC>(body_out + static_cast<int64_t>(vi) * VEC, g);
      }
    } else {
      // Rows with different alignments: scalar accesses, still coalesced.
      const int j0 = seg * kSegment + t;
      constexpr int kItems = kUnroll * VEC;
      float vals[kItems];
#pragma unroll
      for (int k = 0; k < kItems; ++k) {
        const int j = j0 + k * kBackwardThreads;
        vals[k] = read && j < V ? to_float(in[j]) : 0.0f;
      }
#pragma unroll
      for (int k = 0; k < kItems; ++k) {
        const int j = j0 + k * kBackwardThreads;
        if (j < V) out[j] = detail::from_float<S>(value(vals[k], j));
      }
    }
  }
}

template <typename S>
cudaError_t forward_typed(const S* logits, int64_t row_stride, const int64_t* targets, int64_t N,
                          int V, int64_t ignore_index, double label_smoothing, float* lse,
                          float* loss, float* row_loss, cudaStream_t stream) {
  if (N > 0) {
    const Plan p = forward_plan(V);
    int64_t grid = ceil_div(N, p.rows);
    grid = grid < kMaxGrid ? grid : kMaxGrid;
    const auto kernel = label_smoothing != 0.0 ? forward_rows<S, true> : forward_rows<S, false>;
    const cudaError_t err = detail::launch(
        kernel, static_cast<unsigned>(grid), p.block, 0, stream, logits, row_stride, targets, N,
        V, ignore_index, static_cast<float>(label_smoothing), lse, row_loss, p.unit);
    if (err != cudaSuccess) return err;
  }
  return detail::launch(finish_loss, 1, kCountThreads, 0, stream, row_loss, targets, N,
                        ignore_index, loss);
}

template <typename S>
cudaError_t backward_typed(const S* logits, int64_t row_stride, const int64_t* targets,
                           const float* lse, const float* grad_loss, int64_t N, int V,
                           int64_t ignore_index, double label_smoothing, S* grad, float* scale,
                           cudaStream_t stream) {
  const cudaError_t err = detail::launch(backward_scale, 1, kCountThreads, 0, stream, targets, N,
                                         ignore_index, grad_loss, scale);
  if (err != cudaSuccess) return err;
  constexpr int kSegment = kBackwardThreads * kUnroll * detail::kVec16<S>;
  const int64_t nseg = ceil_div(V, kSegment);
  int64_t grid = N * nseg;
  grid = grid < kMaxGrid ? grid : kMaxGrid;
  // Taken from every probability, and in total from the target's (V > 0 here).
  const double uniform = label_smoothing / static_cast<double>(V);
  const double target_offset = (1.0 - label_smoothing) + uniform;
  const auto kernel = label_smoothing != 0.0 ? backward_rows<S, true> : backward_rows<S, false>;
  return detail::launch(kernel, static_cast<unsigned>(grid), kBackwardThreads, 0, stream, logits,
                        row_stride, targets, lse, scale, N, V, ignore_index,
                        static_cast<float>(uniform), static_cast<float>(target_offset), grad,
                        nseg);
}

}  // namespace

size_t cross_entropy_workspace_bytes(int64_t N) {
  // One float per row (the forward's loss terms); at least 16 bytes (the backward's scale).
  const int64_t n = N > 4 ? N : 4;
  return static_cast<size_t>(n) * sizeof(float);
}

cudaError_t cross_entropy_forward(DType dtype, const void* logits, int64_t row_stride,
                                  const int64_t* targets, int64_t N, int64_t V,
                                  int64_t ignore_index, double label_smoothing, float* lse,
                                  float* loss, void* workspace, cudaStream_t stream) {
  if (N < 0 || V < 0 || V > INT_MAX / 2) return cudaErrorInvalidValue;
  if (!(label_smoothing >= 0.0 && label_smoothing <= 1.0)) return cudaErrorInvalidValue;
  if (N > 0 && workspace == nullptr) return cudaErrorInvalidValue;
  float* row_loss = static_cast<float*>(workspace);
  const int v = static_cast<int>(V);
  return detail::with_storage(dtype, [&](auto* type) {
    using S = std::remove_pointer_t<decltype(type)>;
    return forward_typed(static_cast<const S*>(logits), row_stride, targets, N, v, ignore_index,
                         label_smoothing, lse, loss, row_loss, stream);
  });
}

cudaError_t cross_entropy_backward(DType dtype, const void* logits, int64_t row_stride,
                                   const int64_t* targets, const float* lse,
                                   const float* grad_loss, int64_t N, int64_t V,
                                   int64_t ignore_index, double label_smoothing,
                                   void* grad_logits, void* workspace, cudaStream_t stream) {
  if (N < 0 || V < 0 || V > INT_MAX / 2) return cudaErrorInvalidValue;
  if (!(label_smoothing >= 0.0 && label_smoothing <= 1.0)) return cudaErrorInvalidValue;
  if (!known_dtype(dtype)) return cudaErrorInvalidValue;
  if (N == 0 || V == 0) return cudaSuccess;  // no gradient element to write
  if (workspace == nullptr) return cudaErrorInvalidValue;
  float* scale = static_cast<float*>(workspace);
  const int v = static_cast<int>(V);
  return detail::with_storage(dtype, [&](auto* type) {
    using S = std::remove_pointer_t<decltype(type)>;
    return backward_typed(static_cast<const S*>(logits), row_stride, targets, lse, grad_loss, N,
                          v, ignore_index, label_smoothing, static_cast<S*>(grad_logits), scale,
                          stream);
  });
}

}  // namespace pygpt::cuda
