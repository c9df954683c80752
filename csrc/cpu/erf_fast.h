// erf for the CPU kernels (GELU), written so that GCC/Clang vectorise the loops that call it: no
// branches and no library calls in the float path.
#pragma once

#include "cpu/isa.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace pygpt::cpu {
inline namespace PYGPT_CPU_ISA {

// erf(x) for float within 5e-7 relative error of the exact erf over all floats (about 8 float
// ulps; tests/native/test_bias_gelu.cpp checks it against std::erf in double on a dense grid),
// odd, exactly +-1 beyond |x| = 4 (where erf rounds to +-1 in float anyway), NaN for NaN.
// erf(x) / x = P(x^2) / Q(x^2) on [-4, 4], with P of degree 5 and Q of degree 5 fitted here to
// a relative error of 2.5e-8 (a linearised least-squares rational fit, reweighted towards
// minimax); the rest of the error is float rounding. Q > 1 everywhere, so no pole.
inline float erf_fast(float x) {
  // |x| clamped to 4 on the bits (an integer min; a NaN clamps too and is restored at the end).
  // Clamping with a float min or a select would let GCC's PRE specialise the polynomials on the
  // clamped constant, which leaves branches in the loop that -ftrapping-math then keeps it from
  // vectorising without AVX-512's masks.
  const int32_t bits = __builtin_bit_cast(int32_t, x);
  const int32_t magnitude = std::min(bits & 0x7fffffff, 0x40800000);  // 0x40800000 is 4.0f
  const float xc = __builtin_bit_cast(float, magnitude | (bits & INT32_MIN));
  const float t = xc * xc;
  float p = 1.986920097e-06f;
  p = p * t + 2.845636336e-04f;
  p = p * t + 3.882992547e-03f;
  p = p * t + 5.310065672e-02f;
  p = p * t + 1.935361028e-01f;
  p = p * t + 1.128379107e+00f;
  float q = 3.742149420e-05f;
  q = q * t + 1.185496920e-03f;
  q = q * t + 1.520653442e-02f;
  q = q * t + 1.153463870e-01f;
  q = q * t + 5.048494339e-01f;
  q = q * t + 1.0f;
  // The fit overshoots 1 by an ulp near |x| = 4.
  const float y = std::min(std::max(xc * (p / q), -1.0f), 1.0f);
  return x == x ? y : x;  // NaN in, NaN out
}

// float64 exists for gradcheck, where accuracy matters and speed does not.
inline double erf_fast(double x) { return std::erf(x); }

}  // namespace PYGPT_CPU_ISA
}  // namespace pygpt::cpu
