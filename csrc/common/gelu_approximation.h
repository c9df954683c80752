// Which GELU the bias + GELU kernels compute, shared by the CPU (cpu/bias_gelu.h) and CUDA
// (cuda/bias_gelu.h) kernels and their bindings, named as F.gelu's `approximate` argument names
// them ("none", "tanh"): plain values, no framework types.
#pragma once

namespace pygpt {

enum class GeluApproximation {
  kNone,  // the exact GELU, h * Phi(h) = h * (1 + erf(h / sqrt 2)) / 2
  kTanh,  // its tanh approximation (GPT-2's): h * (1 + tanh(sqrt(2 / pi) (h + 0.044715 h^3))) / 2
};

}  // namespace pygpt
