// The argument checks and preparation of pygpt.bias_gelu and its backward (bias_gelu.cpp),
// shared by their CPU and CUDA bindings; each binding checks x's device and dtype first.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <cstdint>

#include "common/gelu_approximation.h"

namespace pygpt {

// A checked bias_gelu call, ready for a kernel: x and bias contiguous (copies only where they
// were not), x as N rows of C, the GELU, and out, a new contiguous tensor of x's shape (the
// forward's y, the backward's dx); grad_y, contiguous, only in the backward's.
struct BiasGeluArgs {
  at::Tensor x, bias, grad_y, out;
  GeluApproximation gelu;
  int64_t C, N;
};

// The forward's: x (..., C) with at least one dimension; bias (C,) with x's dtype and device;
// approximate as F.gelu's, "none" (exact) or "tanh", anything else refused.
BiasGeluArgs bias_gelu_args(const at::Tensor& x, const at::Tensor& bias,
                            c10::string_view approximate, const char* op);

// The backward's: the forward's, then grad_y with x's shape, dtype and device.
BiasGeluArgs bias_gelu_backward_args(const at::Tensor& grad_y, const at::Tensor& x,
                                     const at::Tensor& bias, c10::string_view approximate,
                                     const char* op);

}  // namespace pygpt
