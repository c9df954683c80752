// CUDA binding of pygpt.layer_norm and its backward. mean and rstd are float32 on CUDA.
#include <ATen/ops/empty.h>
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

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_cuda(
    const at::Tensor& x_in, const std::optional<at::Tensor>& weight_in,
    const std::optional<at::Tensor>& bias_in, double eps) {
  const char* op = "pygpt.layer_norm";
  check_cuda_float(x_in, op, "x");
  const c10::cuda::CUDAGuard guard(x_in.device());
  const LayerNormArgs a = layer_norm_args(x_in, weight_in, bias_in, eps, at::kFloat, op);
  C10_CUDA_CHECK(cuda::layer_norm_forward(
      cuda_dtype(a.x), a.x.const_data_ptr(), data_or_null(a.weight), data_or_null(a.bias),
      a.out.data_ptr(), a.mean.data_ptr<float>(), a.rstd.data_ptr<float>(), a.N, a.C, eps,
      current_stream()));
  return {a.out, a.mean, a.rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward_cuda(
    const at::Tensor& grad_y_in, const at::Tensor& x_in,
    const std::optional<at::Tensor>& weight_in, const at::Tensor& mean_in,
    const at::Tensor& rstd_in, bool weight_grad, bool bias_grad) {
  const char* op = "pygpt.layer_norm_backward";
  check_cuda_float(x_in, op, "x");
  const c10::cuda::CUDAGuard guard(x_in.device());
  const LayerNormArgs a =
      layer_norm_backward_args(grad_y_in, x_in, weight_in, mean_in, rstd_in, op);
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
  at::Tensor dweight = at::empty({weight_grad ? a.C : 0}, a.x.options());
  at::Tensor dbias = at::empty({bias_grad ? a.C : 0}, a.x.options());
  at::Tensor scratch = workspace(cuda::layer_norm_backward_workspace_bytes(a.N, a.C), a.x);
  C10_CUDA_CHECK(cuda::layer_norm_backward(
      cuda_dtype(a.x), a.grad_y.const_data_ptr(), a.x.const_data_ptr(), data_or_null(a.weight),
      a.mean.const_data_ptr<float>(), a.rstd.const_data_ptr<float>(), a.out.data_ptr(),
      weight_grad ? dweight.data_ptr() : nullptr, bias_grad ? dbias.data_ptr() : nullptr, a.N,
      a.C, scratch.data_ptr(), current_stream()));
  return {a.out, dweight, dbias};
}

}  // namespace

TORCH_LIBRARY_IMPL(pygpt, CUDA, m) {
  m.impl("layer_norm", &layer_norm_cuda);
  m.impl("layer_norm_backward", &layer_norm_backward_cuda);
}

}  // namespace pygpt
