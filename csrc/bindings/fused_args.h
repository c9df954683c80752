// Argument checks of the fused ops (bias_gelu, add_layer_norm), shared by their CPU and CUDA
// bindings. Each failure raises a c10::Error naming the op, the argument and what was expected.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace pygpt {

// x (..., C) with at least one dimension; bias (C,) with x's dtype and device.
void check_bias_gelu_args(const at::Tensor& x, const at::Tensor& bias, const char* op);

// grad (named `name`) has x's shape, dtype and device.
void check_same_as_x(const at::Tensor& grad, const char* name, const at::Tensor& x,
                     const char* op);

// residual has x's shape, dtype and device; weight and bias, when given, are (C,) for x (..., C),
// with x's dtype and device. eps is non-negative.
void check_add_layer_norm_args(const at::Tensor& x, const at::Tensor& residual,
                               const std::optional<at::Tensor>& weight,
                               const std::optional<at::Tensor>& bias, double eps, const char* op);

}  // namespace pygpt
