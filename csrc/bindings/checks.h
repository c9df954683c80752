// Argument checks that every op's bindings use (device and dtype of a tensor, a tensor matching
// another); each op's own checks are in its <op>.cpp. Each failure raises a c10::Error
// (RuntimeError or ValueError in Python) whose message names the op, the argument and what was
// expected.
#pragma once

#include <ATen/core/Tensor.h>

namespace pygpt {

// t is float32 or float64 (the dtypes the CPU kernels implement).
void check_cpu_float(const at::Tensor& t, const char* op, const char* name);

// t is a CUDA tensor of float32, bfloat16 or float16 (the dtypes the CUDA kernels implement).
void check_cuda_float(const at::Tensor& t, const char* op, const char* name);

// t has the dtype and device of ref.
void check_matches(const at::Tensor& t, const char* name, const at::Tensor& ref,
                   const char* ref_name, const char* op);

// grad (named `name`) has x's shape, dtype and device.
void check_same_as_x(const at::Tensor& grad, const char* name, const at::Tensor& x,
                     const char* op);

}  // namespace pygpt
