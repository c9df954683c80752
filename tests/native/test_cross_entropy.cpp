// Tests the fused cross-entropy kernels (csrc/cpu/cross_entropy.h) in float and double against a
// naive double oracle: lse, loss sum, logits gradient, ignored and non-finite rows, padded rows,
// row-range splitting and finite differences, each without label smoothing and with s = 0.1
// and s = 1.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "cpu/cross_entropy.h"
#include "cross_entropy_cases.h"
#include "test_support.h"

namespace {

using namespace pygpt::test;
using pygpt::cpu::cross_entropy_backward;
using pygpt::cpu::cross_entropy_forward;

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Case {
  int64_t N, V, row_padding;  // row_stride = V + row_padding
  Pattern pattern;
  double stddev;
  double ignored_fraction;  // of rows whose target is ignore_index
};

struct Problem {
  int64_t N, V, row_stride, ignore_index;
  std::vector<double> logits;  // N x row_stride, padding filled with junk
  std::vector<int64_t> targets;
  double grad_scale;
  double label_smoothing;
};

struct Reference {
  std::vector<double> lse, grad;
  double loss_sum;
};

Reference oracle(const Problem& p) {
  Reference ref{std::vector<double>(p.N), std::vector<double>(p.N * p.V, 0.0), 0.0};
  for (int64_t i = 0; i < p.N; ++i) {
    const double* row = &p.logits[i * p.row_stride];
    double max = -kInf;
    for (int64_t j = 0; j < p.V; ++j) max = std::max(max, row[j]);
    double sum = 0.0, logit_sum = 0.0;
    for (int64_t j = 0; j < p.V; ++j) sum += std::exp(row[j] - max);
    for (int64_t j = 0; j < p.V; ++j) logit_sum += row[j];
    const double lse = max + std::log(sum);
    ref.lse[i] = lse;
    if (p.targets[i] == p.ignore_index) continue;
    // The target distribution (1 - s) * onehot + s / V; s = 0 must not see the row's mean.
    const double s = p.label_smoothing;
    const double nll = lse - row[p.targets[i]];
    ref.loss_sum += s == 0.0 ? nll : (1.0 - s) * nll + s * (lse - logit_sum / p.V);
    for (int64_t j = 0; j < p.V; ++j) {
      const double target = (j == p.targets[i] ? 1.0 - s : 0.0) + s / p.V;
      ref.grad[i * p.V + j] = (std::exp(row[j] - lse) - target) * p.grad_scale;
    }
  }
  return ref;
}

Problem make_problem(const Case& c, double label_smoothing, Rng& rng) {
  const int64_t row_stride = c.V + c.row_padding;
  Problem p{c.N, c.V, row_stride, -100, std::vector<double>(c.N * row_stride),
            std::vector<int64_t>(c.N), 0.0, label_smoothing};
  for (int64_t i = 0; i < c.N; ++i) {
    draw_logit_row(c.pattern, c.V, row_stride, c.stddev, rng, &p.logits[i * row_stride]);
    p.targets[i] = draw_target(c.pattern, c.V, c.ignored_fraction, p.ignore_index, rng);
  }
  int64_t counted = 0;
  for (int64_t t : p.targets) counted += t != p.ignore_index;
  p.grad_scale = counted > 0 ? 1.0 / counted : 1.0;
  return p;
}

template <typename T>
struct Result {
  std::vector<T> lse, grad;
  double loss_sum;
};

// Runs the forward over each range of bounds, then the backward over each range.
template <typename T>
Result<T> run_kernels(const Problem& p, const std::vector<T>& logits,
                      const std::vector<int64_t>& bounds) {
  Result<T> r{std::vector<T>(p.N), std::vector<T>(p.N * p.V), 0.0};
  for (size_t k = 0; k + 1 < bounds.size(); ++k) {
    r.loss_sum += cross_entropy_forward(logits.data(), p.row_stride, p.targets.data(), p.V,
                                        p.ignore_index, p.label_smoothing, r.lse.data(),
                                        bounds[k], bounds[k + 1]);
  }
  for (size_t k = 0; k + 1 < bounds.size(); ++k) {
    cross_entropy_backward(logits.data(), p.row_stride, p.targets.data(), r.lse.data(), p.V,
                           p.ignore_index, p.label_smoothing, static_cast<T>(p.grad_scale),
                           r.grad.data(), bounds[k], bounds[k + 1]);
  }
  return r;
}

template <typename T>
void expect_loss_sum(const std::string& what, double got, double ref) {
  std::vector<double> got_v = {got};
  expect_close(what, got_v, {ref}, kTol<T> * std::max(1.0, std::abs(ref)), kTol<T>);
}

template <typename T>
void run_case(const Case& c, double label_smoothing, Rng& rng) {
  const std::string name =
      format("cross_entropy<%s> N=%ld V=%ld padding=%ld pattern=%d ignored=%g smoothing=%g",
             type_name<T>(), static_cast<long>(c.N), static_cast<long>(c.V),
             static_cast<long>(c.row_padding), static_cast<int>(c.pattern), c.ignored_fraction,
             label_smoothing);
  const Problem p = make_problem(c, label_smoothing, rng);
  const std::vector<T> logits(p.logits.begin(), p.logits.end());
  Problem rounded = p;  // the oracle sees exactly the logits the kernel sees
  rounded.logits = to_double(logits);
  const Reference ref = oracle(rounded);

  const Result<T> full = run_kernels(p, logits, {0, p.N});
  expect_matches_oracle(name + " lse", full.lse, ref.lse);
  expect_loss_sum<T>(name + " loss sum", full.loss_sum, ref.loss_sum);
  expect_matches_oracle(name + " grad", full.grad, ref.grad);

  const Result<T> split = run_kernels(p, logits, {0, p.N / 2, p.N / 2, p.N});
  expect_identical(name + " split lse", split.lse, full.lse);
  expect_loss_sum<T>(name + " split loss sum", split.loss_sum, full.loss_sum);
  expect_identical(name + " split grad", split.grad, full.grad);

  if (c.row_padding == 0) {  // the gradient may overwrite the logits it is computed from
    std::vector<T> buffer = logits;
    cross_entropy_backward(buffer.data(), p.V, p.targets.data(), full.lse.data(), p.V,
                           p.ignore_index, p.label_smoothing, static_cast<T>(p.grad_scale),
                           buffer.data(), 0, p.N);
    expect_identical(name + " in-place grad", buffer, full.grad);
  }
}

template <typename T>
void run_all(Rng& rng) {
  const Case cases[] = {
      {1, 1, 0, Pattern::kNormal, 1.0, 0.0},        {4, 1, 3, Pattern::kNormal, 1.0, 0.3},
      {3, 2, 0, Pattern::kNormal, 1.0, 0.0},        {5, 3, 1, Pattern::kNormal, 2.0, 0.2},
      {8, 7, 0, Pattern::kNormal, 1.0, 0.0},        {6, 65, 0, Pattern::kNormal, 5.0, 0.0},
      {7, 127, 2, Pattern::kNormal, 1.0, 0.3},      {5, 1000, 0, Pattern::kNormal, 1.0, 0.0},
      {3, 2047, 0, Pattern::kRising, 1.0, 0.0},     {3, 2048, 0, Pattern::kFalling, 1.0, 0.0},
      {3, 2049, 5, Pattern::kRising, 1.0, 0.0},     {2, 6001, 0, Pattern::kRising, 3.0, 0.0},
      {2, 50257, 0, Pattern::kNormal, 2.0, 0.0},    {4, 9, 0, Pattern::kNormal, 1.0, 1.0},
      {6, 4100, 0, Pattern::kMaskedTail, 1.0, 0.2}, {5, 33, 0, Pattern::kMaskedTail, 1.0, 0.0},
      {40, 100, 0, Pattern::kNormal, 30.0, 0.5},    {33, 257, 7, Pattern::kFalling, 1.0, 0.1},
  };
  for (double label_smoothing : kLabelSmoothings) {
    for (const Case& c : cases) run_case<T>(c, label_smoothing, rng);
  }
}

// Rows containing NaN or +inf, or nothing but -inf, must not crash; they produce NaN like softmax
// does (lse -inf for an all -inf row), while ignored rows still get zero gradients. With label
// smoothing, a row that is partly -inf has loss +inf (its mean logit is -inf) but a finite
// gradient, as in F.cross_entropy.
template <typename T>
void check_non_finite_rows(double s) {
  const T inf = std::numeric_limits<T>::infinity();
  const int64_t N = kNonFiniteRows, V = kNonFiniteV, ignore = -1;
  const std::vector<T> logits = non_finite_logits<T>();
  const std::vector<int64_t> targets = non_finite_targets(ignore);
  std::vector<T> lse(N), grad(N * V);
  const double loss = cross_entropy_forward(logits.data(), V, targets.data(), V, ignore, s,
                                            lse.data(), 0, N);
  cross_entropy_backward(logits.data(), V, targets.data(), lse.data(), V, ignore, s, T(1),
                         grad.data(), 0, N);
  const std::string name =
      format("cross_entropy<%s> non-finite rows smoothing=%g", type_name<T>(), s);
  check(std::isfinite(lse[0]) && std::isfinite(lse[5]), name + ": finite rows have finite lse");
  check(lse[1] == -inf, name + ": all -inf row has lse -inf");
  check(std::isnan(lse[2]) && std::isnan(lse[3]) && std::isnan(lse[4]) && std::isnan(lse[6]),
        name + ": NaN/+inf rows have NaN lse");
  check(std::isnan(loss), name + ": loss sum is NaN");
  const double partly_masked = cross_entropy_forward(logits.data(), V, targets.data(), V, ignore,
                                                     s, lse.data(), 5, 6);
  check(s == 0.0 ? std::isfinite(partly_masked) : partly_masked == kInf,
        name + ": the partly -inf row's loss is finite without smoothing, +inf with");
  bool finite_rows_ok = true, nan_rows_ok = true, ignored_row_zero = true;
  for (int64_t j = 0; j < V; ++j) {
    finite_rows_ok = finite_rows_ok && std::isfinite(grad[j]) && std::isfinite(grad[5 * V + j]);
    for (int64_t i : {1, 2, 3, 6}) nan_rows_ok = nan_rows_ok && std::isnan(grad[i * V + j]);
    ignored_row_zero = ignored_row_zero && grad[kNonFiniteIgnoredRow * V + j] == T(0);
  }
  check(finite_rows_ok, name + ": finite rows have finite gradients");
  check(nan_rows_ok, name + ": non-finite rows have NaN gradients");
  check(ignored_row_zero, name + ": ignored non-finite row has zero gradient");
}

// The double backward against central differences of grad_scale * loss_sum.
void check_finite_differences(double s, Rng& rng) {
  const int64_t N = 4, V = 6;
  const double grad_scale = 0.7;
  std::vector<double> logits = rng.normal_vector<double>(N * V, 0.0, 2.0);
  const std::vector<int64_t> targets = {3, -100, 0, 5};
  std::vector<double> lse(N), grad(N * V);
  auto loss = [&] {
    return grad_scale *
           cross_entropy_forward(logits.data(), V, targets.data(), V, -100, s, lse.data(), 0, N);
  };
  const std::vector<double> numerical = numerical_gradient(loss, logits);
  loss();
  cross_entropy_backward(logits.data(), V, targets.data(), lse.data(), V, -100, s, grad_scale,
                         grad.data(), 0, N);
  expect_close(format("cross_entropy finite differences grad smoothing=%g", s), grad, numerical,
               1e-7, 1e-6);
}

}  // namespace

int main() {
  Rng rng(977);
  run_all<float>(rng);
  run_all<double>(rng);
  for (double s : kLabelSmoothings) {
    check_non_finite_rows<float>(s);
    check_non_finite_rows<double>(s);
    check_finite_differences(s, rng);
  }
  return Tally::get().finish("test_cross_entropy");
}
