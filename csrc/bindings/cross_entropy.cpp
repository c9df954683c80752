// pygpt.cross_entropy, its home: the schemas of the op and of its backward, their argument checks
// and preparation (cross_entropy_args.h, for the CPU and CUDA bindings cross_entropy_cpu.cpp and
// cross_entropy_cuda.cpp) and the op's autograd in C++ (autograd_support.h).
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "bindings/autograd_support.h"
#include "bindings/cross_entropy_args.h"

namespace pygpt {
namespace {

// What the forward and the backward check and prepare alike: logits with unit column stride,
// targets contiguous, and the sizes.
CrossEntropyArgs checked_rows(const at::Tensor& logits, const at::Tensor& targets,
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
  CrossEntropyArgs a;
  a.logits = logits.stride(1) == 1 ? logits : logits.contiguous();
  a.targets = targets.contiguous();
  a.N = a.logits.size(0);
  a.V = a.logits.size(1);
  return a;
}

}  // namespace

CrossEntropyArgs cross_entropy_args(const at::Tensor& logits, const at::Tensor& targets,
                                    double label_smoothing, at::ScalarType stats_dtype,
                                    const char* op) {
  CrossEntropyArgs a = checked_rows(logits, targets, label_smoothing, op);
  a.lse = at::empty({a.N}, a.logits.options().dtype(stats_dtype));
  return a;
}

CrossEntropyArgs cross_entropy_backward_args(const at::Tensor& logits, const at::Tensor& targets,
                                             const at::Tensor& lse, double label_smoothing,
                                             const char* op) {
  CrossEntropyArgs a = checked_rows(logits, targets, label_smoothing, op);
  a.lse = lse.contiguous();
  a.grad_logits = at::empty({a.N, a.V}, a.logits.options());
  return a;
}

namespace {

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

}  // namespace

TORCH_LIBRARY_FRAGMENT(pygpt, m) {
  // Returns (mean loss, lse per row); label_smoothing as in F.cross_entropy.
  m.def("cross_entropy(Tensor logits, Tensor targets, int ignore_index=-100,"
        " float label_smoothing=0.0) -> (Tensor, Tensor)");
  m.def("cross_entropy_backward(Tensor grad_loss, Tensor logits, Tensor targets, Tensor lse,"
        " int ignore_index, float label_smoothing=0.0) -> Tensor");
}

TORCH_LIBRARY_IMPL(pygpt, Autograd, m) { m.impl("cross_entropy", &cross_entropy_autograd); }

}  // namespace pygpt
