// The position-bias cases of the attention kernels (CPU and CUDA tests share them): a naive
// double oracle that builds every score with its bias (common/attention_shape.h's AttentionBias:
// a relative-position table and ALiBi slopes) and the bias gradients, and the shapes to run.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/attention_shape.h"
#include "test_support.h"

namespace pygpt::test {

struct BiasCase {
  int64_t B, H, Tq, Tk, D;
  bool causal;
  int64_t max_distance;  // R; -1: no table
  bool alibi;
  std::vector<int32_t> q_lengths, kv_lengths;  // empty: no lengths
};

// Shapes: T = 1, Tq < Tk (a cache) and Tq > Tk, odd sizes, several tiles, R = 0 and R past T,
// table and slopes alone and together, padded batches with lengths 0, 1 and full.
inline std::vector<BiasCase> bias_cases() {
  return {
      {1, 1, 1, 1, 4, true, 2, true, {}, {}},
      {2, 3, 7, 7, 8, false, 3, false, {}, {}},
      {1, 2, 5, 70, 8, true, 5, true, {}, {}},
      {1, 2, 70, 5, 4, true, 0, false, {}, {}},
      {1, 1, 100, 100, 16, true, 40, true, {}, {}},
      {1, 2, 33, 97, 8, false, -1, true, {}, {}},
      {1, 1, 1, 130, 32, true, 200, true, {}, {}},
      {4, 2, 37, 37, 8, true, 6, true, {37, 1, 0, 20}, {37, 1, 0, 20}},
      {3, 2, 12, 130, 8, false, 9, true, {12, 3, 0}, {130, 65, 9}},
      {3, 1, 40, 9, 8, true, 3, true, {40, 17, 5}, {9, 3, 9}},
  };
}

// Dense (B, H, T, D) double inputs; table (H, 2R + 1), slopes (H,) as in bias (host pointers).
struct BiasReference {
  std::vector<double> out, lse, dq, dk, dv, dtable, dslopes;
};

inline BiasReference bias_oracle(const AttentionShape& s, const AttentionBias<double>& bias,
                                 const std::vector<double>& q, const std::vector<double>& k,
                                 const std::vector<double>& v, const std::vector<double>& dout) {
  const int64_t Tq = s.Tq, Tk = s.Tk, Dk = s.Dk, Dv = s.Dv;
  const double inf = std::numeric_limits<double>::infinity();
  BiasReference r{std::vector<double>(s.B * s.H * Tq * Dv, 0.0),
                  std::vector<double>(s.B * s.H * Tq, -inf),
                  std::vector<double>(s.B * s.H * Tq * Dk, 0.0),
                  std::vector<double>(s.B * s.H * Tk * Dk, 0.0),
                  std::vector<double>(s.B * s.H * Tk * Dv, 0.0),
                  std::vector<double>(bias.table ? s.H * bias.width() : 0, 0.0),
                  std::vector<double>(bias.slopes ? s.H : 0, 0.0)};
  std::vector<double> P(Tk);
  for (int64_t b = 0; b < s.B; ++b) {
    const int64_t Lq = s.q_len(b), Lk = s.kv_len(b);
    for (int64_t h = 0; h < s.H; ++h) {
      const int64_t bh = b * s.H + h;
      for (int64_t i = 0; i < Lq; ++i) {
        const int64_t pos = i + Lk - Lq;  // the query's position among the keys
        const int64_t seen = s.causal ? std::clamp<int64_t>(pos + 1, 0, Lk) : Lk;
        if (seen == 0) continue;
        const double* Q = &q[(bh * Tq + i) * Dk];
        double max = -inf;
        for (int64_t j = 0; j < seen; ++j) {
          double dot = 0.0;
          for (int64_t c = 0; c < Dk; ++c) dot += Q[c] * k[(bh * Tk + j) * Dk + c];
          P[j] = s.scale * dot + bias.at(h, j - pos);
          max = std::max(max, P[j]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j < seen; ++j) sum += std::exp(P[j] - max);
        const double lse = max + std::log(sum);
        r.lse[bh * Tq + i] = lse;
        const double* dO = &dout[(bh * Tq + i) * Dv];
        double delta = 0.0;
        for (int64_t j = 0; j < seen; ++j) {
          P[j] = std::exp(P[j] - lse);
          for (int64_t c = 0; c < Dv; ++c) {
            r.out[(bh * Tq + i) * Dv + c] += P[j] * v[(bh * Tk + j) * Dv + c];
          }
        }
        for (int64_t c = 0; c < Dv; ++c) delta += dO[c] * r.out[(bh * Tq + i) * Dv + c];
        for (int64_t j = 0; j < seen; ++j) {
          double dP = 0.0;
          for (int64_t c = 0; c < Dv; ++c) dP += dO[c] * v[(bh * Tk + j) * Dv + c];
          const double dS = P[j] * (dP - delta), d = static_cast<double>(j - pos);
          for (int64_t c = 0; c < Dk; ++c) {
            r.dq[(bh * Tq + i) * Dk + c] += s.scale * dS * k[(bh * Tk + j) * Dk + c];
            r.dk[(bh * Tk + j) * Dk + c] += s.scale * dS * Q[c];
          }
          for (int64_t c = 0; c < Dv; ++c) r.dv[(bh * Tk + j) * Dv + c] += P[j] * dO[c];
          if (bias.table) r.dtable[h * bias.width() + bias.bucket(j - pos)] += dS;
          if (bias.slopes) r.dslopes[h] -= dS * std::abs(d);
        }
      }
    }
  }
  return r;
}

}  // namespace pygpt::test
