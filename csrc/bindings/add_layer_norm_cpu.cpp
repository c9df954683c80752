// CPU binding of pygpt.add_layer_norm and its backward: rows in parallel; the weight and bias
// gradients are reduced in two stages (bindings/row_partials.h).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include "bindings/add_layer_norm_args.h"
#include "bindings/checks.h"
#include "bindings/layer_norm_args.h"
#include "bindings/parallel_rows.h"
#include "bindings/row_partials.h"
#include "dispatch/cpu_dispatch.h"

namespace pygpt {
namespace {

std::optional<at::Tensor> contiguous(const std::optional<at::Tensor>& t) {
  return t.has_value() ? std::optional<at::Tensor>(t->contiguous()) : std::nullopt;
}

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
  check_add_layer_norm_args(x_in, residual_in, weight_in, bias_in, eps, op);
  const at::Tensor x = x_in.contiguous(), residual = residual_in.contiguous();
  const auto weight = contiguous(weight_in), bias = contiguous(bias_in);
  const int64_t C = x.size(-1), N = C > 0 ? x.numel() / C : 0;
  at::Tensor sum = at::empty_like(x, at::MemoryFormat::Contiguous);
  at::Tensor y = at::empty_like(sum);
  at::Tensor mean = at::empty(x.sizes().slice(0, x.dim() - 1), x.options());
  at::Tensor rstd = at::empty_like(mean);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "pygpt.add_layer_norm", [&] {
    at::parallel_for(0, N, row_grain(C), [&](int64_t begin, int64_t end) {
      cpu::kernels<scalar_t>().add_layer_norm_forward(
          x.const_data_ptr<scalar_t>(), residual.const_data_ptr<scalar_t>(),
          data_or_null<scalar_t>(weight), data_or_null<scalar_t>(bias), sum.data_ptr<scalar_t>(),
          y.data_ptr<scalar_t>(), mean.data_ptr<scalar_t>(), rstd.data_ptr<scalar_t>(), C, eps,
          begin, end);
    });
  });
  return {sum, y, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> add_layer_norm_backward_cpu(
    const at::Tensor& grad_y_in, const std::optional<at::Tensor>& grad_sum_in,
    const at::Tensor& sum_in, const std::optional<at::Tensor>& weight_in,
    const at::Tensor& mean_in, const at::Tensor& rstd_in, bool weight_grad, bool bias_grad) {
  const char* op = "pygpt.add_layer_norm_backward";
  check_cpu_float(sum_in, op, "sum");
  check_layer_norm_args(sum_in, weight_in, std::nullopt, op);
  check_same_as_x(grad_y_in, "grad_y", sum_in, op);
  if (grad_sum_in.has_value()) check_same_as_x(*grad_sum_in, "grad_sum", sum_in, op);
  const auto row_shape = sum_in.sizes().slice(0, sum_in.dim() - 1);
  for (const auto& [t, name] : {std::pair{&mean_in, "mean"}, std::pair{&rstd_in, "rstd"}}) {
    check_matches(*t, name, sum_in, "sum", op);
    TORCH_CHECK(t->sizes() == row_shape, op, ": ", name, " must have shape ", row_shape,
                ", got ", t->sizes());
  }
  const at::Tensor sum = sum_in.contiguous(), grad_y = grad_y_in.contiguous();
  const at::Tensor mean = mean_in.contiguous(), rstd = rstd_in.contiguous();
  const auto grad_sum = contiguous(grad_sum_in), weight = contiguous(weight_in);
  const int64_t C = sum.size(-1), N = C > 0 ? sum.numel() / C : 0;
  at::Tensor dx = at::empty_like(sum, at::MemoryFormat::Contiguous);
  const RowPartials dweight(N, C, weight_grad, sum.options());
  const RowPartials dbias(N, C, bias_grad, sum.options());
  AT_DISPATCH_FLOATING_TYPES(sum.scalar_type(), "pygpt.add_layer_norm_backward", [&] {
    // Both partials split the rows alike (same N, C and thread count): one loop fills both.
    dweight.for_chunks([&](int64_t begin, int64_t end, int64_t chunk) {
      cpu::kernels<scalar_t>().add_layer_norm_backward(
          grad_y.const_data_ptr<scalar_t>(), data_or_null<scalar_t>(grad_sum),
          sum.const_data_ptr<scalar_t>(), data_or_null<scalar_t>(weight),
          mean.const_data_ptr<scalar_t>(), rstd.const_data_ptr<scalar_t>(),
          dx.data_ptr<scalar_t>(), dweight.partial<scalar_t>(chunk),
          dbias.partial<scalar_t>(chunk), C, begin, end);
    });
  });
  return {dx, dweight.total(), dbias.total()};
}

}  // namespace

TORCH_LIBRARY_IMPL(pygpt, CPU, m) {
  m.impl("add_layer_norm", &add_layer_norm_cpu);
  m.impl("add_layer_norm_backward", &add_layer_norm_backward_cpu);
}

}  // namespace pygpt
