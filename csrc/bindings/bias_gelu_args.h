// The argument checks of pygpt.bias_gelu and its backward (bias_gelu.cpp), shared by their CPU
// and CUDA bindings.
#pragma once

#include <ATen/core/Tensor.h>

namespace pygpt {

// x (..., C) with at least one dimension; bias (C,) with x's dtype and device.
void check_bias_gelu_args(const at::Tensor& x, const at::Tensor& bias, const char* op);

}  // namespace pygpt
