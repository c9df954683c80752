// CPU binding of pygpt.bias_gelu and its backward: rows in parallel; the bias gradient is
// reduced in two stages (bindings/row_partials.h).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
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
  const BiasGeluArgs a = bias_gelu_args(x_in, bias_in, approximate, op);
  AT_DISPATCH_FLOATING_TYPES(a.x.scalar_type(), "pygpt.bias_gelu", [&] {
    at::parallel_for(0, a.N, row_grain(a.C), [&](int64_t begin, int64_t end) {
      cpu::kernels<scalar_t>().bias_gelu_forward(a.x.const_data_ptr<scalar_t>(),
                                                 a.bias.const_data_ptr<scalar_t>(),
                                                 a.out.data_ptr<scalar_t>(), a.C, begin, end,
                                                 a.gelu);
    });
  });
  return a.out;
}

std::tuple<at::Tensor, at::Tensor> bias_gelu_backward_cpu(const at::Tensor& grad_y_in,
                                                          const at::Tensor& x_in,
                                                          const at::Tensor& bias_in,
                                                          bool bias_grad,
                                                          c10::string_view approximate) {
  const char* op = "pygpt.bias_gelu_backward";
  check_cpu_float(x_in, op, "x");
  const BiasGeluArgs a = bias_gelu_backward_args(grad_y_in, x_in, bias_in, approximate, op);
  const RowPartials dbias(a.N, a.C, bias_grad, a.x.options());
  AT_DISPATCH_FLOATING_TYPES(a.x.scalar_type(), "pygpt.bias_gelu_backward", [&] {
    dbias.for_chunks([&](int64_t begin, int64_t end, int64_t chunk) {
      cpu::kernels<scalar_t>().bias_gelu_backward(
          a.grad_y.const_data_ptr<scalar_t>(), a.x.const_data_ptr<scalar_t>(),
          a.bias.const_data_ptr<scalar_t>(), a.out.data_ptr<scalar_t>(),
          dbias.partial<scalar_t>(chunk), a.C, begin, end, a.gelu);
    });
  });
  return {a.out, dbias.total()};
}

}  // namespace

TORCH_LIBRARY_IMPL(pygpt, CPU, m) {
  m.impl("bias_gelu", &bias_gelu_cpu);
  m.impl("bias_gelu_backward", &bias_gelu_backward_cpu);
}

}  // namespace pygpt
