// The argument checks and preparation of pygpt.add_layer_norm and its backward
// (add_layer_norm.cpp), shared by their CPU and CUDA bindings; each binding checks the device and
// dtype of x (the backward's: sum) first.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace pygpt {

// A checked add_layer_norm call, ready for a kernel, its tensors contiguous (copies only where
// they were not): sum as N rows of C, the forward's new output x + residual and the backward's
// input; weight and bias when given (the backward takes no bias); out, a new tensor of sum's
// shape (the forward's y, the backward's dx); mean and rstd of sum's leading shape, the
// forward's new outputs and the backward's inputs. x and residual only in the forward's,
// grad_y and grad_sum (when given) only in the backward's.
struct AddLayerNormArgs {
  at::Tensor x, residual, grad_y, sum, out, mean, rstd;
  std::optional<at::Tensor> grad_sum, weight, bias;
  int64_t C, N;
};

// The forward's: weight and bias as layer_norm's (check_layer_norm_args), residual with x's
// shape, dtype and device, eps non-negative. mean and rstd get stats_dtype (x's on the CPU,
// float32 on CUDA).
AddLayerNormArgs add_layer_norm_args(const at::Tensor& x, const at::Tensor& residual,
                                     const std::optional<at::Tensor>& weight,
                                     const std::optional<at::Tensor>& bias, double eps,
                                     at::ScalarType stats_dtype, const char* op);

// The backward's: weight as layer_norm's, grad_y and grad_sum (when given) with sum's shape,
// dtype and device. mean and rstd are only made contiguous: their checks differ by device (sum's
// dtype on the CPU, float32 on CUDA), so each binding makes them after this call, on the tensors
// it was given.
AddLayerNormArgs add_layer_norm_backward_args(const at::Tensor& grad_y,
                                              const std::optional<at::Tensor>& grad_sum,
                                              const at::Tensor& sum,
                                              const std::optional<at::Tensor>& weight,
                                              const at::Tensor& mean, const at::Tensor& rstd,
                                              const char* op);

}  // namespace pygpt
