// pygpt.bias_gelu, its home: the schemas of the op and of its backward, their argument checks
// and preparation (bias_gelu_args.h, for the CPU and CUDA bindings bias_gelu_cpu.cpp and
// bias_gelu_cuda.cpp) and the op's autograd in C++ (autograd_support.h).
#include <ATen/ops/empty_like.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "bindings/autograd_support.h"
#include "bindings/bias_gelu_args.h"
#include "bindings/checks.h"

namespace pygpt {

namespace {

// The GELU F.gelu's `approximate` names: "none" (exact) or "tanh"; anything else is refused.
GeluApproximation gelu_approximation(c10::string_view approximate, const char* op) {
  if (approximate == "none") return GeluApproximation::kNone;
  TORCH_CHECK(approximate == "tanh", op, ": approximate must be 'none' or 'tanh', got '",
              approximate, "'");
  return GeluApproximation::kTanh;
}

}  // namespace

BiasGeluArgs bias_gelu_args(const at::Tensor& x, const at::Tensor& bias,
                            c10::string_view approximate, const char* op) {
  TORCH_CHECK(x.dim() >= 1, op, ": x must have at least one dimension");
  const int64_t C = x.size(-1);
  TORCH_CHECK(bias.dim() == 1 && bias.size(0) == C, op, ": bias must have shape (", C,
              ",) to match x's last dimension, got ", bias.sizes());
  check_matches(bias, "bias", x, "x", op);
  BiasGeluArgs a;
  a.gelu = gelu_approximation(approximate, op);
  a.x = x.contiguous();
  a.bias = bias.contiguous();
  a.C = C;
  a.N = C > 0 ? a.x.numel() / C : 0;
  a.out = at::empty_like(a.x, at::MemoryFormat::Contiguous);
  return a;
}

BiasGeluArgs bias_gelu_backward_args(const at::Tensor& grad_y, const at::Tensor& x,
                                     const at::Tensor& bias, c10::string_view approximate,
                                     const char* op) {
  BiasGeluArgs a = bias_gelu_args(x, bias, approximate, op);
  check_same_as_x(grad_y, "grad_y", x, op);
  a.grad_y = grad_y.contiguous();
  return a;
}

namespace {

using BiasGeluFn = Tensor(const Tensor&, const Tensor&, c10::string_view);
using BiasGeluBackwardFn = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&,
                                                      bool, c10::string_view);

struct BiasGelu : torch::autograd::Function<BiasGelu> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& bias,
                        c10::string_view approximate) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    static const auto bias_gelu = op<BiasGeluFn>("pygpt::bias_gelu");
    ctx->save_for_backward({x, bias});
    ctx->saved_data["approximate"] = std::string(approximate);
    return bias_gelu.call(x, bias, approximate);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const bool want_bias = ctx->needs_input_grad(1);
    static const auto backward = op<BiasGeluBackwardFn>("pygpt::bias_gelu_backward");
    const std::string approximate = ctx->saved_data["approximate"].toStringRef();
    auto [dx, dbias] = backward.call(grads[0], s[0], s[1], want_bias, approximate);
    return {dx, want_bias ? dbias : Tensor(), Tensor()};
  }
};

Tensor bias_gelu_autograd(const Tensor& x, const Tensor& bias, c10::string_view approximate) {
  return BiasGelu::apply(x, bias, approximate);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(pygpt, m) {
  // gelu(x + bias) over x's last dimension, bias (C,); approximate as F.gelu's: "none", the
  // exact (erf) GELU, or "tanh", its tanh approximation.
  m.def("bias_gelu(Tensor x, Tensor bias, str approximate='none') -> Tensor");
  // Returns (grad_x, grad_bias); grad_bias is an empty tensor when not asked for.
  m.def("bias_gelu_backward(Tensor grad_y, Tensor x, Tensor bias, bool bias_grad,"
        " str approximate='none') -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(pygpt, Autograd, m) { m.impl("bias_gelu", &bias_gelu_autograd); }

}  // namespace pygpt
