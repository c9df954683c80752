// CPU binding of pygpt.layer_norm and its backward: rows in parallel; the weight and bias
// gradients are reduced in two stages (bindings/row_partials.h).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "bindings/checks.h"
#include "bindings/layer_norm_args.h"
#include "bindings/parallel_rows.h"
#include "bindings/row_partials.h"
#include "dispatch/cpu_dispatch.h"

namespace pygpt {
namespace {

template <typename T>
const T* data_or_null(const std::optional<at::Tensor>& t) {
  return t.has_value() ? t->const_data_ptr<T>() : nullptr;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_cpu(
    const at::Tensor& x_in, const std::optional<at::Tensor>& weight_in,
    const std::optional<at::Tensor>& bias_in, double eps) {
  const char* op = "pygpt.layer_norm";
  check_cpu_float(x_in, op, "x");
  const LayerNormArgs a =
      layer_norm_args(x_in, weight_in, bias_in, eps, x_in.scalar_type(), op);
  AT_DISPATCH_FLOATING_TYPES(a.x.scalar_type(), "pygpt.layer_norm", [&] {
    at::parallel_for(0, a.N, row_grain(a.C), [&](int64_t begin, int64_t end) {
      cpu::kernels<scalar_t>().layer_norm_forward(
          a.x.const_data_ptr<scalar_t>(), data_or_null<scalar_t>(a.weight),
          data_or_null<scalar_t>(a.bias), a.out.data_ptr<scalar_t>(), a.mean.data_ptr<scalar_t>(),
          a.rstd.data_ptr<scalar_t>(), a.C, eps, begin, end);
    });
  });
  return {a.out, a.mean, a.rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward_cpu(
    const at::Tensor& grad_y_in, const at::Tensor& x_in,
    const std::optional<at::Tensor>& weight_in, const at::Tensor& mean_in,
    const at::Tensor& rstd_in, bool weight_grad, bool bias_grad) {
  const char* op = "pygpt.layer_norm_backward";
  check_cpu_float(x_in, op, "x");
  const LayerNormArgs a =
      layer_norm_backward_args(grad_y_in, x_in, weight_in, mean_in, rstd_in, op);
  for (const auto& [t, name] : {std::pair{&grad_y_in, "grad_y"}, std::pair{&mean_in, "mean"},
                                std::pair{&rstd_in, "rstd"}}) {
    check_matches(*t, name, x_in, "x", op);
  }
  TORCH_CHECK(grad_y_in.sizes() == x_in.sizes(), op, ": grad_y must have x's shape ",
              x_in.sizes(), ", got ", grad_y_in.sizes());
  const auto row_shape = x_in.sizes().slice(0, x_in.dim() - 1);
  TORCH_CHECK(mean_in.sizes() == row_shape && rstd_in.sizes() == row_shape, op,
              ": mean and rstd must have shape ", row_shape, ", got ", mean_in.sizes(), " and ",
              rstd_in.sizes());
  const RowPartials dweight(a.N, a.C, weight_grad, a.x.options());
  const RowPartials dbias(a.N, a.C, bias_grad, a.x.options());
  AT_DISPATCH_FLOATING_TYPES(a.x.scalar_type(), "pygpt.layer_norm", [&] {
    // Both partials split the rows alike (same N, C and thread count): one loop fills both.
    dweight.for_chunks([&](int64_t begin, int64_t end, int64_t chunk) {
      cpu::kernels<scalar_t>().layer_norm_backward(
          a.grad_y.const_data_ptr<scalar_t>(), a.x.const_data_ptr<scalar_t>(),
          data_or_null<scalar_t>(a.weight), a.mean.const_data_ptr<scalar_t>(),
          a.rstd.const_data_ptr<scalar_t>(), a.out.data_ptr<scalar_t>(),
          dweight.partial<scalar_t>(chunk), dbias.partial<scalar_t>(chunk), a.C, begin, end);
    });
  });
  return {a.out, dweight.total(), dbias.total()};
}

}  // namespace

TORCH_LIBRARY_IMPL(pygpt, CPU, m) {
  m.impl("layer_norm", &layer_norm_cpu);
  m.impl("layer_norm_backward", &layer_norm_backward_cpu);
}

}  // namespace pygpt
