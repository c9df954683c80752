#include "bindings/validate.h"

#include <ATen/ops/aminmax.h>
#include <c10/util/Exception.h>

#include <cmath>

namespace pygpt {

void check_cpu_float(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), op, ": ", name, " must be a CPU tensor, got device ",
              t.device());
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble, op, ": ", name,
              " must be float32 or float64, got ", t.scalar_type());
}

void check_cuda_float(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK(t.device().is_cuda(), op, ": ", name, " must be a CUDA tensor, got device ",
              t.device());
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16, op, ": ", name,
              " must be float32 or bfloat16 on CUDA, got ", t.scalar_type());
}

void check_matches(const at::Tensor& t, const char* name, const at::Tensor& ref,
                   const char* ref_name, const char* op) {
  TORCH_CHECK(t.device() == ref.device(), op, ": ", name, " is on ", t.device(), " but ", ref_name,
              " is on ", ref.device());
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), op, ": ", name, " has dtype ", t.scalar_type(),
              " but ", ref_name, " has dtype ", ref.scalar_type());
}

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

void check_cross_entropy_args(const at::Tensor& logits, const at::Tensor& targets,
                              double label_smoothing, const char* op) {
  TORCH_CHECK(logits.dim() == 2, op, ": logits must be 2-D (N, V), got shape ", logits.sizes());
  TORCH_CHECK(targets.dim() == 1, op, ": targets must be 1-D (N,), got shape ", targets.sizes());
  TORCH_CHECK(targets.scalar_type() == at::kLong, op, ": targets must be int64, got ",
              targets.scalar_type());
  TORCH_CHECK(targets.device() == logits.device(), op, ": targets is on ", targets.device(),
              " but logits is on ", logits.device());
  TORCH_CHECK(targets.size(0) == logits.size(0), op, ": targets has ", targets.size(0),
              " entries but logits has ", logits.size(0), " rows");
  TORCH_CHECK_VALUE(label_smoothing >= 0.0 && label_smoothing <= 1.0, op,
                    ": label_smoothing must be a finite number in [0, 1], got ", label_smoothing);
}

}  // namespace pygpt
