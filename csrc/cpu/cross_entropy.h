// Fused softmax cross-entropy on the CPU: framework-free math.
//
// logits (N, V) rows with unit column stride and a given row stride; targets (N,) int64, already
// checked by the caller to lie in [0, V) or equal ignore_index. The forward keeps only the per-row
// log-sum-exp; the backward rebuilds softmax from it and writes the logits gradient in one pass.
//
// Label smoothing s (in [0, 1], checked by the caller) follows F.cross_entropy: the target
// distribution is (1 - s) * onehot(target) + s / V, so a row's loss is
// (1 - s) * (lse - x[target]) + s * (lse - mean_j x[j]) and its gradient
// softmax - (1 - s) * onehot(target) - s / V. With s > 0 the forward also sums each row's logits,
// in the same sweep as its log-sum-exp; s == 0 is exactly the unsmoothed computation.
#pragma once

#include "cpu/isa.h"

#include <cstdint>

namespace pygpt::cpu {
inline namespace PYGPT_CPU_ISA {

// Writes lse[i] for rows [row_begin, row_end) and returns the sum of the row losses
// (lse[i] - logits[i, target[i]] when label_smoothing is 0) over the rows whose target is not
// ignore_index (ignored rows still get their lse).
template <typename T>
double cross_entropy_forward(const T* logits, int64_t row_stride, const int64_t* targets, int64_t V,
                             int64_t ignore_index, double label_smoothing, T* lse,
                             int64_t row_begin, int64_t row_end);

// grad_logits[i, :] = (softmax(logits[i]) - (1 - s) * onehot(target[i]) - s / V) * grad_scale
// for rows [row_begin, row_end), s = label_smoothing; rows whose target is ignore_index get zeros.
// grad_logits is contiguous (N, V). grad_scale is the upstream gradient of the mean loss divided
// by the non-ignored count.
template <typename T>
void cross_entropy_backward(const T* logits, int64_t row_stride, const int64_t* targets,
                            const T* lse, int64_t V, int64_t ignore_index, double label_smoothing,
                            T grad_scale, T* grad_logits, int64_t row_begin, int64_t row_end);

}  // namespace PYGPT_CPU_ISA
}  // namespace pygpt::cpu
