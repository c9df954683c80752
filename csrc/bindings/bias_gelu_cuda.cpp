// CUDA binding of pygpt.bias_gelu and its backward.
#include <ATen/ops/empty.h>
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
  const c10::cuda::CUDAGuard guard(x_in.device());
  const BiasGeluArgs a = bias_gelu_args(x_in, bias_in, approximate, op);
  C10_CUDA_CHECK(cuda::bias_gelu_forward(cuda_dtype(a.x), a.x.const_data_ptr(),
                                         a.bias.const_data_ptr(), a.out.data_ptr(), a.N, a.C,
                                         a.gelu, current_stream()));
  return a.out;
}

std::tuple<at::Tensor, at::Tensor> bias_gelu_backward_cuda(const at::Tensor& grad_y_in,
                                                           const at::Tensor& x_in,
                                                           const at::Tensor& bias_in,
                                                           bool bias_grad,
                                                           c10::string_view approximate) {
  const char* op = "pygpt.bias_gelu_backward";
  check_cuda_float(x_in, op, "x");
  const c10::cuda::CUDAGuard guard(x_in.device());
  const BiasGeluArgs a = bias_gelu_backward_args(grad_y_in, x_in, bias_in, approximate, op);
  at::Tensor dbias = at::empty({bias_grad ? a.C : 0}, a.x.options());
  at::Tensor scratch =
      workspace(bias_grad ? cuda::bias_gelu_backward_workspace_bytes(a.N, a.C) : 0, a.x);
  C10_CUDA_CHECK(cuda::bias_gelu_backward(
      cuda_dtype(a.x), a.grad_y.const_data_ptr(), a.x.const_data_ptr(), a.bias.const_data_ptr(),
      a.out.data_ptr(), bias_grad ? dbias.data_ptr() : nullptr, a.N, a.C,
      bias_grad ? scratch.data_ptr() : nullptr, a.gelu, current_stream()));
  return {a.out, dbias};
}

}  // namespace

TORCH_LIBRARY_IMPL(pygpt, CUDA, m) {
  m.impl("bias_gelu", &bias_gelu_cuda);
  m.impl("bias_gelu_backward", &bias_gelu_backward_cuda);
}

}  // namespace pygpt
