// CPU binding of pygpt.rotary: rows in parallel.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "bindings/checks.h"
#include "bindings/parallel_rows.h"
#include "bindings/rotary_args.h"
#include "dispatch/cpu_dispatch.h"

namespace pygpt {
namespace {

at::Tensor rotary_cpu(const at::Tensor& x_in, const at::Tensor& cos_in, const at::Tensor& sin_in,
                      const at::Tensor& positions_in, bool inverse) {
  const char* op = "pygpt.rotary";
  check_cpu_float(x_in, op, "x");
  const RotaryArgs a = rotary_args(x_in, cos_in, sin_in, positions_in, inverse, op);
  const RotaryShape& s = a.shape;
  AT_DISPATCH_FLOATING_TYPES(a.x.scalar_type(), "pygpt.rotary", [&] {
    at::parallel_for(0, s.B * s.H * s.T, row_grain(s.D), [&](int64_t begin, int64_t end) {
      cpu::kernels<scalar_t>().rotary(a.x.const_data_ptr<scalar_t>(), a.cos.const_data_ptr<scalar_t>(),
                            a.sin.const_data_ptr<scalar_t>(),
                            a.positions.const_data_ptr<int64_t>(), a.y.data_ptr<scalar_t>(), s,
                            begin, end);
    });
  });
  return a.y;
}

}  // namespace

TORCH_LIBRARY_IMPL(pygpt, CPU, m) { m.impl("rotary", &rotary_cpu); }

}  // namespace pygpt
