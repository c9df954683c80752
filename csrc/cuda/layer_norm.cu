// Layer norm over the last dimension on CUDA (declared in layer_norm.h), float32, bfloat16
// and float16 storage, float32 arithmetic. The math mirrors cpu/layer_norm.cpp. The same kernels run the
// residual add fused into the norm (add_layer_norm_*): with a residual, the forward reads x and
// residual, writes their sum (rounded to the storage type) and normalises that sum; with
// grad_sum, the backward adds it to dx. Without them they are the plain layer norm.
//
// Rows are handled by "units" of U threads (U a power of two, 32..1024): U = 32 is a warp per row
// (8 rows per 256-thread block), larger U a group of warps or the whole block per row. The unit
// size is chosen from C so that each thread keeps at most kPerThread elements of its row in
// registers: the row is read from memory once and its statistics are exact two-pass sums over
// the registers (a first mean, then the centred sums of d and d^2, as the CPU does), so there is
// no one-pass sum-of-squares cancellation. Rows longer than the register capacity (C > 16384
// forward, C > 8192 backward) take a block-per-row fallback that re-reads the row (from L2).
//
// Backward: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = grad_y * weight, per row with
// group reductions; the weight/bias gradients in two deterministic stages (no atomics):
//   stage 1: every block keeps per-column sums of grad_y * xhat and grad_y over its rows in
//            registers (the same threads own the same columns for every row), folds its units
//            together in shared memory in a fixed order and writes one partial row per block to
//            workspace = float[2][G][C] (dweight partials, then dbias partials), G = the grid;
//   stage 2: a (32 x 16)-thread block per 32 columns sums the G partials in a fixed order and
//            writes dweight / dbias in dtype.
// G depends on N and C only (never on the device or on pointer alignment), so
// layer_norm_backward_workspace_bytes(N, C) is exact and results are bitwise reproducible.
#include "cuda/layer_norm.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "cuda/kernel_utils.cuh"

namespace pygpt::cuda {
namespace {

using detail::ceil_div;
using detail::group_allreduce;
using detail::is_aligned;
using detail::load_pack;
using detail::rounded_product;
using detail::store_pack;
using detail::SumOp;

constexpr int kPerThread = 16;               // row elements a thread keeps in registers
constexpr int kMinBlock = 256;               // small units are packed into blocks of this size
constexpr int kForwardMaxUnit = 1024;        // register path: C <= 16384 forward
constexpr int kBackwardMaxUnit = 512;        // and C <= 8192 backward (4x16 live values)
constexpr int kFallbackThreads = 512;        // block per row beyond those
constexpr int64_t kBackwardThreadsInFlight = 262144;  // caps the backward grid (G) ...
constexpr int64_t kWorkspaceFloats = int64_t{1} << 23;  // ... and so does 32 MiB of partials,
constexpr int64_t kMinBackwardBlocks = 128;             // down to this many blocks (huge C)
constexpr int64_t kMaxGrid = 1 << 20;        // row loops are grid-strided beyond this
constexpr int kReduceCols = 32, kReduceRows = 16;  // stage-2 block shape

// How rows map onto threads for a given C.
struct Plan {
  bool registers;  // false: the block-per-row fallback
  int unit;        // threads per row
  int block;       // threads per block
  int rows;        // rows per block per step (block / unit)
};

Plan make_plan(int64_t C, int max_unit) {
  const int64_t need = ceil_div(C, kPerThread);
  if (need > max_unit) return {false, kFallbackThreads, kFallbackThreads, 1};
  const int unit = detail::pow2_at_least(need, detail::kWarpSize, max_unit);
  const int block = unit > kMinBlock ? unit : kMinBlock;
  return {true, unit, block, block / unit};
}

// Blocks of the backward (G, the number of partial rows); N > 0. Enough threads to fill the GPU,
// but at most 32 MiB of partials (2 * G * C floats) unless C is so large that this would leave
// fewer than kMinBackwardBlocks blocks.
int64_t backward_grid(int64_t N, int64_t C) {
  const Plan p = make_plan(C, kBackwardMaxUnit);
  int64_t cap = kBackwardThreadsInFlight / p.block;
  const int64_t budget = kWorkspaceFloats / (2 * C);
  const int64_t workspace_cap = budget > kMinBackwardBlocks ? budget : kMinBackwardBlocks;
  cap = cap < workspace_cap ? cap : workspace_cap;
  const int64_t blocks = ceil_div(N, p.rows);
  return blocks < cap ? blocks : cap;
}

// v (x's VEC elements at offset) += residual's: the sum, rounded to S as it is stored, replaces v
// and is written to sum_out at the same offset.
template <int VEC, typename S>
__device__ __forceinline__ void add_residual(const S* residual, S* sum_out, int64_t offset,
                                             float (&v)[VEC]) {
  float r[VEC];
  load_pack<VEC>(residual + offset, r);
#pragma unroll
  for (int e = 0; e < VEC; ++e) v[e] = detail::to_float(detail::from_float<S>(v[e] + r[e]));
  store_pack<VEC>(sum_out + offset, v);
}

// out += the VEC elements at p.
template <int VEC, typename S>
__device__ __forceinline__ void add_pack(const S* p, float (&out)[VEC]) {
  float g[VEC];
  load_pack<VEC>(p, g);
#pragma unroll
  for (int e = 0; e < VEC; ++e) out[e] += g[e];
}

// ------------------------------------------------------------------------------------------
// Forward

// Register path: unit threads per row, each owning chunks c = t + k * unit (k < kPerThread / VEC)
// of VEC consecutive elements. VEC > 1 needs C % VEC == 0 and 16-byte aligned pointers.
template <typename S, int VEC>
__global__ void __launch_bounds__(kForwardMaxUnit)
    forward_registers(const S* x, const S* residual, const S* weight, const S* bias, S* sum_out,
                      S* y, float* mean_out, float* rstd_out, int64_t N, int C, int unit,
                      double eps) {
  constexpr int kChunks = kPerThread / VEC;
  __shared__ float red1[32];
  __shared__ float2 red2[32];
  const int rows = blockDim.x / unit;
  const int u = threadIdx.x / unit, t = threadIdx.x % unit;
  const int nchunks = C / VEC;
  // Chunks t, t + unit, ... below nchunks: the first `owned` of the thread's kChunks.
  const int owned = t < nchunks ? (nchunks - t + unit - 1) / unit : 0;

  for (int64_t base = static_cast<int64_t>(blockIdx.x) * rows; base < N;
       base += static_cast<int64_t>(gridDim.x) * rows) {
    const int64_t row = base + u;
    const bool active = row < N;  // all units take part in the block's reductions
    const int64_t offset = (active ? row : 0) * static_cast<int64_t>(C);
    float v[kChunks][VEC];
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      if (active && k < owned) {
        const int64_t at = offset + (t + k * unit) * VEC;
        load_pack<VEC>(x + at, v[k]);
        if (residual != nullptr) add_residual<VEC>(residual, sum_out, at, v[k]);
      } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e) v[k][e] = 0.0f;
      }
#pragma unroll
      for (int e = 0; e < VEC; ++e) sum += v[k][e];
    }
    sum = group_allreduce(sum, SumOp{}, unit, red1);
    const float rough_mean = sum / static_cast<float>(C);
    float2 centred = make_float2(0.0f, 0.0f);
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      if (active && k < owned) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const float d = v[k][e] - rough_mean;
          centred.x += d;
          centred.y += d * d;
        }
      }
    }
    centred = group_allreduce(centred, SumOp{}, unit, red2);
    if (!active) continue;
    const double n = static_cast<double>(C);
    const double shift = static_cast<double>(centred.x) / n;
    const double var = fmax(static_cast<double>(centred.y) / n - shift * shift, 0.0);
    const float m = static_cast<float>(static_cast<double>(rough_mean) + shift);
    const float r = static_cast<float>(1.0 / sqrt(var + eps));
    if (t == 0) {
      mean_out[row] = m;
      rstd_out[row] = r;
    }
    S* yr = y + row * static_cast<int64_t>(C);
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      if (k >= owned) continue;
      const int j = (t + k * unit) * VEC;
      float wv[VEC], bv[VEC], out[VEC];
      if (weight != nullptr) load_pack<VEC>(weight + j, wv);
      if (bias != nullptr) load_pack<VEC>(bias + j, bv);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        float o = (v[k][e] - m) * r;
        if (weight != nullptr) o *= wv[e];
        if (bias != nullptr) o += bv[e];
        out[e] = o;
      }
      store_pack<VEC>(yr + j, out);
    }
  }
}

// Fallback for long rows: a block per row, three sweeps over the row (sum, centred sums, output).
template <typename S, int VEC>
__global__ void __launch_bounds__(kFallbackThreads)
    forward_rows(const S* x, const S* residual, const S* weight, const S* bias, S* sum_out, S* y,
                 float* mean_out, float* rstd_out, int64_t N, int C, double eps) {
  __shared__ float red1[32];
  __shared__ float2 red2[32];
  const int nchunks = C / VEC;
  const int group = blockDim.x;
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const int64_t offset = row * static_cast<int64_t>(C);
    const S* xr = x + offset;
    float sum = 0.0f;
    for (int c = threadIdx.x; c < nchunks; c += blockDim.x) {
      float v[VEC];
      load_pack<VEC>(xr + c * VEC, v);
      if (residual != nullptr) add_residual<VEC>(residual, sum_out, offset + c * VEC, v);
#pragma unroll
      for (int e = 0; e < VEC; ++e) sum += v[e];
    }
    sum = group_allreduce(sum, SumOp{}, group, red1);
    const float rough_mean = sum / static_cast<float>(C);
    // The sweeps below re-read the row: the sum, written above by this same thread, if any.
    if (residual != nullptr) xr = sum_out + offset;
    float2 centred = make_float2(0.0f, 0.0f);
    for (int c = threadIdx.x; c < nchunks; c += blockDim.x) {
      float v[VEC];
      load_pack<VEC>(xr + c * VEC, v);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const float d = v[e] - rough_mean;
        centred.x += d;
        centred.y += d * d;
      }
    }
    centred = group_allreduce(centred, SumOp{}, group, red2);
    const double n = static_cast<double>(C);
    const double shift = static_cast<double>(centred.x) / n;
    const double var = fmax(static_cast<double>(centred.y) / n - shift * shift, 0.0);
    const float m = static_cast<float>(static_cast<double>(rough_mean) + shift);
    const float r = static_cast<float>(1.0 / sqrt(var + eps));
    if (threadIdx.x == 0) {
      mean_out[row] = m;
      rstd_out[row] = r;
    }
    S* yr = y + row * static_cast<int64_t>(C);
    for (int c = threadIdx.x; c < nchunks; c += blockDim.x) {
      float v[VEC], wv[VEC], bv[VEC];
      load_pack<VEC>(xr + c * VEC, v);
      if (weight != nullptr) load_pack<VEC>(weight + c * VEC, wv);
      if (bias != nullptr) load_pack<VEC>(bias + c * VEC, bv);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        float o = (v[e] - m) * r;
        if (weight != nullptr) o *= wv[e];
        if (bias != nullptr) o += bv[e];
        v[e] = o;
      }
      store_pack<VEC>(yr + c * VEC, v);
    }
  }
}

// ------------------------------------------------------------------------------------------
// Backward

// Register path. Block b handles rows b * rows + u, stepping by gridDim.x * rows; with
// part_w / part_b non-null it writes its column sums of grad_y * xhat / grad_y to row b of
// them. Dynamic shared memory: 2 * C floats when the block holds more than one unit, else none.
template <typename S, int VEC>
__global__ void __launch_bounds__(kBackwardMaxUnit)
    backward_registers(const S* grad_y, const S* grad_sum, const S* x, const S* weight,
                       const float* mean, const float* rstd, S* dx, float* part_w, float* part_b,
                       int64_t N, int C, int unit) {
  constexpr int kChunks = kPerThread / VEC;
  __shared__ float2 red2[32];
  float* const fold = detail::dynamic_shared<float>();  // [2][C] when rows > 1
  const int rows = blockDim.x / unit;
  const int u = threadIdx.x / unit, t = threadIdx.x % unit;
  const int nchunks = C / VEC;
  const bool partials = part_w != nullptr || part_b != nullptr;
  // Chunks t, t + unit, ... below nchunks: the first `owned` of the thread's kChunks.
  const int owned = t < nchunks ? (nchunks - t + unit - 1) / unit : 0;
  float acc_w[kChunks][VEC], acc_b[kChunks][VEC];
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
#pragma unroll
    for (int e = 0; e < VEC; ++e) acc_w[k][e] = acc_b[k][e] = 0.0f;
  }

  for (int64_t base = static_cast<int64_t>(blockIdx.x) * rows; base < N;
       base += static_cast<int64_t>(gridDim.x) * rows) {
    const int64_t row = base + u;
    const bool active = row < N;
    const int64_t offset = (active ? row : 0) * static_cast<int64_t>(C);
    const float m = active ? mean[row] : 0.0f, r = active ? rstd[row] : 0.0f;
    float dy[kChunks][VEC], xhat[kChunks][VEC];
    float2 sums = make_float2(0.0f, 0.0f);  // sum g, sum g * xhat
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      if (active && k < owned) {
        const int j = (t + k * unit) * VEC;
        float xv[VEC], wv[VEC];
        load_pack<VEC>(grad_y + offset + j, dy[k]);
        load_pack<VEC>(x + offset + j, xv);
        if (weight != nullptr) load_pack<VEC>(weight + j, wv);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          xhat[k][e] = (xv[e] - m) * r;
          const float g = weight != nullptr ? rounded_product(dy[k][e], wv[e]) : dy[k][e];
          sums.x += g;
          sums.y += g * xhat[k][e];
        }
      } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e) dy[k][e] = xhat[k][e] = 0.0f;
      }
    }
    sums = group_allreduce(sums, SumOp{}, unit, red2);
    if (!active) continue;
    const float mean_g = sums.x / static_cast<float>(C);
    const float mean_g_xhat = sums.y / static_cast<float>(C);
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      if (k >= owned) continue;
      const int j = (t + k * unit) * VEC;
      float wv[VEC], out[VEC];
      if (weight != nullptr) load_pack<VEC>(weight + j, wv);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const float g = weight != nullptr ? rounded_product(dy[k][e], wv[e]) : dy[k][e];
        out[e] = r * (g - mean_g - xhat[k][e] * mean_g_xhat);
        acc_w[k][e] += dy[k][e] * xhat[k][e];
        acc_b[k][e] += dy[k][e];
      }
      if (grad_sum != nullptr) add_pack<VEC>(grad_sum + offset + j, out);
      store_pack<VEC>(dx + offset + j, out);
    }
  }
  if (!partials) return;

  const int64_t out_row = static_cast<int64_t>(blockIdx.x) * C;
  if (rows == 1) {
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      if (k >= owned) continue;
      const int j = (t + k * unit) * VEC;
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        if (part_w != nullptr) part_w[out_row + j + e] = acc_w[k][e];
        if (part_b != nullptr) part_b[out_row + j + e] = acc_b[k][e];
      }
    }
    return;
  }
  // Fold the units' sums in unit order (deterministic), then write the block's partial row.
  for (int step = 0; step < rows; ++step) {
    if (u == step) {
#pragma unroll
      for (int k = 0; k < kChunks; ++k) {
        if (k >= owned) continue;
        const int j = (t + k * unit) * VEC;
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          fold[j + e] = step == 0 ? acc_w[k][e] : fold[j + e] + acc_w[k][e];
          fold[C + j + e] = step == 0 ? acc_b[k][e] : fold[C + j + e] + acc_b[k][e];
        }
      }
    }
    __syncthreads();
  }
  for (int j = threadIdx.x; j < C; j += blockDim.x) {
    if (part_w != nullptr) part_w[out_row + j] = fold[j];
    if (part_b != nullptr) part_b[out_row + j] = fold[C + j];
  }
}

// Fallback for long rows: a block per row, two sweeps (the sums, then dx); the block's column
// sums live in its own workspace row, which only the thread owning a column ever touches.
template <typename S, int VEC>
__global__ void __launch_bounds__(kFallbackThreads)
    backward_rows(const S* grad_y, const S* grad_sum, const S* x, const S* weight,
                  const float* mean, const float* rstd, S* dx, float* part_w, float* part_b,
                  int64_t N, int C) {
  __shared__ float2 red2[32];
  const int nchunks = C / VEC;
  const int group = blockDim.x;
  float* pw = part_w != nullptr ? part_w + static_cast<int64_t>(blockIdx.x) * C : nullptr;
  float* pb = part_b != nullptr ? part_b + static_cast<int64_t>(blockIdx.x) * C : nullptr;
  for (int j = threadIdx.x * VEC; j < C; j += blockDim.x * VEC) {
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      if (pw != nullptr) pw[j + e] = 0.0f;
      if (pb != nullptr) pb[j + e] = 0.0f;
    }
  }
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const int64_t offset = row * static_cast<int64_t>(C);
    const float m = mean[row], r = rstd[row];
    float2 sums = make_float2(0.0f, 0.0f);
    for (int c = threadIdx.x; c < nchunks; c += blockDim.x) {
      float dy[VEC], xv[VEC], wv[VEC];
      load_pack<VEC>(grad_y + offset + c * VEC, dy);
      load_pack<VEC>(x + offset + c * VEC, xv);
      if (weight != nullptr) load_pack<VEC>(weight + c * VEC, wv);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const float xhat = (xv[e] - m) * r;
        const float g = weight != nullptr ? rounded_product(dy[e], wv[e]) : dy[e];
        sums.x += g;
        sums.y += g * xhat;
      }
    }
    sums = group_allreduce(sums, SumOp{}, group, red2);
    const float mean_g = sums.x / static_cast<float>(C);
    const float mean_g_xhat = sums.y / static_cast<float>(C);
    for (int c = threadIdx.x; c < nchunks; c += blockDim.x) {
      const int j = c * VEC;
      float dy[VEC], xv[VEC], wv[VEC], out[VEC];
      load_pack<VEC>(grad_y + offset + j, dy);
      load_pack<VEC>(x + offset + j, xv);
      if (weight != nullptr) load_pack<VEC>(weight + j, wv);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const float xhat = (xv[e] - m) * r;
        const float g = weight != nullptr ? rounded_product(dy[e], wv[e]) : dy[e];
        out[e] = r * (g - mean_g - xhat * mean_g_xhat);
        if (pw != nullptr) pw[j + e] += dy[e] * xhat;
        if (pb != nullptr) pb[j + e] += dy[e];
      }
      if (grad_sum != nullptr) add_pack<VEC>(grad_sum + offset + j, out);
      store_pack<VEC>(dx + offset + j, out);
    }
  }
}

// Stage 2: dweight[j] = sum over the G partial rows, in a fixed order; same for dbias.
template <typename S>
__global__ void __launch_bounds__(kReduceCols* kReduceRows)
    reduce_partials(const float* part_w, const float* part_b, S* dweight, S* dbias, int64_t G,
                    int C) {
  __shared__ float sw[kReduceRows][kReduceCols + 1], sb[kReduceRows][kReduceCols + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kReduceCols + tx;
  float aw = 0.0f, ab = 0.0f;
  if (j < C) {
    for (int64_t p = ty; p < G; p += kReduceRows) {
      if (dweight != nullptr) aw += part_w[p * C + j];
      if (dbias != nullptr) ab += part_b[p * C + j];
    }
  }
  sw[ty][tx] = aw;
  sb[ty][tx] = ab;
  __syncthreads();
  if (ty != 0 || j >= C) return;
  for (int k = 1; k < kReduceRows; ++k) {
    aw += sw[k][tx];
    ab += sb[k][tx];
  }
  if (dweight != nullptr) dweight[j] = detail::from_float<S>(aw);
  if (dbias != nullptr) dbias[j] = detail::from_float<S>(ab);
}

// ------------------------------------------------------------------------------------------
// Launchers

template <typename S>
cudaError_t forward_typed(const S* x, const S* residual, const S* weight, const S* bias,
                          S* sum, S* y, float* mean, float* rstd, int64_t N, int C, double eps,
                          cudaStream_t stream) {
  constexpr int V = detail::kVec16<S>;
  const bool vec = C % V == 0 && is_aligned(x, 16) && is_aligned(y, 16) &&
                   is_aligned(weight, 16) && is_aligned(bias, 16) &&  // null is aligned
                   is_aligned(residual, 16) && is_aligned(sum, 16);
  const Plan p = make_plan(C, kForwardMaxUnit);
  if (p.registers) {
    int64_t grid = ceil_div(N, p.rows);
    grid = grid < kMaxGrid ? grid : kMaxGrid;
    return detail::launch(vec ? forward_registers<S, V> : forward_registers<S, 1>,
                          static_cast<unsigned>(grid), p.block, 0, stream, x, residual, weight,
                          bias, sum, y, mean, rstd, N, C, p.unit, eps);
  }
  const int64_t grid = N < kMaxGrid ? N : kMaxGrid;
  return detail::launch(vec ? forward_rows<S, V> : forward_rows<S, 1>,
                        static_cast<unsigned>(grid), p.block, 0, stream, x, residual, weight,
                        bias, sum, y, mean, rstd, N, C, eps);
}

template <typename S>
cudaError_t backward_typed(const S* grad_y, const S* grad_sum, const S* x, const S* weight,
                           const float* mean, const float* rstd, S* dx, S* dweight, S* dbias,
                           int64_t N, int C, void* workspace, cudaStream_t stream) {
  constexpr int V = detail::kVec16<S>;
  const bool vec = C % V == 0 && is_aligned(grad_y, 16) && is_aligned(x, 16) &&
                   is_aligned(weight, 16) && is_aligned(dx, 16) && is_aligned(grad_sum, 16);
  const Plan p = make_plan(C, kBackwardMaxUnit);
  const int64_t G = backward_grid(N, C);
  const bool partials = dweight != nullptr || dbias != nullptr;
  if (partials && workspace == nullptr) return cudaErrorInvalidValue;
  float* part_w = nullptr;
  float* part_b = nullptr;
  if (partials) {
    float* ws = static_cast<float*>(workspace);
    if (dweight != nullptr) part_w = ws;
    if (dbias != nullptr) part_b = ws + G * static_cast<int64_t>(C);
  }
  const unsigned grid = static_cast<unsigned>(G);
  cudaError_t err;
  if (p.registers) {
    const size_t smem = partials && p.rows > 1 ? 2 * static_cast<size_t>(C) * sizeof(float) : 0;
    err = detail::launch(vec ? backward_registers<S, V> : backward_registers<S, 1>, grid, p.block,
                         smem, stream, grad_y, grad_sum, x, weight, mean, rstd, dx, part_w,
                         part_b, N, C, p.unit);
  } else {
    err = detail::launch(vec ? backward_rows<S, V> : backward_rows<S, 1>, grid, p.block, 0, stream,
                         grad_y, grad_sum, x, weight, mean, rstd, dx, part_w, part_b, N, C);
  }
  if (err != cudaSuccess || !partials) return err;
  const dim3 block(kReduceCols, kReduceRows);
  const unsigned col_blocks = static_cast<unsigned>(ceil_div(C, kReduceCols));
  return detail::launch(reduce_partials<S>, col_blocks, block, 0, stream, part_w, part_b, dweight,
                        dbias, G, C);
}

// The forward for either storage type; residual and sum null for the plain layer norm.
cudaError_t forward_any(DType dtype, const void* x, const void* residual, const void* weight,
                        const void* bias, void* sum, void* y, float* mean, float* rstd, int64_t N,
                        int64_t C, double eps, cudaStream_t stream) {
  if (N < 0 || C < 0 || C > INT_MAX / 2) return cudaErrorInvalidValue;
  if (N == 0 || C == 0) return cudaSuccess;
  const int c = static_cast<int>(C);
  return detail::with_storage(dtype, [&](auto* type) {
    using S = std::remove_pointer_t<decltype(type)>;
    return forward_typed(static_cast<const S*>(x), static_cast<const S*>(residual),
                         static_cast<const S*>(weight), static_cast<const S*>(bias),
                         static_cast<S*>(sum), static_cast<S*>(y), mean, rstd, N, c, eps, stream);
  });
}

// The backward for either storage type; grad_sum null for the plain layer norm.
cudaError_t backward_any(DType dtype, const void* grad_y, const void* grad_sum, const void* x,
                         const void* weight, const float* mean, const float* rstd, void* dx,
                         void* dweight, void* dbias, int64_t N, int64_t C, void* workspace,
                         cudaStream_t stream) {
  if (N < 0 || C < 0 || C > INT_MAX / 2) return cudaErrorInvalidValue;
  if (!known_dtype(dtype)) return cudaErrorInvalidValue;
  if (C == 0) return cudaSuccess;
  if (N == 0) {  // sums over no rows: zero weight and bias gradients, nothing else to do
    const size_t bytes = static_cast<size_t>(C) * dtype_bytes(dtype);
    cudaError_t err = cudaSuccess;
    if (dweight != nullptr) err = cudaMemsetAsync(dweight, 0, bytes, stream);
    if (err == cudaSuccess && dbias != nullptr) err = cudaMemsetAsync(dbias, 0, bytes, stream);
    return err;
  }
  const int c = static_cast<int>(C);
  return detail::with_storage(dtype, [&](auto* type) {
    using S = std::remove_pointer_t<decltype(type)>;
    return backward_typed(static_cast<const S*>(grad_y), static_cast<const S*>(grad_sum),
                          static_cast<const S*>(x), static_cast<const S*>(weight), mean, rstd,
                          static_cast<S*>(dx), static_cast<S*>(dweight), static_cast<S*>(dbias),
                          N, c, workspace, stream);
  });
}

}  // namespace

cudaError_t layer_norm_forward(DType dtype, const void* x, const void* weight, const void* bias,
                               void* y, float* mean, float* rstd, int64_t N, int64_t C,
                               double eps, cudaStream_t stream) {
  return forward_any(dtype, x, nullptr, weight, bias, nullptr, y, mean, rstd, N, C, eps, stream);
}

size_t layer_norm_backward_workspace_bytes(int64_t N, int64_t C) {
  if (N <= 0 || C <= 0) return 0;
  return 2 * static_cast<size_t>(backward_grid(N, C)) * static_cast<size_t>(C) * sizeof(float);
}

cudaError_t layer_norm_backward(DType dtype, const void* grad_y, const void* x,
                                const void* weight, const float* mean, const float* rstd,
                                void* dx, void* dweight, void* dbias, int64_t N, int64_t C,
                                void* workspace, cudaStream_t stream) {
  return backward_any(dtype, grad_y, nullptr, x, weight, mean, rstd, dx, dweight, dbias, N, C,
                      workspace, stream);
}

cudaError_t add_layer_norm_forward(DType dtype, const void* x, const void* residual,
                                   const void* weight, const void* bias, void* sum, void* y,
                                   float* mean, float* rstd, int64_t N, int64_t C, double eps,
                                   cudaStream_t stream) {
  if (residual == nullptr || sum == nullptr) return cudaErrorInvalidValue;
  return forward_any(dtype, x, residual, weight, bias, sum, y, mean, rstd, N, C, eps, stream);
}

cudaError_t add_layer_norm_backward(DType dtype, const void* grad_y, const void* grad_sum,
                                    const void* sum, const void* weight, const float* mean,
                                    const float* rstd, void* dx, void* dweight, void* dbias,
                                    int64_t N, int64_t C, void* workspace, cudaStream_t stream) {
  return backward_any(dtype, grad_y, grad_sum, sum, weight, mean, rstd, dx, dweight, dbias, N, C,
                      workspace, stream);
}

}  // namespace pygpt::cuda
