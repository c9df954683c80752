// How the cross-entropy tests (CPU and CUDA) draw their logits and targets, so both exercise the
// same kinds of rows.
#pragma once

#include <cstdint>
#include <limits>

#include "test_support.h"

namespace pygpt::test {

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

}  // namespace pygpt::test
