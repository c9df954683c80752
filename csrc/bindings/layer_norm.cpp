// pygpt.layer_norm, its home: the schemas of the op and of its backward, their argument checks
// and preparation (layer_norm_args.h, for the CPU and CUDA bindings layer_norm_cpu.cpp and
// layer_norm_cuda.cpp) and the op's autograd in C++ (autograd_support.h).
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "bindings/autograd_support.h"
#include "bindings/checks.h"
#include "bindings/layer_norm_args.h"

namespace pygpt {

void check_layer_norm_args(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                           const std::optional<at::Tensor>& bias, const char* op) {
  TORCH_CHECK(x.dim() >= 1, op, ": x must have at least one dimension");
  const int64_t C = x.size(-1);
  for (const auto& [param, name] : {std::pair{&weight, "weight"}, std::pair{&bias, "bias"}}) {
    if (!param->has_value()) continue;
    const at::Tensor& p = param->value();
    TORCH_CHECK(p.dim() == 1 && p.size(0) == C, op, ": ", name, " must have shape (", C,
                ",) to match x's last dimension, got ", p.sizes());
    check_matches(p, name, x, "x", op);
  }
}

namespace {

// What the forward and the backward check and prepare alike: check_layer_norm_args's checks,
// then x, weight and bias contiguous, the sizes, and out like x.
LayerNormArgs checked_rows(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                           const std::optional<at::Tensor>& bias, const char* op) {
  check_layer_norm_args(x, weight, bias, op);
  LayerNormArgs a;
  a.x = x.contiguous();
  a.weight = contiguous_if_given(weight);
  a.bias = contiguous_if_given(bias);
  a.C = a.x.size(-1);
  a.N = a.C > 0 ? a.x.numel() / a.C : 0;
  a.out = at::empty_like(a.x);
  return a;
}

}  // namespace

LayerNormArgs layer_norm_args(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                              const std::optional<at::Tensor>& bias, double eps,
                              at::ScalarType stats_dtype, const char* op) {
  LayerNormArgs a = checked_rows(x, weight, bias, op);
  TORCH_CHECK_VALUE(eps >= 0, op, ": eps must be non-negative, got ", eps);
  a.mean = at::empty(a.x.sizes().slice(0, a.x.dim() - 1), a.x.options().dtype(stats_dtype));
  a.rstd = at::empty_like(a.mean);
  return a;
}

LayerNormArgs layer_norm_backward_args(const at::Tensor& grad_y, const at::Tensor& x,
                                       const std::optional<at::Tensor>& weight,
                                       const at::Tensor& mean, const at::Tensor& rstd,
                                       const char* op) {
  LayerNormArgs a = checked_rows(x, weight, std::nullopt, op);
  a.grad_y = grad_y.contiguous();
  a.mean = mean.contiguous();
  a.rstd = rstd.contiguous();
  return a;
}

namespace {

using LayerNormFn = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const OptTensor&,
                                                       const OptTensor&, double);
using LayerNormBackwardFn = std::tuple<Tensor, Tensor, Tensor>(
    const Tensor&, const Tensor&, const OptTensor&, const Tensor&, const Tensor&, bool, bool);

struct LayerNorm : torch::autograd::Function<LayerNorm> {
  static variable_list forward(AutogradContext* ctx, const Tensor& x, const OptTensor& weight,
                               const OptTensor& bias, double eps) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    static const auto layer_norm = op<LayerNormFn>("pygpt::layer_norm");
    auto [y, mean, rstd] = layer_norm.call(x, weight, bias, eps);
    ctx->save_for_backward({x, weight.value_or(Tensor()), mean, rstd});
    ctx->saved_data["has_bias"] = bias.has_value() && bias->defined();
    ctx->mark_non_differentiable({mean, rstd});
    return {y, mean, rstd};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    // needs_input_grad counts only the tensors given: bias is the second without a weight.
    const bool has_weight = s[1].defined();
    const bool want_weight = has_weight && ctx->needs_input_grad(1);
    const bool want_bias =
        ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(has_weight ? 2 : 1);
    static const auto backward = op<LayerNormBackwardFn>("pygpt::layer_norm_backward");
    auto [dx, dweight, dbias] =
        backward.call(grads[0], s[0], given(s[1]), s[2], s[3], want_weight, want_bias);
    return {dx, want_weight ? dweight : Tensor(), want_bias ? dbias : Tensor(), Tensor()};
  }
};

std::tuple<Tensor, Tensor, Tensor> layer_norm_autograd(const Tensor& x, const OptTensor& weight,
                                                       const OptTensor& bias, double eps) {
  const variable_list r = LayerNorm::apply(x, weight, bias, eps);
  return {r[0], r[1], r[2]};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(pygpt, m) {
  // Returns (y, mean, rstd).
  m.def("layer_norm(Tensor x, Tensor? weight=None, Tensor? bias=None, float eps=1e-05)"
        " -> (Tensor, Tensor, Tensor)");
  // Returns (grad_x, grad_weight, grad_bias); a gradient not asked for is an empty tensor.
  m.def("layer_norm_backward(Tensor grad_y, Tensor x, Tensor? weight, Tensor mean, Tensor rstd,"
        " bool weight_grad, bool bias_grad) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(pygpt, Autograd, m) { m.impl("layer_norm", &layer_norm_autograd); }

}  // namespace pygpt
