// Shared declarations of the framework-free CUDA kernels: the element types they take and the
// launcher convention. Launchers take raw device pointers, sizes and the cudaStream_t to run
// on, enqueue their kernels, and return the launch's cudaError_t; no ATen or c10 headers, so
// nvcc compiles them on a machine without a CUDA build of PyTorch (see CMakeLists.txt).
// Inputs and outputs are contiguous (the torch binding makes them so); every kernel
// accumulates in float32 whatever the element type.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace pygpt::cuda {

// The element types of the kernels' inputs and outputs; each computes in float32 whatever it is.
enum class DType { kFloat32, kBFloat16, kFloat16 };

// Whether dtype is one of DType's (a value cast from elsewhere may not be).
constexpr bool known_dtype(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kBFloat16 || dtype == DType::kFloat16;
}

// Bytes of one element of dtype.
constexpr size_t dtype_bytes(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }

}  // namespace pygpt::cuda
