// Rotary position embedding (declared in rotary.h): per row, one counted loop over the pairs
// that the compiler vectorises, then a copy of the channels that are not rotated.
#include "cpu/rotary.h"

namespace pygpt::cpu {
inline namespace PYGPT_CPU_ISA {
namespace {

template <typename T, bool kInverse>
void rotate_rows(const T* x, const T* cos, const T* sin, const int64_t* positions, T* y,
                 const RotaryShape& s, int64_t row_begin, int64_t row_end) {
  const int64_t half = s.half;
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t t = row % s.T, h = row / s.T % s.H, b = row / (s.T * s.H);
    const T* xr = x + b * s.x_b + h * s.x_h + t * s.x_t;
    T* yr = y + b * s.y_b + h * s.y_h + t * s.y_t;
    const int64_t p = positions[b * s.pos_b + t * s.pos_t];
    const T* c = cos + p * half;
    const T* sn = sin + p * half;
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
      const T a = xr[i], bb = xr[i + half];
      const T si = kInverse ? -sn[i] : sn[i];
      yr[i] = a * c[i] - bb * si;
      yr[i + half] = bb * c[i] + a * si;
    }
    for (int64_t j = 2 * half; j < s.D; ++j) yr[j] = xr[j];
  }
}

}  // namespace

template <typename T>
void rotary(const T* x, const T* cos, const T* sin, const int64_t* positions, T* y,
            const RotaryShape& s, int64_t row_begin, int64_t row_end) {
  if (s.inverse) {
    rotate_rows<T, true>(x, cos, sin, positions, y, s, row_begin, row_end);
  } else {
    rotate_rows<T, false>(x, cos, sin, positions, y, s, row_begin, row_end);
  }
}

template void rotary<float>(const float*, const float*, const float*, const int64_t*, float*,
                            const RotaryShape&, int64_t, int64_t);
template void rotary<double>(const double*, const double*, const double*, const int64_t*,
                             double*, const RotaryShape&, int64_t, int64_t);

}  // namespace PYGPT_CPU_ISA
}  // namespace pygpt::cpu
