// What the CPU and CUDA native rotary tests share: the cases (shapes, position layouts, memory
// layouts), building one case's inputs, and a straight-from-the-definition double oracle.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "common/rotary_shape.h"
#include "test_support.h"

namespace pygpt::test {

struct RotaryCase {
  int64_t B, H, T, D, half, max_pos;
  bool per_row;     // positions (B, T); else one (T,) row for the whole batch
  bool heads_view;  // x is the (B, H, T, D) view of a (B, T, H * D) buffer
};

inline const std::vector<RotaryCase>& rotary_cases() {
  static const std::vector<RotaryCase> cases = {
      {1, 1, 1, 2, 1, 4, false, false},    {2, 3, 5, 8, 4, 16, true, false},
      {2, 3, 7, 10, 2, 16, false, true},   {1, 2, 1, 7, 3, 3, true, true},
      {3, 2, 9, 15, 5, 40, true, false},   {2, 4, 33, 64, 32, 80, false, true},
      {1, 1, 17, 33, 0, 20, false, false}, {2, 2, 65, 96, 16, 70, true, true},
      {0, 2, 3, 4, 2, 8, false, false},    {2, 2, 0, 4, 2, 8, true, false},
  };
  return cases;
}

inline std::string describe(const RotaryCase& c, bool inverse) {
  return format("B=%ld H=%ld T=%ld D=%ld half=%ld per_row=%d heads_view=%d inverse=%d",
                static_cast<long>(c.B), static_cast<long>(c.H), static_cast<long>(c.T),
                static_cast<long>(c.D), static_cast<long>(c.half), c.per_row, c.heads_view,
                inverse);
}

// The layout of a case: x as stored (heads view or contiguous), y contiguous.
inline RotaryShape rotary_shape(const RotaryCase& c, bool inverse) {
  RotaryShape s{c.B, c.H, c.T, c.D, c.half, 0, 0, 0, c.H * c.T * c.D, c.T * c.D, c.D,
                c.per_row ? c.T : 0, 1, inverse};
  if (c.heads_view) {
    s.x_b = c.T * c.H * c.D, s.x_h = c.D, s.x_t = c.H * c.D;
  } else {
    s.x_b = s.y_b, s.x_h = s.y_h, s.x_t = s.y_t;
  }
  return s;
}

struct RotaryInputs {
  std::vector<double> x, cos, sin;  // x in its storage layout
  std::vector<int64_t> positions;
};

// Random x, positions in [0, max_pos) and tables of true rotations (cos^2 + sin^2 = 1).
inline RotaryInputs rotary_inputs(const RotaryCase& c, Rng& rng) {
  RotaryInputs in{rng.normal_vector<double>(c.B * c.H * c.T * c.D), {}, {}, {}};
  for (int64_t i = 0; i < c.max_pos * c.half; ++i) {
    const double angle = 6.283185307179586 * rng.uniform() * 10.0;
    in.cos.push_back(std::cos(angle));
    in.sin.push_back(std::sin(angle));
  }
  for (int64_t i = 0; i < (c.per_row ? c.B : 1) * c.T; ++i) {
    in.positions.push_back(rng.integer(0, c.max_pos));
  }
  return in;
}

// y (contiguous B, H, T, D) from the definition: each pair times its 2x2 rotation matrix.
inline std::vector<double> rotary_oracle(const RotaryInputs& in, const RotaryShape& s) {
  std::vector<double> y(s.B * s.H * s.T * s.D);
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.H; ++h) {
      for (int64_t t = 0; t < s.T; ++t) {
        const double* xr = &in.x[b * s.x_b + h * s.x_h + t * s.x_t];
        double* yr = &y[b * s.y_b + h * s.y_h + t * s.y_t];
        const int64_t p = in.positions[b * s.pos_b + t * s.pos_t];
        for (int64_t j = 0; j < s.D; ++j) yr[j] = xr[j];
        for (int64_t i = 0; i < s.half; ++i) {
          const double c = in.cos[p * s.half + i];
          const double sn = (s.inverse ? -1.0 : 1.0) * in.sin[p * s.half + i];
          const double m[2][2] = {{c, -sn}, {sn, c}};
          const double pair[2] = {xr[i], xr[i + s.half]};
          yr[i] = m[0][0] * pair[0] + m[0][1] * pair[1];
          yr[i + s.half] = m[1][0] * pair[0] + m[1][1] * pair[1];
        }
      }
    }
  }
  return y;
}

}  // namespace pygpt::test
