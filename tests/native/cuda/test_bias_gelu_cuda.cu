// Tests the CUDA bias + GELU (csrc/cuda/bias_gelu.h) against the CPU kernels (csrc/cpu/
// bias_gelu.h) run in double on exactly the inputs the device sees: float32 inputs, or inputs
// rounded to bfloat16 or float16 first, for the exact GELU and its tanh approximation. Covers the
// vectorised and scalar (odd C, misaligned pointers)
// forward, one and many row groups (and the group cap) in the backward, no bias gradient, N = 0,
// and run-to-run bitwise reproducibility. Exits with 77 (ctest: skipped) without a CUDA device.
//
// Tolerances (|got - ref| <= atol + rtol * |ref|, per element), as test_layer_norm_cuda.cu:
//   float32: atol = 1e-5 * scale, rtol = 1e-5, scale = max(1, max |ref|) over the tensor;
//   bfloat16, float16: the same, plus rtol = 1.01 * u for the final rounding to the storage
//            type, u its unit roundoff (2^-8 for bfloat16, 2^-11 for float16).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cpu/bias_gelu.h"
#include "cuda/bias_gelu.h"
#include "cuda_test_support.h"
#include "../test_support.h"

namespace {

using namespace pygpt::test;
using pygpt::GeluApproximation;
using pygpt::cuda::DType;

constexpr double kFloatTol = 1e-5;
constexpr double kRoundings = 1.01;  // unit roundoffs allowed for the final rounding to 16 bits

struct Case {
  int64_t N, C;
  double scale;  // x ~ N(0, scale^2)
  int misalign;  // elements by which every device pointer is moved off 16-byte alignment
};

void expect_values(const std::string& what, const std::vector<float>& got,
                   const std::vector<double>& ref, DType dtype) {
  const double atol = kFloatTol * scale_of(ref);
  const double rtol = kRoundings * unit_roundoff(dtype) + kFloatTol;
  check(got.size() == ref.size(), what + ": size mismatch");
  expect_close(what, got.data(), ref.data(), std::min(got.size(), ref.size()), atol, rtol);
}

void run_case(const Case& c, bool bias_grad, DType dtype, GeluApproximation approximate,
              Rng& rng) {
  const int64_t N = c.N, C = c.C;
  const std::string name =
      format("bias_gelu_cuda<%s, %s> N=%ld C=%ld scale=%g misalign=%d bias_grad=%d",
             dtype_name(dtype), approximate == GeluApproximation::kTanh ? "tanh" : "none",
             static_cast<long>(N), static_cast<long>(C), c.scale, c.misalign, bias_grad);
  std::vector<float> x(N * C), dy(N * C), b(C);
  for (float& e : x) e = static_cast<float>(c.scale * rng.normal());
  for (float& e : dy) e = static_cast<float>(rng.normal());
  for (float& e : b) e = static_cast<float>(rng.normal());
  x = rounded(x, dtype);
  dy = rounded(dy, dtype);
  b = rounded(b, dtype);
  const std::vector<double> xd(x.begin(), x.end()), bd(b.begin(), b.end()),
      dyd(dy.begin(), dy.end());
  std::vector<double> ref_y(N * C), ref_dx(N * C), ref_db(C, 0.0);
  pygpt::cpu::bias_gelu_forward<double>(xd.data(), bd.data(), ref_y.data(), C, 0, N,
                                        approximate);
  pygpt::cpu::bias_gelu_backward<double>(dyd.data(), xd.data(), bd.data(), ref_dx.data(),
                                         ref_db.data(), C, 0, N, approximate);

  const size_t es = pygpt::cuda::dtype_bytes(dtype), shift = static_cast<size_t>(c.misalign) * es;
  check(shift < kPad, name + ": misalignment fits the buffers' padding");
  const size_t big = static_cast<size_t>(N * C) * es + kPad;
  const size_t small = static_cast<size_t>(C) * es + kPad;
  DeviceBuffer x_d(big), dy_d(big), y_d(big), b_d(small);
  upload_values(x_d.get(shift), x, dtype);
  upload_values(dy_d.get(shift), dy, dtype);
  upload_values(b_d.get(shift), b, dtype);
  const cudaError_t fwd = pygpt::cuda::bias_gelu_forward(
      dtype, x_d.get(shift), b_d.get(shift), y_d.get(shift), N, C, approximate, nullptr);
  check(fwd == cudaSuccess, name + ": forward launch: " + cudaGetErrorString(fwd));
  PYGPT_CUDA_CHECK(cudaDeviceSynchronize());
  expect_values(name + " y", download_values(y_d.get(shift), N * C, dtype), ref_y, dtype);

  auto backward = [&](std::vector<float>& dx, std::vector<float>& db) {
    DeviceBuffer dx_d(big), db_d(small), ws(pygpt::cuda::bias_gelu_backward_workspace_bytes(N, C));
    void* dbp = bias_grad ? db_d.get(shift) : nullptr;
    const cudaError_t bwd = pygpt::cuda::bias_gelu_backward(
        dtype, dy_d.get(shift), x_d.get(shift), b_d.get(shift), dx_d.get(shift), dbp, N, C,
        bias_grad ? ws.get() : nullptr, approximate, nullptr);
    check(bwd == cudaSuccess, name + ": backward launch: " + cudaGetErrorString(bwd));
    PYGPT_CUDA_CHECK(cudaDeviceSynchronize());
    dx = download_values(dx_d.get(shift), N * C, dtype);
    if (bias_grad) db = download_values(dbp, C, dtype);
  };
  std::vector<float> dx, db, dx2, db2;
  backward(dx, db);
  expect_values(name + " dx", dx, ref_dx, dtype);
  if (bias_grad) expect_values(name + " dbias", db, ref_db, dtype);
  backward(dx2, db2);
  check(bitwise_equal(dx, dx2) && bitwise_equal(db, db2), name + ": backward is reproducible");
}

// N = 0: nothing to compute; the bias gradient is a sum over no rows, zeros.
void check_empty(DType dtype) {
  const std::string name = format("bias_gelu_cuda<%s> N=0", dtype_name(dtype));
  DeviceBuffer x(64), b(64), y(64), db(64);
  check(pygpt::cuda::bias_gelu_forward(dtype, x.get(), b.get(), y.get(), 0, 5,
                                       GeluApproximation::kNone, nullptr) == cudaSuccess,
        name + ": forward returns cudaSuccess");
  check(pygpt::cuda::bias_gelu_backward_workspace_bytes(0, 5) == 0, name + ": no workspace");
  check(pygpt::cuda::bias_gelu_backward(dtype, y.get(), x.get(), b.get(), y.get(), db.get(), 0, 5,
                                        nullptr, GeluApproximation::kTanh, nullptr) ==
            cudaSuccess,
        name + ": backward returns cudaSuccess");
  PYGPT_CUDA_CHECK(cudaDeviceSynchronize());
  bool zeros = true;
  for (float v : download_values(db.get(), 5, dtype)) zeros = zeros && v == 0.0f;
  check(zeros, name + ": dbias is zero");
}

}  // namespace

int main() {
  if (!cuda_device_available()) return kSkipExitCode;
  Rng rng(20261124);
  const Case cases[] = {
      {1, 1, 1.0, 0},   {5, 1, 1.0, 0},    {1, 7, 3.0, 0},    {3, 33, 1.0, 0},
      {4, 64, 4.0, 0},  {4, 64, 1.0, 1},   {65, 40, 1.0, 0},  {130, 127, 2.0, 0},
      {12, 512, 1.0, 0}, {3, 1031, 1.0, 3}, {200, 24, 1.0, 0}, {70000, 3, 1.0, 0},
  };
  for (const DType dtype : kDTypes) {
    for (GeluApproximation approximate : {GeluApproximation::kNone, GeluApproximation::kTanh}) {
      for (const Case& c : cases) {
        for (bool bias_grad : {true, false}) run_case(c, bias_grad, dtype, approximate, rng);
      }
    }
    check_empty(dtype);
  }
  return Tally::get().finish("test_bias_gelu_cuda");
}
