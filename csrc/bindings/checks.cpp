#include "bindings/checks.h"

#include <c10/util/Exception.h>

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
  const at::ScalarType type = t.scalar_type();
  TORCH_CHECK(type == at::kFloat || type == at::kBFloat16 || type == at::kHalf, op, ": ", name,
              " must be float32, bfloat16 or float16 on CUDA, got ", type);
}

void check_matches(const at::Tensor& t, const char* name, const at::Tensor& ref,
                   const char* ref_name, const char* op) {
  TORCH_CHECK(t.device() == ref.device(), op, ": ", name, " is on ", t.device(), " but ", ref_name,
              " is on ", ref.device());
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), op, ": ", name, " has dtype ", t.scalar_type(),
              " but ", ref_name, " has dtype ", ref.scalar_type());
}

void check_same_as_x(const at::Tensor& grad, const char* name, const at::Tensor& x,
                     const char* op) {
  check_matches(grad, name, x, "x", op);
  TORCH_CHECK(grad.sizes() == x.sizes(), op, ": ", name, " must have x's shape ", x.sizes(),
              ", got ", grad.sizes());
}

}  // namespace pygpt
