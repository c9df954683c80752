// Rotary position embedding on CUDA: the mirror of cpu/rotary.h (layout in
// common/rotary_shape.h).
#pragma once

#include "common/rotary_shape.h"
#include "cuda/common.h"

namespace pygpt::cuda {

// y = x rotated by the angles of its rows' positions (s.inverse: by minus them), x, y, cos and
// sin in dtype, positions int64 in [0, max_pos) (the caller checks). y must not overlap x.
cudaError_t rotary(DType dtype, const void* x, const void* cos, const void* sin,
                   const int64_t* positions, void* y, const RotaryShape& s, cudaStream_t stream);

}  // namespace pygpt::cuda
