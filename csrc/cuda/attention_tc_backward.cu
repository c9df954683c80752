// Flash attention backward on tensor cores (FlashAttention-2's algorithm) for bf16 and fp16
// inputs at head dim D = 64 or 128, float32 accumulators; the contract of attention_backward
// (cuda/attention.cu): masks, lengths, bias gradients and the workspace are the same.
//
// Three kernels on the stream:
//   1. preprocess: delta = rowsum(dO * O) in float32 into the workspace, and the float32 dQ
//      accumulator (also in the workspace) zeroed;
//   2. main: one block per (batch * head, 64-key tile), of 4 warps at D = 64 and 8 at D = 128.
//      Its K and V tiles stay in shared memory. The warps form four key groups of 16 keys; a
//      group has D / 64 warps, each keeping dK and dV of the group's keys at 64 of the head dims
//      (16 x 64 each) in float32 registers, C-fragment layout (so D = 128 holds as few
//      accumulators a thread as D = 64, and neither spills), while the 32-query tiles that see
//      any of the block's keys stream past (Q and dO through two shared-memory buffers: cp.async
//      fetches tile t + 1 while the warps compute on tile t). Per query tile:
//        1. each warp, for its group's keys and its query halves (16 queries each: both at
//           D = 64, one at D = 128):
//           a. S^T = K Q^T and dP^T = V dO^T (16 keys x 16 queries) by mma.m16n8k16: the A
//              operands are the group's K and V rows (ldmatrix.x4, as the forward loads Q), the
//              B operands Q^T and dO^T by plain ldmatrix of Q's and dO's rows (stored by rows
//              they are Q^T and dO^T stored by columns, as K is in the forward);
//           b. P^T = exp2(S^T scale log2(e) + bias log2(e) - lse log2(e)) and
//              dS^T = P^T * (dP^T - delta), elementwise in registers with the forward's masks
//              (MmaLayout says which (key, query) each element is); masked elements are
//              exactly 0;
//           c. P^T and dS^T, rounded to the input type as they lie (the C fragments of
//              n-blocks 2 kk and 2 kk + 1 are the A fragment over queries 16 kk .. + 15), to
//              shared memory;
//        then, after a barrier,
//        2. dV += P^T dO and dK += dS^T Q by mma over the tile's 32 queries, each warp its
//           group's keys at its 64 dims: P^T and dS^T by ldmatrix.x4 of their rows, dO and Q by
//           ldmatrix.trans (row-major K x N tiles, as V in the forward);
//        3. dQ (32 x D) += dS K over the block's 64 keys: each warp one (16 queries x 32 dims)
//           part, dS's A fragments by ldmatrix.trans of the stored dS^T, K's B fragments by
//           ldmatrix.trans of K's rows; the float32 parts are atomically added (atomicAdd) to
//           the workspace's dQ accumulator.
//      At the end dk = scale * dK and dv = dV are rounded and stored.
//   3. convert: dq = scale * dQ accumulator, rounded to the input type.
// dQ is summed over key tiles owned by different blocks; float32 atomics do that in one pass
// with no second sweep over K, V (FlashAttention-2's choice), at the price of a run-to-run
// varying rounding order: dq's last bits (and the bias gradients', below) vary between runs,
// as in attention.cu; dk and dv are deterministic.
//
// Bias gradients (AttentionBias, float32): every visible dS element adds itself, unrounded, to a
// shared-memory bin of its key - query offset within the (query tile, key tile) pair (shared
// float atomics; the bias itself is read by bin too, computed once a tile); after the tile one thread per nonzero bin adds the bin to the head's table
// column of that distance and, times -|d|, to its slope (global float32 atomics), the outputs of
// attention.cu's add_bias_grads.
//
// Masking and lengths as the forward: query i sees key j iff i < Lq, j < Lk and, causal,
// j <= i + Lk - Lq. A block's query loop runs from the first query that sees any of its keys to
// Lq; Q and dO rows past Lq and K, V rows past Lk are zero-filled by cp.async's src-size 0 and
// never read, and lse and delta are read only for real queries; a key group skips
// (warp-uniformly) the query tiles none of whose queries sees its keys, writing zeros as its
// part of P^T and dS^T. A block
// whose keys all lie past Lk loops over nothing and writes zero dk, dv; padded queries' dq stays
// the preprocess's zero.
//
// Shared memory (16-bit elements unless said): K and V tiles (64 x D), two Q and two dO buffers
// (32 x D), all swizzled as in the forward; P^T and dS^T (64 x 40 each: rows padded by 8
// elements, 80 bytes, so the 8 rows of an ldmatrix phase and the 8 row groups of a fragment
// store fall in 8 different 16-byte bank groups); float32 lse, delta (32 each), the bias
// gradient bins and the bias by bin (95 each): 43.0 KB at D = 64, 75.0 KB at D = 128 (opted in;
// sm_80 grants 163 KB).
//
// Framework-free: raw device pointers and sizes, launched on the caller's stream.
#include <climits>
#include <cstdint>
#include <type_traits>

#include "cuda/attention_tc.h"
#include "cuda/attention_tc_common.cuh"
#include "cuda/kernel_utils.cuh"
#include "cuda/tensor_core.cuh"

namespace pygpt::cuda {
namespace {

using detail::ceil_div;
using detail::kFullMask;
using detail::kWarpSize;
using detail::ldmatrix;
using detail::mma_m16n8k16;
using detail::MmaLayout;
using detail::pack2;
using tc::a_from_c_pair;
using tc::aligned16;
using tc::kLog2e;
using tc::load_tile_async;
using tc::swizzled;
using tc::visible_keys;

template <int D>
struct TcBackwardConfig {
  static constexpr int kPartDims = 64;         // head dims of dK and dV a warp keeps
  static constexpr int kDimParts = D / kPartDims;  // warps sharing 16 keys
  static constexpr int kWarps = 4 * kDimParts;
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kBlockK = 64;           // keys per block, 16 per key group of warps
  static constexpr int kBlockQ = 32;           // queries per streamed tile
  static constexpr int kDsLd = kBlockQ + 8;    // P^T and dS^T row stride (elements), see the top
  static constexpr int kBins = kBlockK + kBlockQ - 1;  // key - query offsets within a tile pair
  static constexpr int kKVElems = kBlockK * D;
  static constexpr int kQElems = kBlockQ * D;
  static constexpr int kDsElems = kBlockK * kDsLd;
  // 16-bit: K, V, Q buffers 0 and 1, dO buffers 0 and 1, P^T, dS^T; then float32: lse, delta,
  // the bias gradient bins and the bias by bin.
  static constexpr int kVOffset = kKVElems;
  static constexpr int kQOffset = 2 * kKVElems;
  static constexpr int kDOOffset = kQOffset + 2 * kQElems;
  static constexpr int kPOffset = kDOOffset + 2 * kQElems;
  static constexpr int kDsOffset = kPOffset + kDsElems;
  static constexpr int kHalfElems = kDsOffset + kDsElems;
  static constexpr size_t kSharedBytes =
      kHalfElems * sizeof(uint16_t) + (2 * kBlockQ + 2 * kBins) * sizeof(float);
  static constexpr int kPreprocessThreads = 128;  // one warp per row
  static_assert(D == 64 || D == 128, "head dims 64 and 128");
  static_assert(kHalfElems * sizeof(uint16_t) % 16 == 0, "the float32 part stays aligned");
  static_assert(kBlockK == 16 * (kWarps / kDimParts), "16 keys per key group");
  static_assert((kBlockQ / 16) * (D / 32) == kWarps, "dQ parts: (16 queries, 32 dims) per warp");
};

template <typename T>
__device__ __forceinline__ float half_bits_to_float(uint16_t bits) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(__ushort_as_bfloat16(bits));
  } else {
    return __half2float(__ushort_as_half(bits));
  }
}

// delta[row] = sum_c dO[row, c] * O[row, c] in float32; dq_acc[row, :] = 0. One warp per row,
// each lane D / 32 adjacent elements. A padded query (row % Tq at or past its batch row's Lq)
// reads nothing and gets delta 0 (never used).
template <typename T, int D>
__global__ void __launch_bounds__(TcBackwardConfig<D>::kPreprocessThreads)
    attention_backward_tc_preprocess_kernel(const uint16_t* __restrict__ out,
                                            const uint16_t* __restrict__ dout,
                                            float* __restrict__ delta,
                                            float* __restrict__ dq_acc, int64_t rows, int64_t Tq,
                                            int64_t H, const int32_t* q_lengths) {
  constexpr int kWarps = TcBackwardConfig<D>::kPreprocessThreads / kWarpSize;
  constexpr int kPerLane = D / kWarpSize;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + warp; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kWarps) {
    const bool padded = q_lengths != nullptr && row % Tq >= q_lengths[row / Tq / H];
    float sum = 0.f;
    if (!padded) {
#pragma unroll
      for (int u = 0; u < kPerLane; ++u) {
        const int64_t idx = row * D + lane * kPerLane + u;
        sum = fmaf(half_bits_to_float<T>(dout[idx]), half_bits_to_float<T>(out[idx]), sum);
      }
    }
    sum += __shfl_xor_sync(kFullMask, sum, 1);
    sum += __shfl_xor_sync(kFullMask, sum, 2);
    sum += __shfl_xor_sync(kFullMask, sum, 4);
    sum += __shfl_xor_sync(kFullMask, sum, 8);
    sum += __shfl_xor_sync(kFullMask, sum, 16);
    if (lane == 0) delta[row] = sum;
#pragma unroll
    for (int u = 0; u < kPerLane; ++u) dq_acc[row * D + lane * kPerLane + u] = 0.f;
  }
}

// dq = scale * dq_acc rounded to T, two elements per thread (D is even).
template <typename T>
__global__ void __launch_bounds__(256)
    attention_backward_tc_convert_kernel(const float* __restrict__ dq_acc, uint32_t* __restrict__ dq,
                                         int64_t pairs, float scale) {
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < pairs;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dq[idx] = pack2<T>(dq_acc[2 * idx] * scale, dq_acc[2 * idx + 1] * scale);
  }
}

struct TcBackwardParams {
  const uint16_t* q;
  const uint16_t* k;
  const uint16_t* v;
  const uint16_t* dout;
  const float* lse;
  const float* delta;
  float* dq_acc;
  uint16_t* dk;
  uint16_t* dv;
  int64_t Tq, Tk, H;
  int64_t k_tiles;            // ceil(Tk / kBlockK)
  const int32_t* q_lengths;   // nullptr: all Tq
  const int32_t* kv_lengths;  // nullptr: all Tk
  float scale;
  float scale_log2;           // scale * log2(e)
  bool causal;
  AttentionBias<float> bias;  // natural units
  float* dtable;              // (H, 2R + 1), added to atomically; nullptr: not wanted
  float* dslopes;             // (H,), likewise
};

template <typename T, int D>
__global__ void __launch_bounds__(TcBackwardConfig<D>::kThreads)
    attention_backward_tc_kernel(const TcBackwardParams p) {
  using C = TcBackwardConfig<D>;
  constexpr int kBQ = C::kBlockQ, kLd = C::kDsLd;
  constexpr int kDSteps = D / 16;           // k-steps of S^T = K Q^T and dP^T = V dO^T
  constexpr int kQSteps = kBQ / 16;         // query halves of a tile; k-steps of dV, dK
  constexpr int kPartPairs = C::kPartDims / 16;  // n-block pairs of a warp's dK and dV part
  constexpr int kKSteps = C::kBlockK / 16;  // k-steps of dQ += dS K (16 keys)

  uint16_t* const smem = detail::dynamic_shared<uint16_t>();
  uint16_t* const Ks = smem;
  uint16_t* const Vs = smem + C::kVOffset;
  uint16_t* const Qs = smem + C::kQOffset;    // buffer b at Qs + b * kQElems
  uint16_t* const dOs = smem + C::kDOOffset;  // likewise
  uint16_t* const Ps = smem + C::kPOffset;    // (kBlockK, kLd): P^T, keys by rows
  uint16_t* const dSs = smem + C::kDsOffset;  // likewise dS^T
  float* const lse_s = reinterpret_cast<float*>(smem + C::kHalfElems);  // lse * log2(e)
  float* const delta_s = lse_s + kBQ;
  float* const bins = delta_s + kBQ;
  float* const bias_s = bins + C::kBins;  // bias * log2(e) by bin, as `bins`

  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int g = MmaLayout::group(lane), t = MmaLayout::thread_in_group(lane);
  const int key_group = warp % (C::kWarps / C::kDimParts);  // its 16 keys of the block's 64
  // Its query halves and dK, dV dims (a constant 0 at D = 64, so that loops over it unroll).
  const int part = C::kDimParts == 1 ? 0 : warp / (C::kWarps / C::kDimParts);
  const int64_t bh = blockIdx.x / p.k_tiles;
  const int64_t k0 = (blockIdx.x % p.k_tiles) * C::kBlockK;
  const int64_t Tq = p.Tq, Tk = p.Tk;
  const int64_t Lq = p.q_lengths ? p.q_lengths[bh / p.H] : Tq;
  const int64_t Lk = p.kv_lengths ? p.kv_lengths[bh / p.H] : Tk;
  const int64_t h = bh % p.H;
  const int64_t shift = Lk - Lq;  // query i's position among the keys is i + shift
  const bool has_bias = p.bias.any();
  const bool bias_grads = p.dtable != nullptr || p.dslopes != nullptr;
  const uint16_t* const q = p.q + bh * Tq * D;
  const uint16_t* const dout = p.dout + bh * Tq * D;

  // Queries [q_begin, Lq) see some key of this block (causal: key k0 from query k0 - shift on).
  int64_t q_begin = k0 >= Lk ? Lq : p.causal ? k0 - shift : 0;
  q_begin = q_begin < 0 ? 0 : q_begin > Lq ? Lq : q_begin;
  const int64_t q_first = q_begin / kBQ * kBQ;
  const int64_t tiles = (Lq - q_first + kBQ - 1) / kBQ;

  load_tile_async<D, C::kThreads>(Ks, p.k + (bh * Tk + k0) * D, Lk - k0, C::kBlockK);
  load_tile_async<D, C::kThreads>(Vs, p.v + (bh * Tk + k0) * D, Lk - k0, C::kBlockK);
  detail::cp_async_commit();
  if (tiles > 0) {
    load_tile_async<D, C::kThreads>(Qs, q + q_first * D, Lq - q_first, kBQ);
    load_tile_async<D, C::kThreads>(dOs, dout + q_first * D, Lq - q_first, kBQ);
    detail::cp_async_commit();
  }

  // This lane's two keys (C-fragment rows g and g + 8 of the key group's 16).
  const int64_t group_k0 = k0 + 16 * key_group;
  const int64_t keys[2] = {group_k0 + g, group_k0 + g + 8};
  // The row and chunk of this lane's address in an ldmatrix.x4 of a 16 x 16 tile at rows r0..,
  // chunks c0, c0 + 1 (matrix m: rows 8 (m & 1) .. + 7, chunk m / 2), for non-transposed A
  // fragments and for transposed B fragment pairs alike.
  const int x4_row = (lane & 7) + ((lane >> 3) & 1) * 8, x4_chunk = lane >> 4;

  float dk[2 * kPartPairs][4], dv[2 * kPartPairs][4];  // C fragments: keys by rows, dims across
#pragma unroll
  for (int nb = 0; nb < 2 * kPartPairs; ++nb) {
#pragma unroll
    for (int i = 0; i < 4; ++i) dk[nb][i] = dv[nb][i] = 0.f;
  }

#pragma unroll 1
  for (int64_t tile = 0; tile < tiles; ++tile) {
    const int64_t qt0 = q_first + tile * kBQ;
    const int buf = static_cast<int>(tile & 1);
    if (tile + 1 < tiles) {  // prefetch the next tile into the other buffer, then wait for this
      const int64_t q1 = qt0 + kBQ;
      load_tile_async<D, C::kThreads>(Qs + (buf ^ 1) * C::kQElems, q + q1 * D, Lq - q1, kBQ);
      load_tile_async<D, C::kThreads>(dOs + (buf ^ 1) * C::kQElems, dout + q1 * D, Lq - q1, kBQ);
      detail::cp_async_commit();
      detail::cp_async_wait<1>();
    } else {
      detail::cp_async_wait<0>();
    }
    if (threadIdx.x < kBQ) {  // real queries only: padded lse and delta are never read
      const int64_t i = qt0 + threadIdx.x;
      lse_s[threadIdx.x] = i < Lq ? p.lse[bh * Tq + i] * kLog2e : 0.f;
      delta_s[threadIdx.x] = i < Lq ? p.delta[bh * Tq + i] : 0.f;
    }
    if (bias_grads) {  // block-uniform
      for (int c = threadIdx.x; c < C::kBins; c += C::kThreads) bins[c] = 0.f;
    }
    // Bin c holds the key - query offset (j - k0) - (i - qt0) = c - (kBQ - 1): the distance
    // j - (i + shift) of the bias.
    const auto bin_distance = [&](int c) { return k0 - qt0 - shift + c - (kBQ - 1); };
    if (has_bias) {  // likewise
      for (int c = threadIdx.x; c < C::kBins; c += C::kThreads) {
        bias_s[c] = p.bias.at(h, bin_distance(c)) * kLog2e;
      }
    }
    __syncthreads();  // the tiles (and at tile 0 K, V), lse, delta, the bins and bias are there

    const uint16_t* const Qb = Qs + buf * C::kQElems;
    const uint16_t* const dOb = dOs + buf * C::kQElems;
    // Warp-uniform: the tile's last real query sees the most keys; does it see the group's?
    const int64_t last = (qt0 + kBQ < Lq ? qt0 + kBQ : Lq) - 1;
    const bool group_seen = visible_keys(last, Lq, Lk, p.causal) > group_k0;

    // 1. P^T and dS^T of the group's 16 keys and this warp's query halves, to shared memory.
#pragma unroll
    for (int kk = part; kk < kQSteps; kk += C::kDimParts) {
      const int at = (16 * key_group + g) * kLd + 16 * kk + 2 * t;
      uint32_t pa[4] = {}, da[4] = {};  // no query of the tile sees these keys: P, dS are 0
      if (group_seen) {
        // a. S^T = K Q^T and dP^T = V dO^T over queries 16 kk .. + 15 (n-blocks 2 kk, + 1).
        // Per pair of k-steps: the A fragments of the group's K and V rows at head dims
        // 32 pair .. + 31, then per n-block one ldmatrix.x4 of Q's (dO's) rows at dims
        // 8 (4 pair + m) .. + 7: registers 0, 1 are the B fragment of k-step 2 pair, 2, 3 that
        // of 2 pair + 1.
        float s[2][4] = {}, dp[2][4] = {};
#pragma unroll
        for (int pair = 0; pair < kDSteps / 2; ++pair) {
          uint32_t ka[2][4], va[2][4];
#pragma unroll
          for (int u = 0; u < 2; ++u) {
            const int off = swizzled<D>(16 * key_group + x4_row, 2 * (2 * pair + u) + x4_chunk);
            ldmatrix<4, false>(ka[u], Ks + off);
            ldmatrix<4, false>(va[u], Vs + off);
          }
#pragma unroll
          for (int n = 0; n < 2; ++n) {
            const int b_off = swizzled<D>(8 * (2 * kk + n) + (lane & 7), 4 * pair + (lane >> 3));
            uint32_t b[4];
            ldmatrix<4, false>(b, Qb + b_off);
            const uint32_t q_lo[2] = {b[0], b[1]}, q_hi[2] = {b[2], b[3]};
            mma_m16n8k16<T>(s[n], ka[0], q_lo, s[n]);
            mma_m16n8k16<T>(s[n], ka[1], q_hi, s[n]);
            ldmatrix<4, false>(b, dOb + b_off);
            const uint32_t o_lo[2] = {b[0], b[1]}, o_hi[2] = {b[2], b[3]};
            mma_m16n8k16<T>(dp[n], va[0], o_lo, dp[n]);
            mma_m16n8k16<T>(dp[n], va[1], o_hi, dp[n]);
          }
        }

        // b. P^T and dS^T in place of S^T and dP^T. Element e of n-block n is key
        // keys[e / 2], query qt0 + col, and its bin (key - k0) - col + kBQ - 1 (the bias and
        // bias gradient of its key - query offset). Only visible elements: a masked one is
        // exactly 0 whatever NaN its row's dO, delta or lse or its key's V holds; a visible
        // NaN propagates.
#pragma unroll
        for (int n = 0; n < 2; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = 8 * (2 * kk + n) + MmaLayout::c_col(lane, e);
            const int bin = 16 * key_group + g + 8 * (e >> 1) - col + (kBQ - 1);
            const bool vis = keys[e >> 1] < visible_keys(qt0 + col, Lq, Lk, p.causal);
            float x = fmaf(s[n][e], p.scale_log2, -lse_s[col]);
            if (has_bias) x += bias_s[bin];
            const float pe = vis ? exp2f(x) : 0.f;
            const float ds = vis ? pe * (dp[n][e] - delta_s[col]) : 0.f;
            s[n][e] = pe;
            dp[n][e] = ds;
            if (bias_grads && vis) atomicAdd(bins + bin, ds);
          }
        }
        // Rounded to T, the A fragments of P^T and dS^T over these 16 queries as they lie.
        a_from_c_pair<T>(s[0], s[1], pa);
        a_from_c_pair<T>(dp[0], dp[1], da);
      }
      // Registers 0..3: rows g, g + 8 at queries 16 kk + 2t, + 1, then + 8, + 9.
      const auto store = [&](uint16_t* row, const uint32_t (&a)[4]) {
        *reinterpret_cast<uint32_t*>(row) = a[0];
        *reinterpret_cast<uint32_t*>(row + 8 * kLd) = a[1];
        *reinterpret_cast<uint32_t*>(row + 8) = a[2];
        *reinterpret_cast<uint32_t*>(row + 8 * kLd + 8) = a[3];
      };
      store(Ps + at, pa);
      store(dSs + at, da);
    }
    __syncthreads();  // the whole P^T and dS^T tiles and the bias bins are written

    // 2. dV += P^T dO and dK += dS^T Q for the group's 16 keys and this warp's kPartDims head
    // dims, over the tile's 32 queries. P^T's and dS^T's A fragments by ldmatrix.x4 of their
    // rows (as K's in a); dO's and Q's B fragments by one ldmatrix.x4.trans per pair of n-blocks:
    // matrix m holds queries 16 kk + 8 (m & 1) .. + 7 at head dims 8 (chunk0 + 2 pair + m / 2)
    // .. + 7, so registers 0, 1 are the B fragment of n-block 2 pair, 2, 3 that of 2 pair + 1.
    if (group_seen) {
      const int chunk0 = part * (C::kPartDims / 8);
#pragma unroll
      for (int kk = 0; kk < kQSteps; ++kk) {
        uint32_t pa[4], da[4];
        const int a_off = (16 * key_group + x4_row) * kLd + 16 * kk + 8 * x4_chunk;
        ldmatrix<4, false>(pa, Ps + a_off);
        ldmatrix<4, false>(da, dSs + a_off);
#pragma unroll
        for (int pair = 0; pair < kPartPairs; ++pair) {
          const int off = swizzled<D>(16 * kk + x4_row, chunk0 + 2 * pair + x4_chunk);
          uint32_t b[4];
          ldmatrix<4, true>(b, dOb + off);
          const uint32_t o_lo[2] = {b[0], b[1]}, o_hi[2] = {b[2], b[3]};
          mma_m16n8k16<T>(dv[2 * pair], pa, o_lo, dv[2 * pair]);
          mma_m16n8k16<T>(dv[2 * pair + 1], pa, o_hi, dv[2 * pair + 1]);
          ldmatrix<4, true>(b, Qb + off);
          const uint32_t q_lo[2] = {b[0], b[1]}, q_hi[2] = {b[2], b[3]};
          mma_m16n8k16<T>(dk[2 * pair], da, q_lo, dk[2 * pair]);
          mma_m16n8k16<T>(dk[2 * pair + 1], da, q_hi, dk[2 * pair + 1]);
        }
      }
    }

    // 3. dQ += dS K: this warp's part, queries 16 (warp % 2) .. + 15, head dims
    // 32 (warp / 2) .. + 31. dS's A fragment over keys 16 kk .. + 15 by one ldmatrix.x4.trans
    // of dS^T: matrix m = (queries 0-7 | 8-15 as m & 1) x (keys 0-7 | 8-15 as m / 2) is stored
    // as keys by rows, and .trans gives lane (g, t) its elements (query g, keys 2t, 2t + 1):
    // registers a0a1, a2a3, a4a5, a6a7 in that order. K's B fragments: ldmatrix.x4.trans of
    // K's rows as dO's in 2.
    {
      const int q_part = 16 * (warp % 2), chunk0 = 4 * (warp / 2);
      float dq[4][4] = {};
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk) {
        uint32_t a[4];
        ldmatrix<4, true>(a, dSs + (16 * kk + x4_chunk * 8 + (lane & 7)) * kLd + q_part +
                                 ((lane >> 3) & 1) * 8);
#pragma unroll
        for (int pair = 0; pair < 2; ++pair) {
          uint32_t b[4];
          ldmatrix<4, true>(b, Ks + swizzled<D>(16 * kk + x4_row, chunk0 + 2 * pair + x4_chunk));
          const uint32_t b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
          mma_m16n8k16<T>(dq[2 * pair], a, b_lo, dq[2 * pair]);
          mma_m16n8k16<T>(dq[2 * pair + 1], a, b_hi, dq[2 * pair + 1]);
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int64_t i = qt0 + q_part + g + 8 * r;
        // Padded rows' dq stays the preprocess's zero; a row that sees none of this block's
        // keys adds nothing (not even 0 times a NaN key).
        if (visible_keys(i, Lq, Lk, p.causal) <= k0) continue;
        float* const row_acc = p.dq_acc + (bh * Tq + i) * D + 8 * chunk0 + 2 * t;
#pragma unroll
        for (int nb = 0; nb < 4; ++nb) {
          atomicAdd(row_acc + 8 * nb, dq[nb][2 * r]);
          atomicAdd(row_acc + 8 * nb + 1, dq[nb][2 * r + 1]);
        }
      }
    }

    if (bias_grads) {
      for (int c = threadIdx.x; c < C::kBins; c += C::kThreads) {
        const float sum = bins[c];
        if (sum == 0.f) continue;  // NaN is not 0: it propagates
        const int64_t d = bin_distance(c);
        if (p.dtable != nullptr) atomicAdd(p.dtable + h * p.bias.width() + p.bias.bucket(d), sum);
        if (p.dslopes != nullptr) {
          atomicAdd(p.dslopes + h, -sum * static_cast<float>(d < 0 ? -d : d));
        }
      }
    }
    __syncthreads();  // buffers, P^T, dS^T, lse, delta, bins and bias are free for the next tile
  }

  // dk = scale * dK, dv = dV, rounded, this warp's dims; keys past Lk hold zeros (their P and dS
  // were 0).
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t j = keys[r];
    if (j >= Tk) continue;
    uint16_t* const dk_row = p.dk + (bh * Tk + j) * D + part * C::kPartDims;
    uint16_t* const dv_row = p.dv + (bh * Tk + j) * D + part * C::kPartDims;
#pragma unroll
    for (int nb = 0; nb < 2 * kPartPairs; ++nb) {
      const int c = 8 * nb + MmaLayout::c_col(lane, 0);
      *reinterpret_cast<uint32_t*>(dk_row + c) =
          pack2<T>(dk[nb][2 * r] * p.scale, dk[nb][2 * r + 1] * p.scale);
      *reinterpret_cast<uint32_t*>(dv_row + c) = pack2<T>(dv[nb][2 * r], dv[nb][2 * r + 1]);
    }
  }
}

unsigned grid_stride_blocks(int64_t work_items, int64_t per_block) {
  const int64_t blocks = ceil_div(work_items, per_block);
  return static_cast<unsigned>(blocks < (1 << 16) ? blocks : (1 << 16));
}

template <typename T, int D>
cudaError_t launch_backward_tc(const AttentionShape& s, const uint16_t* q, const uint16_t* k,
                               const uint16_t* v, const uint16_t* out, const uint16_t* grad_out,
                               const float* lse, uint16_t* dq, uint16_t* dk, uint16_t* dv,
                               float* workspace, cudaStream_t stream,
                               const AttentionBias<float>& bias, float* dtable, float* dslopes) {
  using C = TcBackwardConfig<D>;
  const int64_t rows = s.B * s.H * s.Tq;
  float* const dq_acc = workspace;
  float* const delta = workspace + rows * D;
  if (rows > 0) {
    const cudaError_t err = detail::launch(
        attention_backward_tc_preprocess_kernel<T, D>,
        grid_stride_blocks(rows, C::kPreprocessThreads / kWarpSize), C::kPreprocessThreads, 0,
        stream, out, grad_out, delta, dq_acc, rows, s.Tq, s.H, s.q_lengths);
    if (err != cudaSuccess) return err;
  }

  // Runs even when Tq == 0: dk and dv are then zero.
  TcBackwardParams p;
  p.q = q, p.k = k, p.v = v, p.dout = grad_out, p.lse = lse, p.delta = delta;
  p.dq_acc = dq_acc, p.dk = dk, p.dv = dv;
  p.Tq = s.Tq, p.Tk = s.Tk, p.H = s.H;
  p.k_tiles = ceil_div(s.Tk, C::kBlockK);
  p.q_lengths = s.q_lengths, p.kv_lengths = s.kv_lengths;
  p.scale = static_cast<float>(s.scale);
  p.scale_log2 = static_cast<float>(s.scale * 1.4426950408889634);
  p.causal = s.causal;
  p.bias = bias;
  p.dtable = bias.table != nullptr ? dtable : nullptr;
  p.dslopes = bias.slopes != nullptr ? dslopes : nullptr;
  const int64_t blocks = s.B * s.H * p.k_tiles;
  if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;
  if (blocks > 0) {
    auto kernel = attention_backward_tc_kernel<T, D>;
    cudaError_t err = cudaSuccess;
    if (C::kSharedBytes > 48 * 1024) {  // opt in above the default 48 KB (a per-device attribute)
      err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(C::kSharedBytes));
    }
    if (err == cudaSuccess) {
      err = detail::launch(kernel, static_cast<unsigned>(blocks), C::kThreads, C::kSharedBytes,
                           stream, p);
    }
    if (err != cudaSuccess) return err;
  }

  const int64_t pairs = rows * D / 2;
  if (pairs == 0) return cudaSuccess;
  return detail::launch(attention_backward_tc_convert_kernel<T>, grid_stride_blocks(pairs, 256),
                        256, 0, stream, dq_acc, reinterpret_cast<uint32_t*>(dq), pairs,
                        static_cast<float>(s.scale));
}

template <typename T>
cudaError_t backward_tc_typed(const AttentionShape& s, const void* q, const void* k,
                              const void* v, const void* out, const void* grad_out,
                              const float* lse, void* dq, void* dk, void* dv, void* workspace,
                              cudaStream_t stream, const AttentionBias<float>& bias,
                              float* dtable, float* dslopes) {
  const auto in = [](const void* x) { return static_cast<const uint16_t*>(x); };
  const auto io = [](void* x) { return static_cast<uint16_t*>(x); };
  if (s.Dk == 64) {
    return launch_backward_tc<T, 64>(s, in(q), in(k), in(v), in(out), in(grad_out), lse, io(dq),
                                     io(dk), io(dv), static_cast<float*>(workspace), stream, bias,
                                     dtable, dslopes);
  }
  return launch_backward_tc<T, 128>(s, in(q), in(k), in(v), in(out), in(grad_out), lse, io(dq),
                                    io(dk), io(dv), static_cast<float*>(workspace), stream, bias,
                                    dtable, dslopes);
}

}  // namespace

bool attention_backward_tc_supported(const AttentionShape& s, const void* q, const void* k,
                                     const void* v, const void* out, const void* grad_out,
                                     const void* dq, const void* dk, const void* dv) {
  return s.B >= 0 && s.H >= 0 && s.Tq >= 0 && s.Tk >= 0 && s.Dk == s.Dv &&
         (s.Dk == 64 || s.Dk == 128) && aligned16(q) && aligned16(k) && aligned16(v) &&
         aligned16(out) && aligned16(grad_out) && aligned16(dq) && aligned16(dk) &&
         aligned16(dv);
}

size_t attention_backward_tc_workspace_bytes(const AttentionShape& s) {
  if (s.B < 0 || s.H < 0 || s.Tq < 0 || s.Dk < 0) return 0;
  return static_cast<size_t>(s.B * s.H * s.Tq * (s.Dk + 1)) * sizeof(float);
}

cudaError_t attention_backward_tc(const AttentionShape& s, HalfType dtype, const void* q,
                                  const void* k, const void* v, const void* out,
                                  const void* grad_out, const float* lse, void* dq, void* dk,
                                  void* dv, void* workspace, cudaStream_t stream,
                                  const AttentionBias<float>& bias, float* dtable,
                                  float* dslopes) {
  if (!attention_backward_tc_supported(s, q, k, v, out, grad_out, dq, dk, dv)) {
    return cudaErrorInvalidValue;
  }
  if (s.B * s.H == 0 || s.Tq + s.Tk == 0) return cudaSuccess;  // no gradient to write
  switch (dtype) {
    case HalfType::kBFloat16:
      return backward_tc_typed<__nv_bfloat16>(s, q, k, v, out, grad_out, lse, dq, dk, dv,
                                              workspace, stream, bias, dtable, dslopes);
    case HalfType::kFloat16:
      return backward_tc_typed<__half>(s, q, k, v, out, grad_out, lse, dq, dk, dv, workspace,
                                       stream, bias, dtable, dslopes);
  }
  return cudaErrorInvalidValue;
}

}  // namespace pygpt::cuda
