// Tests the CUDA residual add + layer norm (add_layer_norm_* in csrc/cuda/layer_norm.h) against
// the CPU kernels (csrc/cpu/add_layer_norm.h) run in double on exactly the sum the device
// normalises: x + residual in float32, rounded to bfloat16 for bfloat16 storage. Covers the
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
constexpr double kBf16Rtol = 1.01 / 256.0;

struct Case {
  int64_t N, C;
  int misalign;
  bool affine, grad_sum;
};

void expect_values(const std::string& what, const std::vector<float>& got,
                   const std::vector<double>& ref, bool bf16) {
  const double atol = kFloatTol * scale_of(ref);
  const double rtol = bf16 ? kBf16Rtol + kFloatTol : kFloatTol;
  check(got.size() == ref.size(), what + ": size mismatch");
  expect_close(what, got.data(), ref.data(), std::min(got.size(), ref.size()), atol, rtol);
}

std::vector<float> normals(Rng& rng, size_t n, double mean, double stddev, bool bf16) {
  std::vector<float> v(n);
  for (float& e : v) e = static_cast<float>(mean + stddev * rng.normal());
  return rounded(v, bf16);
}

void run_case(const Case& c, bool bf16, Rng& rng) {
  const int64_t N = c.N, C = c.C;
  const DType dtype = bf16 ? DType::kBFloat16 : DType::kFloat32;
  const std::string name =
      format("add_layer_norm_cuda<%s> N=%ld C=%ld misalign=%d affine=%d grad_sum=%d",
             bf16 ? "bf16" : "float", static_cast<long>(N), static_cast<long>(C), c.misalign,
             c.affine, c.grad_sum);
  const std::vector<float> x = normals(rng, N * C, 0.0, 1.0, bf16),
                           r = normals(rng, N * C, 1.0, 2.0, bf16),
                           dy = normals(rng, N * C, 0.0, 1.0, bf16),
                           dsum = c.grad_sum ? normals(rng, N * C, 0.0, 1.0, bf16)
                                             : std::vector<float>(),
                           w = c.affine ? normals(rng, C, 1.0, 0.5, bf16) : std::vector<float>(),
                           b = c.affine ? normals(rng, C, 0.0, 1.0, bf16) : std::vector<float>();
  // The sum the device stores and normalises.
  std::vector<float> s(N * C);
  for (int64_t k = 0; k < N * C; ++k) s[k] = x[k] + r[k];
  s = rounded(s, bf16);
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

  const size_t es = bf16 ? 2 : 4, shift = static_cast<size_t>(c.misalign) * es;
  check(shift < kPad, name + ": misalignment fits the buffers' padding");
  const size_t big = static_cast<size_t>(N * C) * es + kPad;
  const size_t small = static_cast<size_t>(C) * es + kPad;
  DeviceBuffer x_d(big), r_d(big), s_d(big), y_d(big), dy_d(big), ds_d(big), dx_d(big), w_d(small),
      b_d(small), dw_d(small), db_d(small), mean_d(N * 4 + 4), rstd_d(N * 4 + 4),
      ws(pygpt::cuda::layer_norm_backward_workspace_bytes(N, C));
  upload_values(x_d.get(shift), x, bf16);
  upload_values(r_d.get(shift), r, bf16);
  upload_values(dy_d.get(shift), dy, bf16);
  upload_values(ds_d.get(shift), dsum, bf16);
  upload_values(w_d.get(shift), w, bf16);
  upload_values(b_d.get(shift), b, bf16);
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

  check(bitwise_equal(download_values(s_d.get(shift), N * C, bf16), s),
        name + ": sum is x + residual rounded to the storage type");
  expect_values(name + " y", download_values(y_d.get(shift), N * C, bf16), y, bf16);
  expect_values(name + " mean", download_values(mean_d.get(), N, false), mean, false);
  expect_values(name + " rstd", download_values(rstd_d.get(), N, false), rstd, false);
  expect_values(name + " dx", download_values(dx_d.get(shift), N * C, bf16), dx, bf16);
  if (c.affine) {
    expect_values(name + " dweight", download_values(dw_d.get(shift), C, bf16), dw, bf16);
    expect_values(name + " dbias", download_values(db_d.get(shift), C, bf16), db, bf16);
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
  for (bool bf16 : {false, true}) {
    for (const Case& c : cases) run_case(c, bf16, rng);
  }
  return Tally::get().finish("test_add_layer_norm_cuda");
}
