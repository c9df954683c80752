// How the cross-entropy tests (CPU and CUDA) draw their logits and targets, so both exercise the
// same kinds of rows.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "test_support.h"

namespace pygpt::test {

// The label smoothings every test runs with: none (the unsmoothed path), some, and all (the
// target's own term then has weight 0).
constexpr double kLabelSmoothings[] = {0.0, 0.1, 1.0};

enum class Pattern {
  kNormal,      // N(0, stddev^2)
  kRising,      // a ramp up the row plus noise: the running max keeps growing
  kFalling,     // a ramp down the row plus noise
  kMaskedTail,  // normal, with the second half of each row -inf (a masked vocabulary)
};

// Fills row[0, row_stride) with logits of V classes drawn as `pattern`; the columns past V are
// padding (1e30) that a kernel must never read.
template <typename T>
void draw_logit_row(Pattern pattern, int64_t V, int64_t row_stride, double stddev, Rng& rng,
                    T* row) {
  for (int64_t j = 0; j < row_stride; ++j) {
    const double ramp = V > 1 ? 8.0 * j / (V - 1) : 0.0;
    double value = stddev * rng.normal();
    if (pattern == Pattern::kRising) value += ramp;
    if (pattern == Pattern::kFalling) value -= ramp;
    if (pattern == Pattern::kMaskedTail && j >= (V + 1) / 2) {
      value = -std::numeric_limits<double>::infinity();
    }
    if (j >= V) value = 1e30;
    row[j] = static_cast<T>(value);
  }
}

// ignore_index with probability ignored_fraction (always when no class is visible), else a
// class the pattern leaves visible.
inline int64_t draw_target(Pattern pattern, int64_t V, double ignored_fraction,
                           int64_t ignore_index, Rng& rng) {
  const int64_t visible = pattern == Pattern::kMaskedTail ? (V + 1) / 2 : V;
  return rng.uniform() < ignored_fraction || visible == 0 ? ignore_index
                                                          : rng.integer(0, visible);
}

// Rows that hold NaN, +inf or only -inf, with their targets (ignore_index marks row 4): the
// kernels must give NaN lse and gradients for rows 2, 3 and 6, lse -inf for row 1, finite results
// for rows 0 and 5, and a zero gradient for the ignored row 4.
constexpr int64_t kNonFiniteRows = 7, kNonFiniteV = 5, kNonFiniteIgnoredRow = 4;

template <typename T>
std::vector<T> non_finite_logits() {
  const T inf = std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN();
  return {
      0,    1,    2,    3,    4,     // finite
      -inf, -inf, -inf, -inf, -inf,  // all -inf
      0,    nan,  2,    3,    4,     // NaN
      0,    1,    inf,  3,    4,     // +inf
      0,    nan,  inf,  3,    4,     // NaN and +inf, target ignored
      -inf, 1,    -inf, 3,    -inf,  // partly -inf: finite
      -inf, nan,  -inf, -inf, -inf,  // NaN among -inf
  };
}

inline std::vector<int64_t> non_finite_targets(int64_t ignore_index) {
  return {2, 0, 1, 4, ignore_index, 1, 3};
}

}  // namespace pygpt::test
