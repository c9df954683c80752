// Bias + GELU fused, on CUDA: the mirror of cpu/bias_gelu.h.
#pragma once

#include "common/gelu_approximation.h"
#include "cuda/common.h"

namespace pygpt::cuda {

// y = gelu(x + bias) for x and y (N, C) and bias (C,), all in dtype; gelu the exact (erf) GELU
// or its tanh approximation, as `approximate` says.
cudaError_t bias_gelu_forward(DType dtype, const void* x, const void* bias, void* y, int64_t N,
                              int64_t C, GeluApproximation approximate, cudaStream_t stream);

// Bytes of float32 scratch for the two-stage bias gradient reduction.
size_t bias_gelu_backward_workspace_bytes(int64_t N, int64_t C);

// dx = grad_y * gelu'(x + bias), (N, C) in dtype; dbias (C,) in dtype, the column sums of dx
// (in float32 before rounding), when non-null, which needs the workspace.
cudaError_t bias_gelu_backward(DType dtype, const void* grad_y, const void* x, const void* bias,
                               void* dx, void* dbias, int64_t N, int64_t C, void* workspace,
                               GeluApproximation approximate, cudaStream_t stream);

}  // namespace pygpt::cuda
