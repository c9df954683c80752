// What the CUDA bindings share: the kernels' element type for a tensor, and the stream and
// device guard every launch runs under. Compiled only in the CUDA build.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "cuda/common.h"

namespace pygpt {

// The kernels' element type of a tensor that check_cuda_float accepted.
inline cuda::DType cuda_dtype(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kBFloat16: return cuda::DType::kBFloat16;
    case at::kHalf: return cuda::DType::kFloat16;
    default: return cuda::DType::kFloat32;
  }
}

inline cudaStream_t current_stream() { return at::cuda::getCurrentCUDAStream(); }

// Uninitialised device scratch of the given size, freed with the tensor.
inline at::Tensor workspace(size_t bytes, const at::Tensor& like) {
  return at::empty({static_cast<int64_t>(bytes)}, like.options().dtype(at::kByte));
}

}  // namespace pygpt
