// CUDA binding of pygpt.add_layer_norm and its backward (the layer norm kernels with a residual
// input, cuda/layer_norm.h). mean and rstd are float32 on CUDA.
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "bindings/add_layer_norm_args.h"
#include "bindings/checks.h"
#include "bindings/cuda_utils.h"
#include "cuda/layer_norm.h"

namespace pygpt {
namespace {

const void* data_or_null(const std::optional<at::Tensor>& t) {
  return t.has_value() ? t->const_data_ptr() : nullptr;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> add_layer_norm_cuda(
    const at::Tensor& x_in, const at::Tensor& residual_in,
    const std::optional<at::Tensor>& weight_in, const std::optional<at::Tensor>& bias_in,
    double eps) {
  const char* op = "pygpt.add_layer_norm";
  check_cuda_float(x_in, op, "x");
  const c10::cuda::CUDAGuard guard(x_in.device());
  const AddLayerNormArgs a =
      add_layer_norm_args(x_in, residual_in, weight_in, bias_in, eps, at::kFloat, op);
  C10_CUDA_CHECK(cuda::add_layer_norm_forward(
      cuda_dtype(a.x), a.x.const_data_ptr(), a.residual.const_data_ptr(), data_or_null(a.weight),
      data_or_null(a.bias), a.sum.data_ptr(), a.out.data_ptr(), a.mean.data_ptr<float>(),
      a.rstd.data_ptr<float>(), a.N, a.C, eps, current_stream()));
  return {a.sum, a.out, a.mean, a.rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> add_layer_norm_backward_cuda(
    const at::Tensor& grad_y_in, const std::optional<at::Tensor>& grad_sum_in,
    const at::Tensor& sum_in, const std::optional<at::Tensor>& weight_in,
    const at::Tensor& mean_in, const at::Tensor& rstd_in, bool weight_grad, bool bias_grad) {
  const char* op = "pygpt.add_layer_norm_backward";
  check_cuda_float(sum_in, op, "sum");
  const c10::cuda::CUDAGuard guard(sum_in.device());
  const AddLayerNormArgs a = add_layer_norm_backward_args(grad_y_in, grad_sum_in, sum_in,
                                                          weight_in, mean_in, rstd_in, op);
  const auto row_shape = sum_in.sizes().slice(0, sum_in.dim() - 1);
  for (const auto& [t, name] : {std::pair{&mean_in, "mean"}, std::pair{&rstd_in, "rstd"}}) {
    TORCH_CHECK(t->device() == sum_in.device() && t->scalar_type() == at::kFloat &&
                    t->sizes() == row_shape,
                op, ": ", name, " must be a float32 tensor of shape ", row_shape, " on ",
                sum_in.device());
  }
  at::Tensor dweight = at::empty({weight_grad ? a.C : 0}, a.sum.options());
  at::Tensor dbias = at::empty({bias_grad ? a.C : 0}, a.sum.options());
  at::Tensor scratch = workspace(cuda::layer_norm_backward_workspace_bytes(a.N, a.C), a.sum);
  C10_CUDA_CHECK(cuda::add_layer_norm_backward(
      cuda_dtype(a.sum), a.grad_y.const_data_ptr(), data_or_null(a.grad_sum),
      a.sum.const_data_ptr(), data_or_null(a.weight), a.mean.const_data_ptr<float>(),
      a.rstd.const_data_ptr<float>(), a.out.data_ptr(), weight_grad ? dweight.data_ptr() : nullptr,
      bias_grad ? dbias.data_ptr() : nullptr, a.N, a.C, scratch.data_ptr(), current_stream()));
  return {a.out, dweight, dbias};
}

}  // namespace

TORCH_LIBRARY_IMPL(pygpt, CUDA, m) {
  m.impl("add_layer_norm", &add_layer_norm_cuda);
  m.impl("add_layer_norm_backward", &add_layer_norm_backward_cuda);
}

}  // namespace pygpt
