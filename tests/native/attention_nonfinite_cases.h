// NaN propagation through the attention kernels (CPU and CUDA share these cases): one NaN in q,
// k or v must make NaN exactly the results that depend on it, never the zeros of a row that sees
// no key. The runner (the kernel under test) maps dense (B, H, T, D) inputs to its results in
// double; the expectations come from the mask alone:
//   q[r] NaN: out and lse row r (if it sees a key) are NaN, all other rows finite; backward: dq
//     row r and the dk, dv rows of the keys r sees have NaN.
//   k[c] NaN: the out and lse rows that see key c are NaN, all others finite; backward: their dq
//     rows and the dk, dv rows of every key they see have NaN.
//   v[c] NaN: the out rows that see c have NaN; lse and dv stay finite everywhere (the scores and
//     P do not involve v); backward: those rows' dq and the dk of every key they see have NaN.
// Everywhere: rows that see no key give out = 0, lse = -inf and dq = 0 exactly, and the other
// heads stay finite. (A masked key's NaN value may reach rows of the same kernel tile through a
// 0 weight, as in the dense reference, so for v and the backward only the rows that must be NaN
// are checked, not that all others are finite.)
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "common/attention_shape.h"
#include "test_support.h"

namespace pygpt::test {

struct AttentionResults {
  std::vector<double> out, lse, dq, dk, dv;
};

namespace nonfinite_detail {

// What a row of a result must be.
enum class Row { kAny, kFinite, kNaN, kZero, kNegInf };

// Checks rows (B*H*T rows of width D) of x against their expectations.
inline void expect_rows(const std::string& what, const std::vector<double>& x, int64_t D,
                        const std::vector<Row>& rows) {
  size_t bad = 0, first = rows.size();
  for (size_t r = 0; r < rows.size(); ++r) {
    bool any_nan = false, all_finite = true, all_zero = true, all_neg_inf = true;
    for (int64_t c = 0; c < D; ++c) {
      const double e = x[r * D + c];
      any_nan = any_nan || std::isnan(e);
      all_finite = all_finite && std::isfinite(e);
      all_zero = all_zero && e == 0.0;
      all_neg_inf = all_neg_inf && e == -std::numeric_limits<double>::infinity();
    }
    const bool ok = rows[r] == Row::kAny || (rows[r] == Row::kFinite && all_finite) ||
                    (rows[r] == Row::kNaN && (any_nan || D == 0)) ||
                    (rows[r] == Row::kZero && all_zero) || (rows[r] == Row::kNegInf && all_neg_inf);
    if (!ok && bad++ == 0) first = r;
  }
  check(bad == 0,
        format("%s: %zu rows not as expected (first: row %zu)", what.c_str(), bad, first));
}

}  // namespace nonfinite_detail

// run(shape, q, k, v, dout) -> AttentionResults, all dense contiguous, in double.
template <typename Run>
void check_nan_propagation(const std::string& kernel, Run&& run, Rng& rng) {
  using nonfinite_detail::Row;
  struct Shape {
    int64_t B, H, Tq, Tk, D;
    bool causal;
  };
  const Shape shapes[] = {{1, 2, 9, 9, 8, true},  {2, 2, 9, 9, 8, false},
                          {1, 2, 5, 70, 8, true}, {1, 1, 70, 5, 4, true},
                          {1, 1, 70, 70, 8, true}, {1, 2, 33, 40, 4, false}};
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const Shape& sh : shapes) {
    const AttentionShape s{sh.B, sh.H, sh.Tq, sh.Tk, sh.D, sh.D, sh.causal,
                           1.0 / std::sqrt(static_cast<double>(sh.D))};
    auto visible = [&](int64_t i) {
      return s.causal ? std::clamp<int64_t>(i + 1 + s.Tk - s.Tq, 0, s.Tk) : s.Tk;
    };
    for (const char which : {'q', 'k', 'v'}) {
      const int64_t T = which == 'q' ? s.Tq : s.Tk;
      for (const int64_t t : {int64_t{0}, T / 2, T - 1}) {
        const int64_t BH = s.B * s.H, bh = BH - 1;  // the poisoned (batch, head): the last
        std::vector<double> q = rng.normal_vector<double>(BH * s.Tq * sh.D);
        std::vector<double> k = rng.normal_vector<double>(BH * s.Tk * sh.D);
        std::vector<double> v = rng.normal_vector<double>(BH * s.Tk * sh.D);
        const std::vector<double> dout = rng.normal_vector<double>(BH * s.Tq * sh.D);
        (which == 'q' ? q : which == 'k' ? k : v)[(bh * T + t) * sh.D] = nan;
        const AttentionResults got = run(s, q, k, v, dout);

        // Which query rows depend on the poison, and the keys those rows see.
        std::vector<bool> hit(s.Tq, false);
        int64_t keys_of_hit = 0;
        for (int64_t i = 0; i < s.Tq; ++i) {
          hit[i] = visible(i) > 0 && (which == 'q' ? i == t : visible(i) > t);
          if (hit[i]) keys_of_hit = std::max(keys_of_hit, visible(i));
        }
        auto rows = [&](int64_t T_, auto&& of_row) {  // per (bh', row) expectations
          std::vector<Row> r(BH * T_);
          for (int64_t h = 0; h < BH; ++h)
            for (int64_t i = 0; i < T_; ++i) r[h * T_ + i] = h == bh ? of_row(i) : Row::kFinite;
          return r;
        };
        auto query_row = [&](bool nan_if_hit, bool others_finite, Row keyless) {
          return [=, &hit, &visible](int64_t i) {
            if (visible(i) == 0) return keyless;
            if (hit[i] && nan_if_hit) return Row::kNaN;
            return others_finite ? Row::kFinite : Row::kAny;
          };
        };
        auto key_row = [&](bool nan_if_seen) {
          return [=](int64_t j) { return nan_if_seen && j < keys_of_hit ? Row::kNaN : Row::kAny; };
        };
        const std::string name = format("%s NaN propagation B=%ld H=%ld Tq=%ld Tk=%ld %s %c[%ld]",
                                        kernel.c_str(), (long)s.B, (long)s.H, (long)s.Tq,
                                        (long)s.Tk, s.causal ? "causal" : "full", which, (long)t);
        const bool scores = which != 'v';  // the poison is in the scores (else only in values)
        using nonfinite_detail::expect_rows;
        expect_rows(name + " out", got.out, sh.D, rows(s.Tq, query_row(true, scores, Row::kZero)));
        expect_rows(name + " lse", got.lse, 1,
                    rows(s.Tq, query_row(scores, true, Row::kNegInf)));
        expect_rows(name + " dq", got.dq, sh.D, rows(s.Tq, query_row(true, false, Row::kZero)));
        expect_rows(name + " dk", got.dk, sh.D, rows(s.Tk, key_row(true)));
        if (scores) {
          expect_rows(name + " dv", got.dv, sh.D, rows(s.Tk, key_row(true)));
        } else {
          expect_rows(name + " dv", got.dv, sh.D, rows(s.Tk, [](int64_t) { return Row::kFinite; }));
        }
      }
    }
  }
}

}  // namespace pygpt::test
