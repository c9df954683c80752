// Shared declarations of the framework-free CUDA kernels: the element types they take and the
// launcher convention. Launchers take raw device pointers, sizes and the cudaStream_t to run
// on, enqueue their kernels, and return the launch's cudaError_t; no ATen or c10 headers, so
// nvcc compiles them on a machine without a CUDA build of PyTorch (see CMakeLists.txt).
// Inputs and outputs are contiguous (the torch binding makes them so); every kernel
// accumulates in float32 whatever the element type.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace pygpt::cuda {

enum class DType { kFloat32, kBFloat16 };

}  // namespace pygpt::cuda
