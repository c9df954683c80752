// Layer normalisation over the last dimension on the CPU: framework-free math.
//
// x is viewed as (N, C) rows, contiguous. Rows are independent, so the caller splits [0, N) into
// ranges and runs them in parallel; the weight/bias gradients are summed per range into caller-owned
// partial buffers that the caller then adds up (a two-stage reduction with no atomics).
#pragma once

#include "cpu/isa.h"

#include <cstdint>

namespace pygpt::cpu {
inline namespace PYGPT_CPU_ISA {

// y = (x - mean) * rstd * weight + bias for rows [row_begin, row_end); saves mean and rstd per row.
// weight and bias may be null (no affine transform / no bias).
template <typename T>
void layer_norm_forward(const T* x, const T* weight, const T* bias, T* y, T* mean, T* rstd,
                        int64_t C, double eps, int64_t row_begin, int64_t row_end);

// dx for rows [row_begin, row_end), and adds those rows' contribution to dweight_partial and
// dbias_partial (length C, may be null when not wanted). weight may be null (treated as ones).
template <typename T>
void layer_norm_backward(const T* grad_y, const T* x, const T* weight, const T* mean, const T* rstd,
                         T* dx, T* dweight_partial, T* dbias_partial, int64_t C, int64_t row_begin,
                         int64_t row_end);

}  // namespace PYGPT_CPU_ISA
}  // namespace pygpt::cpu
