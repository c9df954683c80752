// Tests the CUDA rotary kernel (csrc/cuda/rotary.h) against the double oracle of
// rotary_cases.h on exactly the inputs the device sees (float32, or rounded to bfloat16 or
// float16 first): shared and per-row positions, strided heads views, partial rotation, empty
// shapes, both directions. Exits with 77 (ctest: skipped) when there is no CUDA device.
//
// Tolerances: float32 1e-5 relative to the row scale (a rotation is two products and a sum);
// bfloat16 and float16 add half an ulp of the stored result (rtol 1.01 * u, u the unit roundoff:
// 2^-8 for bfloat16, 2^-11 for float16) to that, and the pass-through channels must be copied
// exactly in all three.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cuda/rotary.h"
#include "cuda_test_support.h"
#include "../rotary_cases.h"
#include "../test_support.h"

namespace {

using namespace pygpt::test;
using pygpt::cuda::DType;

constexpr double kFloatTol = 1e-5;
constexpr double kRoundings = 1.01;  // unit roundoffs allowed for the final rounding to 16 bits

std::vector<float> to_float(const std::vector<double>& v, DType dtype) {
  return rounded(std::vector<float>(v.begin(), v.end()), dtype);
}

void run_case(const RotaryCase& c, const RotaryInputs& in, bool inverse, DType dtype) {
  const pygpt::RotaryShape s = rotary_shape(c, inverse);
  const std::string name = format("rotary_cuda<%s> ", dtype_name(dtype)) + describe(c, inverse);
  const std::vector<float> x = to_float(in.x, dtype), cos = to_float(in.cos, dtype),
                           sin = to_float(in.sin, dtype);
  const RotaryInputs seen{to_double(x), to_double(cos), to_double(sin), in.positions};
  const std::vector<double> ref = rotary_oracle(seen, s);

  const size_t es = pygpt::cuda::dtype_bytes(dtype);
  DeviceBuffer x_d(x.size() * es), cos_d(cos.size() * es), sin_d(sin.size() * es),
      y_d(ref.size() * es), pos_d(in.positions.size() * 8);
  upload_values(x_d.get(), x, dtype);
  upload_values(cos_d.get(), cos, dtype);
  upload_values(sin_d.get(), sin, dtype);
  upload(pos_d.get(), in.positions.data(), in.positions.size() * 8);
  const cudaError_t err =
      pygpt::cuda::rotary(dtype, x_d.get(), cos_d.get(), sin_d.get(), pos_d.get<int64_t>(),
                          y_d.get(), s, nullptr);
  check(err == cudaSuccess, name + ": launch: " + cudaGetErrorString(err));
  PYGPT_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> y = download_values(y_d.get(), ref.size(), dtype);
  const double rtol = kRoundings * unit_roundoff(dtype) + kFloatTol;
  expect_close(name + " y", y.data(), ref.data(), ref.size(), kFloatTol * scale_of(ref), rtol);
  bool copied = true;
  for (int64_t r = 0; r < c.B * c.H * c.T; ++r) {
    for (int64_t j = 2 * c.half; j < c.D; ++j) {
      copied = copied && y[r * c.D + j] == ref[r * c.D + j];
    }
  }
  check(copied, name + ": pass-through channels copied exactly");
}

}  // namespace

int main() {
  if (!cuda_device_available()) return kSkipExitCode;
  Rng rng(20261123);
  for (const RotaryCase& c : rotary_cases()) {
    const RotaryInputs in = rotary_inputs(c, rng);
    for (bool inverse : {false, true}) {
      for (const DType dtype : kDTypes) run_case(c, in, inverse, dtype);
    }
  }
  // Invalid layouts are refused without a launch.
  pygpt::RotaryShape bad = rotary_shape(rotary_cases()[1], false);
  bad.half = bad.D;  // 2 * half > D
  check(pygpt::cuda::rotary(DType::kFloat32, nullptr, nullptr, nullptr, nullptr, nullptr, bad,
                            nullptr) == cudaErrorInvalidValue,
        "rotary_cuda: 2 * half > D is cudaErrorInvalidValue");
  return Tally::get().finish("test_rotary_cuda");
}
