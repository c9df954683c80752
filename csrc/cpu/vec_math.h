// Small math helpers shared by the CPU kernels, written so that GCC/Clang vectorise the loops
// that call them (no branches, no library calls in the float path).
#pragma once

#include "cpu/isa.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace pygpt::cpu {
inline namespace PYGPT_CPU_ISA {

// exp(x) for float with ~1 ulp error over the whole range, 0 below -87.3 (including -inf),
// +inf above 88.7, NaN for NaN. Range reduction x = n*ln2 + r with |r| <= ln2/2, then a degree-7
// Taylor polynomial (truncation error < 1e-8 relative) and 2^n built from the exponent bits.
inline float exp_fast(float x) {
  constexpr float lo = -87.3f, hi = 88.7f;
  float xc = x > lo ? x : lo;  // NaN becomes lo here, so the integer conversion below is defined
  xc = xc < hi ? xc : hi;
  // Round to nearest by the 1.5 * 2^23 shifter trick: unlike floor(), GCC vectorises it.
  constexpr float shifter = 12582912.0f;
  const float n = (xc * 1.44269504088896341f + shifter) - shifter;
  float r = xc - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const float scale = __builtin_bit_cast(float, (static_cast<int32_t>(n) + 127) << 23);
  float y = p * scale;
  y = x < lo ? 0.0f : y;
  y = x > hi ? std::numeric_limits<float>::infinity() : y;
  return x == x ? y : x;  // NaN in, NaN out
}

// float64 exists for gradcheck, where accuracy matters and speed does not.
inline double exp_fast(double x) { return std::exp(x); }

}  // namespace PYGPT_CPU_ISA
}  // namespace pygpt::cpu
