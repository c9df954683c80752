// CUDA binding of pygpt.bias_gelu and its backward.
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include "bindings/bias_gelu_args.h"
#include "bindings/checks.h"
#include "bindings/cuda_utils.h"
#include "cuda/bias_gelu.h"

namespace pygpt {
namespace {

at::Tensor bias_gelu_cuda(const at::Tensor& x_in, const at::Tensor& bias_in,
                          c10::string_view approximate) {
  const char* op = "pygpt.bias_gelu";
  check_cuda_float(x_in, op, "x");
  check_bias_gelu_args(x_in, bias_in, op);
  const GeluApproximation gelu = gelu_approximation(approximate, op);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous(), bias = bias_in.contiguous();
  const int64_t C = x.size(-1), N = C > 0 ? x.numel() / C : 0;
  at::Tensor y = at::empty_like(x, at::MemoryFormat::Contiguous);
  C10_CUDA_CHECK(cuda::bias_gelu_forward(cuda_dtype(x), x.const_data_ptr(), bias.const_data_ptr(),
                                         y.data_ptr(), N, C, gelu, current_stream()));
  return y;
}

std::tuple<at::Tensor, at::Tensor> bias_gelu_backward_cuda(const at::Tensor& grad_y_in,
                                                           const at::Tensor& x_in,
                                                           const at::Tensor& bias_in,
                                                           bool bias_grad,
                                                           c10::string_view approximate) {
  const char* op = "pygpt.bias_gelu_backward";
  check_cuda_float(x_in, op, "x");
  check_bias_gelu_args(x_in, bias_in, op);
  const GeluApproximation gelu = gelu_approximation(approximate, op);
  check_same_as_x(grad_y_in, "grad_y", x_in, op);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous(), bias = bias_in.contiguous();
  const at::Tensor grad_y = grad_y_in.contiguous();
  const int64_t C = x.size(-1), N = C > 0 ? x.numel() / C : 0;
  at::Tensor dx = at::empty_like(x, at::MemoryFormat::Contiguous);
  at::Tensor dbias = at::empty({bias_grad ? C : 0}, x.options());
  at::Tensor scratch =
      workspace(bias_grad ? cuda::bias_gelu_backward_workspace_bytes(N, C) : 0, x);
  C10_CUDA_CHECK(cuda::bias_gelu_backward(
      cuda_dtype(x), grad_y.const_data_ptr(), x.const_data_ptr(), bias.const_data_ptr(),
      dx.data_ptr(), bias_grad ? dbias.data_ptr() : nullptr, N, C,
      bias_grad ? scratch.data_ptr() : nullptr, gelu, current_stream()));
  return {dx, dbias};
}

}  // namespace

TORCH_LIBRARY_IMPL(pygpt, CUDA, m) {
  m.impl("bias_gelu", &bias_gelu_cuda);
  m.impl("bias_gelu_backward", &bias_gelu_backward_cuda);
}

}  // namespace pygpt
