// Layer norm over the last dimension on CUDA, optionally of a residual add fused with it: the
// mirror of cpu/layer_norm.h and cpu/add_layer_norm.h.
#pragma once

#include "cuda/common.h"

namespace pygpt::cuda {

// y (N, C) in dtype, mean and rstd (N,) in float32, from x (N, C) in dtype; weight and bias (C,)
// in dtype, each may be null.
cudaError_t layer_norm_forward(DType dtype, const void* x, const void* weight, const void* bias,
                               void* y, float* mean, float* rstd, int64_t N, int64_t C,
                               double eps, cudaStream_t stream);

// Bytes of float32 scratch for the two-stage weight/bias gradient reduction.
size_t layer_norm_backward_workspace_bytes(int64_t N, int64_t C);

// dx (N, C) in dtype; dweight and dbias (C,) in dtype when non-null (weight may be null: ones).
cudaError_t layer_norm_backward(DType dtype, const void* grad_y, const void* x,
                                const void* weight, const float* mean, const float* rstd,
                                void* dx, void* dweight, void* dbias, int64_t N, int64_t C,
                                void* workspace, cudaStream_t stream);

// The residual add fused into the norm: sum = x + residual (N, C) in dtype, rounded to dtype,
// then y, mean and rstd of sum as layer_norm_forward. residual and sum must be non-null.
cudaError_t add_layer_norm_forward(DType dtype, const void* x, const void* residual,
                                   const void* weight, const void* bias, void* sum, void* y,
                                   float* mean, float* rstd, int64_t N, int64_t C, double eps,
                                   cudaStream_t stream);

// dx = layer_norm_backward's dx (of the norm of sum) + grad_sum (may be null: none), the
// gradient of both x and residual; dweight, dbias and the workspace as layer_norm_backward.
cudaError_t add_layer_norm_backward(DType dtype, const void* grad_y, const void* grad_sum,
                                    const void* sum, const void* weight, const float* mean,
                                    const float* rstd, void* dx, void* dweight, void* dbias,
                                    int64_t N, int64_t C, void* workspace, cudaStream_t stream);

}  // namespace pygpt::cuda
