// Fused softmax cross-entropy on the CPU: framework-free math.
//
// logits (N, V) rows with unit column stride and a given row stride; targets (N,) int64, already
// checked by the caller to lie in [0, V) or equal ignore_index. The forward keeps only the per-row
// log-sum-exp; the backward rebuilds softmax from it and writes the logits gradient in one pass.
#pragma once

#include <cstdint>

namespace pygpt::cpu {

// Writes lse[i] for rows [row_begin, row_end) and returns the sum of (lse[i] - logits[i, target[i]])
// over the rows whose target is not ignore_index (ignored rows still get their lse).
template <typename T>
double cross_entropy_forward(const T* logits, int64_t row_stride, const int64_t* targets, int64_t V,
                             int64_t ignore_index, T* lse, int64_t row_begin, int64_t row_end);

// grad_logits[i, :] = (softmax(logits[i]) - onehot(target[i])) * grad_scale for rows
// [row_begin, row_end); rows whose target is ignore_index get zeros. grad_logits is contiguous
// (N, V). grad_scale is the upstream gradient of the mean loss divided by the non-ignored count.
template <typename T>
void cross_entropy_backward(const T* logits, int64_t row_stride, const int64_t* targets,
                            const T* lse, int64_t V, int64_t ignore_index, T grad_scale,
                            T* grad_logits, int64_t row_begin, int64_t row_end);

}  // namespace pygpt::cpu
