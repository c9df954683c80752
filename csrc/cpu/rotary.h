// Rotary position embedding on the CPU: framework-free math (layout in common/rotary_shape.h).
#pragma once

#include "cpu/isa.h"

#include <cstdint>

#include "common/rotary_shape.h"

namespace pygpt::cpu {
inline namespace PYGPT_CPU_ISA {

// y = x rotated by the angles of its rows' positions, for rows [row_begin, row_end) of the
// B * H * T rows in (b, h, t) order. cos and sin are (max_pos, half) row-major; every position
// id must lie in [0, max_pos) (the caller checks). y must not overlap x.
template <typename T>
void rotary(const T* x, const T* cos, const T* sin, const int64_t* positions, T* y,
            const RotaryShape& s, int64_t row_begin, int64_t row_end);

}  // namespace PYGPT_CPU_ISA
}  // namespace pygpt::cpu
