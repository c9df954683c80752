// CUDA binding of pygpt.layer_norm and its backward. mean and rstd are float32 on CUDA.
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

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

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_cuda(
    const at::Tensor& x_in, const std::optional<at::Tensor>& weight_in,
    const std::optional<at::Tensor>& bias_in, double eps) {
  const char* op = "pygpt.layer_norm";
  check_cuda_float(x_in, op, "x");
  check_layer_norm_args(x_in, weight_in, bias_in, op);
  TORCH_CHECK_VALUE(eps >= 0, op, ": eps must be non-negative, got ", eps);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  const auto weight = contiguous(weight_in), bias = contiguous(bias_in);
  const int64_t C = x.size(-1), N = C > 0 ? x.numel() / C : 0;
  at::Tensor y = at::empty_like(x);
  at::Tensor mean = at::empty(x.sizes().slice(0, x.dim() - 1), x.options().dtype(at::kFloat));
  at::Tensor rstd = at::empty_like(mean);
  C10_CUDA_CHECK(cuda::layer_norm_forward(cuda_dtype(x), x.const_data_ptr(), data_or_null(weight),
                                          data_or_null(bias), y.data_ptr(),
                                          mean.data_ptr<float>(), rstd.data_ptr<float>(), N, C,
                                          eps, current_stream()));
  return {y, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward_cuda(
    const at::Tensor& grad_y_in, const at::Tensor& x_in,
    const std::optional<at::Tensor>& weight_in, const at::Tensor& mean_in,
    const at::Tensor& rstd_in, bool weight_grad, bool bias_grad) {
  const char* op = "pygpt.layer_norm_backward";
  check_cuda_float(x_in, op, "x");
  check_layer_norm_args(x_in, weight_in, std::nullopt, op);
  check_matches(grad_y_in, "grad_y", x_in, "x", op);
  TORCH_CHECK(grad_y_in.sizes() == x_in.sizes(), op, ": grad_y must have x's shape ",
              x_in.sizes(), ", got ", grad_y_in.sizes());
  const auto row_shape = x_in.sizes().slice(0, x_in.dim() - 1);
  for (const auto& [t, name] : {std::pair{&mean_in, "mean"}, std::pair{&rstd_in, "rstd"}}) {
    TORCH_CHECK(t->device() == x_in.device() && t->scalar_type() == at::kFloat &&
                    t->sizes() == row_shape,
                op, ": ", name, " must be a float32 tensor of shape ", row_shape, " on ",
                x_in.device());
  }
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous(), grad_y = grad_y_in.contiguous();
  const at::Tensor mean = mean_in.contiguous(), rstd = rstd_in.contiguous();
  const auto weight = contiguous(weight_in);
  const int64_t C = x.size(-1), N = C > 0 ? x.numel() / C : 0;
  at::Tensor dx = at::empty_like(x);
  at::Tensor dweight = at::empty({weight_grad ? C : 0}, x.options());
  at::Tensor dbias = at::empty({bias_grad ? C : 0}, x.options());
  at::Tensor scratch = workspace(cuda::layer_norm_backward_workspace_bytes(N, C), x);
  C10_CUDA_CHECK(cuda::layer_norm_backward(
      cuda_dtype(x), grad_y.const_data_ptr(), x.const_data_ptr(), data_or_null(weight),
      mean.const_data_ptr<float>(), rstd.const_data_ptr<float>(), dx.data_ptr(),
      weight_grad ? dweight.data_ptr() : nullptr, bias_grad ? dbias.data_ptr() : nullptr, N, C,
      scratch.data_ptr(), current_stream()));
  return {dx, dweight, dbias};
}

}  // namespace

TORCH_LIBRARY_IMPL(pygpt, CUDA, m) {
  m.impl("layer_norm", &layer_norm_cuda);
  m.impl("layer_norm_backward", &layer_norm_backward_cuda);
}

}  // namespace pygpt
