// The shape and memory layout of one rotary-embedding call, shared by the CPU and CUDA kernels
// (plain integers only, so that both compile without a framework).
//
// x and y are (B, H, T, D) with any strides over B, H and T and contiguous channels (stride 1
// over D), so that the (B, T, H * D) -> (B, H, T, D) view of a projection is taken as it is.
// Row (b, h, t) is rotated by the angle of position p = positions[b * pos_b + t * pos_t]
// (pos_b = 0 when one position row serves the whole batch): the tables hold cos and sin of
// p * theta_i, `half` columns each, row p at table + p * half. Half-split layout (GPT-NeoX,
// LLaMA): channel i < half pairs with channel i + half,
//   y[i]        = x[i] * cos - x[i + half] * sin
//   y[i + half] = x[i + half] * cos + x[i] * sin,
// and channels from 2 * half to D pass through unchanged (partial rotation). The inverse
// rotation (sin negated) is the backward: the gradient of a rotation is the inverse rotation.
#pragma once

#include <cstdint>

namespace pygpt {

struct RotaryShape {
  int64_t B, H, T, D;
  int64_t half;                 // rotated pairs per row: rotary_dim / 2, 2 * half <= D
  int64_t x_b, x_h, x_t;        // strides of x (elements)
  int64_t y_b, y_h, y_t;        // strides of y (elements)
  int64_t pos_b, pos_t;         // strides of the position ids
  bool inverse;                 // rotate by -angle (the backward)
};

}  // namespace pygpt
