// CUDA binding of pygpt.cross_entropy and its backward. Targets are checked on the device (one
// synchronisation for the error, as the CPU op's check); the loss reduction and the gradient's
// scale stay on the device. lse is float32 on CUDA; the loss has the logits' dtype.
#include <ATen/ATen.h>  // tensor comparison operators for the target check
#include <torch/library.h>

#include "bindings/checks.h"
#include "bindings/cross_entropy_args.h"
#include "bindings/cuda_utils.h"
#include "cuda/cross_entropy.h"

namespace pygpt {
namespace {

void check_targets(const at::Tensor& targets, int64_t V, int64_t ignore_index, const char* op) {
  const at::Tensor bad = ((targets < 0) | (targets >= V)) & (targets != ignore_index);
  if (bad.any().item<bool>()) {
    const int64_t i = bad.nonzero()[0][0].item<int64_t>();
    TORCH_CHECK_VALUE(false, op, ": targets[", i, "] = ", targets[i].item<int64_t>(),
                      " is out of range: expected a class in [0, ", V, ") or ignore_index (",
                      ignore_index, ")");
  }
}

std::tuple<at::Tensor, at::Tensor> cross_entropy_cuda(const at::Tensor& logits_in,
                                                      const at::Tensor& targets_in,
                                                      int64_t ignore_index,
                                                      double label_smoothing) {
  const char* op = "pygpt.cross_entropy";
  check_cuda_float(logits_in, op, "logits");
  const c10::cuda::CUDAGuard guard(logits_in.device());
  const CrossEntropyArgs a =
      cross_entropy_args(logits_in, targets_in, label_smoothing, at::kFloat, op);
  check_targets(a.targets, a.V, ignore_index, op);
  at::Tensor loss = at::empty({}, a.logits.options().dtype(at::kFloat));
  at::Tensor scratch = workspace(cuda::cross_entropy_workspace_bytes(a.N), a.logits);
  C10_CUDA_CHECK(cuda::cross_entropy_forward(
      cuda_dtype(a.logits), a.logits.const_data_ptr(), a.logits.stride(0),
      a.targets.const_data_ptr<int64_t>(), a.N, a.V, ignore_index, label_smoothing,
      a.lse.data_ptr<float>(), loss.data_ptr<float>(), scratch.data_ptr(), current_stream()));
  return {loss.to(a.logits.scalar_type()), a.lse};
}

at::Tensor cross_entropy_backward_cuda(const at::Tensor& grad_loss, const at::Tensor& logits_in,
                                       const at::Tensor& targets_in, const at::Tensor& lse,
                                       int64_t ignore_index, double label_smoothing) {
  const char* op = "pygpt.cross_entropy_backward";
  check_cuda_float(logits_in, op, "logits");
  const c10::cuda::CUDAGuard guard(logits_in.device());
  const CrossEntropyArgs a =
      cross_entropy_backward_args(logits_in, targets_in, lse, label_smoothing, op);
  check_matches(grad_loss, "grad_loss", logits_in, "logits", op);
  TORCH_CHECK(grad_loss.numel() == 1, op, ": grad_loss must hold one value, got shape ",
              grad_loss.sizes());
  TORCH_CHECK(lse.device() == logits_in.device() && lse.scalar_type() == at::kFloat &&
                  lse.dim() == 1 && lse.size(0) == logits_in.size(0),
              op, ": lse must be a float32 tensor of shape (", logits_in.size(0), ",)");
  const at::Tensor grad = grad_loss.to(at::kFloat).contiguous();
  at::Tensor scratch = workspace(cuda::cross_entropy_workspace_bytes(a.N), a.logits);
  C10_CUDA_CHECK(cuda::cross_entropy_backward(
      cuda_dtype(a.logits), a.logits.const_data_ptr(), a.logits.stride(0),
      a.targets.const_data_ptr<int64_t>(), a.lse.const_data_ptr<float>(),
      grad.const_data_ptr<float>(), a.N, a.V, ignore_index, label_smoothing,
      a.grad_logits.data_ptr(), scratch.data_ptr(), current_stream()));
  return a.grad_logits;
}

}  // namespace

TORCH_LIBRARY_IMPL(pygpt, CUDA, m) {
  m.impl("cross_entropy", &cross_entropy_cuda);
  m.impl("cross_entropy_backward", &cross_entropy_backward_cuda);
}

}  // namespace pygpt
