#include "bindings/fused_args.h"

#include <c10/util/Exception.h>

#include "bindings/validate.h"

namespace pygpt {

void check_bias_gelu_args(const at::Tensor& x, const at::Tensor& bias, const char* op) {
  TORCH_CHECK(x.dim() >= 1, op, ": x must have at least one dimension");
  const int64_t C = x.size(-1);
  TORCH_CHECK(bias.dim() == 1 && bias.size(0) == C, op, ": bias must have shape (", C,
              ",) to match x's last dimension, got ", bias.sizes());
  check_matches(bias, "bias", x, "x", op);
}

void check_same_as_x(const at::Tensor& grad, const char* name, const at::Tensor& x,
                     const char* op) {
  check_matches(grad, name, x, "x", op);
  TORCH_CHECK(grad.sizes() == x.sizes(), op, ": ", name, " must have x's shape ", x.sizes(),
              ", got ", grad.sizes());
}

void check_add_layer_norm_args(const at::Tensor& x, const at::Tensor& residual,
                               const std::optional<at::Tensor>& weight,
                               const std::optional<at::Tensor>& bias, double eps, const char* op) {
  check_layer_norm_args(x, weight, bias, op);
  check_same_as_x(residual, "residual", x, op);
  TORCH_CHECK_VALUE(eps >= 0, op, ": eps must be non-negative, got ", eps);
}

}  // namespace pygpt
