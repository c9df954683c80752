// The float16 subset of the host CUDA emulator (see cuda_runtime.h beside it): the type and its
// conversions, rounding to nearest even as the device's __float2half_rn does (overflow to
// infinity, gradual underflow to subnormals, NaN kept quiet with its high payload bits).
#pragma once

#include "cuda_runtime.h"

struct __half {
  unsigned short x;
};

inline float __half2float(__half h) {
  const unsigned sign = (h.x & 0x8000u) << 16, exponent = (h.x >> 10) & 0x1fu, mantissa = h.x & 0x3ffu;
  if (exponent == 0x1f) return __uint_as_float(sign | 0x7f800000u | mantissa << 13);  // inf, NaN
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  return __uint_as_float(sign | (exponent + 112) << 23 | mantissa << 13);  // rebias 15 -> 127
}

inline __half __float2half_rn(float f) {
  const unsigned u = __float_as_uint(f), abs = u & 0x7fffffffu;
  const unsigned short sign = static_cast<unsigned short>((u >> 16) & 0x8000u);
  auto bits = [sign](unsigned magnitude) { return __half{static_cast<unsigned short>(sign | magnitude)}; };
  if (abs > 0x7f800000u) return bits(0x7e00u | ((abs >> 13) & 0x3ffu));  // quiet NaN
  if (abs >= 0x477ff000u) return bits(0x7c00u);  // 65520 and up round past 65504: infinity
  if (abs >= 0x38800000u) {                      // 2^-14 and up: a normal float16
    const unsigned rebiased = abs - 0x38000000u;  // exponent 127 -> 15 bias
    return bits((rebiased + 0xfffu + ((rebiased >> 13) & 1u)) >> 13);  // carries into the exponent
  }
  // A float16 subnormal (or zero): round (1.m * 2^(e - 127)) / 2^-24 to an integer, half to even.
  const unsigned exponent = abs >> 23, shift = 126 - exponent;
  if (exponent == 0 || shift > 24) return bits(0);  // below 2^-25: rounds to zero
  const unsigned mantissa = (abs & 0x7fffffu) | 0x800000u;
  const unsigned q = mantissa >> shift, rest = mantissa & ((1u << shift) - 1), half = 1u << (shift - 1);
  return bits(q + (rest > half || (rest == half && (q & 1u))));
}

inline unsigned short __half_as_ushort(__half h) { return h.x; }
// The bits of an unsigned short reinterpreted as a half (__ushort_as_half).
inline __half __ushort_as_half(unsigned short i) { return __half{i}; }
