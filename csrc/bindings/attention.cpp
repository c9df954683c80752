// pygpt.attention, its home: the schemas of the op and of its backward, their argument checks
// and outputs (attention_args.h, for the CPU and CUDA bindings attention_cpu.cpp and
// attention_cuda.cpp) and the op's autograd in C++ (autograd_support.h).
#include <ATen/ops/aminmax.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cmath>

#include "bindings/attention_args.h"
#include "bindings/autograd_support.h"
#include "bindings/checks.h"

namespace pygpt {
namespace {

// lengths as a contiguous int32 (B,) tensor, checked: integer, (B,), on q's device, in [0, limit].
at::Tensor checked_lengths(const std::optional<at::Tensor>& lengths, const char* name, int64_t B,
                           int64_t limit, const at::Tensor& q, const char* op) {
  if (!lengths.has_value()) return {};
  const at::Tensor& t = lengths.value();
  TORCH_CHECK(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, op, ": ", name,
              " must be int32 or int64, got ", t.scalar_type());
  TORCH_CHECK(t.dim() == 1 && t.size(0) == B, op, ": ", name, " must have shape (", B,
              ",), one length per batch row, got ", t.sizes());
  TORCH_CHECK(t.device() == q.device(), op, ": ", name, " is on ", t.device(), " but q is on ",
              q.device());
  if (B > 0) {
    const auto [lo, hi] = at::aminmax(t);
    const int64_t min = lo.item<int64_t>(), max = hi.item<int64_t>();
    TORCH_CHECK_VALUE(min >= 0 && max <= limit, op, ": ", name, " must lie in [0, ", limit,
                      "], got values from ", min, " to ", max);
  }
  return t.to(at::kInt).contiguous();
}

// A score-bias tensor, checked: q's dtype and device, shape (H,) or (H, odd width); contiguous.
at::Tensor checked_bias(const std::optional<at::Tensor>& bias, const char* name, bool table,
                        const at::Tensor& q, const char* op) {
  if (!bias.has_value()) return {};
  const at::Tensor& t = bias.value();
  check_matches(t, name, q, "q", op);
  const int64_t H = q.size(1);
  if (table) {
    TORCH_CHECK(t.dim() == 2 && t.size(0) == H && t.size(1) % 2 == 1, op, ": ", name,
                " must have shape (H, 2 * max_distance + 1) = (", H, ", odd), got ", t.sizes());
  } else {
    TORCH_CHECK(t.dim() == 1 && t.size(0) == H, op, ": ", name, " must have shape (", H,
                ",), one slope per head, got ", t.sizes());
  }
  return t.contiguous();
}

}  // namespace

AttentionArgs attention_args(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             bool causal, std::optional<double> scale,
                             const std::optional<at::Tensor>& q_lengths,
                             const std::optional<at::Tensor>& kv_lengths,
                             const std::optional<at::Tensor>& rel_bias,
                             const std::optional<at::Tensor>& alibi_slopes, const char* op) {
  TORCH_CHECK(q.dim() == 4, op, ": q must be 4-D (B, H, Tq, Dk), got shape ", q.sizes());
  TORCH_CHECK(k.dim() == 4, op, ": k must be 4-D (B, H, Tk, Dk), got shape ", k.sizes());
  TORCH_CHECK(v.dim() == 4, op, ": v must be 4-D (B, H, Tk, Dv), got shape ", v.sizes());
  check_matches(k, "k", q, "q", op);
  check_matches(v, "v", q, "q", op);
  TORCH_CHECK(k.size(0) == q.size(0) && k.size(1) == q.size(1), op,
              ": k's batch and head sizes ", k.sizes().slice(0, 2), " must equal q's ",
              q.sizes().slice(0, 2));
  TORCH_CHECK(v.size(0) == q.size(0) && v.size(1) == q.size(1), op,
              ": v's batch and head sizes ", v.sizes().slice(0, 2), " must equal q's ",
              q.sizes().slice(0, 2));
  TORCH_CHECK(k.size(3) == q.size(3), op, ": head dim mismatch, q has Dk=", q.size(3),
              " but k has ", k.size(3));
  TORCH_CHECK(v.size(2) == k.size(2), op, ": k and v must have the same length, k has Tk=",
              k.size(2), " but v has ", v.size(2));
  const double default_scale = q.size(3) > 0 ? 1.0 / std::sqrt(double(q.size(3))) : 1.0;
  const double s = scale.value_or(default_scale);
  TORCH_CHECK_VALUE(std::isfinite(s), op, ": scale must be finite, got ", s);
  AttentionArgs args{{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), v.size(3), causal, s},
                     checked_lengths(q_lengths, "q_lengths", q.size(0), q.size(2), q, op),
                     checked_lengths(kv_lengths, "kv_lengths", q.size(0), k.size(2), q, op),
                     checked_bias(rel_bias, "rel_bias", true, q, op),
                     checked_bias(alibi_slopes, "alibi_slopes", false, q, op)};
  if (args.q_lengths.defined()) args.shape.q_lengths = args.q_lengths.const_data_ptr<int32_t>();
  if (args.kv_lengths.defined()) args.shape.kv_lengths = args.kv_lengths.const_data_ptr<int32_t>();
  return args;
}

AttentionOutputs attention_outputs(const AttentionShape& s, const at::Tensor& q,
                                   at::ScalarType stats_dtype) {
  AttentionOutputs o;
  o.out = at::empty({s.B, s.H, s.Tq, s.Dv}, q.options());
  o.lse = at::empty({s.B, s.H, s.Tq}, q.options().dtype(stats_dtype));
  return o;
}

AttentionInputGrads attention_input_grads(const AttentionShape& s, const at::Tensor& q) {
  AttentionInputGrads g;
  g.dq = at::empty({s.B, s.H, s.Tq, s.Dk}, q.options());
  g.dk = at::empty({s.B, s.H, s.Tk, s.Dk}, q.options());
  g.dv = at::empty({s.B, s.H, s.Tk, s.Dv}, q.options());
  return g;
}

namespace {

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

}  // namespace

TORCH_LIBRARY_FRAGMENT(pygpt, m) {
  // Returns (out, lse); lse is the log-sum-exp of each scaled, biased, masked score row. The
  // lengths are the real queries and keys of each batch row of a right-padded batch (None: all).
  // rel_bias (H, 2R + 1) and alibi_slopes (H,) add a bias of the key - query distance to the
  // scores (common/attention_shape.h's AttentionBias).
  m.def("attention(Tensor q, Tensor k, Tensor v, bool causal=True, float? scale=None,"
        " Tensor? q_lengths=None, Tensor? kv_lengths=None, Tensor? rel_bias=None,"
        " Tensor? alibi_slopes=None) -> (Tensor, Tensor)");
  // Returns (grad_q, grad_k, grad_v, grad_rel_bias, grad_alibi_slopes); the gradient of a bias
  // input not given is an empty tensor.
  m.def("attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse,"
        " bool causal, float? scale, Tensor? q_lengths=None, Tensor? kv_lengths=None,"
        " Tensor? rel_bias=None, Tensor? alibi_slopes=None)"
        " -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(pygpt, Autograd, m) { m.impl("attention", &attention_autograd); }

}  // namespace pygpt
