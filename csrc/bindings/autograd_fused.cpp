// Autograd of the fused ops (bias_gelu, add_layer_norm) in C++, as autograd.cpp does for the
// others: the forward runs the op below autograd, the backward its backward kernel.
#include <torch/library.h>

#include "bindings/autograd_support.h"

namespace pygpt {
namespace {

// --- bias + GELU -------------------------------------------------------------------------------

using BiasGeluFn = Tensor(const Tensor&, const Tensor&);
using BiasGeluBackwardFn = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&,
                                                      bool);

struct BiasGelu : torch::autograd::Function<BiasGelu> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& bias) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    static const auto bias_gelu = op<BiasGeluFn>("pygpt::bias_gelu");
    ctx->save_for_backward({x, bias});
    return bias_gelu.call(x, bias);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const bool want_bias = ctx->needs_input_grad(1);
    static const auto backward = op<BiasGeluBackwardFn>("pygpt::bias_gelu_backward");
    auto [dx, dbias] = backward.call(grads[0], s[0], s[1], want_bias);
    return {dx, want_bias ? dbias : Tensor()};
  }
};

Tensor bias_gelu_autograd(const Tensor& x, const Tensor& bias) { return BiasGelu::apply(x, bias); }

// --- residual add + layer norm -----------------------------------------------------------------

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

TORCH_LIBRARY_IMPL(pygpt, Autograd, m) {
  m.impl("bias_gelu", &bias_gelu_autograd);
  m.impl("add_layer_norm", &add_layer_norm_autograd);
}

}  // namespace pygpt
