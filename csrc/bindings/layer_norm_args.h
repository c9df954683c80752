// The argument checks of pygpt.layer_norm and its backward (layer_norm.cpp), shared by their CPU
// and CUDA bindings and by add_layer_norm's.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace pygpt {

// weight and bias, when given, are (C,) for x (..., C), with x's dtype and device.
void check_layer_norm_args(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                           const std::optional<at::Tensor>& bias, const char* op);

}  // namespace pygpt
