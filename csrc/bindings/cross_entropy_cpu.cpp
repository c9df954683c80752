// CPU binding of pygpt.cross_entropy and its backward: validates targets, runs rows in parallel,
// and turns the summed row losses into the mean over non-ignored targets (F.cross_entropy's rule).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/scalar_tensor.h>
#include <torch/library.h>

#include "bindings/checks.h"
#include "bindings/cross_entropy_args.h"
#include "bindings/parallel_rows.h"
#include "dispatch/cpu_dispatch.h"

namespace pygpt {
namespace {

// Raises on a target outside [0, V) that is not ignore_index; returns how many are not ignored.
int64_t count_valid_targets(const at::Tensor& targets, int64_t V, int64_t ignore_index,
                            const char* op) {
  const int64_t* t = targets.const_data_ptr<int64_t>();
  int64_t valid = 0;
  for (int64_t i = 0; i < targets.numel(); ++i) {
    if (t[i] == ignore_index) continue;
    TORCH_CHECK_VALUE(t[i] >= 0 && t[i] < V, op, ": targets[", i, "] = ", t[i],
                      " is out of range: expected a class in [0, ", V, ") or ignore_index (",
                      ignore_index, ")");
    ++valid;
  }
  return valid;
}

std::tuple<at::Tensor, at::Tensor> cross_entropy_cpu(const at::Tensor& logits_in,
                                                     const at::Tensor& targets_in,
                                                     int64_t ignore_index, double label_smoothing) {
  const char* op = "pygpt.cross_entropy";
  check_cpu_float(logits_in, op, "logits");
  const CrossEntropyArgs a =
      cross_entropy_args(logits_in, targets_in, label_smoothing, logits_in.scalar_type(), op);
  const int64_t valid = count_valid_targets(a.targets, a.V, ignore_index, op);
  TORCH_CHECK_VALUE(a.V > 0 || valid == 0, op, ": logits has no classes (V = 0)");
  double loss_sum = 0;
  AT_DISPATCH_FLOATING_TYPES(a.logits.scalar_type(), "pygpt.cross_entropy", [&] {
    loss_sum = at::parallel_reduce(
        0, a.N, row_grain(a.V), 0.0,
        [&](int64_t begin, int64_t end, double acc) {
          return acc + cpu::kernels<scalar_t>().cross_entropy_forward(
                           a.logits.const_data_ptr<scalar_t>(), a.logits.stride(0),
                           a.targets.const_data_ptr<int64_t>(), a.V, ignore_index,
                           label_smoothing, a.lse.data_ptr<scalar_t>(), begin, end);
        },
        std::plus<double>());
  });
  // No valid target gives 0 / 0 = nan, as F.cross_entropy does.
  const double loss = valid > 0 ? loss_sum / double(valid) : std::nan("");
  return {at::scalar_tensor(loss, a.logits.options()), a.lse};
}

at::Tensor cross_entropy_backward_cpu(const at::Tensor& grad_loss, const at::Tensor& logits_in,
                                      const at::Tensor& targets_in, const at::Tensor& lse_in,
                                      int64_t ignore_index, double label_smoothing) {
  const char* op = "pygpt.cross_entropy_backward";
  check_cpu_float(logits_in, op, "logits");
  const CrossEntropyArgs a =
      cross_entropy_backward_args(logits_in, targets_in, lse_in, label_smoothing, op);
  check_matches(grad_loss, "grad_loss", logits_in, "logits", op);
  check_matches(lse_in, "lse", logits_in, "logits", op);
  TORCH_CHECK(grad_loss.numel() == 1, op, ": grad_loss must hold one value, got shape ",
              grad_loss.sizes());
  TORCH_CHECK(lse_in.dim() == 1 && lse_in.size(0) == logits_in.size(0), op,
              ": lse must have shape (", logits_in.size(0), ",), got ", lse_in.sizes());
  const int64_t valid = count_valid_targets(a.targets, a.V, ignore_index, op);
  AT_DISPATCH_FLOATING_TYPES(a.logits.scalar_type(), "pygpt.cross_entropy", [&] {
    // With no valid target every row is ignored and written as zeros; the scale is unused.
    const scalar_t scale =
        valid > 0 ? scalar_t(grad_loss.item<double>() / double(valid)) : scalar_t(0);
    at::parallel_for(0, a.N, row_grain(a.V), [&](int64_t begin, int64_t end) {
      cpu::kernels<scalar_t>().cross_entropy_backward(
          a.logits.const_data_ptr<scalar_t>(), a.logits.stride(0),
          a.targets.const_data_ptr<int64_t>(), a.lse.const_data_ptr<scalar_t>(), a.V,
          ignore_index, label_smoothing, scale, a.grad_logits.data_ptr<scalar_t>(), begin, end);
    });
  });
  return a.grad_logits;
}

}  // namespace

TORCH_LIBRARY_IMPL(pygpt, CPU, m) {
  m.impl("cross_entropy", &cross_entropy_cpu);
  m.impl("cross_entropy_backward", &cross_entropy_backward_cpu);
}

}  // namespace pygpt
