// CUDA binding of pygpt.add_layer_norm and its backward (the layer norm kernels with a residual
// input, cuda/layer_norm.h). mean and rstd are float32 on CUDA.
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include "bindings/add_layer_norm_args.h"
#include "bindings/checks.h"
#include "bindings/cuda_utils.h"
#include "bindings/layer_norm_args.h"
#include "cuda/layer_norm.h"

namespace pygpt {
namespace {

const void* data_or_null(const std::optional<at::Tensor>& t) {
  return t.has_value() ? t->const_data_ptr() : nullptr;
}

std::optional<at::Tensor> contiguous(const std::optional<at::Tensor>& t) {
  return t.has_value() ? std::optional<at::Tensor>(t->contiguous()) : std::nullopt;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> add_layer_norm_cuda(
    const at::Tensor& x_in, const at::Tensor& residual_in,
    const std::optional<at::Tensor>& weight_in, const std::optional<at::Tensor>& bias_in,
    double eps) {
  const char* op = "pygpt.add_layer_norm";
  check_cuda_float(x_in, op, "x");
  check_add_layer_norm_args(x_in, residual_in, weight_in, bias_in, eps, op);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous(), residual = residual_in.contiguous();
  const auto weight = contiguous(weight_in), bias = contiguous(bias_in);
  const int64_t C = x.size(-1), N = C > 0 ? x.numel() / C : 0;
  at::Tensor sum = at::empty_like(x, at::MemoryFormat::Contiguous);
  at::Tensor y = at::empty_like(sum);
  at::Tensor mean = at::empty(x.sizes().slice(0, x.dim() - 1), x.options().dtype(at::kFloat));
  at::Tensor rstd = at::empty_like(mean);
  C10_CUDA_CHECK(cuda::add_layer_norm_forward(
      cuda_dtype(x), x.const_data_ptr(), residual.const_data_ptr(), data_or_null(weight),
      data_or_null(bias), sum.data_ptr(), y.data_ptr(), mean.data_ptr<float>(),
      rstd.data_ptr<float>(), N, C, eps, current_stream()));
  return {sum, y, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> add_layer_norm_backward_cuda(
    const at::Tensor& grad_y_in, const std::optional<at::Tensor>& grad_sum_in,
    const at::Tensor& sum_in, const std::optional<at::Tensor>& weight_in,
    const at::Tensor& mean_in, const at::Tensor& rstd_in, bool weight_grad, bool bias_grad) {
  const char* op = "pygpt.add_layer_norm_backward";
  check_cuda_float(sum_in, op, "sum");
  check_layer_norm_args(sum_in, weight_in, std::nullopt, op);
  check_same_as_x(grad_y_in, "grad_y", sum_in, op);
  if (grad_sum_in.has_value()) check_same_as_x(*grad_sum_in, "grad_sum", sum_in, op);
  const auto row_shape = sum_in.sizes().slice(0, sum_in.dim() - 1);
  for (const auto& [t, name] : {std::pair{&mean_in, "mean"}, std::pair{&rstd_in, "rstd"}}) {
    TORCH_CHECK(t->device() == sum_in.device() && t->scalar_type() == at::kFloat &&
                    t->sizes() == row_shape,
                op, ": ", name, " must be a float32 tensor of shape ", row_shape, " on ",
                sum_in.device());
  }
  const c10::cuda::CUDAGuard guard(sum_in.device());
  const at::Tensor sum = sum_in.contiguous(), grad_y = grad_y_in.contiguous();
  const at::Tensor mean = mean_in.contiguous(), rstd = rstd_in.contiguous();
  const auto grad_sum = contiguous(grad_sum_in), weight = contiguous(weight_in);
  const int64_t C = sum.size(-1), N = C > 0 ? sum.numel() / C : 0;
  at::Tensor dx = at::empty_like(sum, at::MemoryFormat::Contiguous);
  at::Tensor dweight = at::empty({weight_grad ? C : 0}, sum.options());
  at::Tensor dbias = at::empty({bias_grad ? C : 0}, sum.options());
  at::Tensor scratch = workspace(cuda::layer_norm_backward_workspace_bytes(N, C), sum);
  C10_CUDA_CHECK(cuda::add_layer_norm_backward(
      cuda_dtype(sum), grad_y.const_data_ptr(), data_or_null(grad_sum), sum.const_data_ptr(),
      data_or_null(weight), mean.const_data_ptr<float>(), rstd.const_data_ptr<float>(),
      dx.data_ptr(), weight_grad ? dweight.data_ptr() : nullptr,
      bias_grad ? dbias.data_ptr() : nullptr, N, C, scratch.data_ptr(), current_stream()));
  return {dx, dweight, dbias};
}

}  // namespace

TORCH_LIBRARY_IMPL(pygpt, CUDA, m) {
  m.impl("add_layer_norm", &add_layer_norm_cuda);
  m.impl("add_layer_norm_backward", &add_layer_norm_backward_cuda);
}

}  // namespace pygpt
