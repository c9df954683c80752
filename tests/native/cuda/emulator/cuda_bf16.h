// The bfloat16 subset of the host CUDA emulator (see cuda_runtime.h beside it): the type and its
// conversions, rounding to nearest even as the device's __float2bfloat16_rn does.
#pragma once

#include "cuda_runtime.h"

struct __nv_bfloat16 {
  unsigned short x;
};

inline float __bfloat162float(__nv_bfloat16 b) { return __uint_as_float(unsigned{b.x} << 16); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  unsigned u = __float_as_uint(f);
  if (std::isnan(f)) return {static_cast<unsigned short>((u >> 16) | 0x40u)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return {static_cast<unsigned short>(u >> 16)};
}
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.x; }
// The bits of an unsigned short reinterpreted as a bfloat16 (__ushort_as_bfloat16).
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short i) { return __nv_bfloat16{i}; }
