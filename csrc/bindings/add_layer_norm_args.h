// The argument checks of pygpt.add_layer_norm (add_layer_norm.cpp), shared by its CPU and CUDA
// bindings; its backward's are layer_norm's (layer_norm_args.h) and check_same_as_x's.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace pygpt {

// residual has x's shape, dtype and device; weight and bias, when given, are (C,) for x (..., C),
// with x's dtype and device. eps is non-negative.
void check_add_layer_norm_args(const at::Tensor& x, const at::Tensor& residual,
                               const std::optional<at::Tensor>& weight,
                               const std::optional<at::Tensor>& bias, double eps, const char* op);

}  // namespace pygpt
