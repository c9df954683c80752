// Autograd of the pygpt ops, in C++: each op's Autograd kernel is a torch::autograd::Function
// whose forward runs the op below autograd (its CPU or CUDA kernel) and whose backward calls the
// op's backward kernel, so a training step runs no Python per op call (pygpt/ops.py registers
// only the fake implementations). The gradients are those the ops' schemas document
// (registration.cpp); the auxiliary outputs (lse, mean, rstd) are not differentiable. The fused
// ops' autograd is in autograd_fused.cpp.
#include <torch/library.h>

#include "bindings/autograd_support.h"

namespace pygpt {
namespace {

// --- attention ---------------------------------------------------------------------------------

using AttentionFn = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, bool,
                                               std::optional<double>, const OptTensor&,
                                               const OptTensor&, const OptTensor&,
                                               const OptTensor&);
using AttentionBackwardFn = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor>(
    const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool,
    std::optional<double>, const OptTensor&, const OptTensor&, const OptTensor&, const OptTensor&);

struct Attention : torch::autograd::Function<Attention> {
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k,
                               const Tensor& v, bool causal, std::optional<double> scale,
                               const OptTensor& q_lengths, const OptTensor& kv_lengths,
                               const OptTensor& rel_bias, const OptTensor& alibi_slopes) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    static const auto attention = op<AttentionFn>("pygpt::attention");
    auto [out, lse] = attention.call(q, k, v, causal, scale, q_lengths, kv_lengths, rel_bias,
                                     alibi_slopes);
    ctx->save_for_backward({q, k, v, out, lse, q_lengths.value_or(Tensor()),
                            kv_lengths.value_or(Tensor()), rel_bias.value_or(Tensor()),
                            alibi_slopes.value_or(Tensor())});
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["scale"] = scale;
    ctx->mark_non_differentiable({lse});
    return {out, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const auto scale = ctx->saved_data["scale"].toOptional<double>();
    static const auto attention_backward = op<AttentionBackwardFn>("pygpt::attention_backward");
    auto [dq, dk, dv, d_rel, d_slopes] = attention_backward.call(
        grads[0], s[0], s[1], s[2], s[3], s[4], ctx->saved_data["causal"].toBool(), scale,
        given(s[5]), given(s[6]), given(s[7]), given(s[8]));
    return {dq,       dk,       dv,
            Tensor(), Tensor(), Tensor(),
            Tensor(), s[7].defined() ? d_rel : Tensor(), s[8].defined() ? d_slopes : Tensor()};
  }
};

std::tuple<Tensor, Tensor> attention_autograd(const Tensor& q, const Tensor& k, const Tensor& v,
                                              bool causal, std::optional<double> scale,
                                              const OptTensor& q_lengths,
                                              const OptTensor& kv_lengths,
                                              const OptTensor& rel_bias,
                                              const OptTensor& alibi_slopes) {
  const variable_list r =
      Attention::apply(q, k, v, causal, scale, q_lengths, kv_lengths, rel_bias, alibi_slopes);
  return {r[0], r[1]};
}

// --- layer norm --------------------------------------------------------------------------------

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

// --- cross-entropy -----------------------------------------------------------------------------

using CrossEntropyFn = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, int64_t, double);
using CrossEntropyBackwardFn = Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                      int64_t, double);

struct CrossEntropy : torch::autograd::Function<CrossEntropy> {
  static variable_list forward(AutogradContext* ctx, const Tensor& logits, const Tensor& targets,
                               int64_t ignore_index, double label_smoothing) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    static const auto cross_entropy = op<CrossEntropyFn>("pygpt::cross_entropy");
    auto [loss, lse] = cross_entropy.call(logits, targets, ignore_index, label_smoothing);
    ctx->save_for_backward({logits, targets, lse});
    ctx->saved_data["ignore_index"] = ignore_index;
    ctx->saved_data["label_smoothing"] = label_smoothing;
    ctx->mark_non_differentiable({lse});
    return {loss, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    static const auto backward = op<CrossEntropyBackwardFn>("pygpt::cross_entropy_backward");
    Tensor grad_logits = backward.call(grads[0], s[0], s[1], s[2],
                                       ctx->saved_data["ignore_index"].toInt(),
                                       ctx->saved_data["label_smoothing"].toDouble());
    return {grad_logits, Tensor(), Tensor(), Tensor()};
  }
};

std::tuple<Tensor, Tensor> cross_entropy_autograd(const Tensor& logits, const Tensor& targets,
                                                  int64_t ignore_index, double label_smoothing) {
  const variable_list r = CrossEntropy::apply(logits, targets, ignore_index, label_smoothing);
  return {r[0], r[1]};
}

// --- rotary ------------------------------------------------------------------------------------

using RotaryFn = Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool);

struct Rotary : torch::autograd::Function<Rotary> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& cos,
                        const Tensor& sin, const Tensor& positions, bool inverse) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    static const auto rotary = op<RotaryFn>("pygpt::rotary");
    ctx->save_for_backward({cos, sin, positions});
    ctx->saved_data["inverse"] = inverse;
    return rotary.call(x, cos, sin, positions, inverse);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    TORCH_CHECK(!ctx->needs_input_grad(1) && !ctx->needs_input_grad(2),
                "pygpt.rotary: cos and sin are fixed tables and get no gradient; pass them "
                "detached");
    const variable_list s = ctx->get_saved_variables();
    // A rotation's gradient is the inverse rotation: the op itself, through autograd again, so
    // that it is differentiable in turn (double backward).
    static const auto rotary = op<RotaryFn>("pygpt::rotary");
    Tensor grad_x = rotary.call(grads[0], s[0], s[1], s[2], !ctx->saved_data["inverse"].toBool());
    return {grad_x, Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

Tensor rotary_autograd(const Tensor& x, const Tensor& cos, const Tensor& sin,
                       const Tensor& positions, bool inverse) {
  return Rotary::apply(x, cos, sin, positions, inverse);
}

}  // namespace

TORCH_LIBRARY_IMPL(pygpt, Autograd, m) {
  m.impl("attention", &attention_autograd);
  m.impl("layer_norm", &layer_norm_autograd);
  m.impl("cross_entropy", &cross_entropy_autograd);
  m.impl("rotary", &rotary_autograd);
}

}  // namespace pygpt
