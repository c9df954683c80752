// The residual add fused into the layer norm that follows it, on the CPU: framework-free math.
//
// sum = x + residual, y = layer_norm(sum): a pre-norm transformer adds a sub-layer's output to
// the residual stream and normalises the result for the next sub-layer; a post-norm one
// normalises x + sublayer(x). Rows (N, C), contiguous, independent: the caller splits [0, N)
// into ranges and runs them in parallel, as for layer_norm.h, whose kernels these reuse on
// cache-sized blocks of rows (the sum is written and normalised while still in cache).
#pragma once

#include "cpu/isa.h"

#include <cstdint>

namespace pygpt::cpu {
inline namespace PYGPT_CPU_ISA {

// sum = x + residual and y = (sum - mean) * rstd * weight + bias for rows [row_begin,
// row_end); saves mean and rstd per row. weight and bias may be null.
template <typename T>
void add_layer_norm_forward(const T* x, const T* residual, const T* weight, const T* bias, T* sum,
                            T* y, T* mean, T* rstd, int64_t C, double eps, int64_t row_begin,
                            int64_t row_end);

// dx = d(sum) for rows [row_begin, row_end): the layer norm's backward through y plus grad_sum,
// the gradient that reaches sum from its other uses (may be null: none). dx is the gradient of
// both x and residual. Adds the rows' weight/bias gradients into dweight_partial and
// dbias_partial (length C, may be null when not wanted), as layer_norm_backward.
template <typename T>
void add_layer_norm_backward(const T* grad_y, const T* grad_sum, const T* sum, const T* weight,
                             const T* mean, const T* rstd, T* dx, T* dweight_partial,
                             T* dbias_partial, int64_t C, int64_t row_begin, int64_t row_end);

}  // namespace PYGPT_CPU_ISA
}  // namespace pygpt::cpu
