// The argument checks and kernel layout of pygpt.rotary (rotary.cpp), shared by its CPU and CUDA
// bindings.
#pragma once

#include <ATen/core/Tensor.h>

#include "common/rotary_shape.h"

namespace pygpt {

// A checked rotary call: x with contiguous channels (a copy only when x's were not), the
// contiguous tables, the position ids, and the layout of x and of y, a new contiguous
// (B, H, T, D) tensor. Keep the struct alive while the kernel runs.
struct RotaryArgs {
  at::Tensor x, cos, sin, positions, y;
  RotaryShape shape;
};

// x (B, H, T, D) floating; cos and sin (max_pos, half) with x's dtype and device, 2 * half <= D;
// positions int64 (T,) or (B, T) on x's device with values in [0, max_pos). The dtype of x is
// checked by the caller (the CPU and CUDA kernels take different ones).
RotaryArgs rotary_args(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                       const at::Tensor& positions, bool inverse, const char* op);

}  // namespace pygpt
