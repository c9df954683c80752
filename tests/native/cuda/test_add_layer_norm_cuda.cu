// Tests the CUDA residual add + layer norm (add_layer_norm_* in csrc/cuda/layer_norm.h) against
// the CPU kernels (csrc/cpu/add_layer_norm.h) run in double on exactly the sum the device
// normalises: x + residual in float32, rounded to the storage type (bfloat16, float16). Covers the
// register and block-per-row (C > 16384 forward, > 8192 backward) paths, vectorised and scalar
// (odd C, misaligned pointers), with and without grad_sum, weight and bias, and checks that the
// sum output is that sum bit for bit. Exits with 77 (ctest: skipped) without a CUDA device.
// Tolerances as test_layer_norm_cuda.cu.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cpu/add_layer_norm.h"
#include "cuda/layer_norm.h"
#include "cuda_test_support.h"
#include "../test_support.h"

namespace {

using namespace pygpt::test;
using pygpt::cuda::DType;

constexpr double kEps = 1e-5;
constexpr double kFloatTol = 1e-5;
constexpr double kRoundings = 1.01;  // unit roundoffs allowed for the final rounding to 16 bits

struct Case {
  int64_t N, C;
  int misalign;
  bool affine, grad_sum;
};

// dtype: the type got was stored in (float32 for mean and rstd whatever the tensors' type).
void expect_values(const std::string& what, const std::vector<float>& got,
                   const std::vector<double>& ref, DType dtype) {
  const double atol = kFloatTol * scale_of(ref);
  const double rtol = kRoundings * unit_roundoff(dtype) + kFloatTol;
  check(got.size() == ref.size(), what + ": size mismatch");
  expect_close(what, got.data(), ref.data(), std::min(got.size(), ref.size()), atol, rtol);
}

std::vector<float> normals(Rng& rng, size_t n, double mean, double stddev, DType dtype) {
  std::vector<float> v(n);
  for (float& e : v) e = static_cast<float>(mean + stddev * rng.normal());
  return rounded(v, dtype);
}

void run_case(const Case& c, DType dtype, Rng& rng) {
  const int64_t N = c.N, C = c.C;
  const std::string name =
      format("add_layer_norm_cuda<%s> N=%ld C=%ld misalign=%d affine=%d grad_sum=%d",
             dtype_name(dtype), static_cast<long>(N), static_cast<long>(C), c.misalign,
             c.affine, c.grad_sum);
  const std::vector<float> x = normals(rng, N * C, 0.0, 1.0, dtype),
                           r = normals(rng, N * C, 1.0, 2.0, dtype),
                           dy = normals(rng, N * C, 0.0, 1.0, dtype),
                           dsum = c.grad_sum ? normals(rng, N * C, 0.0, 1.0, dtype)
                                             : std::vector<float>(),
                           w = c.affine ? normals(rng, C, 1.0, 0.5, dtype) : std::vector<float>(),
                           b = c.affine ? normals(rng, C, 0.0, 1.0, dtype) : std::vector<float>();
  // The sum the device stores and normalises.
  std::vector<float> s(N * C);
  for (int64_t k = 0; k < N * C; ++k) s[k] = x[k] + r[k];
  s = rounded(s, dtype);
  auto d = [](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
  const std::vector<double> sd = d(s), zeros(N * C, 0.0), wd = d(w), bd = d(b), dyd = d(dy),
                            dsd = d(dsum);
  std::vector<double> ref_s(N * C), y(N * C), mean(N), rstd(N), dx(N * C), dw(C, 0.0), db(C, 0.0);
  const double* wp = c.affine ? wd.data() : nullptr;
  pygpt::cpu::add_layer_norm_forward<double>(sd.data(), zeros.data(), wp,
                                             c.affine ? bd.data() : nullptr, ref_s.data(),
                                             y.data(), mean.data(), rstd.data(), C, kEps, 0, N);
  pygpt::cpu::add_layer_norm_backward<double>(dyd.data(), c.grad_sum ? dsd.data() : nullptr,
                                              ref_s.data(), wp, mean.data(), rstd.data(),
                                              dx.data(), dw.data(), db.data(), C, 0, N);

  const size_t es = pygpt::cuda::dtype_bytes(dtype), shift = static_cast<size_t>(c.misalign) * es;
  check(shift < kPad, name + ": misalignment fits the buffers' padding");
  const size_t big = static_cast<size_t>(N * C) * es + kPad;
  const size_t small = static_cast<size_t>(C) * es + kPad;
  DeviceBuffer x_d(big), r_d(big), s_d(big), y_d(big), dy_d(big), ds_d(big), dx_d(big), w_d(small),
      b_d(small), dw_d(small), db_d(small), mean_d(N * 4 + 4), rstd_d(N * 4 + 4),
      ws(pygpt::cuda::layer_norm_backward_workspace_bytes(N, C));
  upload_values(x_d.get(shift), x, dtype);
  upload_values(r_d.get(shift), r, dtype);
  upload_values(dy_d.get(shift), dy, dtype);
  upload_values(ds_d.get(shift), dsum, dtype);
  upload_values(w_d.get(shift), w, dtype);
  upload_values(b_d.get(shift), b, dtype);
  void* wdev = c.affine ? w_d.get(shift) : nullptr;
  const cudaError_t fwd = pygpt::cuda::add_layer_norm_forward(
      dtype, x_d.get(shift), r_d.get(shift), wdev, c.affine ? b_d.get(shift) : nullptr,
      s_d.get(shift), y_d.get(shift), mean_d.get<float>(), rstd_d.get<float>(), N, C, kEps,
      nullptr);
  check(fwd == cudaSuccess, name + ": forward launch: " + cudaGetErrorString(fwd));
  const cudaError_t bwd = pygpt::cuda::add_layer_norm_backward(
      dtype, dy_d.get(shift), c.grad_sum ? ds_d.get(shift) : nullptr, s_d.get(shift), wdev,
      mean_d.get<float>(), rstd_d.get<float>(), dx_d.get(shift),
      c.affine ? dw_d.get(shift) : nullptr, c.affine ? db_d.get(shift) : nullptr, N, C,
      c.affine ? ws.get() : nullptr, nullptr);
  check(bwd == cudaSuccess, name + ": backward launch: " + cudaGetErrorString(bwd));
  PYGPT_CUDA_CHECK(cudaDeviceSynchronize());

  check(bitwise_equal(download_values(s_d.get(shift), N * C, dtype), s),
        name + ": sum is x + residual rounded to the storage type");
  expect_values(name + " y", download_values(y_d.get(shift), N * C, dtype), y, dtype);
  const DType f32 = DType::kFloat32;  // mean and rstd are float32 whatever the tensors' type
  expect_values(name + " mean", download_values(mean_d.get(), N, f32), mean, f32);
  expect_values(name + " rstd", download_values(rstd_d.get(), N, f32), rstd, f32);
  expect_values(name + " dx", download_values(dx_d.get(shift), N * C, dtype), dx, dtype);
  if (c.affine) {
    expect_values(name + " dweight", download_values(dw_d.get(shift), C, dtype), dw, dtype);
    expect_values(name + " dbias", download_values(db_d.get(shift), C, dtype), db, dtype);
  }
}

}  // namespace

int main() {
  if (!cuda_device_available()) return kSkipExitCode;
  Rng rng(20261124);
  const Case cases[] = {
      {1, 1, 0, true, true},      {3, 7, 0, true, false},     {37, 128, 0, true, true},
      {37, 128, 1, false, true},  {64, 768, 0, true, true},   {5, 513, 0, true, false},
      {9, 8200, 0, true, true},   {3, 16392, 0, true, true},  {2, 16392, 1, false, true},
      {300, 65, 0, true, true},
  };
  for (const DType dtype : kDTypes) {
    for (const Case& c : cases) run_case(c, dtype, rng);
  }
  return Tally::get().finish("test_add_layer_norm_cuda");
}
