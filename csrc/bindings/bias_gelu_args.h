// The argument checks of pygpt.bias_gelu and its backward (bias_gelu.cpp), shared by their CPU
// and CUDA bindings.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include "common/gelu_approximation.h"

namespace pygpt {

// x (..., C) with at least one dimension; bias (C,) with x's dtype and device.
void check_bias_gelu_args(const at::Tensor& x, const at::Tensor& bias, const char* op);

// The GELU F.gelu's `approximate` names: "none" (exact) or "tanh"; anything else is refused.
GeluApproximation gelu_approximation(c10::string_view approximate, const char* op);

}  // namespace pygpt
