// pygpt.rotary, its home: the op's schema, its argument checks (rotary_args.h, for the CPU and
// CUDA bindings rotary_cpu.cpp and rotary_cuda.cpp) and its autograd in C++
// (autograd_support.h).
#include <ATen/ops/aminmax.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "bindings/autograd_support.h"
#include "bindings/checks.h"
#include "bindings/rotary_args.h"

namespace pygpt {

RotaryArgs rotary_args(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                       const at::Tensor& positions, bool inverse, const char* op) {
  TORCH_CHECK(x.dim() == 4, op, ": x must be 4-D (B, H, T, D), got shape ", x.sizes());
  TORCH_CHECK(cos.dim() == 2, op, ": cos must be 2-D (max_pos, rotary_dim / 2), got shape ",
              cos.sizes());
  check_matches(cos, "cos", x, "x", op);
  check_matches(sin, "sin", x, "x", op);
  TORCH_CHECK(sin.sizes() == cos.sizes(), op, ": sin must have cos's shape ", cos.sizes(),
              ", got ", sin.sizes());
  const int64_t B = x.size(0), H = x.size(1), T = x.size(2), D = x.size(3);
  const int64_t half = cos.size(1), max_pos = cos.size(0);
  TORCH_CHECK(2 * half <= D, op, ": cos and sin have ", half, " columns, so rotary_dim = ",
              2 * half, ", which must not exceed x's head dim D = ", D);
  TORCH_CHECK(positions.scalar_type() == at::kLong, op, ": positions must be int64, got ",
              positions.scalar_type());
  TORCH_CHECK(positions.device() == x.device(), op, ": positions is on ", positions.device(),
              " but x is on ", x.device());
  const bool per_row = positions.dim() == 2;
  TORCH_CHECK((positions.dim() == 1 && positions.size(0) == T) ||
                  (per_row && positions.size(0) == B && positions.size(1) == T),
              op, ": positions must have shape (T,) = (", T, ",) or (B, T) = (", B, ", ", T,
              "), got ", positions.sizes());
  if (positions.numel() > 0) {
    const auto [lo, hi] = at::aminmax(positions);
    const int64_t min = lo.item<int64_t>(), max = hi.item<int64_t>();
    TORCH_CHECK_VALUE(min >= 0 && max < max_pos, op, ": positions must lie in [0, ", max_pos,
                      ") (the rows of cos and sin), got values from ", min, " to ", max);
  }
  RotaryArgs a{x.stride(3) == 1 ? x : x.contiguous(), cos.contiguous(), sin.contiguous(),
               positions, at::empty(x.sizes(), x.options()), {}};
  const int64_t pos_b = per_row ? positions.stride(0) : 0;
  const int64_t pos_t = positions.stride(-1);
  a.shape = RotaryShape{B, H, T, D, half,
                        a.x.stride(0), a.x.stride(1), a.x.stride(2),
                        a.y.stride(0), a.y.stride(1), a.y.stride(2),
                        pos_b, pos_t, inverse};
  return a;
}

namespace {

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

TORCH_LIBRARY_FRAGMENT(pygpt, m) {
  // Rotary position embedding of x (B, H, T, D) by the angles in the rows `positions` of the
  // cos / sin tables (max_pos, rotary_dim / 2); inverse rotates back (its own backward).
  m.def("rotary(Tensor x, Tensor cos, Tensor sin, Tensor positions, bool inverse=False)"
        " -> Tensor");
}

TORCH_LIBRARY_IMPL(pygpt, Autograd, m) { m.impl("rotary", &rotary_autograd); }

}  // namespace pygpt
