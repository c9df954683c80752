// The argument checks of pygpt.cross_entropy and its backward (cross_entropy.cpp), shared by
// their CPU and CUDA bindings.
#pragma once

#include <ATen/core/Tensor.h>

namespace pygpt {

// logits (N, V) floating, targets (N,) int64 on the same device; label_smoothing finite in [0, 1].
void check_cross_entropy_args(const at::Tensor& logits, const at::Tensor& targets,
                              double label_smoothing, const char* op);

}  // namespace pygpt
