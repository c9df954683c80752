// pygpt.linear_cross_entropy, its home: the op's schema, its argument checks, its kernel and its
// autograd in C++ (autograd_support.h). The kernel is device-generic (CompositeExplicitAutograd):
// it runs the rows chunk by chunk through ATen's matmuls and our cross-entropy ops, so the (N, V)
// logits never exist, and takes the gradients asked for during the forward
// (pygpt/linear_cross_entropy.py says why; its fake repeats the shape checks for traced calls).
// The messages of the checks are those of Python's: shapes as tuples, dtypes as torch.<name>.
#include <ATen/ATen.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <string>
#include <typeinfo>

#include "bindings/autograd_support.h"

namespace pygpt {
namespace {

constexpr const char* kOp = "pygpt.linear_cross_entropy";

// --- Python's spelling of shapes, dtypes and floats, for the messages ---------------------------

std::string py_shape(at::IntArrayRef sizes) {
  std::string s = "(";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
  return s + (sizes.size() == 1 ? ",)" : ")");
}

std::string py_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "torch.float32";
    case at::kDouble: return "torch.float64";
    case at::kHalf: return "torch.float16";
    case at::kLong: return "torch.int64";
    case at::kInt: return "torch.int32";
    case at::kShort: return "torch.int16";
    case at::kChar: return "torch.int8";
    case at::kByte: return "torch.uint8";
    case at::kComplexHalf: return "torch.complex32";
    case at::kComplexFloat: return "torch.complex64";
    case at::kComplexDouble: return "torch.complex128";
    default: {  // the others are ATen's names in lower case (bfloat16, bool, float8_e4m3fn, ...)
      std::string name = c10::toString(t);
      std::transform(name.begin(), name.end(), name.begin(),
                     [](unsigned char c) { return std::tolower(c); });
      return "torch." + name;
    }
  }
}

// repr() of a Python float: the shortest digits that read back as v, positional for decimal
// exponents from -4 to 15 (with ".0" when whole), else d.ddde+XX.
std::string py_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  const auto end = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific).ptr;
  std::string s(buf, end);  // [-]d[.ddd]e±XX
  const std::string sign = s[0] == '-' ? "-" : "";
  const size_t e = s.find('e');
  std::string digits = s.substr(sign.size(), e - sign.size());
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int point = std::stoi(s.substr(e + 1)) + 1;  // digits = 0.ddd * 10^point
  const int n = static_cast<int>(digits.size());
  if (point <= -4 || point > 16) {
    char exponent[8];
    std::snprintf(exponent, sizeof exponent, "e%+03d", point - 1);
    return sign + digits.substr(0, 1) + (n > 1 ? "." + digits.substr(1) : "") + exponent;
  }
  if (point <= 0) return sign + "0." + std::string(-point, '0') + digits;
  if (point >= n) return sign + digits + std::string(point - n, '0') + ".0";
  return sign + digits.substr(0, point) + "." + digits.substr(point);
}

// --- argument checks ---------------------------------------------------------------------------

void check_args(const Tensor& x, const Tensor& weight, const Tensor& targets,
                const OptTensor& bias, double label_smoothing, int64_t rows) {
  TORCH_CHECK_VALUE(x.dim() == 2, kOp, ": x must be 2-D (N, C), got shape ", py_shape(x.sizes()));
  TORCH_CHECK_VALUE(weight.dim() == 2 && weight.size(1) == x.size(1), kOp,
                    ": weight must be (V, C) with C = ", x.size(1),
                    " as x's last dimension, got shape ", py_shape(weight.sizes()));
  TORCH_CHECK_VALUE(targets.sizes() == x.sizes().slice(0, 1), kOp, ": targets must be 1-D (",
                    x.size(0), ",) to match x's rows, got shape ", py_shape(targets.sizes()));
  TORCH_CHECK_VALUE(!bias.has_value() || bias->sizes() == weight.sizes().slice(0, 1), kOp,
                    ": bias must have shape (", weight.size(0), ",) to match weight's rows, got ",
                    py_shape(bias->sizes()));
  TORCH_CHECK_VALUE(at::isFloatingType(x.scalar_type()), kOp,
                    ": x must be a floating-point tensor, got ", py_dtype(x.scalar_type()));
  for (const auto& [t, name] : {std::pair{&weight, "weight"}, std::pair{bias ? &*bias : nullptr,
                                                                        "bias"}}) {
    TORCH_CHECK_VALUE(t == nullptr || t->scalar_type() == x.scalar_type(), kOp, ": ", name,
                      " is ", py_dtype(t->scalar_type()), " but x is ",
                      py_dtype(x.scalar_type()), "; they must match");
  }
  TORCH_CHECK_VALUE(targets.scalar_type() == at::kLong, kOp,
                    ": targets must have dtype int64, got ", py_dtype(targets.scalar_type()));
  for (const auto& [t, name] :
       {std::pair{&weight, "weight"}, std::pair{&targets, "targets"},
        std::pair{bias ? &*bias : nullptr, "bias"}}) {
    TORCH_CHECK(t == nullptr || t->device() == x.device(), kOp, ": ", name, " is on ",
                t->device(), " but x is on ", x.device(), "; all tensors must be on the same device");
  }
  TORCH_CHECK_VALUE(label_smoothing >= 0.0 && label_smoothing <= 1.0, kOp,
                    ": label_smoothing must be a finite number in [0, 1], got ",
                    py_float(label_smoothing));
  TORCH_CHECK_VALUE(rows >= 1, kOp, ": chunk_rows must be >= 1, got ", rows);
}

// Every target is a class in [0, V) or ignore_index.
void check_targets(const Tensor& targets, int64_t V, int64_t ignore_index) {
  const Tensor bad = (targets.lt(0) | targets.ge(V)) & targets.ne(ignore_index);
  if (bad.any().item<bool>()) {
    const int64_t i = bad.nonzero()[0][0].item<int64_t>();
    TORCH_CHECK_VALUE(false, kOp, ": targets[", i, "] = ", targets[i].item<int64_t>(),
                      " is out of range: expected a class in [0, ", V, ") or ignore_index (",
                      ignore_index, ")");
  }
}

// --- the kernel --------------------------------------------------------------------------------

using CrossEntropyFn = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, int64_t, double);
using CrossEntropyBackwardFn = Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                      int64_t, double);

// Gradients of half-precision inputs accumulate in float32 and are cast back at the end.
at::ScalarType accumulation_dtype(at::ScalarType t) {
  return t == at::kHalf || t == at::kBFloat16 ? at::kFloat : t;
}

// Returns (mean loss, grad_x, grad_weight, grad_bias): the gradients of the loss asked for by the
// flags (of a loss gradient of one), empty (0,) tensors for those not asked for.
std::tuple<Tensor, Tensor, Tensor, Tensor> linear_cross_entropy_kernel(
    const Tensor& x, const Tensor& weight, const Tensor& targets, const OptTensor& bias,
    int64_t ignore_index, double label_smoothing, int64_t chunk_rows, bool grad_x,
    bool grad_weight, bool grad_bias) {
  check_args(x, weight, targets, bias, label_smoothing, chunk_rows);
  check_targets(targets, weight.size(0), ignore_index);
  const at::ScalarType acc = accumulation_dtype(x.scalar_type());
  const int64_t N = x.size(0);
  Tensor gx = grad_x ? at::zeros(x.sizes(), x.options()) : at::empty({0}, x.options());
  Tensor gw = grad_weight ? at::zeros(weight.sizes(), weight.options().dtype(acc))
                          : at::empty({0}, x.options());
  Tensor gb = grad_bias && bias.has_value() ? at::zeros(bias->sizes(), x.options().dtype(acc))
                                            : at::empty({0}, x.options());
  const Tensor counted = targets.ne(ignore_index);
  const Tensor n_valid = counted.sum();
  // Our ops give each chunk's mean loss and gradient over the chunk's own counted rows; the
  // chunk's share (its count / the total count) makes them the whole batch's mean. The share
  // scales the small side of each product (x's rows, grad_x's rows, the bias sums), in float32
  // at least, never the chunk's (rows, V) gradient.
  Tensor loss_sum = at::zeros({}, x.options().dtype(at::kDouble));
  const Tensor one = at::ones({}, x.options());
  const bool wanted = grad_x || grad_weight || grad_bias;
  const Tensor w_t = weight.t();
  static const auto cross_entropy = op<CrossEntropyFn>("pygpt::cross_entropy");
  static const auto cross_entropy_backward =
      op<CrossEntropyBackwardFn>("pygpt::cross_entropy_backward");
  // One logits buffer for every chunk (fresh pages for each chunk's would cost page faults).
  const Tensor buffer = at::empty({std::min(chunk_rows, N), weight.size(0)}, x.options());
  for (int64_t start = 0; start < N; start += chunk_rows) {
    const int64_t end = std::min(start + chunk_rows, N);
    const Tensor x_c = x.slice(0, start, end), t_c = targets.slice(0, start, end);
    Tensor logits = buffer.slice(0, 0, end - start);
    if (bias.has_value()) {
      at::addmm_out(logits, *bias, x_c, w_t);
    } else {
      at::mm_out(logits, x_c, w_t);
    }
    const auto [loss_c, lse] = cross_entropy.call(logits, t_c, ignore_index, label_smoothing);
    const Tensor valid_c = counted.slice(0, start, end).sum();
    loss_sum.add_(at::where(valid_c.gt(0), loss_c.to(at::kDouble) * valid_c, 0.0));
    if (!wanted) continue;
    Tensor g = cross_entropy_backward.call(one, logits, t_c, lse, ignore_index, label_smoothing);
    const Tensor share = (valid_c.to(at::kDouble) / n_valid.clamp_min(1)).to(acc);
    if (grad_x) {
      Tensor gx_c = gx.slice(0, start, end);
      at::mm_out(gx_c, g, weight).mul_(share);
    }
    if (grad_weight) gw.addmm_(g.t().to(acc), x_c.to(acc) * share);
    if (grad_bias) gb.add_(g.sum(0, /*keepdim=*/false, acc) * share);
    g.reset();  // the buffer and one chunk's gradient are all that live at once
  }
  const Tensor loss = (loss_sum / n_valid).to(x.scalar_type());  // 0 / 0 = NaN: none counted
  return {loss, gx, gw.to(weight.scalar_type()), gb.to(x.scalar_type())};
}

// --- autograd ----------------------------------------------------------------------------------

using LinearCrossEntropyFn = std::tuple<Tensor, Tensor, Tensor, Tensor>(
    const Tensor&, const Tensor&, const Tensor&, const OptTensor&, c10::SymInt, double,
    c10::SymInt, bool, bool, bool);

// Whether t is a plain tensor holding its values (not a fake, functional or batched one, nor
// seen by a dispatch mode while a graph is traced): only then may the backward read it.
bool holds_values(const Tensor& t) {
  return typeid(*t.unsafeGetTensorImpl()) == typeid(c10::TensorImpl) &&
         !t.key_set().has(c10::DispatchKey::Python) && !t.is_meta() &&
         c10::impl::TorchDispatchModeTLS::stack_len() == 0;
}

// The gradients were computed in the forward; the backward only scales them by the loss's
// incoming gradient. Its outputs (the gradients) are not differentiable.
struct LinearCrossEntropy : torch::autograd::Function<LinearCrossEntropy> {
  static variable_list forward(AutogradContext* ctx, const Tensor& x, const Tensor& weight,
                               const Tensor& targets, const OptTensor& bias,
                               c10::SymInt ignore_index, double label_smoothing,
                               c10::SymInt chunk_rows, bool grad_x, bool grad_weight,
                               bool grad_bias) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    static const auto kernel = op<LinearCrossEntropyFn>("pygpt::linear_cross_entropy");
    auto [loss, gx, gw, gb] = kernel.call(x, weight, targets, bias, ignore_index, label_smoothing,
                                          chunk_rows, grad_x, grad_weight, grad_bias);
    ctx->save_for_backward({gx, gw, gb});
    ctx->saved_data["computed"] = c10::List<bool>({grad_x, grad_weight, grad_bias});
    ctx->saved_data["has_bias"] = bias.has_value() && bias->defined();
    ctx->mark_non_differentiable({gx, gw, gb});
    ctx->set_materialize_grads(false);  // no zero-filled (V, C) gradient for the gradient outputs
    return {loss, gx, gw, gb};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    TORCH_CHECK(!at::GradMode::is_enabled(), kOp,
                ": double backward is not supported (the gradients are computed in the "
                "forward, first order only)");
    variable_list result(10);  // one per input of the op; the gradients of x, weight and bias
    const Tensor& grad_loss = grads[0];
    if (!grad_loss.defined()) return result;  // nothing flows back (see materialize_grads)
    // A loss's own backward passes 1: then the saved gradients are handed over as they are (the
    // graph releases them, so .grad takes them without a copy) instead of multiplied into new
    // (V, C) tensors. Eager only: a traced graph (fake tensors) keeps the product.
    const bool unit = holds_values(grad_loss) && grad_loss.eq(1).item<bool>();
    const variable_list saved = ctx->get_saved_variables();
    const c10::List<bool> computed = ctx->saved_data["computed"].toBoolList();
    // needs_input_grad counts only the tensors given: x, weight, targets, then bias if given.
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    const bool needed[3] = {ctx->needs_input_grad(0), ctx->needs_input_grad(1),
                            has_bias && ctx->needs_input_grad(3)};
    const char* names[3] = {"x", "weight", "bias"};
    const int slots[3] = {0, 1, 3};
    for (int i = 0; i < 3; ++i) {
      TORCH_CHECK(!needed[i] || computed[i], kOp, ": a gradient for ", names[i],
                  " is needed but was not computed in the forward; call "
                  "pygpt.ops.linear_cross_entropy, which sets the flags");
      if (computed[i]) result[slots[i]] = unit ? saved[i] : saved[i] * grad_loss;
    }
    return result;
  }
};

std::tuple<Tensor, Tensor, Tensor, Tensor> linear_cross_entropy_autograd(
    const Tensor& x, const Tensor& weight, const Tensor& targets, const OptTensor& bias,
    c10::SymInt ignore_index, double label_smoothing, c10::SymInt chunk_rows, bool grad_x,
    bool grad_weight, bool grad_bias) {
  const variable_list r =
      LinearCrossEntropy::apply(x, weight, targets, bias, std::move(ignore_index),
                                label_smoothing, std::move(chunk_rows), grad_x, grad_weight,
                                grad_bias);
  return {r[0], r[1], r[2], r[3]};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(pygpt, m) {
  // x (N, C) @ weight (V, C)^T + bias (V,), then the mean cross-entropy against targets (N,),
  // chunk_rows rows at a time. Returns (mean loss, grad_x, grad_weight, grad_bias): the
  // gradients the flags ask for (of a loss gradient of one), empty (0,) tensors for the others.
  m.def("linear_cross_entropy(Tensor x, Tensor weight, Tensor targets, Tensor? bias,"
        " SymInt ignore_index, float label_smoothing, SymInt chunk_rows, bool grad_x,"
        " bool grad_weight, bool grad_bias) -> (Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(pygpt, CompositeExplicitAutograd, m) {
  m.impl("linear_cross_entropy", &linear_cross_entropy_kernel);
}

TORCH_LIBRARY_IMPL(pygpt, Autograd, m) {
  m.impl("linear_cross_entropy", &linear_cross_entropy_autograd);
}

}  // namespace pygpt
