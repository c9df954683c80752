// The shape of one scaled-dot-product attention call, shared by the CPU (cpu/attention.h) and
// CUDA (cuda/attention.h) kernels and their bindings: plain sizes, no framework types.
#pragma once

#include <cstdint>

namespace pygpt {

// q (B, H, Tq, Dk), k (B, H, Tk, Dk), v (B, H, Tk, Dv); out (B, H, Tq, Dv).
struct AttentionShape {
  int64_t B, H, Tq, Tk, Dk, Dv;
  bool causal;  // bottom-right aligned: query i sees keys j <= i + (Tk - Tq)
  double scale;  // multiplies q k^T before the softmax
};

}  // namespace pygpt
