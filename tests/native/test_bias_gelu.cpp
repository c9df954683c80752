// Tests erf_fast (csrc/cpu/erf_fast.h) against std::erf in double, and the bias + GELU kernels
// (csrc/cpu/bias_gelu.h), the exact GELU and its tanh approximation, in float and double against
// a naive double oracle: y, dx, dbias, row-range splitting with summed partials, and finite
// differences.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "cpu/bias_gelu.h"
#include "cpu/erf_fast.h"
#include "test_support.h"

namespace {

using namespace pygpt::test;
using pygpt::GeluApproximation;
using pygpt::cpu::bias_gelu_backward;
using pygpt::cpu::bias_gelu_forward;
using pygpt::cpu::erf_fast;

// erf_fast's stated accuracy: 5e-7 relative to the exact erf, over every float it is tried on.
constexpr double kErfRtol = 5e-7;

void check_erf_fast() {
  std::vector<float> xs;
  for (int i = -2000000; i <= 2000000; ++i) xs.push_back(static_cast<float>(i * 3e-6));  // [-6, 6]
  for (double e = -37.0; e <= 1.0; e += 1e-3) {  // tiny to 10, both signs
    xs.push_back(static_cast<float>(std::pow(10.0, e)));
    xs.push_back(-static_cast<float>(std::pow(10.0, e)));
  }
  for (float x : {0.0f, -0.0f, 3.9f, 4.0f, 4.1f, 1e30f, -1e30f, std::numeric_limits<float>::max()})
    xs.push_back(x);
  std::vector<float> got(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) got[i] = erf_fast(xs[i]);  // a vectorised loop
  std::vector<double> ref(xs.size());
  double worst = 0.0;
  for (size_t i = 0; i < xs.size(); ++i) {
    ref[i] = std::erf(static_cast<double>(xs[i]));
    if (ref[i] != 0.0) worst = std::max(worst, std::abs(got[i] - ref[i]) / std::abs(ref[i]));
  }
  std::printf("erf_fast: max relative error %.3g over %zu floats\n", worst, xs.size());
  expect_close("erf_fast vs std::erf", got, ref, 0.0, kErfRtol);
  bool odd = true, bounded = true;
  for (size_t i = 0; i < xs.size(); ++i) {
    odd = odd && erf_fast(-xs[i]) == -got[i];
    bounded = bounded && std::abs(got[i]) <= 1.0f;
  }
  check(odd, "erf_fast is odd");
  check(bounded, "erf_fast lies in [-1, 1]");
  const float inf = std::numeric_limits<float>::infinity();
  check(erf_fast(inf) == 1.0f && erf_fast(-inf) == -1.0f, "erf_fast(+-inf) = +-1");
  check(std::isnan(erf_fast(std::numeric_limits<float>::quiet_NaN())), "erf_fast(NaN) is NaN");
  check(erf_fast(0.5) == std::erf(0.5), "erf_fast in double is std::erf");
}

struct Reference {
  std::vector<double> y, dx, dbias;
};

const char* approximation_name(GeluApproximation approximate) {
  return approximate == GeluApproximation::kTanh ? "tanh" : "none";
}

// Straight from the definitions. Exact: gelu(h) = h * Phi(h), gelu'(h) = Phi(h) + h * phi(h).
// Tanh: gelu(h) = h (1 + t) / 2 with t = tanh(u), u = sqrt(2 / pi) (h + 0.044715 h^3), and
// gelu'(h) = (1 + t) / 2 + h (1 - t^2) u'(h) / 2, u'(h) = sqrt(2 / pi) (1 + 3 * 0.044715 h^2).
Reference oracle(const std::vector<double>& x, const std::vector<double>& bias,
                 const std::vector<double>& dy, int64_t N, int64_t C,
                 GeluApproximation approximate) {
  Reference ref{std::vector<double>(N * C), std::vector<double>(N * C),
                std::vector<double>(C, 0.0)};
  const double root = std::sqrt(2.0 / M_PI);
  for (int64_t i = 0; i < N; ++i) {
    for (int64_t j = 0; j < C; ++j) {
      const double h = x[i * C + j] + bias[j];
      double y, grad;
      if (approximate == GeluApproximation::kTanh) {
        const double t = std::tanh(root * (h + 0.044715 * h * h * h));
        y = 0.5 * h * (1.0 + t);
        grad = 0.5 * (1.0 + t) + 0.5 * h * (1.0 - t * t) * root * (1.0 + 3 * 0.044715 * h * h);
      } else {
        const double cdf = 0.5 * std::erfc(-h / std::sqrt(2.0));
        const double pdf = std::exp(-0.5 * h * h) / std::sqrt(2.0 * M_PI);
        y = h * cdf;
        grad = cdf + h * pdf;
      }
      ref.y[i * C + j] = y;
      ref.dx[i * C + j] = dy[i * C + j] * grad;
      ref.dbias[j] += ref.dx[i * C + j];
    }
  }
  return ref;
}

template <typename T>
void run_case(int64_t N, int64_t C, double scale, GeluApproximation approximate, Rng& rng) {
  const std::string name =
      format("bias_gelu<%s, %s> N=%ld C=%ld scale=%g", type_name<T>(),
             approximation_name(approximate), static_cast<long>(N), static_cast<long>(C), scale);
  const std::vector<T> x = rng.normal_vector<T>(N * C, 0.0, scale), bias = rng.normal_vector<T>(C),
                       dy = rng.normal_vector<T>(N * C);
  const Reference ref = oracle(to_double(x), to_double(bias), to_double(dy), N, C, approximate);

  std::vector<T> y(N * C), dx(N * C), dbias(C, T(0));
  bias_gelu_forward(x.data(), bias.data(), y.data(), C, 0, N, approximate);
  bias_gelu_backward(dy.data(), x.data(), bias.data(), dx.data(), dbias.data(), C, 0, N,
                     approximate);
  expect_matches_oracle(name + " y", y, ref.y);
  expect_matches_oracle(name + " dx", dx, ref.dx);
  expect_matches_oracle(name + " dbias", dbias, ref.dbias);

  // Row ranges: identical rows, and partial bias gradients (per range, then summed) that match.
  const std::vector<int64_t> bounds = {0, N / 3, N / 3 + (N + 1) / 3, N};
  std::vector<T> y2(N * C), dx2(N * C), dx_no_bias(N * C), dbias_sum(C, T(0));
  for (size_t r = 0; r + 1 < bounds.size(); ++r) {
    std::vector<T> part(C, T(0));
    bias_gelu_forward(x.data(), bias.data(), y2.data(), C, bounds[r], bounds[r + 1],
                      approximate);
    bias_gelu_backward(dy.data(), x.data(), bias.data(), dx2.data(), part.data(), C, bounds[r],
                       bounds[r + 1], approximate);
    bias_gelu_backward<T>(dy.data(), x.data(), bias.data(), dx_no_bias.data(), nullptr, C,
                          bounds[r], bounds[r + 1], approximate);
    for (int64_t j = 0; j < C; ++j) dbias_sum[j] += part[j];
  }
  expect_identical(name + " split y", y2, y);
  expect_identical(name + " split dx", dx2, dx);
  expect_identical(name + " dx without the bias gradient", dx_no_bias, dx);
  expect_matches_oracle(name + " split dbias (summed partials)", dbias_sum, ref.dbias);
}

// The double backward against central differences of sum(dy * y) through the double forward.
void check_finite_differences(GeluApproximation approximate, Rng& rng) {
  const int64_t N = 3, C = 7;
  const std::string name =
      format("bias_gelu<%s> finite differences", approximation_name(approximate));
  std::vector<double> x = rng.normal_vector<double>(N * C, 0.0, 2.0),
                      bias = rng.normal_vector<double>(C), dy = rng.normal_vector<double>(N * C);
  auto loss = [&] {
    std::vector<double> y(N * C);
    bias_gelu_forward(x.data(), bias.data(), y.data(), C, 0, N, approximate);
    double l = 0.0;
    for (int64_t i = 0; i < N * C; ++i) l += dy[i] * y[i];
    return l;
  };
  std::vector<double> dx(N * C), dbias(C, 0.0);
  bias_gelu_backward(dy.data(), x.data(), bias.data(), dx.data(), dbias.data(), C, 0, N,
                     approximate);
  expect_close(name + " dx", dx, numerical_gradient(loss, x), 1e-6, 1e-6);
  expect_close(name + " dbias", dbias, numerical_gradient(loss, bias), 1e-6, 1e-6);
}

template <typename T>
void run_all(Rng& rng) {
  const int64_t shapes[][2] = {{1, 1}, {3, 1}, {1, 7}, {5, 3}, {4, 16}, {7, 33}, {2, 127},
                               {12, 512}, {3, 1000}, {2, 4099}, {64, 17}};
  for (GeluApproximation approximate : {GeluApproximation::kNone, GeluApproximation::kTanh}) {
    for (const auto& s : shapes) {
      for (double scale : {1.0, 4.0}) run_case<T>(s[0], s[1], scale, approximate, rng);
    }
  }
}

}  // namespace

int main() {
  Rng rng(20261124);
  check_erf_fast();
  run_all<float>(rng);
  run_all<double>(rng);
  check_finite_differences(GeluApproximation::kNone, rng);
  check_finite_differences(GeluApproximation::kTanh, rng);
  return Tally::get().finish("test_bias_gelu");
}
