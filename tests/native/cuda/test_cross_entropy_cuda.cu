// Tests the CUDA fused cross-entropy (csrc/cuda/cross_entropy.h) against the CPU kernels (csrc/
// cpu/cross_entropy.h) run in double on exactly the logits the device sees: float32, or rounded
// to bfloat16 or float16 first. Covers warp- and block-per-row shapes up to V = 131072, padded rows
// (row_stride > V) and misaligned logits / gradient pointers (scalar heads and tails, the scalar
// backward path), ignored and all-ignored targets, rows with NaN / inf, the gradient written in
// place over the logits, N = 0 and V = 0, and run-to-run bitwise reproducibility; without label
// smoothing, and a selection of those shapes with s = 0.1 and s = 1. Exits with 77 (ctest:
// skipped) when there is no CUDA device.
//
// Tolerances (|got - ref| <= atol + rtol * |ref|):
//   lse and loss (float32 outputs for every dtype): atol = rtol = 1e-5, atol relative to
//     max(1, max |ref|) (the CPU tests' kTol<float>).
//   grad, float32: rtol = 2e-5 and atol = 1e-6 * max |ref|. Each element is
//     exp(x - lse) * scale, whose relative error is about the absolute error of the float32 lse
//     (half an ulp of lse, ~4e-6 at |lse| ~ 100, plus the float32 sum of exps), so rtol holds
//     for every probability above 1e-6 of the largest gradient; atol covers the rest.
//   grad, bfloat16 and float16: the same plus the rounding to the storage type: rtol 1.01 * u,
//     u its unit roundoff (2^-8 for bfloat16, 2^-11 for float16), and atol half its smallest
//     subnormal (2^-25 for float16), since gradients of tiny probabilities over many rows fall
//     below float16's normal range (6.1e-5); see cuda_test_support.h.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "cpu/cross_entropy.h"
#include "cuda/cross_entropy.h"
#include "cuda_test_support.h"
#include "../cross_entropy_cases.h"
#include "../test_support.h"

namespace {

using namespace pygpt::test;
using pygpt::cuda::DType;

constexpr int64_t kIgnore = -100;
constexpr float kGradLoss = 0.7f;
constexpr double kFloatTol = 1e-5;
constexpr double kGradRtol = 2e-5;
constexpr double kGradAtol = 1e-6;
constexpr double kRoundings = 1.01;  // unit roundoffs allowed for the rounding to 16 bits
constexpr int64_t kLargestSmoothed = 1 << 21;  // elements (N * V) of a case run with smoothing

// The gradient's rtol: float32's plus the rounding of the stored gradient to dtype.
double grad_rtol(DType dtype) { return kGradRtol + kRoundings * unit_roundoff(dtype); }

struct Case {
  int64_t N, V, row_padding;  // row_stride = V + row_padding
  Pattern pattern;
  double stddev;
  double ignored_fraction;
  int logits_misalign, grad_misalign;  // elements past a 16-byte boundary
};

struct Problem {
  int64_t N, V, row_stride;
  std::vector<float> logits;  // N x row_stride in the dtype's values; padding is junk (1e30)
  std::vector<int64_t> targets;
  double label_smoothing;
};

struct Reference {
  std::vector<double> lse, grad;
  double loss;
};

// In float16 the padding's 1e30 overflows to +inf: junk all the same, and as visible if read.
Problem make_problem(const Case& c, double label_smoothing, DType dtype, Rng& rng) {
  const int64_t row_stride = c.V + c.row_padding;
  Problem p{c.N, c.V, row_stride, std::vector<float>(c.N * row_stride),
            std::vector<int64_t>(c.N), label_smoothing};
  for (int64_t i = 0; i < c.N; ++i) {
    draw_logit_row(c.pattern, c.V, row_stride, c.stddev, rng, &p.logits[i * row_stride]);
    p.targets[i] = draw_target(c.pattern, c.V, c.ignored_fraction, kIgnore, rng);
  }
  p.logits = rounded(p.logits, dtype);
  return p;
}

Reference oracle(const Problem& p) {
  const std::vector<double> logits(p.logits.begin(), p.logits.end());
  Reference r{std::vector<double>(p.N), std::vector<double>(p.N * p.V), 0.0};
  const double sum = pygpt::cpu::cross_entropy_forward<double>(
      logits.data(), p.row_stride, p.targets.data(), p.V, kIgnore, p.label_smoothing,
      r.lse.data(), 0, p.N);
  int64_t count = 0;
  for (int64_t t : p.targets) count += t != kIgnore;
  r.loss = count > 0 ? sum / static_cast<double>(count) : std::nan("");
  const double scale = count > 0 ? static_cast<double>(kGradLoss) / static_cast<double>(count) : 0;
  pygpt::cpu::cross_entropy_backward<double>(logits.data(), p.row_stride, p.targets.data(),
                                             r.lse.data(), p.V, kIgnore, p.label_smoothing, scale,
                                             r.grad.data(), 0, p.N);
  return r;
}

// Device inputs and outputs of one problem.
struct Device {
  Device(const Problem& p, DType dtype, int logits_misalign, int grad_misalign)
      : es(pygpt::cuda::dtype_bytes(dtype)),
        logits_shift(static_cast<size_t>(logits_misalign) * es),
        grad_shift(static_cast<size_t>(grad_misalign) * es),
        logits(p.N * p.row_stride * es + kPad),
        targets(p.N * sizeof(int64_t) + 8),
        lse(p.N * sizeof(float) + 4),
        loss(sizeof(float)),
        grad_loss(sizeof(float)),
        grad(p.N * p.V * es + kPad),
        workspace(pygpt::cuda::cross_entropy_workspace_bytes(p.N)) {
    upload_values(logits.get(logits_shift), p.logits, dtype);
    upload(targets.get(), p.targets.data(), p.targets.size() * sizeof(int64_t));
    upload(grad_loss.get(), &kGradLoss, sizeof(float));
  }
  size_t es, logits_shift, grad_shift;
  DeviceBuffer logits, targets, lse, loss, grad_loss, grad, workspace;
};

struct Result {
  std::vector<float> lse, loss, grad;
};

cudaError_t forward(const Problem& p, DType dtype, Device& d, const void* logits) {
  return pygpt::cuda::cross_entropy_forward(dtype, logits, p.row_stride, d.targets.get<int64_t>(),
                                            p.N, p.V, kIgnore, p.label_smoothing,
                                            d.lse.get<float>(), d.loss.get<float>(),
                                            d.workspace.get(), nullptr);
}

cudaError_t backward(const Problem& p, DType dtype, Device& d, const void* logits,
                     int64_t row_stride, void* grad) {
  return pygpt::cuda::cross_entropy_backward(dtype, logits, row_stride, d.targets.get<int64_t>(),
                                             d.lse.get<float>(), d.grad_loss.get<float>(), p.N,
                                             p.V, kIgnore, p.label_smoothing, grad,
                                             d.workspace.get(), nullptr);
}

Result run(const Problem& p, DType dtype, Device& d, const std::string& name) {
  const void* logits = d.logits.get(d.logits_shift);
  void* grad = d.grad.get(d.grad_shift);
  const cudaError_t f = forward(p, dtype, d, logits);
  check(f == cudaSuccess, name + ": forward launch: " + cudaGetErrorString(f));
  const cudaError_t b = backward(p, dtype, d, logits, p.row_stride, grad);
  check(b == cudaSuccess, name + ": backward launch: " + cudaGetErrorString(b));
  PYGPT_CUDA_CHECK(cudaDeviceSynchronize());
  return {download_values(d.lse.get(), p.N, DType::kFloat32),  // lse and loss: float32 always
          download_values(d.loss.get(), 1, DType::kFloat32),
          download_values(grad, p.N * p.V, dtype)};
}

void expect_results(const std::string& name, const Problem& p, const Result& r,
                    const Reference& ref, DType dtype) {
  expect_close(name + " lse", r.lse.data(), ref.lse.data(), r.lse.size(),
               kFloatTol * scale_of(ref.lse), kFloatTol);
  expect_close(name + " loss", r.loss.data(), &ref.loss, 1,
               kFloatTol * std::max(1.0, std::isfinite(ref.loss) ? std::abs(ref.loss) : 0.0),
               kFloatTol);
  double grad_max = 0.0;
  for (double g : ref.grad) {
    if (std::isfinite(g)) grad_max = std::max(grad_max, std::abs(g));
  }
  expect_close(name + " grad", r.grad.data(), ref.grad.data(), r.grad.size(),
               kGradAtol * grad_max + underflow_atol(dtype), grad_rtol(dtype));
  bool ignored_zero = true;
  for (int64_t i = 0; i < p.N; ++i) {
    if (p.targets[i] != kIgnore) continue;
    for (int64_t j = 0; j < p.V; ++j) ignored_zero = ignored_zero && r.grad[i * p.V + j] == 0.0f;
  }
  check(ignored_zero, name + ": ignored rows have exactly zero gradients");
}

void run_case(const Case& c, double label_smoothing, DType dtype, Rng& rng) {
  const std::string name =
      format("cross_entropy_cuda<%s> N=%ld V=%ld padding=%ld pattern=%d stddev=%g ignored=%g "
             "misalign=%d/%d smoothing=%g",
             dtype_name(dtype), static_cast<long>(c.N), static_cast<long>(c.V),
             static_cast<long>(c.row_padding), static_cast<int>(c.pattern), c.stddev,
             c.ignored_fraction, c.logits_misalign, c.grad_misalign, label_smoothing);
  const Problem p = make_problem(c, label_smoothing, dtype, rng);
  const Reference ref = oracle(p);
  check(static_cast<size_t>(std::max(c.logits_misalign, c.grad_misalign)) *
                pygpt::cuda::dtype_bytes(dtype) < kPad,
        name + ": misalignment fits the buffers' padding");
  Device d(p, dtype, c.logits_misalign, c.grad_misalign);
  const Result r = run(p, dtype, d, name);
  expect_results(name, p, r, ref, dtype);

  const Result again = run(p, dtype, d, name + " (again)");
  check(bitwise_equal(again.lse, r.lse) && bitwise_equal(again.loss, r.loss) &&
            bitwise_equal(again.grad, r.grad),
        name + ": bitwise reproducible");

  if (c.row_padding == 0) {  // the gradient written over the logits it is computed from
    DeviceBuffer buffer(p.N * p.V * d.es + kPad);
    void* inplace = buffer.get(d.logits_shift);
    if (p.N * p.V > 0) {
      PYGPT_CUDA_CHECK(cudaMemcpy(inplace, d.logits.get(d.logits_shift), p.N * p.V * d.es,
                                  cudaMemcpyDeviceToDevice));
    }
    const cudaError_t b = backward(p, dtype, d, inplace, p.V, inplace);
    check(b == cudaSuccess, name + ": in-place backward launch");
    PYGPT_CUDA_CHECK(cudaDeviceSynchronize());
    check(bitwise_equal(download_values(inplace, p.N * p.V, dtype), r.grad),
          name + ": in-place gradient equals the out-of-place one");
  }
}

// Rows holding NaN or +inf give lse NaN and NaN gradients, a row of only -inf gives lse -inf,
// ignored rows stay zero whatever they hold (as the CPU kernels do, with or without smoothing).
void check_non_finite_rows(double label_smoothing, DType dtype) {
  const std::string name = format("cross_entropy_cuda<%s> non-finite rows smoothing=%g",
                                  dtype_name(dtype), label_smoothing);
  Problem p{kNonFiniteRows, kNonFiniteV, kNonFiniteV, non_finite_logits<float>(),
            non_finite_targets(kIgnore), label_smoothing};
  const Reference ref = oracle(p);
  Device d(p, dtype, 0, 0);
  const Result r = run(p, dtype, d, name);
  expect_close(name + " lse", r.lse.data(), ref.lse.data(), r.lse.size(), 1e-5, 1e-5);
  check(std::isnan(r.loss[0]), name + ": loss is NaN");
  expect_close(name + " grad", r.grad.data(), ref.grad.data(), r.grad.size(),
               1e-6 + underflow_atol(dtype), grad_rtol(dtype));
  bool ignored_zero = true;
  for (int64_t j = 0; j < p.V; ++j) {
    ignored_zero = ignored_zero && r.grad[kNonFiniteIgnoredRow * p.V + j] == 0.0f;
  }
  check(ignored_zero, name + ": ignored non-finite row has zero gradient");
}

// N = 0: the mean over no rows is NaN; V = 0 (every target ignored): lse -inf, loss NaN. A label
// smoothing outside [0, 1] is refused (cudaErrorInvalidValue) before anything runs.
void check_empty(DType dtype) {
  const std::string name = format("cross_entropy_cuda<%s>", dtype_name(dtype));
  {
    DeviceBuffer logits(64), targets(64), lse(64), loss(4), grad_loss(4), grad(64);
    DeviceBuffer ws(pygpt::cuda::cross_entropy_workspace_bytes(0));
    upload(grad_loss.get(), &kGradLoss, sizeof(float));
    auto forward = [&](double s) {
      return pygpt::cuda::cross_entropy_forward(dtype, logits.get(), 8, targets.get<int64_t>(), 0,
                                                8, kIgnore, s, lse.get<float>(),
                                                loss.get<float>(), ws.get(), nullptr);
    };
    auto backward = [&](double s) {
      return pygpt::cuda::cross_entropy_backward(dtype, logits.get(), 8, targets.get<int64_t>(),
                                                 lse.get<float>(), grad_loss.get<float>(), 0, 8,
                                                 kIgnore, s, grad.get(), ws.get(), nullptr);
    };
    for (double bad : {-0.1, 1.5, std::nan("")}) {
      check(forward(bad) == cudaErrorInvalidValue && backward(bad) == cudaErrorInvalidValue,
            format("%s label_smoothing=%g: refused", name.c_str(), bad));
    }
    check(forward(0.1) == cudaSuccess, name + " N=0: forward returns cudaSuccess");
    check(backward(0.1) == cudaSuccess, name + " N=0: backward returns cudaSuccess");
    PYGPT_CUDA_CHECK(cudaDeviceSynchronize());
    check(std::isnan(download_values(loss.get(), 1, DType::kFloat32)[0]),
          name + " N=0: loss is NaN");
  }
  {
    Problem p{3, 0, 0, {}, {kIgnore, kIgnore, kIgnore}, 0.0};
    Device d(p, dtype, 0, 0);
    const Result r = run(p, dtype, d, name + " V=0");
    check(r.lse[0] == -std::numeric_limits<float>::infinity() &&
              r.lse[2] == -std::numeric_limits<float>::infinity(),
          name + " V=0: lse is -inf");
    check(std::isnan(r.loss[0]), name + " V=0: loss is NaN");
  }
}

}  // namespace

int main() {
  if (!cuda_device_available()) return kSkipExitCode;
  Rng rng(9771);
  using P = Pattern;
  const Case cases[] = {
      // The listed vocabularies, one row and several hundred (few rows for the largest).
      {1, 1, 0, P::kNormal, 1.0, 0.0, 0, 0},
      {300, 1, 3, P::kNormal, 1.0, 0.3, 0, 0},
      {1, 3, 0, P::kNormal, 1.0, 0.0, 0, 0},
      {300, 3, 1, P::kNormal, 2.0, 0.2, 1, 0},
      {1, 7, 0, P::kNormal, 1.0, 0.0, 3, 3},
      {300, 7, 0, P::kNormal, 1.0, 0.0, 0, 1},
      {1, 65, 0, P::kNormal, 5.0, 0.0, 0, 0},
      {300, 65, 0, P::kNormal, 5.0, 0.1, 0, 0},
      {1, 127, 2, P::kNormal, 1.0, 0.0, 0, 0},
      {300, 127, 2, P::kNormal, 1.0, 0.3, 0, 0},
      {1, 1000, 0, P::kNormal, 1.0, 0.0, 0, 0},
      {300, 1000, 0, P::kNormal, 1.0, 0.0, 2, 2},
      {1, 4096, 0, P::kNormal, 1.0, 0.0, 0, 0},
      {300, 4096, 8, P::kRising, 1.0, 0.1, 0, 0},
      {1, 50257, 0, P::kNormal, 2.0, 0.0, 0, 0},
      {5, 50257, 0, P::kNormal, 2.0, 0.0, 0, 0},
      {260, 50257, 0, P::kNormal, 1.0, 0.1, 0, 0},
      {1, 131072, 0, P::kNormal, 1.0, 0.0, 0, 0},
      {4, 131072, 0, P::kRising, 1.0, 0.0, 0, 0},
      {3, 131072, 5, P::kFalling, 1.0, 0.3, 1, 3},
      // Running max growing / shrinking across the row, masked vocabularies, large logits,
      // padded rows, all targets ignored, many rows per block.
      {3, 2047, 0, P::kRising, 1.0, 0.0, 0, 0},
      {3, 2049, 5, P::kRising, 1.0, 0.0, 0, 0},
      {2, 6001, 0, P::kRising, 3.0, 0.0, 5, 5},
      {6, 4100, 0, P::kMaskedTail, 1.0, 0.2, 0, 0},
      {5, 33, 0, P::kMaskedTail, 1.0, 0.0, 0, 0},
      {40, 100, 0, P::kNormal, 30.0, 0.5, 0, 0},
      {33, 257, 7, P::kFalling, 1.0, 0.1, 0, 0},
      {4, 9, 0, P::kNormal, 1.0, 1.0, 0, 0},
      {64, 1000, 0, P::kNormal, 1.0, 1.0, 0, 0},
      {2000, 64, 0, P::kNormal, 1.0, 0.2, 0, 0},
      {200, 16385, 0, P::kNormal, 1.0, 0.0, 0, 0},
  };
  for (const DType dtype : kDTypes) {
    for (double s : kLabelSmoothings) {
      for (const Case& c : cases) {
        // Smoothed, the largest problems are left out: smaller ones take the same kernel paths.
        if (s != 0.0 && c.N * c.V > kLargestSmoothed) continue;
        run_case(c, s, dtype, rng);
      }
      check_non_finite_rows(s, dtype);
    }
    check_empty(dtype);
  }
  return Tally::get().finish("test_cross_entropy_cuda");
}
