// The argument checks and preparation of pygpt.layer_norm and its backward (layer_norm.cpp),
// shared by their CPU and CUDA bindings (each checks x's device and dtype first), and the checks
// by add_layer_norm's.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace pygpt {

// weight and bias, when given, are (C,) for x (..., C), with x's dtype and device.
void check_layer_norm_args(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                           const std::optional<at::Tensor>& bias, const char* op);

// t contiguous (a copy only where it was not), when given.
inline std::optional<at::Tensor> contiguous_if_given(const std::optional<at::Tensor>& t) {
  return t.has_value() ? std::optional<at::Tensor>(t->contiguous()) : std::nullopt;
}

// A checked layer_norm call, ready for a kernel: x contiguous, as N rows of C; weight and bias
// contiguous when given (the backward takes no bias); out, a new tensor like x (the forward's y,
// the backward's dx). mean and rstd, of x's leading shape: the forward's new outputs, the
// backward's inputs made contiguous. grad_y, contiguous, only in the backward's.
struct LayerNormArgs {
  at::Tensor x, grad_y, out, mean, rstd;
  std::optional<at::Tensor> weight, bias;
  int64_t C, N;
};

// The forward's: check_layer_norm_args's checks, then eps non-negative. mean and rstd get
// stats_dtype (x's on the CPU, float32 on CUDA).
LayerNormArgs layer_norm_args(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                              const std::optional<at::Tensor>& bias, double eps,
                              at::ScalarType stats_dtype, const char* op);

// The backward's: x and weight checked as the forward's. grad_y, mean and rstd are only made
// contiguous: their checks differ by device (mean and rstd have x's dtype on the CPU, float32 on
// CUDA), so each binding makes them after this call, on the tensors it was given.
LayerNormArgs layer_norm_backward_args(const at::Tensor& grad_y, const at::Tensor& x,
                                       const std::optional<at::Tensor>& weight,
                                       const at::Tensor& mean, const at::Tensor& rstd,
                                       const char* op);

}  // namespace pygpt
