// Flash attention forward on tensor cores (FlashAttention-2's algorithm) for bf16 and fp16
// inputs at head dim D = 64 or 128, float32 accumulators; the contract of attention_forward
// (cuda/attention.cu): masks, lengths, bias, -inf rows and the lse layout are the same.
//
// One block of 4 warps per (batch * head, 64-query tile), the last query tile first (under a
// causal mask it sees the most keys). Each warp owns 16 query rows, whose Q fragments it loads
// once from shared memory (ldmatrix.x4) into registers. Key and value tiles (BK = 64 keys at
// D = 64, 32 at D = 128) stream through two shared-memory buffers: cp.async fetches tile t + 1
// while the warps compute on tile t. Per tile, each warp:
//   1. S = Q K^T (16 x BK) by mma.m16n8k16, the B operand (K^T: head dim down, keys across) by a
//      plain ldmatrix of K's rows, since K stored by rows is K^T stored by columns;
//   2. scales S to log2 units, adds the bias and masks it in registers: MmaLayout says which
//      (query, key) each accumulator element is, so each lane tests its own elements;
//   3. online softmax: each lane holds two rows (g and g + 8) of the tile, 2 * BK / 8 elements
//      of each; the row max is reduced over the 4 lanes of a quad (shuffles at lane distances 1
//      and 2), the running output and this lane's partial row sum are rescaled, P = exp2(S - max);
//   4. O += P V by mma.m16n8k16, P rounded to the input type in registers and used as the A
//      operand directly (below), V's B fragments by ldmatrix.trans of V's rows.
// At the end the partial row sums are reduced over the quad, out = O / sum is rounded and
// stored, and lse = (max + log2(sum)) * ln 2.
//
// P from accumulators to A operand (MmaLayout, with g = lane / 4, t = lane % 4): S's n-block nb
// (keys 8 nb .. 8 nb + 7) leaves lane (g, t) c0, c1 = S[g][8 nb + 2t, + 1] and c2, c3 =
// S[g + 8][8 nb + 2t, + 1]. The A fragment of the P V step over keys 16 kk .. 16 kk + 15 wants
// in register 0: a0, a1 = P[g][2t, 2t + 1], register 1: a2, a3 = P[g + 8][2t, 2t + 1],
// register 2: a4, a5 = P[g][2t + 8, + 9], register 3: a6, a7 = P[g + 8][2t + 8, + 9] (columns
// relative to 16 kk). So the registers are pack2(c0, c1) and pack2(c2, c3) of n-block 2 kk, then
// the same of n-block 2 kk + 1: every lane already holds its own A fragment, no data moves.
//
// Shared memory: the Q tile (64 x D) and two K and two V buffers (BK x D), 16-bit elements,
// 40 KB at D = 64 and 48 KB at D = 128, no opt-in. Rows are unpadded and swizzled: the 16-byte
// chunk c of row r is stored at chunk position c ^ (r % 8). Every row is a multiple of 128 bytes,
// so unswizzled the 8 rows one ldmatrix phase reads would all start in the same bank; swizzled,
// they read 8 different chunks, 32 different banks.
//
// Masking and lengths as attention.cu: query i sees key j iff i < Lq and j < Lk and, causal,
// j <= i + Lk - Lq; masked scores are -inf, so exp2 gives exactly 0; a row that sees no key
// keeps max -inf (its exponent shift is then 0, so no -inf - -inf) and is written as out 0,
// lse -inf, decided by the mask and never by its sum. Rows of a tile past Lq (or Tq) and keys
// past Lk are zero-filled by cp.async's src-size 0, never read from global memory; the key loop
// ends at the last key the tile's last real query sees, and a warp skips (warp-uniformly) the
// tiles none of its rows sees.
//
// Framework-free: raw device pointers and sizes, launched on the caller's stream.
#include "cuda/attention_tc.h"

#include <climits>
#include <cstdint>

#include "cuda/kernel_utils.cuh"
#include "cuda/attention_tc_common.cuh"
#include "cuda/tensor_core.cuh"

namespace pygpt::cuda {
namespace {

using detail::ceil_div;
using detail::cp_async_commit;
using detail::cp_async_wait;
using detail::kFullMask;
using detail::kWarpSize;
using detail::ldmatrix;
using detail::mma_m16n8k16;
using detail::MmaLayout;
using detail::pack2;
using tc::a_from_c_pair;
using tc::aligned16;
using tc::kLn2;
using tc::kLog2e;
using tc::load_tile_async;
using tc::neg_inf;
using tc::swizzled;

template <int D>
struct TcConfig {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kBlockQ = 16 * kWarps;         // 16 query rows per warp
  static constexpr int kBlockK = D == 64 ? 64 : 32;   // keys per shared-memory tile
  static constexpr int kQElems = kBlockQ * D;
  static constexpr int kKVElems = kBlockK * D;
  // Q, then K buffer 0, K buffer 1, V buffer 0, V buffer 1.
  static constexpr size_t kSharedBytes = (kQElems + 4 * kKVElems) * sizeof(uint16_t);
  static_assert(D == 64 || D == 128, "head dims 64 and 128");
  static_assert(kSharedBytes <= 48 * 1024, "within the shared memory granted without opt-in");
};

struct TcParams {
  const uint16_t* q;
  const uint16_t* k;
  const uint16_t* v;
  uint16_t* out;
  float* lse;
  int64_t Tq, Tk, H;
  int64_t q_tiles;  // ceil(Tq / kBlockQ)
  const int32_t* q_lengths;   // nullptr: all Tq
  const int32_t* kv_lengths;  // nullptr: all Tk
  float scale_log2;           // scale * log2(e)
  bool causal;
  AttentionBias<float> bias;  // natural units; the kernel multiplies it by log2(e)
};

template <typename T, int D>
__global__ void __launch_bounds__(TcConfig<D>::kThreads)
    attention_forward_tc_kernel(const TcParams p) {
  using C = TcConfig<D>;
  constexpr int kBK = C::kBlockK;
  constexpr int kSBlocks = kBK / 8;  // n-blocks of S (8 keys each)
  constexpr int kQSteps = D / 16;    // k-steps of S = Q K^T (16 head dims each)
  constexpr int kOBlocks = D / 8;    // n-blocks of O (8 head dims each)
  constexpr int kPSteps = kBK / 16;  // k-steps of O += P V (16 keys each)

  uint16_t* const smem = detail::dynamic_shared<uint16_t>();
  uint16_t* const Qs = smem;
  uint16_t* const Ks = smem + C::kQElems;                 // buffer b at Ks + b * kKVElems
  uint16_t* const Vs = smem + C::kQElems + 2 * C::kKVElems;

  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int g = MmaLayout::group(lane), t = MmaLayout::thread_in_group(lane);
  const int64_t bh = blockIdx.x / p.q_tiles;
  const int64_t q0 = (p.q_tiles - 1 - blockIdx.x % p.q_tiles) * C::kBlockQ;
  const int64_t Tq = p.Tq, Tk = p.Tk;
  const int64_t Lq = p.q_lengths ? p.q_lengths[bh / p.H] : Tq;
  const int64_t Lk = p.kv_lengths ? p.kv_lengths[bh / p.H] : Tk;
  const int64_t h = bh % p.H;
  const bool has_bias = p.bias.any();
  const uint16_t* const q = p.q + (bh * Tq + q0) * D;
  const uint16_t* const k = p.k + bh * Tk * D;
  const uint16_t* const v = p.v + bh * Tk * D;

  // Keys [0, key_end) are all any real row of the tile sees (visibility grows with the row).
  const int64_t last_row = (q0 + C::kBlockQ < Lq ? q0 + C::kBlockQ : Lq) - 1;
  const int64_t key_end = q0 < Lq ? tc::visible_keys(last_row, Lq, Lk, p.causal) : 0;
  const int64_t tiles = (key_end + kBK - 1) / kBK;

  load_tile_async<D, C::kThreads>(Qs, q, Lq - q0, C::kBlockQ);
  cp_async_commit();
  if (tiles > 0) {
    load_tile_async<D, C::kThreads>(Ks, k, Lk, kBK);
    load_tile_async<D, C::kThreads>(Vs, v, Lk, kBK);
    cp_async_commit();
  }

  // This lane's two rows (MmaLayout: c0, c1 in row g, c2, c3 in row g + 8 of the warp's 16),
  // how many keys each sees, and their positions among the keys (for the bias distance).
  const int64_t warp_first = q0 + 16 * warp;
  const int64_t rows[2] = {warp_first + g, warp_first + g + 8};
  const int64_t limit[2] = {tc::visible_keys(rows[0], Lq, Lk, p.causal),
                            tc::visible_keys(rows[1], Lq, Lk, p.causal)};
  const int64_t pos[2] = {rows[0] + Lk - Lq, rows[1] + Lk - Lq};
  const int64_t warp_last = warp_first + 15 < Lq - 1 ? warp_first + 15 : Lq - 1;
  const int64_t warp_keys = warp_first < Lq ? tc::visible_keys(warp_last, Lq, Lk, p.causal) : 0;

  uint32_t qf[kQSteps][4];  // A fragments of the warp's 16 x D slice of Q
  float o[kOBlocks][4];     // O accumulators, C-fragment layout
  float m[2] = {neg_inf(), neg_inf()};  // running max of rows g, g + 8 (log2 units)
  float l[2] = {0.f, 0.f};              // this lane's share of their running sums
#pragma unroll
  for (int nb = 0; nb < kOBlocks; ++nb) {
#pragma unroll
    for (int i = 0; i < 4; ++i) o[nb][i] = 0.f;
  }

#pragma unroll 1
  for (int64_t tile = 0; tile < tiles; ++tile) {
    const int64_t k0 = tile * kBK;
    const int buf = static_cast<int>(tile & 1);
    if (tile + 1 < tiles) {  // prefetch the next tile into the other buffer, then wait for this
      const int64_t k1 = k0 + kBK;
      load_tile_async<D, C::kThreads>(Ks + (buf ^ 1) * C::kKVElems, k + k1 * D, Lk - k1, kBK);
      load_tile_async<D, C::kThreads>(Vs + (buf ^ 1) * C::kKVElems, v + k1 * D, Lk - k1, kBK);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // every thread's copies of this tile (and, at tile 0, of Q) have landed

    if (tile == 0) {
      // ldmatrix.x4 of the A fragment at head dims 16 s: lanes 8m .. 8m + 7 address rows of
      // matrix m = (rows 0-7 | rows 8-15) x (dims 0-7 | dims 8-15), in register order a0a1,
      // a2a3, a4a5, a6a7.
      const int row = 16 * warp + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
      for (int s = 0; s < kQSteps; ++s) {
        ldmatrix<4, false>(qf[s], Qs + swizzled<D>(row, 2 * s + (lane >> 4)));
      }
    }

    if (k0 < warp_keys) {  // warp-uniform: some row of this warp sees keys of this tile
      const uint16_t* const Kb = Ks + buf * C::kKVElems;
      const uint16_t* const Vb = Vs + buf * C::kKVElems;

      // 1. S = Q K^T. One ldmatrix.x4 per n-block and pair of k-steps: matrix m holds keys
      // 8 nb .. 8 nb + 7 at head dims 8 (4 pair + m) .. + 7, so registers 0, 1 are the B
      // fragment (b0b1, b2b3) of k-step 2 pair and registers 2, 3 that of k-step 2 pair + 1.
      float s[kSBlocks][4];
#pragma unroll
      for (int nb = 0; nb < kSBlocks; ++nb) {
#pragma unroll
        for (int i = 0; i < 4; ++i) s[nb][i] = 0.f;
      }
#pragma unroll
      for (int pair = 0; pair < kQSteps / 2; ++pair) {
#pragma unroll
        for (int nb = 0; nb < kSBlocks; ++nb) {
          uint32_t b[4];
          ldmatrix<4, false>(b, Kb + swizzled<D>(8 * nb + (lane & 7), 4 * pair + (lane >> 3)));
          const uint32_t b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
          mma_m16n8k16<T>(s[nb], qf[2 * pair], b_lo, s[nb]);
          mma_m16n8k16<T>(s[nb], qf[2 * pair + 1], b_hi, s[nb]);
        }
      }

      // 2. and 3. Scale, bias, mask; online softmax per row (r = 0: row g, r = 1: row g + 8).
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float tile_max = neg_inf();
#pragma unroll
        for (int nb = 0; nb < kSBlocks; ++nb) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int64_t j = k0 + 8 * nb + MmaLayout::c_col(lane, e);
            float x = s[nb][2 * r + e] * p.scale_log2;
            if (j >= limit[r]) {
              x = neg_inf();
            } else if (has_bias) {
              x = fmaf(p.bias.at(h, j - pos[r]), kLog2e, x);
            }
            s[nb][2 * r + e] = x;
            tile_max = fmaxf(tile_max, x);
          }
        }
        tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, 2));
        const float m_new = fmaxf(m[r], tile_max);
        const float shift = m_new == neg_inf() ? 0.f : m_new;  // no -inf - -inf
        const float correction = exp2f(m[r] - shift);
        float sum = 0.f;
#pragma unroll
        for (int nb = 0; nb < kSBlocks; ++nb) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float pe = exp2f(s[nb][2 * r + e] - shift);
            s[nb][2 * r + e] = pe;
            sum += pe;
          }
        }
        l[r] = l[r] * correction + sum;
        m[r] = m_new;
#pragma unroll
        for (int nb = 0; nb < kOBlocks; ++nb) {
          o[nb][2 * r] *= correction;
          o[nb][2 * r + 1] *= correction;
        }
      }

      // 4. O += P V. P's A fragment over keys 16 kk .. 16 kk + 15 is S's n-blocks 2 kk and
      // 2 kk + 1 as they lie (see the top). One ldmatrix.x4.trans per k-step and pair of
      // O n-blocks: matrix m holds keys 16 kk + 8 (m & 1) .. + 7 at head dims 8 (2 pair +
      // m / 2) .. + 7, so registers 0, 1 are the B fragment of O n-block 2 pair, 2, 3 that of
      // 2 pair + 1.
#pragma unroll
      for (int kk = 0; kk < kPSteps; ++kk) {
        uint32_t a[4];
        a_from_c_pair<T>(s[2 * kk], s[2 * kk + 1], a);
        const int key = 16 * kk + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
        for (int pair = 0; pair < kOBlocks / 2; ++pair) {
          uint32_t b[4];
          ldmatrix<4, true>(b, Vb + swizzled<D>(key, 2 * pair + (lane >> 4)));
          const uint32_t b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
          mma_m16n8k16<T>(o[2 * pair], a, b_lo, o[2 * pair]);
          mma_m16n8k16<T>(o[2 * pair + 1], a, b_hi, o[2 * pair + 1]);
        }
      }
    }
    __syncthreads();  // every warp is done with this buffer before the next prefetch refills it
  }

  // out = O / sum, rounded; lse. Every lane takes part in the quad sums.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float row_sum = l[r];
    row_sum += __shfl_xor_sync(kFullMask, row_sum, 1);
    row_sum += __shfl_xor_sync(kFullMask, row_sum, 2);
    const int64_t i = rows[r];
    if (i >= Tq) continue;
    // Decided by the mask, never by the sum (NaN scores give NaN, as softmax does).
    const bool seen = limit[r] > 0;
    const float inv = seen ? 1.f / row_sum : 0.f;
    uint16_t* const out_row = p.out + (bh * Tq + i) * D;
#pragma unroll
    for (int nb = 0; nb < kOBlocks; ++nb) {
      const float lo = seen ? o[nb][2 * r] * inv : 0.f;
      const float hi = seen ? o[nb][2 * r + 1] * inv : 0.f;
      *reinterpret_cast<uint32_t*>(out_row + 8 * nb + MmaLayout::c_col(lane, 0)) =
          pack2<T>(lo, hi);
    }
    if (t == 0) p.lse[bh * Tq + i] = seen ? (m[r] + log2f(row_sum)) * kLn2 : neg_inf();
  }
}

template <typename T, int D>
cudaError_t launch_forward_tc(const AttentionShape& s, const void* q, const void* k,
                              const void* v, void* out, float* lse,
                              const AttentionBias<float>& bias, cudaStream_t stream) {
  using C = TcConfig<D>;
  TcParams p;
  p.q = static_cast<const uint16_t*>(q);
  p.k = static_cast<const uint16_t*>(k);
  p.v = static_cast<const uint16_t*>(v);
  p.out = static_cast<uint16_t*>(out);
  p.lse = lse;
  p.Tq = s.Tq, p.Tk = s.Tk, p.H = s.H;
  p.q_tiles = ceil_div(s.Tq, C::kBlockQ);
  p.q_lengths = s.q_lengths, p.kv_lengths = s.kv_lengths;
  p.scale_log2 = static_cast<float>(s.scale * 1.4426950408889634);
  p.causal = s.causal;
  p.bias = bias;
  const int64_t blocks = s.B * s.H * p.q_tiles;
  if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;
  return detail::launch(attention_forward_tc_kernel<T, D>, static_cast<unsigned>(blocks),
                        C::kThreads, C::kSharedBytes, stream, p);
}

template <typename T>
cudaError_t forward_tc_typed(const AttentionShape& s, const void* q, const void* k,
                             const void* v, void* out, float* lse,
                             const AttentionBias<float>& bias, cudaStream_t stream) {
  if (s.Dk == 64) return launch_forward_tc<T, 64>(s, q, k, v, out, lse, bias, stream);
  return launch_forward_tc<T, 128>(s, q, k, v, out, lse, bias, stream);
}

}  // namespace

bool attention_forward_tc_supported(const AttentionShape& s, const void* q, const void* k,
                                    const void* v, const void* out) {
  return s.B >= 0 && s.H >= 0 && s.Tq >= 0 && s.Tk >= 0 && s.Dk == s.Dv &&
         (s.Dk == 64 || s.Dk == 128) && aligned16(q) && aligned16(k) && aligned16(v) &&
         aligned16(out);
}

cudaError_t attention_forward_tc(const AttentionShape& s, HalfType dtype, const void* q,
                                 const void* k, const void* v, void* out, float* lse,
                                 cudaStream_t stream, const AttentionBias<float>& bias) {
  if (!attention_forward_tc_supported(s, q, k, v, out)) return cudaErrorInvalidValue;
  if (s.B * s.H * s.Tq == 0) return cudaSuccess;  // no output; Tk == 0 still writes 0 and -inf
  switch (dtype) {
    case HalfType::kBFloat16:
      return forward_tc_typed<__nv_bfloat16>(s, q, k, v, out, lse, bias, stream);
    case HalfType::kFloat16: return forward_tc_typed<__half>(s, q, k, v, out, lse, bias, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace pygpt::cuda
