// Tests the CUDA layer norm (csrc/cuda/layer_norm.h) against the CPU kernels (csrc/cpu/
// layer_norm.h) run in double on exactly the inputs the device sees: float32 inputs, or inputs
// rounded to bfloat16 or float16 first. Covers warp-per-row, group-per-row and block-per-row
// fallback shapes, the vectorised and scalar (odd C, misaligned pointers) paths, null weight /
// bias, gradients not requested, grids whose blocks take many rows, N = 0, and run-to-run
// bitwise reproducibility. Exits with 77 (ctest: skipped) when there is no CUDA device.
//
// Tolerances (|got - ref| <= atol + rtol * |ref|, per element):
//   float32: atol = 1e-5 * scale, rtol = 1e-5, scale = max(1, max |ref|) over the tensor (the
//            CPU tests' kTol<float>); float32 accumulation over a row or over N rows stays
//            well inside it.
//   bfloat16, float16: the same atol for the float32 arithmetic, plus rtol = 1.01 * u for the
//            final rounding of y, dx, dweight and dbias to the storage type, u its unit roundoff
//            (half an ulp relative: 2^-8 for bfloat16, 2^-11 for float16; cuda_test_support.h's
//            unit_roundoff). mean and rstd are float32 outputs and keep the float32 tolerance.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cpu/layer_norm.h"
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
  double offset, stddev;  // x ~ N(offset, stddev^2)
  int misalign;           // elements by which every device pointer is moved off 16-byte alignment
};

// Which of weight and bias exist, and whether their gradients are asked for.
struct Affine {
  bool weight, bias, grads;
};

struct Reference {
  std::vector<double> y, mean, rstd, dx, dweight, dbias;
};

Reference oracle(int64_t N, int64_t C, const std::vector<float>& x, const std::vector<float>& w,
                 const std::vector<float>& b, const std::vector<float>& dy) {
  const std::vector<double> xd(x.begin(), x.end()), wd(w.begin(), w.end()),
      bd(b.begin(), b.end()), dyd(dy.begin(), dy.end());
  Reference r{std::vector<double>(N * C), std::vector<double>(N),     std::vector<double>(N),
              std::vector<double>(N * C), std::vector<double>(C, 0.0), std::vector<double>(C, 0.0)};
  const double* wp = w.empty() ? nullptr : wd.data();
  const double* bp = b.empty() ? nullptr : bd.data();
  pygpt::cpu::layer_norm_forward<double>(xd.data(), wp, bp, r.y.data(), r.mean.data(),
                                         r.rstd.data(), C, kEps, 0, N);
  pygpt::cpu::layer_norm_backward<double>(dyd.data(), xd.data(), wp, r.mean.data(), r.rstd.data(),
                                          r.dx.data(), r.dweight.data(), r.dbias.data(), C, 0, N);
  return r;
}

// dtype: the type got was stored in (float32 for mean and rstd whatever the tensors' type).
void expect_values(const std::string& what, const std::vector<float>& got,
                   const std::vector<double>& ref, DType dtype) {
  const double atol = kFloatTol * scale_of(ref);
  const double rtol = kRoundings * unit_roundoff(dtype) + kFloatTol;
  check(got.size() == ref.size(), what + ": size mismatch");
  expect_close(what, got.data(), ref.data(), std::min(got.size(), ref.size()), atol, rtol);
}

// Device results of one forward + backward.
struct Result {
  std::vector<float> y, mean, rstd, dx, dweight, dbias;
};

void run_case(const Case& c, const Affine& a, DType dtype, Rng& rng) {
  const int64_t N = c.N, C = c.C;
  const std::string name = format(
      "layer_norm_cuda<%s> N=%ld C=%ld offset=%g misalign=%d weight=%d bias=%d grads=%d",
      dtype_name(dtype), static_cast<long>(N), static_cast<long>(C), c.offset, c.misalign,
      a.weight, a.bias, a.grads);

  std::vector<float> x(N * C), dy(N * C), w, b;
  for (float& e : x) e = static_cast<float>(c.offset + c.stddev * rng.normal());
  for (float& e : dy) e = static_cast<float>(rng.normal());
  if (a.weight) {
    w.resize(C);
    for (float& e : w) e = static_cast<float>(1.0 + 0.5 * rng.normal());
  }
  if (a.bias) {
    b.resize(C);
    for (float& e : b) e = static_cast<float>(rng.normal());
  }
  x = rounded(x, dtype);
  dy = rounded(dy, dtype);
  w = rounded(w, dtype);
  b = rounded(b, dtype);
  const Reference ref = oracle(N, C, x, w, b, dy);

  const size_t es = pygpt::cuda::dtype_bytes(dtype);
  const size_t shift = static_cast<size_t>(c.misalign) * es;  // byte offset of every tensor
  check(shift < kPad, name + ": misalignment fits the buffers' padding");
  const size_t big = static_cast<size_t>(N * C) * es + kPad;
  const size_t small = static_cast<size_t>(C) * es + kPad;
  DeviceBuffer x_d(big), dy_d(big), y_d(big), w_d(small), b_d(small);
  DeviceBuffer mean_d(N * 4 + 4), rstd_d(N * 4 + 4);
  upload_values(x_d.get(shift), x, dtype);
  upload_values(dy_d.get(shift), dy, dtype);
  upload_values(w_d.get(shift), w, dtype);
  upload_values(b_d.get(shift), b, dtype);
  void* wp = a.weight ? w_d.get(shift) : nullptr;
  void* bp = a.bias ? b_d.get(shift) : nullptr;

  const cudaError_t fwd = pygpt::cuda::layer_norm_forward(
      dtype, x_d.get(shift), wp, bp, y_d.get(shift), mean_d.get<float>(), rstd_d.get<float>(), N,
      C, kEps, nullptr);
  check(fwd == cudaSuccess, name + ": forward launch: " + cudaGetErrorString(fwd));
  PYGPT_CUDA_CHECK(cudaDeviceSynchronize());

  const size_t ws_bytes = pygpt::cuda::layer_norm_backward_workspace_bytes(N, C);
  auto backward = [&](Result& r) {
    DeviceBuffer dx_d(big), dw_d(small), db_d(small), ws(ws_bytes);
    void* dwp = a.weight && a.grads ? dw_d.get(shift) : nullptr;
    void* dbp = a.bias && a.grads ? db_d.get(shift) : nullptr;
    // With no parameter gradient asked for the workspace is optional: pass none.
    void* wsp = dwp != nullptr || dbp != nullptr ? ws.get() : nullptr;
    const cudaError_t bwd = pygpt::cuda::layer_norm_backward(
        dtype, dy_d.get(shift), x_d.get(shift), wp, mean_d.get<float>(), rstd_d.get<float>(),
        dx_d.get(shift), dwp, dbp, N, C, wsp, nullptr);
    check(bwd == cudaSuccess, name + ": backward launch: " + cudaGetErrorString(bwd));
    PYGPT_CUDA_CHECK(cudaDeviceSynchronize());
    r.dx = download_values(dx_d.get(shift), N * C, dtype);
    if (dwp != nullptr) r.dweight = download_values(dwp, C, dtype);
    if (dbp != nullptr) r.dbias = download_values(dbp, C, dtype);
  };

  Result r;
  r.y = download_values(y_d.get(shift), N * C, dtype);
  r.mean = download_values(mean_d.get(), N, DType::kFloat32);
  r.rstd = download_values(rstd_d.get(), N, DType::kFloat32);
  backward(r);

  expect_values(name + " y", r.y, ref.y, dtype);
  expect_values(name + " mean", r.mean, ref.mean, DType::kFloat32);
  expect_values(name + " rstd", r.rstd, ref.rstd, DType::kFloat32);
  expect_values(name + " dx", r.dx, ref.dx, dtype);
  if (a.weight && a.grads) expect_values(name + " dweight", r.dweight, ref.dweight, dtype);
  if (a.bias && a.grads) expect_values(name + " dbias", r.dbias, ref.dbias, dtype);

  Result again;
  backward(again);
  check(bitwise_equal(again.dx, r.dx) && bitwise_equal(again.dweight, r.dweight) &&
            bitwise_equal(again.dbias, r.dbias),
        name + ": backward is bitwise reproducible");
}

// N = 0: nothing to normalise; the weight and bias gradients are sums over no rows, zeros.
void check_empty(DType dtype) {
  const int64_t C = 5;
  const std::string name = format("layer_norm_cuda<%s> N=0", dtype_name(dtype));
  DeviceBuffer x(64), w(64), y(64), stats(64), dw(64), db(64), dx(64);
  check(pygpt::cuda::layer_norm_forward(dtype, x.get(), w.get(), nullptr, y.get(),
                                        stats.get<float>(), stats.get<float>(), 0, C, kEps,
                                        nullptr) == cudaSuccess,
        name + ": forward returns cudaSuccess");
  check(pygpt::cuda::layer_norm_backward_workspace_bytes(0, C) == 0, name + ": no workspace");
  check(pygpt::cuda::layer_norm_backward(dtype, y.get(), x.get(), w.get(), stats.get<float>(),
                                         stats.get<float>(), dx.get(), dw.get(), db.get(), 0, C,
                                         nullptr, nullptr) == cudaSuccess,
        name + ": backward returns cudaSuccess");
  PYGPT_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> dwv = download_values(dw.get(), C, dtype);
  const std::vector<float> dbv = download_values(db.get(), C, dtype);
  bool zeros = true;
  for (int64_t j = 0; j < C; ++j) zeros = zeros && dwv[j] == 0.0f && dbv[j] == 0.0f;
  check(zeros, name + ": dweight and dbias are zero");
}

}  // namespace

int main() {
  if (!cuda_device_available()) return kSkipExitCode;
  Rng rng(20240611);
  const Case cases[] = {
      // The listed widths, one row and several hundred (few rows for the longest).
      {1, 1, 0.0, 1.0, 0},
      {300, 1, 0.0, 1.0, 0},
      {1, 3, 0.0, 1.0, 0},
      {300, 3, 2.0, 1.0, 0},
      {1, 7, 0.0, 1.0, 0},
      {300, 7, 0.0, 3.0, 0},
      {1, 65, 0.0, 1.0, 0},
      {300, 65, 0.0, 1.0, 0},
      {1, 127, 0.0, 1.0, 0},
      {300, 127, 3.0, 1.0, 0},
      {1, 1000, 0.0, 1.0, 0},
      {300, 1000, 0.0, 1.0, 0},
      {1, 4096, 0.0, 1.0, 0},
      {300, 4096, 0.0, 2.0, 0},
      {1, 50257, 0.0, 1.0, 0},
      {3, 50257, 1.0, 1.0, 0},
      {1, 131072, 0.0, 1.0, 0},
      {3, 131072, 0.0, 1.0, 0},
      // Unit-size boundaries (warp / 2, 4, 8 ... warps per row), both sides of the register
      // capacities (backward 8192, forward 16384), a large mean (cancellation), misaligned
      // pointers (scalar path), and grids whose blocks take many rows.
      {37, 512, 0.0, 1.0, 0},
      {37, 513, 0.0, 1.0, 0},
      {64, 768, 100.0, 1.0, 0},
      {64, 768, 0.0, 1.0, 1},
      {33, 2048, 0.0, 1.0, 0},
      {9, 8192, 0.0, 1.0, 0},
      {9, 8200, 0.0, 1.0, 0},
      {5, 16384, 0.0, 1.0, 0},
      {5, 16392, 0.0, 1.0, 0},
      {3, 131072, 0.0, 1.0, 1},
      {9000, 32, 0.0, 1.0, 0},
      {4200, 1024, 0.0, 1.0, 0},
      {520, 8200, 0.0, 1.0, 0},
  };
  const Affine affines[] = {
      {true, true, true}, {true, false, true}, {false, true, true}, {false, false, true},
      {true, true, false},
  };
  for (const DType dtype : kDTypes) {
    for (const Case& c : cases) {
      for (const Affine& a : affines) run_case(c, a, dtype, rng);
    }
    check_empty(dtype);
  }
  return Tally::get().finish("test_layer_norm_cuda");
}
