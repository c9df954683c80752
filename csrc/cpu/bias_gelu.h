// Bias + GELU fused, on the CPU: framework-free math.
//
// y = gelu(x + bias), gelu the exact (erf) GELU, gelu(h) = h * Phi(h), Phi the standard normal
// CDF, as F.gelu's default, or its tanh approximation (GeluApproximation::kTanh, F.gelu's
// approximate="tanh"), gelu(h) = h * (1 + tanh(u)) / 2 = h * sigmoid(2u) with
// u = sqrt(2 / pi) * (h + 0.044715 h^3). x is viewed as (N, C) rows, contiguous, bias (C,). Rows
// are independent, so the caller splits [0, N) into ranges and runs them in parallel; the bias
// gradient is summed per range into caller-owned partial buffers that the caller then adds up
// (a two-stage reduction with no atomics, as layer_norm's weight gradient).
#pragma once

#include "common/gelu_approximation.h"
#include "cpu/isa.h"

#include <cstdint>

namespace pygpt::cpu {
inline namespace PYGPT_CPU_ISA {

// y = gelu(x + bias) for rows [row_begin, row_end).
template <typename T>
void bias_gelu_forward(const T* x, const T* bias, T* y, int64_t C, int64_t row_begin,
                       int64_t row_end, GeluApproximation approximate);

// dx = grad_y * gelu'(x + bias) for rows [row_begin, row_end), and adds those rows' dx into
// dbias_partial (length C; may be null when the bias gradient is not wanted).
// Exact: gelu'(h) = Phi(h) + h * phi(h), phi the standard normal density.
// Tanh: gelu'(h) = s + h * s * (1 - s) * 2 du/dh with s = sigmoid(2u),
// du/dh = sqrt(2 / pi) * (1 + 3 * 0.044715 h^2).
template <typename T>
void bias_gelu_backward(const T* grad_y, const T* x, const T* bias, T* dx, T* dbias_partial,
                        int64_t C, int64_t row_begin, int64_t row_end,
                        GeluApproximation approximate);

}  // namespace PYGPT_CPU_ISA
}  // namespace pygpt::cpu
