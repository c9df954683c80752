// The argument checks and preparation of pygpt.cross_entropy and its backward
// (cross_entropy.cpp), shared by their CPU and CUDA bindings; each binding checks the device and
// dtype of logits first, and the targets' values itself (on the CPU, or on the device).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace pygpt {

// A checked cross_entropy call, ready for a kernel: logits (N, V) with unit column stride (a copy
// only when it had not; any row stride), targets contiguous; lse (N,), the forward's new output
// and the backward's input made contiguous; grad_logits, new (N, V), only in the backward's.
struct CrossEntropyArgs {
  at::Tensor logits, targets, lse, grad_logits;
  int64_t N, V;
};

// The forward's: logits (N, V), targets (N,) int64 on logits' device; label_smoothing finite in
// [0, 1]. lse gets stats_dtype (the logits' on the CPU, float32 on CUDA).
CrossEntropyArgs cross_entropy_args(const at::Tensor& logits, const at::Tensor& targets,
                                    double label_smoothing, at::ScalarType stats_dtype,
                                    const char* op);

// The backward's: logits, targets and label_smoothing checked as the forward's. lse is only made
// contiguous and grad_loss is not looked at: their checks differ by device (lse has the logits'
// dtype on the CPU, float32 on CUDA), so each binding makes them after this call, on the tensors
// it was given.
CrossEntropyArgs cross_entropy_backward_args(const at::Tensor& logits, const at::Tensor& targets,
                                             const at::Tensor& lse, double label_smoothing,
                                             const char* op);

}  // namespace pygpt
