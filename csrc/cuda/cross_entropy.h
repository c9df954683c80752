// Fused softmax cross-entropy on CUDA: the mirror of cpu/cross_entropy.h. Targets are
// validated by the binding (in [0, V) or ignore_index).
#pragma once

#include "cuda/common.h"

namespace pygpt::cuda {

// lse (N,) float32 and the mean loss over non-ignored rows into loss (one float32; NaN when
// every row is ignored), from logits (N, V) in dtype with the given row stride (elements).
// label_smoothing s in [0, 1] (validated by the binding): a row's loss is
// (1 - s) * (lse - x[target]) + s * (lse - mean_j x[j]), as in cpu/cross_entropy.h; s == 0 is
// exactly the unsmoothed computation. workspace: cross_entropy_workspace_bytes(N) bytes of
// device memory.
size_t cross_entropy_workspace_bytes(int64_t N);
cudaError_t cross_entropy_forward(DType dtype, const void* logits, int64_t row_stride,
                                  const int64_t* targets, int64_t N, int64_t V,
                                  int64_t ignore_index, double label_smoothing, float* lse,
                                  float* loss, void* workspace, cudaStream_t stream);

// grad_logits (N, V) contiguous in dtype = (softmax - (1 - s) * onehot - s / V) * grad_loss /
// count, one pass; grad_loss is a device pointer to one float32 (no host sync); count the
// non-ignored rows, computed on device; ignored rows get zeros.
cudaError_t cross_entropy_backward(DType dtype, const void* logits, int64_t row_stride,
                                   const int64_t* targets, const float* lse,
                                   const float* grad_loss, int64_t N, int64_t V,
                                   int64_t ignore_index, double label_smoothing,
                                   void* grad_logits, void* workspace, cudaStream_t stream);

}  // namespace pygpt::cuda
