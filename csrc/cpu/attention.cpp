// Flash attention on the CPU. The forward walks one tile of queries across the key tiles with an
// online softmax (running max and sum per row), so no Tq x Tk score matrix ever exists; it keeps
// only the log-sum-exp per row. The backward recomputes each score tile from that log-sum-exp, in
// the key-tile-outer order of FlashAttention-2: a key tile's dK and dV stay in a small accumulator
// while the query tiles stream past, and dQ accumulates in a per-head buffer. A position bias
// (AttentionBias) is added to each score row as it is computed, in both passes; its gradients
// (the score gradients dS, summed per table column and per slope) go to per-(batch, head)
// buffers, so parallel items never share an element.
#include "cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/tile_gemm.h"
#include "cpu/vec_math.h"
#include "cpu/vec_sum.h"

namespace pygpt::cpu {
inline namespace PYGPT_CPU_ISA {
namespace {

// Queries per forward work item and keys per score tile: multiples of the GEMM block (kTileRows
// rows, tile_cols<T>() columns), since the key tile is also the M of the backward's dK and dV
// products: 48 and 96 for AVX-512's 12-row blocks of 32 floats, 48 and 48 for AVX2's 6-row
// blocks of 16, 32 and 64 for the baseline's 4-row blocks of 8.
constexpr int64_t kQueryTile = kTileRows == 4 ? 32 : 48;
constexpr int64_t kKeyTile = kTileRows == 12 ? 96 : kTileRows == 6 ? 48 : 64;
static_assert(kKeyTile % tile_cols<float>() == 0 && kKeyTile % tile_cols<double>() == 0);
static_assert(kQueryTile % kTileRows == 0 && kKeyTile % kTileRows == 0);

// The real queries and keys of one batch row (all Tq and Tk without lengths).
struct RowLengths {
  int64_t q, kv;
};

// How many keys query i (0-based among the row's real queries) may see; they are a prefix.
int64_t visible_keys(const AttentionShape& s, RowLengths len, int64_t i) {
  if (!s.causal) return len.kv;
  return std::clamp<int64_t>(i + 1 + len.kv - len.q, 0, len.kv);
}

// Rows [begin, end) of a (rows, D) block at dst, zeroed: outputs and gradients of padding.
template <typename T>
void zero_rows(T* dst, int64_t begin, int64_t end, int64_t D) {
  std::fill(dst + begin * D, dst + end * D, T(0));
}

// dst (rows_pad x ld) = mul * src[0:rows, 0:D], zero outside; src is a strided (T, D) slice.
template <typename T>
void pack_rows(const T* src, int64_t stride_t, int64_t stride_d, int64_t rows, int64_t rows_pad,
               int64_t D, T mul, T* dst, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* s = src + r * stride_t;
    T* d = dst + r * ld;
    for (int64_t c = 0; c < D; ++c) d[c] = s[c * stride_d] * mul;
    std::fill(d + D, d + ld, T(0));
  }
  std::fill(dst + rows * ld, dst + rows_pad * ld, T(0));
}

// dst (D x ld) = src[0:rows, 0:D] transposed, columns [rows, cols_pad) zeroed.
template <typename T>
void pack_transposed(const T* src, int64_t stride_t, int64_t stride_d, int64_t rows,
                     int64_t cols_pad, int64_t D, T* dst, int64_t ld) {
  for (int64_t j = 0; j < rows; ++j) {
    const T* s = src + j * stride_t;
    for (int64_t c = 0; c < D; ++c) dst[c * ld + j] = s[c * stride_d];
  }
  for (int64_t c = 0; c < D; ++c) std::fill(dst + c * ld + rows, dst + c * ld + cols_pad, T(0));
}

// The largest of x[0..n), NaNs passed over (as std::max(m, x) does). Written with vector types:
// GCC leaves an omp simd max reduction scalar when it targets AVX2.
template <typename T>
T row_max(const T* x, int64_t n) {
  using V = typename Vec<T>::type;
  constexpr int W = Vec<T>::lanes;
  constexpr T lowest = -std::numeric_limits<T>::infinity();
  V mv = V{} + lowest;
  int64_t j = 0;
  for (; j + W <= n; j += W) {
    const V v = load_as<V>(x + j);
    mv = v > mv ? v : mv;
  }
  T m = lowest;
  for (int l = 0; l < W; ++l) m = std::max(m, mv[l]);
  for (; j < n; ++j) m = std::max(m, x[j]);
  return m;
}

// x[j] = exp(x[j] - shift) for j < n; returns their sum.
template <typename T>
T exp_shifted_sum(T* x, int64_t n, T shift) {
  T sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) {
    const T p = exp_fast(x[j] - shift);
    x[j] = p;
    sum += p;
  }
  return sum;
}

// A score row's keys j < n, at distances d0 + j, split where the table's clamp changes: [0, lo)
// clamp to -R (column 0), [lo, hi) lie within (-R, R) (column d0 + j + R), [hi, n) clamp to R
// (column 2R). So each part is a plain, vectorisable loop.
struct BiasRanges {
  int64_t lo, hi;
};

BiasRanges bias_ranges(int64_t d0, int64_t n, int64_t R) {
  const int64_t lo = std::clamp<int64_t>(1 - R - d0, 0, n);
  return {lo, std::clamp<int64_t>(R - d0, lo, n)};
}

// x[j] += bias(h, d0 + j) for j < n: one query row's scores, d0 = its first key's distance.
template <typename T>
void add_bias(T* x, int64_t n, const AttentionBias<T>& bias, int64_t h, int64_t d0) {
  if (bias.table != nullptr) {
    const T* row = bias.table + h * bias.width();
    const int64_t R = bias.max_distance;
    const auto [lo, hi] = bias_ranges(d0, n, R);
    for (int64_t j = 0; j < lo; ++j) x[j] += row[0];
#pragma omp simd
    for (int64_t j = lo; j < hi; ++j) x[j] += row[d0 + R + j];
    for (int64_t j = hi; j < n; ++j) x[j] += row[2 * R];
  }
  if (bias.slopes != nullptr) {
    const T slope = bias.slopes[h];
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) x[j] -= slope * std::abs(T(d0 + j));
  }
}

// One query row's share of the bias gradients: ds[j] (the score gradient) goes to the table
// column of distance d0 + j and, times -|d0 + j|, to the slope (each nullptr: not wanted).
template <typename T>
void add_bias_grad(const T* ds, int64_t n, const AttentionBias<T>& bias, int64_t d0, T* dtable,
                   T* dslope) {
  if (dtable != nullptr) {
    const int64_t R = bias.max_distance;
    const auto [lo, hi] = bias_ranges(d0, n, R);
    T below = 0, above = 0;
    for (int64_t j = 0; j < lo; ++j) below += ds[j];
#pragma omp simd
    for (int64_t j = lo; j < hi; ++j) dtable[d0 + R + j] += ds[j];
    for (int64_t j = hi; j < n; ++j) above += ds[j];
    dtable[0] += below;
    dtable[2 * R] += above;
  }
  if (dslope != nullptr) {
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < n; ++j) sum += ds[j] * std::abs(T(d0 + j));
    *dslope -= sum;
  }
}

// scores[j] = scale * q . k_j for the keys j < n of one query. With unit strides, four keys at a
// time: their dot products' horizontal sums then overlap instead of each waiting on the last.
template <typename T>
void direct_scores(const AttentionShape& s, const T* q, int64_t q_d, const T* k, int64_t k_t,
                   int64_t k_d, int64_t n, T* scores) {
  const T scale = T(s.scale);
  int64_t j = 0;
  if (q_d == 1 && k_d == 1) {
    for (; j + 4 <= n; j += 4) {
      const T* kj = k + j * k_t;
      const auto d = vector_sums<T, 4>(s.Dk, [&](auto load, int64_t c, auto& a) {
        const auto qc = load(q + c);
        a[0] += qc * load(kj + c);
        a[1] += qc * load(kj + k_t + c);
        a[2] += qc * load(kj + 2 * k_t + c);
        a[3] += qc * load(kj + 3 * k_t + c);
      });
      for (int u = 0; u < 4; ++u) scores[j + u] = d[u] * scale;
    }
  }
  for (; j < n; ++j) {
    const T* kj = k + j * k_t;
    T dot = 0;
    for (int64_t c = 0; c < s.Dk; ++c) dot += q[c * q_d] * kj[c * k_d];
    scores[j] = dot * scale;
  }
}

// A few queries (a decode step): tiles would pack all of K and V and run GEMM blocks of
// kTileRows rows for one real row, so each query instead takes dot products with the keys it
// sees and sums their values, in place. Same online-free softmax, same rules for empty rows and
// NaNs as the tiled path; `scores` holds at least Tk values.
template <typename T>
void forward_rows_direct(const AttentionShape& s, View4<T> q, View4<T> k, View4<T> v, T* out,
                         T* lse, int64_t b, int64_t h, int64_t r0, int64_t rows,
                         const AttentionBias<T>& bias, T* scores) {
  const RowLengths len{s.q_len(b), s.kv_len(b)};
  const int64_t bh = b * s.H + h;
  for (int64_t i = r0; i < r0 + rows; ++i) {
    T* o = out + (bh * s.Tq + i) * s.Dv;
    std::fill(o, o + s.Dv, T(0));
    const int64_t n = i < len.q ? visible_keys(s, len, i) : 0;
    if (n == 0) {  // padding, or a query that sees no key
      lse[bh * s.Tq + i] = -std::numeric_limits<T>::infinity();
      continue;
    }
    direct_scores(s, q.at(b, h, i), q.stride_d, k.at(b, h, 0), k.stride_t, k.stride_d, n, scores);
    if (bias.any()) add_bias(scores, n, bias, h, -(i + len.kv - len.q));
    const T m = row_max(scores, n);
    const T shift = m == -std::numeric_limits<T>::infinity() ? T(0) : m;
    const T l = exp_shifted_sum(scores, n, shift);
    for (int64_t j = 0; j < n; ++j) {
      const T* vj = v.at(b, h, j);
      const T pj = scores[j];
      if (v.stride_d == 1) {
#pragma omp simd
        for (int64_t c = 0; c < s.Dv; ++c) o[c] += pj * vj[c];
      } else {
        for (int64_t c = 0; c < s.Dv; ++c) o[c] += pj * vj[c * v.stride_d];
      }
    }
    const T inv = T(1) / l;
    for (int64_t c = 0; c < s.Dv; ++c) o[c] *= inv;
    lse[bh * s.Tq + i] = shift + std::log(l);
  }
}

}  // namespace

int64_t attention_forward_items(const AttentionShape& s) {
  return s.B * s.H * ((s.Tq + kQueryTile - 1) / kQueryTile);
}

int64_t attention_backward_items(const AttentionShape& s) { return s.B * s.H; }

template <typename T>
void attention_forward(const AttentionShape& s, View4<T> q, View4<T> k, View4<T> v, T* out, T* lse,
                       int64_t item_begin, int64_t item_end, const AttentionBias<T>& bias) {
  const int64_t q_tiles = (s.Tq + kQueryTile - 1) / kQueryTile;
  if (s.Tq * 2 <= kTileRows) {  // a few queries (decode steps): the direct way, one item per head
    std::vector<T> scores(s.Tk);
    for (int64_t bh = item_begin; bh < item_end; ++bh) {
      forward_rows_direct(s, q, k, v, out, lse, bh / s.H, bh % s.H, 0, s.Tq, bias,
                          scores.data());
    }
    return;
  }
  constexpr int64_t NR = tile_cols<T>();
  const int64_t dk_pad = round_up(s.Dk, NR), dv_pad = round_up(s.Dv, NR);
  // K^T and V of one head, packed once and reused by every query tile of that head in the range.
  // K^T is packed tile by tile (a Dk x kKeyTile block per key tile): one long (Dk, Tk) panel
  // would put the rows a score tile reads Tk floats apart, a power of two for typical lengths,
  // all in the same L1 sets.
  const int64_t key_tiles = (s.Tk + kKeyTile - 1) / kKeyTile;
  std::vector<T> kt(key_tiles * s.Dk * kKeyTile), vs(s.Tk * dv_pad);
  int64_t packed_bh = -1;
  std::vector<T> qs(kQueryTile * dk_pad), scores(kQueryTile * kKeyTile), acc(kQueryTile * dv_pad);
  std::vector<T> m(kQueryTile), l(kQueryTile);

  for (int64_t item = item_begin; item < item_end; ++item) {
    const int64_t bh = item / q_tiles, b = bh / s.H, h = bh % s.H;
    const RowLengths len{s.q_len(b), s.kv_len(b)};
    const int64_t r0 = (item % q_tiles) * kQueryTile;
    const int64_t tile_rows = std::min(kQueryTile, s.Tq - r0);
    // The tile's real queries; the rest are padding, which gets zeros and lse -inf.
    const int64_t mq = std::clamp<int64_t>(len.q - r0, 0, tile_rows);
    const int64_t mq_pad = round_up(mq, kTileRows);
    zero_rows(out + (bh * s.Tq + r0) * s.Dv, mq, tile_rows, s.Dv);
    std::fill(lse + bh * s.Tq + r0 + mq, lse + bh * s.Tq + r0 + tile_rows,
              -std::numeric_limits<T>::infinity());
    if (mq == 0) continue;
    if (bh != packed_bh) {
      for (int64_t k0 = 0; k0 < len.kv; k0 += kKeyTile) {
        pack_transposed(k.at(b, h, k0), k.stride_t, k.stride_d, std::min(kKeyTile, len.kv - k0),
                        kKeyTile, s.Dk, kt.data() + k0 * s.Dk, kKeyTile);
      }
      pack_rows(v.at(b, h, 0), v.stride_t, v.stride_d, len.kv, len.kv, s.Dv, T(1), vs.data(),
                dv_pad);
      packed_bh = bh;
    }
    pack_rows(q.at(b, h, r0), q.stride_t, q.stride_d, mq, mq_pad, s.Dk, T(s.scale), qs.data(),
              dk_pad);
    std::fill(acc.begin(), acc.end(), T(0));
    std::fill(m.begin(), m.end(), -std::numeric_limits<T>::infinity());
    std::fill(l.begin(), l.end(), T(0));

    const int64_t key_end = visible_keys(s, len, r0 + mq - 1);  // the last row sees the most
    for (int64_t k0 = 0; k0 < key_end; k0 += kKeyTile) {
      const int64_t nk = std::min(kKeyTile, key_end - k0), nk_pad = round_up(nk, NR);
      tile_gemm<T>(mq_pad, nk_pad, s.Dk, qs.data(), dk_pad, 1, kt.data() + k0 * s.Dk, kKeyTile,
                   scores.data(), kKeyTile, false);
      for (int64_t i = 0; i < mq; ++i) {
        T* p = scores.data() + i * kKeyTile;
        const int64_t nvis = std::clamp<int64_t>(visible_keys(s, len, r0 + i) - k0, 0, nk);
        std::fill(p + nvis, p + nk, T(0));
        if (nvis == 0) continue;
        // Key k0's distance from this query, at position r0 + i + kv - q (the row's last ones).
        if (bias.any()) add_bias(p, nvis, bias, h, k0 - (r0 + i + len.kv - len.q));
        const T m_new = std::max(m[i], row_max(p, nvis));
        // All scores so far -inf: shift by 0, not -inf, so that -inf - -inf (NaN) never arises
        // and the row's sum stays 0. NaN or +inf scores make NaN here, which must reach out.
        const T shift = m_new == -std::numeric_limits<T>::infinity() ? T(0) : m_new;
        const T correction = exp_fast(m[i] - shift);
        l[i] = l[i] * correction + exp_shifted_sum(p, nvis, shift);
        m[i] = m_new;
        if (correction != T(1)) {
          T* a = acc.data() + i * dv_pad;
          for (int64_t c = 0; c < dv_pad; ++c) a[c] *= correction;
        }
      }
      tile_gemm<T>(mq_pad, dv_pad, nk, scores.data(), kKeyTile, 1, vs.data() + k0 * dv_pad, dv_pad,
                   acc.data(), dv_pad, true);
    }

    for (int64_t i = 0; i < mq; ++i) {
      const int64_t row = bh * s.Tq + r0 + i;
      T* o = out + row * s.Dv;
      // Decided by the mask, never by l: a NaN or infinite score makes l NaN (or 0, when every
      // score is -inf), and that must give NaN as softmax does, not the zeros of an empty row.
      if (visible_keys(s, len, r0 + i) > 0) {
        const T inv = T(1) / l[i];
        const T* a = acc.data() + i * dv_pad;
        for (int64_t c = 0; c < s.Dv; ++c) o[c] = a[c] * inv;
        lse[row] = m[i] + std::log(l[i]);
      } else {  // a query that sees no key
        std::fill(o, o + s.Dv, T(0));
        lse[row] = -std::numeric_limits<T>::infinity();
      }
    }
  }
}

template <typename T>
void attention_backward(const AttentionShape& s, View4<T> q, View4<T> k, View4<T> v, View4<T> out,
                        View4<T> grad_out, const T* lse, T* dq, T* dk, T* dv, int64_t item_begin,
                        int64_t item_end, const AttentionBias<T>& bias, T* dtable, T* dslopes) {
  constexpr int64_t NR = tile_cols<T>();
  const int64_t dk_pad = round_up(s.Dk, NR), dv_pad = round_up(s.Dv, NR);
  const int64_t tq_pad = round_up(s.Tq, kTileRows);
  std::vector<T> qs(tq_pad * dk_pad), dos(tq_pad * dv_pad), dq_acc(tq_pad * dk_pad), delta(s.Tq);
  std::vector<T> kt(s.Dk * kKeyTile), vt(s.Dv * kKeyTile), kb(kKeyTile * dk_pad);
  std::vector<T> p(kQueryTile * kKeyTile), ds(kQueryTile * kKeyTile);
  std::vector<T> dk_acc(kKeyTile * dk_pad), dv_acc(kKeyTile * dv_pad);

  for (int64_t bh = item_begin; bh < item_end; ++bh) {
    const int64_t b = bh / s.H, h = bh % s.H;
    const RowLengths len{s.q_len(b), s.kv_len(b)};
    const T* lse_bh = lse + bh * s.Tq;
    T* const dtable_bh = bias.table != nullptr && dtable != nullptr ? dtable + bh * bias.width()
                                                                     : nullptr;
    T* const dslope_bh = bias.slopes != nullptr && dslopes != nullptr ? dslopes + bh : nullptr;
    if (dtable_bh != nullptr) std::fill(dtable_bh, dtable_bh + bias.width(), T(0));
    if (dslope_bh != nullptr) *dslope_bh = T(0);
    // Padded queries and keys get zero gradients; only the real ones are read below.
    zero_rows(dq + bh * s.Tq * s.Dk, len.q, s.Tq, s.Dk);
    zero_rows(dk + bh * s.Tk * s.Dk, len.kv, s.Tk, s.Dk);
    zero_rows(dv + bh * s.Tk * s.Dv, len.kv, s.Tk, s.Dv);
    // Whole-head copies: Q pre-scaled (so S = Qs K^T and dK = dS^T Qs), and dO.
    const int64_t lq_pad = round_up(len.q, kTileRows);
    pack_rows(q.at(b, h, 0), q.stride_t, q.stride_d, len.q, lq_pad, s.Dk, T(s.scale), qs.data(),
              dk_pad);
    pack_rows(grad_out.at(b, h, 0), grad_out.stride_t, grad_out.stride_d, len.q, lq_pad, s.Dv,
              T(1), dos.data(), dv_pad);
    for (int64_t i = 0; i < len.q; ++i) {  // delta_i = rowsum(dO * O) = rowsum(dP * P)
      const T* o = out.at(b, h, i);
      const T* g = dos.data() + i * dv_pad;
      T sum = 0;
      for (int64_t c = 0; c < s.Dv; ++c) sum += g[c] * o[c * out.stride_d];
      delta[i] = sum;
    }
    std::fill(dq_acc.begin(), dq_acc.end(), T(0));

    for (int64_t k0 = 0; k0 < len.kv; k0 += kKeyTile) {
      const int64_t nk = std::min(kKeyTile, len.kv - k0), nk_pad = round_up(nk, NR);
      pack_transposed(k.at(b, h, k0), k.stride_t, k.stride_d, nk, nk_pad, s.Dk, kt.data(),
                      kKeyTile);
      pack_transposed(v.at(b, h, k0), v.stride_t, v.stride_d, nk, nk_pad, s.Dv, vt.data(),
                      kKeyTile);
      pack_rows(k.at(b, h, k0), k.stride_t, k.stride_d, nk, nk, s.Dk, T(1), kb.data(), dk_pad);
      std::fill(dk_acc.begin(), dk_acc.end(), T(0));
      std::fill(dv_acc.begin(), dv_acc.end(), T(0));

      // The first query that sees key k0; earlier query tiles contribute nothing to this tile.
      const int64_t first_row = s.causal ? std::max<int64_t>(0, k0 - (len.kv - len.q)) : 0;
      for (int64_t r0 = first_row / kQueryTile * kQueryTile; r0 < len.q; r0 += kQueryTile) {
        const int64_t mq = std::min(kQueryTile, len.q - r0), mq_pad = round_up(mq, kTileRows);
        const T* qs_tile = qs.data() + r0 * dk_pad;
        const T* dos_tile = dos.data() + r0 * dv_pad;
        tile_gemm<T>(mq_pad, nk_pad, s.Dk, qs_tile, dk_pad, 1, kt.data(), kKeyTile, p.data(),
                     kKeyTile, false);
        tile_gemm<T>(mq_pad, nk_pad, s.Dv, dos_tile, dv_pad, 1, vt.data(), kKeyTile, ds.data(),
                     kKeyTile, false);
        for (int64_t i = 0; i < mq; ++i) {  // P = exp(S - lse), dS = P * (dP - delta)
          T* pr = p.data() + i * kKeyTile;
          T* dsr = ds.data() + i * kKeyTile;
          const int64_t nvis = std::clamp<int64_t>(visible_keys(s, len, r0 + i) - k0, 0, nk);
          const T row_lse = lse_bh[r0 + i], row_delta = delta[r0 + i];
          const int64_t d0 = k0 - (r0 + i + len.kv - len.q);  // key k0 - query position
          if (bias.any()) add_bias(pr, nvis, bias, h, d0);
#pragma omp simd
          for (int64_t j = 0; j < nvis; ++j) {
            const T pj = exp_fast(pr[j] - row_lse);
            pr[j] = pj;
            dsr[j] = pj * (dsr[j] - row_delta);
          }
          if (dtable_bh != nullptr || dslope_bh != nullptr) {
            add_bias_grad(dsr, nvis, bias, d0, dtable_bh, dslope_bh);
          }
          std::fill(pr + nvis, pr + nk_pad, T(0));
          std::fill(dsr + nvis, dsr + nk_pad, T(0));
        }
        // Rows [mq, mq_pad) of ds are zero (their dO rows are zero padding) and feed dQ's padding.
        tile_gemm<T>(nk_pad, dv_pad, mq, p.data(), 1, kKeyTile, dos_tile, dv_pad, dv_acc.data(),
                     dv_pad, true);  // dV += P^T dO
        tile_gemm<T>(nk_pad, dk_pad, mq, ds.data(), 1, kKeyTile, qs_tile, dk_pad, dk_acc.data(),
                     dk_pad, true);  // dK += dS^T (scale Q)
        tile_gemm<T>(mq_pad, dk_pad, nk, ds.data(), kKeyTile, 1, kb.data(), dk_pad,
                     dq_acc.data() + r0 * dk_pad, dk_pad, true);  // dQ += dS K (scaled below)
      }
      for (int64_t j = 0; j < nk; ++j) {
        std::copy_n(dk_acc.data() + j * dk_pad, s.Dk, dk + (bh * s.Tk + k0 + j) * s.Dk);
        std::copy_n(dv_acc.data() + j * dv_pad, s.Dv, dv + (bh * s.Tk + k0 + j) * s.Dv);
      }
    }
    const T scale = T(s.scale);
    for (int64_t i = 0; i < len.q; ++i) {
      const T* a = dq_acc.data() + i * dk_pad;
      T* d = dq + (bh * s.Tq + i) * s.Dk;
      // A row that sees no key gets exactly 0, even where the tile product added 0 * NaN keys.
      if (visible_keys(s, len, i) == 0) {
        std::fill(d, d + s.Dk, T(0));
        continue;
      }
      for (int64_t c = 0; c < s.Dk; ++c) d[c] = a[c] * scale;
    }
  }
}

#define PYGPT_INSTANTIATE_ATTENTION(T)                                                          \
  template void attention_forward<T>(const AttentionShape&, View4<T>, View4<T>, View4<T>, T*,  \
                                     T*, int64_t, int64_t, const AttentionBias<T>&);           \
  template void attention_backward<T>(const AttentionShape&, View4<T>, View4<T>, View4<T>,     \
                                      View4<T>, View4<T>, const T*, T*, T*, T*, int64_t, int64_t, \
                                      const AttentionBias<T>&, T*, T*);
PYGPT_INSTANTIATE_ATTENTION(float)
PYGPT_INSTANTIATE_ATTENTION(double)
#undef PYGPT_INSTANTIATE_ATTENTION

}  // namespace PYGPT_CPU_ISA
}  // namespace pygpt::cpu
