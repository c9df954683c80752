// CPU binding of pygpt.add_layer_norm and its backward: rows in parallel; the weight and bias
// gradients are reduced in two stages (bindings/row_partials.h).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "bindings/add_layer_norm_args.h"
#include "bindings/checks.h"
#include "bindings/parallel_rows.h"
#include "bindings/row_partials.h"
#include "dispatch/cpu_dispatch.h"

namespace pygpt {
namespace {

template <typename T>
const T* data_or_null(const std::optional<at::Tensor>& t) {
  return t.has_value() ? t->const_data_ptr<T>() : nullptr;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> add_layer_norm_cpu(
    const at::Tensor& x_in, const at::Tensor& residual_in,
    const std::optional<at::Tensor>& weight_in, const std::optional<at::Tensor>& bias_in,
    double eps) {
  const char* op = "pygpt.add_layer_norm";
  check_cpu_float(x_in, op, "x");
  const AddLayerNormArgs a =
      add_layer_norm_args(x_in, residual_in, weight_in, bias_in, eps, x_in.scalar_type(), op);
  AT_DISPATCH_FLOATING_TYPES(a.x.scalar_type(), "pygpt.add_layer_norm", [&] {
    at::parallel_for(0, a.N, row_grain(a.C), [&](int64_t begin, int64_t end) {
      cpu::kernels<scalar_t>().add_layer_norm_forward(
          a.x.const_data_ptr<scalar_t>(), a.residual.const_data_ptr<scalar_t>(),
          data_or_null<scalar_t>(a.weight), data_or_null<scalar_t>(a.bias),
          a.sum.data_ptr<scalar_t>(), a.out.data_ptr<scalar_t>(), a.mean.data_ptr<scalar_t>(),
          a.rstd.data_ptr<scalar_t>(), a.C, eps, begin, end);
    });
  });
  return {a.sum, a.out, a.mean, a.rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> add_layer_norm_backward_cpu(
    const at::Tensor& grad_y_in, const std::optional<at::Tensor>& grad_sum_in,
    const at::Tensor& sum_in, const std::optional<at::Tensor>& weight_in,
    const at::Tensor& mean_in, const at::Tensor& rstd_in, bool weight_grad, bool bias_grad) {
  const char* op = "pygpt.add_layer_norm_backward";
  check_cpu_float(sum_in, op, "sum");
  const AddLayerNormArgs a = add_layer_norm_backward_args(grad_y_in, grad_sum_in, sum_in,
                                                          weight_in, mean_in, rstd_in, op);
  const auto row_shape = sum_in.sizes().slice(0, sum_in.dim() - 1);
  for (const auto& [t, name] : {std::pair{&mean_in, "mean"}, std::pair{&rstd_in, "rstd"}}) {
    check_matches(*t, name, sum_in, "sum", op);
    TORCH_CHECK(t->sizes() == row_shape, op, ": ", name, " must have shape ", row_shape,
                ", got ", t->sizes());
  }
  const RowPartials dweight(a.N, a.C, weight_grad, a.sum.options());
  const RowPartials dbias(a.N, a.C, bias_grad, a.sum.options());
  AT_DISPATCH_FLOATING_TYPES(a.sum.scalar_type(), "pygpt.add_layer_norm_backward", [&] {
    // Both partials split the rows alike (same N, C and thread count): one loop fills both.
    dweight.for_chunks([&](int64_t begin, int64_t end, int64_t chunk) {
      cpu::kernels<scalar_t>().add_layer_norm_backward(
          a.grad_y.const_data_ptr<scalar_t>(), data_or_null<scalar_t>(a.grad_sum),
          a.sum.const_data_ptr<scalar_t>(), data_or_null<scalar_t>(a.weight),
          a.mean.const_data_ptr<scalar_t>(), a.rstd.const_data_ptr<scalar_t>(),
          a.out.data_ptr<scalar_t>(), dweight.partial<scalar_t>(chunk),
          dbias.partial<scalar_t>(chunk), a.C, begin, end);
    });
  });
  return {a.out, dweight.total(), dbias.total()};
}

}  // namespace

TORCH_LIBRARY_IMPL(pygpt, CPU, m) {
  m.impl("add_layer_norm", &add_layer_norm_cpu);
  m.impl("add_layer_norm_backward", &add_layer_norm_backward_cpu);
}

}  // namespace pygpt
