// pygpt.add_layer_norm, its home: the schemas of the op and of its backward, their argument
// checks and preparation (add_layer_norm_args.h, for the CPU and CUDA bindings
// add_layer_norm_cpu.cpp and add_layer_norm_cuda.cpp) and the op's autograd in C++
// (autograd_support.h).
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "bindings/add_layer_norm_args.h"
#include "bindings/autograd_support.h"
#include "bindings/checks.h"
#include "bindings/layer_norm_args.h"

namespace pygpt {

AddLayerNormArgs add_layer_norm_args(const at::Tensor& x, const at::Tensor& residual,
                                     const std::optional<at::Tensor>& weight,
                                     const std::optional<at::Tensor>& bias, double eps,
                                     at::ScalarType stats_dtype, const char* op) {
  check_layer_norm_args(x, weight, bias, op);
  check_same_as_x(residual, "residual", x, op);
  TORCH_CHECK_VALUE(eps >= 0, op, ": eps must be non-negative, got ", eps);
  AddLayerNormArgs a;
  a.x = x.contiguous();
  a.residual = residual.contiguous();
  a.weight = contiguous_if_given(weight);
  a.bias = contiguous_if_given(bias);
  a.C = a.x.size(-1);
  a.N = a.C > 0 ? a.x.numel() / a.C : 0;
  a.sum = at::empty_like(a.x, at::MemoryFormat::Contiguous);
  a.out = at::empty_like(a.sum);
  a.mean = at::empty(a.x.sizes().slice(0, a.x.dim() - 1), a.x.options().dtype(stats_dtype));
  a.rstd = at::empty_like(a.mean);
  return a;
}

AddLayerNormArgs add_layer_norm_backward_args(const at::Tensor& grad_y,
                                              const std::optional<at::Tensor>& grad_sum,
                                              const at::Tensor& sum,
                                              const std::optional<at::Tensor>& weight,
                                              const at::Tensor& mean, const at::Tensor& rstd,
                                              const char* op) {
  check_layer_norm_args(sum, weight, std::nullopt, op);
  check_same_as_x(grad_y, "grad_y", sum, op);
  if (grad_sum.has_value()) check_same_as_x(*grad_sum, "grad_sum", sum, op);
  AddLayerNormArgs a;
  a.sum = sum.contiguous();
  a.grad_y = grad_y.contiguous();
  a.grad_sum = contiguous_if_given(grad_sum);
  a.weight = contiguous_if_given(weight);
  a.mean = mean.contiguous();
  a.rstd = rstd.contiguous();
  a.C = a.sum.size(-1);
  a.N = a.C > 0 ? a.sum.numel() / a.C : 0;
  a.out = at::empty_like(a.sum, at::MemoryFormat::Contiguous);
  return a;
}

namespace {

using AddLayerNormFn = std::tuple<Tensor, Tensor, Tensor, Tensor>(
    const Tensor&, const Tensor&, const OptTensor&, const OptTensor&, double);
using AddLayerNormBackwardFn = std::tuple<Tensor, Tensor, Tensor>(
    const Tensor&, const OptTensor&, const Tensor&, const OptTensor&, const Tensor&,
    const Tensor&, bool, bool);

struct AddLayerNorm : torch::autograd::Function<AddLayerNorm> {
  static variable_list forward(AutogradContext* ctx, const Tensor& x, const Tensor& residual,
                               const OptTensor& weight, const OptTensor& bias, double eps) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    static const auto add_layer_norm = op<AddLayerNormFn>("pygpt::add_layer_norm");
    auto [sum, y, mean, rstd] = add_layer_norm.call(x, residual, weight, bias, eps);
    ctx->save_for_backward({sum, weight.value_or(Tensor()), mean, rstd});
    ctx->saved_data["has_bias"] = bias.has_value() && bias->defined();
    ctx->mark_non_differentiable({mean, rstd});
    ctx->set_materialize_grads(false);  // an unused output's gradient stays undefined, not zeros
    return {sum, y, mean, rstd};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const Tensor& grad_sum = grads[0];
    const Tensor& grad_y = grads[1];
    if (!grad_y.defined()) {  // only the sum was used: its gradient passes to both inputs
      return {grad_sum, grad_sum, Tensor(), Tensor(), Tensor()};
    }
    const variable_list s = ctx->get_saved_variables();
    // needs_input_grad counts only the tensors given: x, residual, then weight and bias if given.
    const bool has_weight = s[1].defined();
    const bool want_weight = has_weight && ctx->needs_input_grad(2);
    const bool want_bias =
        ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(has_weight ? 3 : 2);
    static const auto backward = op<AddLayerNormBackwardFn>("pygpt::add_layer_norm_backward");
    auto [dx, dweight, dbias] = backward.call(grad_y, given(grad_sum), s[0], given(s[1]), s[2],
                                              s[3], want_weight, want_bias);
    return {dx, dx, want_weight ? dweight : Tensor(), want_bias ? dbias : Tensor(), Tensor()};
  }
};

std::tuple<Tensor, Tensor, Tensor, Tensor> add_layer_norm_autograd(
    const Tensor& x, const Tensor& residual, const OptTensor& weight, const OptTensor& bias,
    double eps) {
  const variable_list r = AddLayerNorm::apply(x, residual, weight, bias, eps);
  return {r[0], r[1], r[2], r[3]};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(pygpt, m) {
  // Returns (sum = x + residual, y = layer_norm(sum), mean, rstd).
  m.def("add_layer_norm(Tensor x, Tensor residual, Tensor? weight=None, Tensor? bias=None,"
        " float eps=1e-05) -> (Tensor, Tensor, Tensor, Tensor)");
  // Returns (grad of x and of residual, grad_weight, grad_bias): the layer norm's backward
  // through y plus grad_sum (None: sum has no other use); a gradient not asked for is empty.
  m.def("add_layer_norm_backward(Tensor grad_y, Tensor? grad_sum, Tensor sum, Tensor? weight,"
        " Tensor mean, Tensor rstd, bool weight_grad, bool bias_grad) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(pygpt, Autograd, m) { m.impl("add_layer_norm", &add_layer_norm_autograd); }

}  // namespace pygpt
