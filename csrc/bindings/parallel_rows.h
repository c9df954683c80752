// How the row-wise CPU kernels (layer norm, cross-entropy) split their rows across threads.
#pragma once

#include <algorithm>
#include <cstdint>

namespace pygpt {

// Elements a task should at least touch (ATen's own grain for elementwise work): below it, waking a
// second thread costs more than it saves.
constexpr int64_t kGrainElements = 32768;

// Rows per task for rows of row_length elements.
inline int64_t row_grain(int64_t row_length) {
  return std::max<int64_t>(1, kGrainElements / std::max<int64_t>(1, row_length));
}

}  // namespace pygpt
