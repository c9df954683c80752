// Flash attention on CUDA for contiguous (B, H, T, D) tensors in float32, bfloat16 or float16,
// float32 accumulation throughout; the mirror of cpu/attention.cpp (same masking, same -inf rows).
//
// Forward: one block of 256 threads (8 warps) per (batch*head, 64-query tile). The query tile
// (pre-multiplied by scale * log2(e), so the softmax runs on exp2) stays in shared memory; the
// key and value tiles (64 keys, 32 for head dims above 64) stream through shared memory. Each
// warp owns 8 query rows: lanes own keys for S = Q K^T (row max via warp shuffles) and own head
// dims for O += P V; P goes through a per-warp shared buffer. Running max and per-lane partial
// sums give the online softmax; out = acc / sum and lse = max + log(sum) are written at the end.
// Query tiles are launched last-first (under a causal mask the last sees the most keys), and a
// warp skips key tiles none of its rows sees.
//
// Backward (FlashAttention-2 order), three kernels on the stream:
//   1. preprocess: delta = rowsum(dO * O) into the workspace, and zero the float32 dQ accumulator;
//   2. main: one block of 256 threads (8 warps) per (batch*head, 64-key tile) keeps its K and V
//      tile in shared memory and its dK, dV in registers (each warp owns 8 keys, lanes own head
//      dims) while the 32-query tiles that see those keys stream past: S and dP = dO V^T with
//      warps owning query rows, P = exp(S - lse) and dS = P * (dP - delta) to shared memory, then
//      dV += P^T dO and dK += dS^T (scale Q) with warps owning keys, and dQ += dS K atomically
//      added (float32 atomicAdd) into the workspace;
//   3. convert: dq = scale * dQ accumulator, in dtype.
// dQ's atomic accumulation makes its float32 rounding order, hence dq's last bits, vary between
// runs; dk, dv and the forward are deterministic.
//
// Position bias (AttentionBias: a relative table and / or ALiBi slopes, float32): each visible
// score gets bias(h, key - query position) as it is computed, forward (in log2 units) and
// backward. Its gradients: after each (query tile, key tile) step of the backward, one thread per
// diagonal of the dS tile (one distance) sums it and atomically adds the sum to the head's table
// column (and, times -|d|, to its slope) in float32 buffers the caller zeroed; like dq, their
// last bits vary between runs.
//
// Masking: a key j is visible to query i iff j < visible_keys(i) (a prefix; bottom-right causal
// alignment); masked scores are -inf before the max, so exp2 gives exactly 0. A row that sees no
// key keeps max = -inf; the exponent shift then uses 0 instead of -inf, so every exp2 argument is
// -inf (never NaN) and the row ends with sum 0. Whether a row is empty is decided by the mask,
// never by its sum: an empty row gets out = 0, lse = -inf; a row that sees keys gets acc / sum,
// so NaN or +inf scores (NaN sum) and all -inf scores (0 / 0) give NaN, as softmax does. In
// the backward only visible keys get P and dS (others exactly 0, so no masked NaN leaks in).
//
// Padded batches (AttentionShape's q_lengths / kv_lengths, device pointers): every kernel reads
// its batch row's Lq and Lk and masks with them where it masked with Tq and Tk (so each row gets
// its own bottom-right causal alignment), addressing memory with Tq and Tk as before; no padded
// position of q, k, v, out, grad_out or lse is ever read, and padded work is skipped. Forward: a
// block whose query tile lies wholly past Lq writes zeros and lse -inf and exits; the key loop
// ends at the last key a real row sees (at most Lk); rows past Lq in a cut tile end as rows that
// see no key. Backward: a block whose key tile lies wholly past Lk writes zero dk, dv and exits;
// the others stop their query loop at Lq and write zero dk, dv for their tile's keys past Lk; the
// preprocess reads no padded row (its dQ accumulator is still zeroed, so the convert writes
// dq = 0 there). Without lengths Lq = Tq and Lk = Tk: the same work as before.
//
// Head dims: kernels are instantiated for a maximum head dim of 32, 64 or 128 (the smallest that
// holds max(Dk, Dv)); columns past Dk / Dv are zero in shared memory and never stored. Dynamic
// shared memory per block (opted in above 48 KB) for head dims up to 32 / 64 / 128: forward
// 41 / 65 / 72.5 KB, backward 42.3 / 66.3 / 114.3 KB. Where the device grants less (sm_75:
// 64 KB, sm_86 / sm_89: 99 KB), smaller tiles are launched: forward 32 queries per block
// (29 / 49 / 52.5 KB), backward 32 keys per block and 16 queries per inner tile (17.1 / 29.1 /
// 53.1 KB).
#include "cuda/attention.h"

#include <climits>
#include <cstdint>

#include "cuda/kernel_utils.cuh"

namespace pygpt::cuda {
namespace {

using detail::ceil_div;
using detail::from_float;
using detail::kWarpSize;
using detail::MaxOp;
using detail::SumOp;
using detail::to_float;
using detail::warp_allreduce;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kMaxSharedBytesNoOptIn = 48 * 1024;

template <typename I>
__host__ __device__ __forceinline__ I min_of(I a, I b) {
  return a < b ? a : b;
}

template <typename I>
__host__ __device__ __forceinline__ I max_of(I a, I b) {
  return a < b ? b : a;
}

__device__ __forceinline__ float neg_inf() { return -__int_as_float(0x7f800000); }

// How many keys query i sees (a prefix of the keys) in a batch row of Lq real queries and Lk
// real keys (Tq and Tk without lengths); 0 for padding rows i >= Lq.
__device__ __forceinline__ int64_t visible_keys(int64_t i, int64_t Lq, int64_t Lk, bool causal) {
  if (i >= Lq) return 0;
  if (!causal) return Lk;
  return min_of<int64_t>(max_of<int64_t>(i + 1 + Lk - Lq, 0), Lk);
}

// Which keys of one key tile (keys k0 .. k0 + nk - 1) each of `rows` consecutive queries
// (i0, i0 + 1, ...) sees, in 32-bit arithmetic: query i0 + r sees tile keys j < limit(r).
struct TileMask {
  int valid_rows;  // rows r >= valid_rows are padding past Lq: they see nothing
  int base;        // query i0 + r sees tile keys j < base + r (before clamping to [0, nk])
  int nk;

  __device__ __forceinline__ int limit(int r) const {
    return r < valid_rows ? min_of(max_of(base + r, 0), nk) : 0;
  }
};

__device__ __forceinline__ TileMask tile_mask(int64_t i0, int rows, int64_t k0, int nk,
                                              int64_t Lq, int64_t Lk, bool causal) {
  TileMask m;
  m.valid_rows = static_cast<int>(min_of<int64_t>(max_of<int64_t>(Lq - i0, 0), rows));
  // visible_keys(i0 + r) - k0 = i0 + r + 1 + Lk - Lq - k0 under the causal mask (the clamps to
  // [0, Lk] don't change j < limit for 0 <= j < nk); clamping base to [-rows, nk] keeps it exact.
  m.base = causal ? static_cast<int>(min_of<int64_t>(
                        max_of<int64_t>(i0 + 1 + Lk - Lq - k0, -static_cast<int64_t>(rows)), nk))
                  : nk;
  m.nk = nk;
  return m;
}

// N consecutive floats from shared memory (p aligned to 4 * N bytes).
template <int N>
__device__ __forceinline__ void load_vec(const float* p, float (&v)[N]) {
  if constexpr (N == 4) {
    const float4 t = *reinterpret_cast<const float4*>(p);
    v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
  } else if constexpr (N == 2) {
    const float2 t = *reinterpret_cast<const float2*>(p);
    v[0] = t.x, v[1] = t.y;
  } else {
#pragma unroll
    for (int u = 0; u < N; ++u) v[u] = p[u];
  }
}

__device__ __forceinline__ float4 load4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}

__device__ __forceinline__ float dot4(float4 a, float4 b, float acc) {
  acc = fmaf(a.x, b.x, acc);
  acc = fmaf(a.y, b.y, acc);
  acc = fmaf(a.z, b.z, acc);
  return fmaf(a.w, b.w, acc);
}

// dst[r * ld + c] = 0 for r < rows and cols <= c < ld: the padding columns no load writes.
template <int kThreads>
__device__ __forceinline__ void zero_columns(float* dst, int ld, int rows, int cols) {
  const int width = ld - cols;
  for (int idx = threadIdx.x; idx < rows * width; idx += kThreads) {
    const int r = idx / width;
    dst[r * ld + cols + (idx - r * width)] = 0.f;
  }
}

// dst[r * ld + c] = mul * src[r * D + c] for r < rows_valid and 0 for rows_valid <= r < rows,
// c < D. Warps take rows, lanes take consecutive columns (coalesced global reads).
template <int kThreads, typename T>
__device__ __forceinline__ void load_rows(float* dst, int ld, const T* src, int64_t rows_valid,
                                          int rows, int D, float mul) {
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  for (int r = warp; r < rows; r += kThreads / kWarpSize) {
    const bool valid = r < rows_valid;
    for (int c = lane; c < D; c += kWarpSize) {
      dst[r * ld + c] = valid ? to_float(src[static_cast<int64_t>(r) * D + c]) * mul : 0.f;
    }
  }
}

// AttentionShape's per-batch-row lengths (device pointers; nullptr: all Tq / all Tk) as the
// kernels take them: the (batch * head) index bh belongs to batch row bh / H, which has Lq real
// queries and Lk real keys, padding on the right.
struct BatchLengths {
  const int32_t* q;
  const int32_t* kv;
  int64_t H;

  static BatchLengths of(const AttentionShape& s) { return {s.q_lengths, s.kv_lengths, s.H}; }
  __device__ __forceinline__ int64_t q_len(int64_t bh, int64_t Tq) const {
    return q ? q[bh / H] : Tq;
  }
  __device__ __forceinline__ int64_t kv_len(int64_t bh, int64_t Tk) const {
    return kv ? kv[bh / H] : Tk;
  }
};

// dst[0 : n] = 0 in T, the block's threads striding: the outputs of a fully padded tile.
template <int kThreads, typename T>
__device__ __forceinline__ void zero_fill(T* dst, int n) {
#pragma unroll 1
  for (int idx = threadIdx.x; idx < n; idx += kThreads) dst[idx] = from_float<T>(0.f);
}

// ------------------------------------------------------------------------------------------------
// Forward

// BQ: queries per block, 64; 32 where the device grants too little shared memory for 64.
template <int DMAX, int BQ>
struct ForwardConfig {
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kMinBlocks = 2;  // per SM: at most 128 registers
  static constexpr int kBlockQ = BQ;                    // queries per block
  static constexpr int kRows = kBlockQ / kWarps;        // query rows per warp
  static constexpr int kBlockK = DMAX > 64 ? 32 : 64;   // keys per shared-memory tile
  static constexpr int kKeysPerLane = kBlockK / kWarpSize;
  static constexpr int kDimsPerLane = DMAX / kWarpSize;
  static constexpr int kLdK = DMAX + 4;  // padded: lanes read different K rows, float4 each
  static constexpr int kQOffset = 0;
  static constexpr int kKOffset = kQOffset + kBlockQ * DMAX;
  static constexpr int kVOffset = kKOffset + kBlockK * kLdK;
  static constexpr int kPOffset = kVOffset + kBlockK * DMAX;
  static constexpr int kFloats = kPOffset + kBlockQ * kBlockK;
  static constexpr size_t kSharedBytes = kFloats * sizeof(float);
  static_assert(DMAX % kWarpSize == 0 && kBlockK % kWarpSize == 0 && kBlockQ % kWarps == 0);
};

struct ForwardParams {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* lse;
  int64_t Tq, Tk;
  int64_t q_tiles;  // ceil(Tq / kBlockQ)
  BatchLengths lengths;
  int Dk, Dv;
  float q_mul;  // scale * log2(e)
  bool causal;
  AttentionBias<float> bias;  // in natural units (the kernel scales it by log2(e))
};

template <typename T, int DMAX, int BQ>
__global__ void __launch_bounds__(ForwardConfig<DMAX, BQ>::kThreads,
                                  ForwardConfig<DMAX, BQ>::kMinBlocks)
    attention_forward_kernel(const ForwardParams p) {
  using C = ForwardConfig<DMAX, BQ>;
  constexpr int kRows = C::kRows, kBK = C::kBlockK, kKPL = C::kKeysPerLane;
  constexpr int kDPL = C::kDimsPerLane, kLdK = C::kLdK;
  float* const smem = detail::dynamic_shared<float>();
  float* const Qs = smem + C::kQOffset;  // (kBlockQ, DMAX), scaled by scale * log2(e)
  float* const Ks = smem + C::kKOffset;  // (kBK, kLdK)
  float* const Vs = smem + C::kVOffset;  // (kBK, DMAX)
  float* const Ps = smem + C::kPOffset;  // (kBlockQ, kBK): each warp its own kRows rows

  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t bh = blockIdx.x / p.q_tiles;
  // Last query tile first: under a causal mask it has the most keys to visit.
  const int64_t q0 = (p.q_tiles - 1 - blockIdx.x % p.q_tiles) * C::kBlockQ;
  const int64_t Tq = p.Tq, Tk = p.Tk;
  const int64_t Lq = p.lengths.q_len(bh, Tq), Lk = p.lengths.kv_len(bh, Tk);
  const int64_t h = bh % p.lengths.H;
  const bool has_bias = p.bias.any();
  const int Dk = p.Dk, Dv = p.Dv;
  if (q0 >= Lq) {  // block-uniform: a tile of padded queries only writes zeros and -inf
    const int rows = static_cast<int>(min_of<int64_t>(C::kBlockQ, Tq - q0));
    zero_fill<C::kThreads>(static_cast<T*>(p.out) + (bh * Tq + q0) * Dv, rows * Dv);
    if (static_cast<int>(threadIdx.x) < rows) p.lse[bh * Tq + q0 + threadIdx.x] = neg_inf();
    return;
  }
  const T* const q = static_cast<const T*>(p.q) + (bh * Tq + q0) * Dk;
  const T* const k = static_cast<const T*>(p.k) + bh * Tk * Dk;
  const T* const v = static_cast<const T*>(p.v) + bh * Tk * Dv;

  zero_columns<C::kThreads>(Qs, DMAX, C::kBlockQ, Dk);
  zero_columns<C::kThreads>(Ks, kLdK, kBK, Dk);
  zero_columns<C::kThreads>(Vs, DMAX, kBK, Dv);
  load_rows<C::kThreads>(Qs, DMAX, q, Lq - q0, C::kBlockQ, Dk, p.q_mul);

  // Visibility grows with the row, so a tile's (or a warp's) last real row sees the most keys;
  // rows past Lq see none (they end with sum 0: zeros and -inf, as rows that see no key).
  const int64_t key_end =
      visible_keys(min_of<int64_t>(q0 + C::kBlockQ, Lq) - 1, Lq, Lk, p.causal);
  const int row0 = warp * kRows;
  const int64_t warp_first = q0 + row0;
  const int64_t warp_keys =
      warp_first < Lq
          ? visible_keys(min_of<int64_t>(warp_first + kRows, Lq) - 1, Lq, Lk, p.causal)
          : 0;
  const int dk4 = (Dk + 3) & ~3;
  float* const Pw = Ps + row0 * kBK;
  const float* const Qw = Qs + row0 * DMAX;

  float m[kRows], l[kRows], acc[kRows][kDPL];  // l: this lane's share of the row sum
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    m[r] = neg_inf();
    l[r] = 0.f;
#pragma unroll
    for (int u = 0; u < kDPL; ++u) acc[r][u] = 0.f;
  }

  for (int64_t k0 = 0; k0 < key_end; k0 += kBK) {
    __syncthreads();  // every warp is done with the previous K, V tile
    const int nk = static_cast<int>(min_of<int64_t>(kBK, Lk - k0));
    load_rows<C::kThreads>(Ks, kLdK, k + k0 * Dk, nk, kBK, Dk, 1.f);
    load_rows<C::kThreads>(Vs, DMAX, v + k0 * Dv, nk, kBK, Dv, 1.f);
    __syncthreads();
    if (k0 >= warp_keys) continue;  // warp-uniform: none of this warp's rows sees these keys

    // S (log2 units) for the warp's rows and this lane's keys lane + 32 t.
    float s[kRows][kKPL];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int t = 0; t < kKPL; ++t) s[r][t] = 0.f;
    }
#pragma unroll 1
    for (int d = 0; d < dk4; d += 4) {
      float4 kv[kKPL];
#pragma unroll
      for (int t = 0; t < kKPL; ++t) kv[t] = load4(Ks + (lane + kWarpSize * t) * kLdK + d);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float4 qv = load4(Qw + r * DMAX + d);
#pragma unroll
        for (int t = 0; t < kKPL; ++t) s[r][t] = dot4(qv, kv[t], s[r][t]);
      }
    }

    // Online softmax: mask, new running max, rescale, P to this warp's shared rows.
    const TileMask mask = tile_mask(warp_first, kRows, k0, nk, Lq, Lk, p.causal);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int nvis = mask.limit(r);
      const int64_t d0 = k0 - (warp_first + r + Lk - Lq);  // key k0 - this query's position
      float tile_max = neg_inf();
#pragma unroll
      for (int t = 0; t < kKPL; ++t) {
        const int j = lane + kWarpSize * t;
        if (j >= nvis) {
          s[r][t] = neg_inf();
        } else if (has_bias) {
          s[r][t] = fmaf(p.bias.at(h, d0 + j), kLog2e, s[r][t]);
        }
        tile_max = fmaxf(tile_max, s[r][t]);
      }
      const float m_new = fmaxf(m[r], warp_allreduce(tile_max, MaxOp{}));
      const float shift = m_new == neg_inf() ? 0.f : m_new;  // no -inf - -inf
      const float correction = exp2f(m[r] - shift);
      float sum = 0.f;
#pragma unroll
      for (int t = 0; t < kKPL; ++t) {
        const float pj = exp2f(s[r][t] - shift);
        Pw[r * kBK + lane + kWarpSize * t] = pj;
        sum += pj;
      }
      l[r] = l[r] * correction + sum;
      m[r] = m_new;
#pragma unroll
      for (int u = 0; u < kDPL; ++u) acc[r][u] *= correction;
    }
    __syncwarp();

    // acc += P V over the tile's keys (P is 0 and V rows are 0 past the valid ones).
    const int nk4 = (nk + 3) & ~3;
#pragma unroll 1
    for (int j = 0; j < nk4; j += 4) {
      float vv[4][kDPL];
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) load_vec<kDPL>(Vs + (j + jj) * DMAX + lane * kDPL, vv[jj]);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float4 pr = load4(Pw + r * kBK + j);
#pragma unroll
        for (int u = 0; u < kDPL; ++u) {
          float a = acc[r][u];
          a = fmaf(pr.x, vv[0][u], a);
          a = fmaf(pr.y, vv[1][u], a);
          a = fmaf(pr.z, vv[2][u], a);
          acc[r][u] = fmaf(pr.w, vv[3][u], a);
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t i = warp_first + r;
    if (i >= Tq) break;  // warp-uniform
    const float row_sum = warp_allreduce(l[r], SumOp{});
    T* const o = static_cast<T*>(p.out) + (bh * Tq + i) * Dv;
    // Decided by the mask, never by the sum: NaN or infinite scores make the sum NaN (or 0 when
    // every score is -inf), which must give NaN as softmax does, not an empty row's zeros.
    const bool seen = visible_keys(i, Lq, Lk, p.causal) > 0;
    const float inv = seen ? 1.f / row_sum : 0.f;
#pragma unroll
    for (int u = 0; u < kDPL; ++u) {
      const int c = lane * kDPL + u;
      if (c < Dv) o[c] = from_float<T>(seen ? acc[r][u] * inv : 0.f);
    }
    if (lane == 0) p.lse[bh * Tq + i] = seen ? (m[r] + log2f(row_sum)) * kLn2 : neg_inf();
  }
}

// ------------------------------------------------------------------------------------------------
// Backward

constexpr int kElementwiseThreads = 256;
constexpr int64_t kMaxElementwiseBlocks = 1 << 16;  // grid-stride loops cover the rest

// delta[row] = sum_c dO[row, c] * O[row, c]; dq_acc[row, :] = 0. One warp per row. A padded
// query (row % Tq past its batch row's Lq) reads nothing and gets delta 0 (never used).
template <typename T>
__global__ void __launch_bounds__(kElementwiseThreads)
    attention_backward_preprocess_kernel(const T* __restrict__ out, const T* __restrict__ dout,
                                         float* __restrict__ delta, float* __restrict__ dq_acc,
                                         int64_t rows, int Dv, int Dk, int64_t Tq,
                                         BatchLengths lengths) {
  constexpr int kWarps = kElementwiseThreads / kWarpSize;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + warp; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kWarps) {
    const bool padded = lengths.q != nullptr && row % Tq >= lengths.q_len(row / Tq, Tq);
    const int read_dims = padded ? 0 : Dv;
    float sum = 0.f;
    for (int c = lane; c < read_dims; c += kWarpSize) {
      sum = fmaf(to_float(dout[row * Dv + c]), to_float(out[row * Dv + c]), sum);
    }
    sum = warp_allreduce(sum, SumOp{});
    if (lane == 0) delta[row] = sum;
    for (int c = lane; c < Dk; c += kWarpSize) dq_acc[row * Dk + c] = 0.f;
  }
}

// dq = scale * dq_acc in dtype.
template <typename T>
__global__ void __launch_bounds__(kElementwiseThreads)
    attention_backward_convert_kernel(const float* __restrict__ dq_acc, T* __restrict__ dq,
                                      int64_t n, float scale) {
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * kElementwiseThreads + threadIdx.x;
       idx < n; idx += static_cast<int64_t>(gridDim.x) * kElementwiseThreads) {
    dq[idx] = from_float<T>(dq_acc[idx] * scale);
  }
}

// BK keys per block, BQ queries per inner tile: 64 and 32; 32 and 16 where the device grants
// too little shared memory for those (under 115 KB for head dims above 64, under 67 KB else).
template <int DMAX, int BQ, int BK>
struct BackwardConfig {
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * kWarpSize;
  // Blocks per SM: two (at most 128 registers) where shared memory allows two on an A100.
  static constexpr int kMinBlocks = DMAX > 64 ? 1 : 2;
  static constexpr int kBlockK = BK;                      // keys per block
  static constexpr int kBlockQ = BQ;                      // queries per inner tile
  static constexpr int kQueryRows = kBlockQ / kWarps;     // query rows per warp (S, dP, dQ)
  static constexpr int kKeyRows = kBlockK / kWarps;       // keys per warp (dK, dV)
  static constexpr int kKeysPerLane = kBlockK / kWarpSize;
  static constexpr int kDimsPerLane = DMAX / kWarpSize;
  static constexpr int kLdK = DMAX + 4;  // K and V: lanes read different rows, float4 each
  static constexpr int kKOffset = 0;
  static constexpr int kVOffset = kKOffset + kBlockK * kLdK;
  static constexpr int kQOffset = kVOffset + kBlockK * kLdK;
  static constexpr int kDOOffset = kQOffset + kBlockQ * DMAX;
  static constexpr int kPOffset = kDOOffset + kBlockQ * DMAX;
  static constexpr int kDSOffset = kPOffset + kBlockQ * kBlockK;
  static constexpr int kLseOffset = kDSOffset + kBlockQ * kBlockK;
  static constexpr int kDeltaOffset = kLseOffset + kBlockQ;
  static constexpr int kFloats = kDeltaOffset + kBlockQ;
  static constexpr size_t kSharedBytes = kFloats * sizeof(float);
  static_assert(DMAX % kWarpSize == 0 && kBlockK % kWarpSize == 0);
  static_assert(kBlockQ % kWarps == 0 && kKeyRows % 4 == 0 && kBlockQ <= kThreads);
};

struct BackwardParams {
  const void* q;
  const void* k;
  const void* v;
  const void* dout;
  const float* lse;
  const float* delta;
  float* dq_acc;
  void* dk;
  void* dv;
  int64_t Tq, Tk;
  int64_t k_tiles;  // ceil(Tk / kBlockK)
  BatchLengths lengths;
  int Dk, Dv;
  float scale;
  bool causal;
  AttentionBias<float> bias;
  float* dtable;   // (H, 2R + 1) float32, added to atomically; nullptr: not wanted
  float* dslopes;  // (H,) float32, likewise
};

// The bias gradients of one (query tile, key tile) pair, dS (kBQ, kBK) in shared memory (0 where
// masked): every diagonal of dS has one key - query distance, d_base + j - r, so one thread sums
// each diagonal and adds it atomically to the head's table column of that distance (and, times
// -|d|, to the head's slope). Zero sums (masked diagonals) add nothing.
template <int kThreads, int kBQ, int kBK>
__device__ __forceinline__ void add_bias_grads(const float* dSs, int64_t d_base,
                                               const AttentionBias<float>& bias, int64_t h,
                                               float* dtable, float* dslopes) {
  for (int g = threadIdx.x; g < kBQ + kBK - 1; g += kThreads) {
    const int off = g - (kBQ - 1);  // j - r along this diagonal
    float sum = 0.f;
    for (int r = max_of(0, -off); r < kBQ && r + off < kBK; ++r) sum += dSs[r * kBK + r + off];
    if (sum == 0.f) continue;  // NaN is not 0: it propagates
    const int64_t d = d_base + off;
    if (dtable != nullptr) atomicAdd(dtable + h * bias.width() + bias.bucket(d), sum);
    if (dslopes != nullptr) atomicAdd(dslopes + h, -sum * static_cast<float>(d < 0 ? -d : d));
  }
}

template <typename T, int DMAX, int BQ, int BK>
__global__ void __launch_bounds__(BackwardConfig<DMAX, BQ, BK>::kThreads,
                                  BackwardConfig<DMAX, BQ, BK>::kMinBlocks)
    attention_backward_kernel(const BackwardParams p) {
  using C = BackwardConfig<DMAX, BQ, BK>;
  constexpr int kBQ = C::kBlockQ, kBK = C::kBlockK, kQR = C::kQueryRows, kKR = C::kKeyRows;
  constexpr int kKPL = C::kKeysPerLane, kDPL = C::kDimsPerLane, kLdK = C::kLdK;
  float* const smem = detail::dynamic_shared<float>();
  float* const Ks = smem + C::kKOffset;       // (kBK, kLdK)
  float* const Vs = smem + C::kVOffset;       // (kBK, kLdK)
  float* const Qs = smem + C::kQOffset;       // (kBQ, DMAX), scaled by scale
  float* const dOs = smem + C::kDOOffset;     // (kBQ, DMAX)
  float* const Ps = smem + C::kPOffset;       // (kBQ, kBK)
  float* const dSs = smem + C::kDSOffset;     // (kBQ, kBK)
  float* const lse_s = smem + C::kLseOffset;  // (kBQ,), log2 units
  float* const delta_s = smem + C::kDeltaOffset;

  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t bh = blockIdx.x / p.k_tiles;
  const int64_t k0 = (blockIdx.x % p.k_tiles) * kBK;
  const int64_t Tq = p.Tq, Tk = p.Tk;
  const int64_t Lq = p.lengths.q_len(bh, Tq), Lk = p.lengths.kv_len(bh, Tk);
  const int64_t h = bh % p.lengths.H;
  const bool has_bias = p.bias.any();
  const bool bias_grads = p.dtable != nullptr || p.dslopes != nullptr;
  const int Dk = p.Dk, Dv = p.Dv;
  if (k0 >= Lk) {  // block-uniform: a tile of padded keys only writes zero gradients
    const int tile_keys = static_cast<int>(min_of<int64_t>(kBK, Tk - k0));
    zero_fill<C::kThreads>(static_cast<T*>(p.dk) + (bh * Tk + k0) * Dk, tile_keys * Dk);
    zero_fill<C::kThreads>(static_cast<T*>(p.dv) + (bh * Tk + k0) * Dv, tile_keys * Dv);
    return;
  }
  const T* const q = static_cast<const T*>(p.q) + bh * Tq * Dk;
  const T* const dout = static_cast<const T*>(p.dout) + bh * Tq * Dv;
  const float* const lse = p.lse + bh * Tq;
  const float* const delta = p.delta + bh * Tq;
  float* const dq_acc = p.dq_acc + bh * Tq * Dk;
  const int nk = static_cast<int>(min_of<int64_t>(kBK, Lk - k0));  // real keys of the tile

  zero_columns<C::kThreads>(Ks, kLdK, kBK, Dk);
  zero_columns<C::kThreads>(Vs, kLdK, kBK, Dv);
  zero_columns<C::kThreads>(Qs, DMAX, kBQ, Dk);
  zero_columns<C::kThreads>(dOs, DMAX, kBQ, Dv);
  load_rows<C::kThreads>(Ks, kLdK, static_cast<const T*>(p.k) + (bh * Tk + k0) * Dk, nk, kBK, Dk,
                         1.f);
  load_rows<C::kThreads>(Vs, kLdK, static_cast<const T*>(p.v) + (bh * Tk + k0) * Dv, nk, kBK, Dv,
                         1.f);

  const int row0 = warp * kQR;  // this warp's query rows within a tile (S, dP, dQ)
  const int key0 = warp * kKR;  // this warp's keys within the block's tile (dK, dV)
  const int dk4 = (Dk + 3) & ~3, dv4 = (Dv + 3) & ~3;
  const int nk4 = (nk + 3) & ~3;
  float dk_acc[kKR][kDPL], dv_acc[kKR][kDPL];
#pragma unroll
  for (int kk = 0; kk < kKR; ++kk) {
#pragma unroll
    for (int u = 0; u < kDPL; ++u) dk_acc[kk][u] = dv_acc[kk][u] = 0.f;
  }

  // Queries before first_row see none of these keys (visibility is a growing prefix).
  const int64_t first_row = p.causal ? max_of<int64_t>(0, k0 - (Lk - Lq)) : 0;
  for (int64_t q0 = first_row / kBQ * kBQ; q0 < Lq; q0 += kBQ) {
    __syncthreads();  // every warp is done with the previous query tile
    const int64_t nq = min_of<int64_t>(kBQ, Lq - q0);
    load_rows<C::kThreads>(Qs, DMAX, q + q0 * Dk, nq, kBQ, Dk, p.scale);
    load_rows<C::kThreads>(dOs, DMAX, dout + q0 * Dv, nq, kBQ, Dv, 1.f);
    if (threadIdx.x < kBQ) {
      const bool valid = threadIdx.x < nq;
      lse_s[threadIdx.x] = valid ? lse[q0 + threadIdx.x] * kLog2e : neg_inf();
      delta_s[threadIdx.x] = valid ? delta[q0 + threadIdx.x] : 0.f;
    }
    __syncthreads();

    // Query phase: this warp's rows, this lane's keys lane + 32 t.
    const int64_t warp_first = q0 + row0;
    const bool warp_sees =
        warp_first < Lq &&
        visible_keys(min_of<int64_t>(warp_first + kQR, Lq) - 1, Lq, Lk, p.causal) > k0;
    if (warp_sees) {  // warp-uniform
      float s[kQR][kKPL], dp[kQR][kKPL];
#pragma unroll
      for (int r = 0; r < kQR; ++r) {
#pragma unroll
        for (int t = 0; t < kKPL; ++t) s[r][t] = dp[r][t] = 0.f;
      }
#pragma unroll 1
      for (int d = 0; d < dk4; d += 4) {  // S = (scale Q) K^T
        float4 kv[kKPL];
#pragma unroll
        for (int t = 0; t < kKPL; ++t) kv[t] = load4(Ks + (lane + kWarpSize * t) * kLdK + d);
#pragma unroll
        for (int r = 0; r < kQR; ++r) {
          const float4 qv = load4(Qs + (row0 + r) * DMAX + d);
#pragma unroll
          for (int t = 0; t < kKPL; ++t) s[r][t] = dot4(qv, kv[t], s[r][t]);
        }
      }
#pragma unroll 1
      for (int d = 0; d < dv4; d += 4) {  // dP = dO V^T
        float4 vv[kKPL];
#pragma unroll
        for (int t = 0; t < kKPL; ++t) vv[t] = load4(Vs + (lane + kWarpSize * t) * kLdK + d);
#pragma unroll
        for (int r = 0; r < kQR; ++r) {
          const float4 gv = load4(dOs + (row0 + r) * DMAX + d);
#pragma unroll
          for (int t = 0; t < kKPL; ++t) dp[r][t] = dot4(gv, vv[t], dp[r][t]);
        }
      }
      const TileMask mask = tile_mask(warp_first, kQR, k0, nk, Lq, Lk, p.causal);
#pragma unroll
      for (int r = 0; r < kQR; ++r) {  // P = exp(S - lse), dS = P * (dP - delta)
        const int nvis = mask.limit(r);
        const float row_lse = lse_s[row0 + r], row_delta = delta_s[row0 + r];
        const int64_t d0 = k0 - (warp_first + r + Lk - Lq);  // key k0 - this query's position
#pragma unroll
        for (int t = 0; t < kKPL; ++t) {
          // Only visible keys: a masked key's P and dS are exactly 0, whatever NaN its value or
          // the row's delta holds; a visible key's NaN (in S, lse or delta) propagates.
          const int j = lane + kWarpSize * t;
          const bool vis = j < nvis;
          const float sj = vis && has_bias ? s[r][t] + p.bias.at(h, d0 + j) : s[r][t];
          const float pj = vis ? exp2f(fmaf(sj, kLog2e, -row_lse)) : 0.f;
          Ps[(row0 + r) * kBK + j] = pj;
          dSs[(row0 + r) * kBK + j] = vis ? pj * (dp[r][t] - row_delta) : 0.f;
        }
      }
    } else {
#pragma unroll
      for (int r = 0; r < kQR; ++r) {
#pragma unroll
        for (int t = 0; t < kKPL; ++t) {
          Ps[(row0 + r) * kBK + lane + kWarpSize * t] = 0.f;
          dSs[(row0 + r) * kBK + lane + kWarpSize * t] = 0.f;
        }
      }
    }
    __syncthreads();

    // Key phase: dV += P^T dO and dK += dS^T (scale Q) for this warp's keys, lanes' dims.
    for (int i = 0; i < static_cast<int>(nq); ++i) {
      float gv[kDPL], qv[kDPL];
      load_vec<kDPL>(dOs + i * DMAX + lane * kDPL, gv);
      load_vec<kDPL>(Qs + i * DMAX + lane * kDPL, qv);
#pragma unroll
      for (int kk4 = 0; kk4 < kKR; kk4 += 4) {
        const float4 p4 = load4(Ps + i * kBK + key0 + kk4);
        const float4 d4 = load4(dSs + i * kBK + key0 + kk4);
        const float pk[4] = {p4.x, p4.y, p4.z, p4.w};
        const float dsk[4] = {d4.x, d4.y, d4.z, d4.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
#pragma unroll
          for (int u = 0; u < kDPL; ++u) {
            dv_acc[kk4 + e][u] = fmaf(pk[e], gv[u], dv_acc[kk4 + e][u]);
            dk_acc[kk4 + e][u] = fmaf(dsk[e], qv[u], dk_acc[kk4 + e][u]);
          }
        }
      }
    }

    if (bias_grads) {  // block-uniform
      add_bias_grads<C::kThreads, kBQ, kBK>(dSs, k0 - (q0 + Lk - Lq), p.bias, h, p.dtable,
                                            p.dslopes);
    }

    // dQ phase: dq_acc[rows] += dS K for this warp's rows, lanes' dims (scale applied at the end).
    if (warp_sees) {
      float dq[kQR][kDPL];
#pragma unroll
      for (int r = 0; r < kQR; ++r) {
#pragma unroll
        for (int u = 0; u < kDPL; ++u) dq[r][u] = 0.f;
      }
#pragma unroll 1
      for (int j = 0; j < nk4; j += 4) {
        float kv[4][kDPL];
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) load_vec<kDPL>(Ks + (j + jj) * kLdK + lane * kDPL, kv[jj]);
#pragma unroll
        for (int r = 0; r < kQR; ++r) {
          const float4 d4 = load4(dSs + (row0 + r) * kBK + j);
#pragma unroll
          for (int u = 0; u < kDPL; ++u) {
            float a = dq[r][u];
            a = fmaf(d4.x, kv[0][u], a);
            a = fmaf(d4.y, kv[1][u], a);
            a = fmaf(d4.z, kv[2][u], a);
            dq[r][u] = fmaf(d4.w, kv[3][u], a);
          }
        }
      }
      const TileMask mask = tile_mask(warp_first, kQR, k0, nk, Lq, Lk, p.causal);
#pragma unroll
      for (int r = 0; r < kQR; ++r) {
        const int64_t i = warp_first + r;
        if (i >= Lq) break;  // padded rows' dq stays the preprocess's zero
        // A row that sees none of these keys adds nothing (not even 0 * a NaN key).
        if (mask.limit(r) == 0) continue;
#pragma unroll
        for (int u = 0; u < kDPL; ++u) {
          const int c = lane * kDPL + u;
          if (c < Dk) atomicAdd(dq_acc + i * Dk + c, dq[r][u]);
        }
      }
    }
  }

  T* const dk = static_cast<T*>(p.dk) + (bh * Tk + k0) * Dk;
  T* const dv = static_cast<T*>(p.dv) + (bh * Tk + k0) * Dv;
#pragma unroll
  for (int kk = 0; kk < kKR; ++kk) {
    const int j = key0 + kk;
    if (j >= nk) break;
#pragma unroll
    for (int u = 0; u < kDPL; ++u) {
      const int c = lane * kDPL + u;
      if (c < Dk) dk[static_cast<int64_t>(j) * Dk + c] = from_float<T>(dk_acc[kk][u]);
      if (c < Dv) dv[static_cast<int64_t>(j) * Dv + c] = from_float<T>(dv_acc[kk][u]);
    }
  }
  // The tile's padded keys past Lk (none without lengths): zero gradients.
  const int padded_keys = static_cast<int>(min_of<int64_t>(kBK, Tk - k0)) - nk;
  zero_fill<C::kThreads>(dk + static_cast<int64_t>(nk) * Dk, padded_keys * Dk);
  zero_fill<C::kThreads>(dv + static_cast<int64_t>(nk) * Dv, padded_keys * Dv);
}

// ------------------------------------------------------------------------------------------------
// Launchers

bool valid_shape(const AttentionShape& s) {
  return s.B >= 0 && s.H >= 0 && s.Tq >= 0 && s.Tk >= 0 && s.Dk >= 0 && s.Dv >= 0 &&
         s.Dk <= kMaxHeadDim && s.Dv <= kMaxHeadDim;
}

// The smallest instantiated maximum head dim that holds both Dk and Dv.
int head_dim_bucket(const AttentionShape& s) {
  const int64_t d = max_of(s.Dk, s.Dv);
  return d <= 32 ? 32 : d <= 64 ? 64 : 128;
}

// Dynamic shared memory a block may opt in to on the current device: 64 KB on sm_75, 163 KB on
// sm_80, 99 KB on sm_86 / sm_89, 227 KB on sm_90.
size_t shared_memory_limit() {
  int device = 0, bytes = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess) {
    cudaGetLastError();  // not this call's error to report: assume no opt-in
    return kMaxSharedBytesNoOptIn;
  }
  return static_cast<size_t>(bytes);
}

// Opts in to more than 48 KB of dynamic shared memory where the kernel needs it (a per-device
// function attribute, cheap to set on every launch).
template <typename Kernel>
cudaError_t prepare_shared_memory(Kernel kernel, size_t bytes) {
  if (bytes <= kMaxSharedBytesNoOptIn) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(bytes));
}

unsigned elementwise_blocks(int64_t work_items, int64_t per_block) {
  return static_cast<unsigned>(
      min_of<int64_t>(ceil_div(work_items, per_block), kMaxElementwiseBlocks));
}

template <typename T, int DMAX, int BQ>
cudaError_t launch_forward(const AttentionShape& s, const void* q, const void* k,
                           const void* v, void* out, float* lse, const AttentionBias<float>& bias,
                           cudaStream_t stream) {
  using C = ForwardConfig<DMAX, BQ>;
  ForwardParams p;
  p.q = q, p.k = k, p.v = v, p.out = out, p.lse = lse;
  p.Tq = s.Tq, p.Tk = s.Tk;
  p.q_tiles = ceil_div(s.Tq, C::kBlockQ);
  p.lengths = BatchLengths::of(s);
  p.Dk = static_cast<int>(s.Dk), p.Dv = static_cast<int>(s.Dv);
  p.q_mul = static_cast<float>(s.scale * 1.4426950408889634);
  p.causal = s.causal;
  p.bias = bias;
  const int64_t blocks = s.B * s.H * p.q_tiles;
  if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;
  auto kernel = attention_forward_kernel<T, DMAX, BQ>;
  cudaError_t err = prepare_shared_memory(kernel, C::kSharedBytes);
  if (err != cudaSuccess) return err;
  return detail::launch(kernel, static_cast<unsigned>(blocks), C::kThreads, C::kSharedBytes, stream, p);
}

// The larger query tile where the device's shared memory holds it (any device within 48 KB).
template <typename T, int DMAX>
cudaError_t launch_forward_fitting(const AttentionShape& s, const void* q, const void* k,
                                   const void* v, void* out, float* lse,
                                   const AttentionBias<float>& bias, cudaStream_t stream) {
  constexpr size_t kLargeTileBytes = ForwardConfig<DMAX, 64>::kSharedBytes;
  if constexpr (kLargeTileBytes > kMaxSharedBytesNoOptIn) {
    if (kLargeTileBytes > shared_memory_limit()) {
      return launch_forward<T, DMAX, 32>(s, q, k, v, out, lse, bias, stream);
    }
  }
  return launch_forward<T, DMAX, 64>(s, q, k, v, out, lse, bias, stream);
}

template <typename T>
cudaError_t forward_typed(const AttentionShape& s, const void* q, const void* k,
                          const void* v, void* out, float* lse, const AttentionBias<float>& bias,
                          cudaStream_t stream) {
  switch (head_dim_bucket(s)) {
    case 32: return launch_forward_fitting<T, 32>(s, q, k, v, out, lse, bias, stream);
    case 64: return launch_forward_fitting<T, 64>(s, q, k, v, out, lse, bias, stream);
    default: return launch_forward_fitting<T, 128>(s, q, k, v, out, lse, bias, stream);
  }
}

template <typename T, int DMAX, int BQ, int BK>
cudaError_t launch_backward_main(const AttentionShape& s, const BackwardParams& base,
                                 cudaStream_t stream) {
  using C = BackwardConfig<DMAX, BQ, BK>;
  BackwardParams p = base;
  p.k_tiles = ceil_div(s.Tk, C::kBlockK);
  const int64_t blocks = s.B * s.H * p.k_tiles;
  if (blocks == 0) return cudaSuccess;
  if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;
  auto kernel = attention_backward_kernel<T, DMAX, BQ, BK>;
  cudaError_t err = prepare_shared_memory(kernel, C::kSharedBytes);
  if (err != cudaSuccess) return err;
  return detail::launch(kernel, static_cast<unsigned>(blocks), C::kThreads, C::kSharedBytes, stream, p);
}

// The larger tiles where the device's shared memory holds them (any device within 48 KB).
template <typename T, int DMAX>
cudaError_t launch_backward_main_fitting(const AttentionShape& s, const BackwardParams& p,
                                         cudaStream_t stream) {
  constexpr size_t kLargeTileBytes = BackwardConfig<DMAX, 32, 64>::kSharedBytes;
  if constexpr (kLargeTileBytes > kMaxSharedBytesNoOptIn) {
    if (kLargeTileBytes > shared_memory_limit()) {
      return launch_backward_main<T, DMAX, 16, 32>(s, p, stream);
    }
  }
  return launch_backward_main<T, DMAX, 32, 64>(s, p, stream);
}

template <typename T>
cudaError_t backward_typed(const AttentionShape& s, const void* q, const void* k,
                           const void* v, const void* out, const void* grad_out, const float* lse,
                           void* dq, void* dk, void* dv, void* workspace, cudaStream_t stream,
                           const AttentionBias<float>& bias, float* dtable, float* dslopes) {
  const int64_t rows = s.B * s.H * s.Tq;
  float* const dq_acc = static_cast<float*>(workspace);
  float* const delta = dq_acc + rows * s.Dk;

  if (rows > 0) {
    const cudaError_t err = detail::launch(
        attention_backward_preprocess_kernel<T>,
        elementwise_blocks(rows, kElementwiseThreads / kWarpSize), kElementwiseThreads, 0, stream,
        static_cast<const T*>(out), static_cast<const T*>(grad_out), delta, dq_acc, rows,
        static_cast<int>(s.Dv), static_cast<int>(s.Dk), s.Tq, BatchLengths::of(s));
    if (err != cudaSuccess) return err;
  }

  // Runs even when Tq == 0: dk and dv are then zero.
  BackwardParams p;
  p.q = q, p.k = k, p.v = v, p.dout = grad_out, p.lse = lse, p.delta = delta, p.dq_acc = dq_acc;
  p.dk = dk, p.dv = dv;
  p.Tq = s.Tq, p.Tk = s.Tk, p.k_tiles = 0;
  p.lengths = BatchLengths::of(s);
  p.Dk = static_cast<int>(s.Dk), p.Dv = static_cast<int>(s.Dv);
  p.scale = static_cast<float>(s.scale);
  p.causal = s.causal;
  p.bias = bias;
  p.dtable = bias.table != nullptr ? dtable : nullptr;
  p.dslopes = bias.slopes != nullptr ? dslopes : nullptr;
  cudaError_t err;
  switch (head_dim_bucket(s)) {
    case 32: err = launch_backward_main_fitting<T, 32>(s, p, stream); break;
    case 64: err = launch_backward_main_fitting<T, 64>(s, p, stream); break;
    default: err = launch_backward_main_fitting<T, 128>(s, p, stream); break;
  }
  if (err != cudaSuccess) return err;

  const int64_t n = rows * s.Dk;
  if (n == 0) return cudaSuccess;
  return detail::launch(attention_backward_convert_kernel<T>,
                        elementwise_blocks(n, kElementwiseThreads), kElementwiseThreads, 0, stream,
                        dq_acc, static_cast<T*>(dq), n, static_cast<float>(s.scale));
}

}  // namespace

cudaError_t attention_forward(const AttentionShape& s, DType dtype, const void* q,
                              const void* k, const void* v, void* out, float* lse,
                              cudaStream_t stream, const AttentionBias<float>& bias) {
  if (!valid_shape(s)) return cudaErrorInvalidValue;
  if (s.B * s.H * s.Tq == 0) return cudaSuccess;  // no output; Tk == 0 still writes 0 and -inf
  return detail::with_storage(dtype, [&](auto* type) {
    return forward_typed<std::remove_pointer_t<decltype(type)>>(s, q, k, v, out, lse, bias,
                                                                stream);
  });
}

size_t attention_backward_workspace_bytes(const AttentionShape& s) {
  if (!valid_shape(s)) return 0;
  const int64_t rows = s.B * s.H * s.Tq;
  return static_cast<size_t>(rows * (s.Dk + 1)) * sizeof(float);  // dQ accumulator, then delta
}

cudaError_t attention_backward(const AttentionShape& s, DType dtype, const void* q,
                               const void* k, const void* v, const void* out,
                               const void* grad_out, const float* lse, void* dq, void* dk,
                               void* dv, void* workspace, cudaStream_t stream,
                               const AttentionBias<float>& bias, float* dtable, float* dslopes) {
  if (!valid_shape(s)) return cudaErrorInvalidValue;
  if (s.B * s.H == 0 || s.Tq + s.Tk == 0) return cudaSuccess;  // no gradient to write
  return detail::with_storage(dtype, [&](auto* type) {
    return backward_typed<std::remove_pointer_t<decltype(type)>>(
        s, q, k, v, out, grad_out, lse, dq, dk, dv, workspace, stream, bias, dtable, dslopes);
  });
}

}  // namespace pygpt::cuda
