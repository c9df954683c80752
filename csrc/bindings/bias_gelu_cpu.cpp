// CPU binding of pygpt.bias_gelu and its backward: rows in parallel; the bias gradient is
// reduced in two stages (bindings/row_partials.h).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include "bindings/bias_gelu_args.h"
#include "bindings/checks.h"
#include "bindings/parallel_rows.h"
#include "bindings/row_partials.h"
#include "dispatch/cpu_dispatch.h"

namespace pygpt {
namespace {

at::Tensor bias_gelu_cpu(const at::Tensor& x_in, const at::Tensor& bias_in,
                         c10::string_view approximate) {
  const char* op = "pygpt.bias_gelu";
  check_cpu_float(x_in, op, "x");
  check_bias_gelu_args(x_in, bias_in, op);
  const GeluApproximation gelu = gelu_approximation(approximate, op);
  const at::Tensor x = x_in.contiguous(), bias = bias_in.contiguous();
  const int64_t C = x.size(-1), N = C > 0 ? x.numel() / C : 0;
  at::Tensor y = at::empty_like(x, at::MemoryFormat::Contiguous);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "pygpt.bias_gelu", [&] {
    at::parallel_for(0, N, row_grain(C), [&](int64_t begin, int64_t end) {
      cpu::kernels<scalar_t>().bias_gelu_forward(x.const_data_ptr<scalar_t>(),
                                       bias.const_data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), C,
                                       begin, end, gelu);
    });
  });
  return y;
}

std::tuple<at::Tensor, at::Tensor> bias_gelu_backward_cpu(const at::Tensor& grad_y_in,
                                                          const at::Tensor& x_in,
                                                          const at::Tensor& bias_in,
                                                          bool bias_grad,
                                                          c10::string_view approximate) {
  const char* op = "pygpt.bias_gelu_backward";
  check_cpu_float(x_in, op, "x");
  check_bias_gelu_args(x_in, bias_in, op);
  const GeluApproximation gelu = gelu_approximation(approximate, op);
  check_same_as_x(grad_y_in, "grad_y", x_in, op);
  const at::Tensor x = x_in.contiguous(), bias = bias_in.contiguous();
  const at::Tensor grad_y = grad_y_in.contiguous();
  const int64_t C = x.size(-1), N = C > 0 ? x.numel() / C : 0;
  at::Tensor dx = at::empty_like(x, at::MemoryFormat::Contiguous);
  const RowPartials dbias(N, C, bias_grad, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "pygpt.bias_gelu_backward", [&] {
    dbias.for_chunks([&](int64_t begin, int64_t end, int64_t chunk) {
      cpu::kernels<scalar_t>().bias_gelu_backward(
          grad_y.const_data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>(),
          bias.const_data_ptr<scalar_t>(), dx.data_ptr<scalar_t>(),
          dbias.partial<scalar_t>(chunk), C, begin, end, gelu);
    });
  });
  return {dx, dbias.total()};
}

}  // namespace

TORCH_LIBRARY_IMPL(pygpt, CPU, m) {
  m.impl("bias_gelu", &bias_gelu_cpu);
  m.impl("bias_gelu_backward", &bias_gelu_backward_cpu);
}

}  // namespace pygpt
