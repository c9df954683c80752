// CUDA binding of pygpt.rotary.
#include <torch/library.h>

#include "bindings/checks.h"
#include "bindings/cuda_utils.h"
#include "bindings/rotary_args.h"
#include "cuda/rotary.h"

namespace pygpt {
namespace {

at::Tensor rotary_cuda(const at::Tensor& x_in, const at::Tensor& cos_in,
                       const at::Tensor& sin_in, const at::Tensor& positions_in, bool inverse) {
  const char* op = "pygpt.rotary";
  check_cuda_float(x_in, op, "x");
  const c10::cuda::CUDAGuard guard(x_in.device());
  const RotaryArgs a = rotary_args(x_in, cos_in, sin_in, positions_in, inverse, op);
  C10_CUDA_CHECK(cuda::rotary(cuda_dtype(a.x), a.x.const_data_ptr(), a.cos.const_data_ptr(),
                              a.sin.const_data_ptr(), a.positions.const_data_ptr<int64_t>(),
                              a.y.data_ptr(), a.shape, current_stream()));
  return a.y;
}

}  // namespace

TORCH_LIBRARY_IMPL(pygpt, CUDA, m) { m.impl("rotary", &rotary_cuda); }

}  // namespace pygpt
