// Tests the layer-norm kernels (csrc/cpu/layer_norm.h) in float and double against a naive double
// oracle: outputs and saved statistics, dx/dweight/dbias, row-range splitting, finite differences.
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu/layer_norm.h"
#include "test_support.h"

namespace {

using namespace pygpt::test;
using pygpt::cpu::layer_norm_backward;
using pygpt::cpu::layer_norm_forward;

struct Case {
  int64_t N, C;
  bool weight, bias;
  double mean, stddev;  // of the inputs x
  double eps;
};

struct Reference {
  std::vector<double> y, mean, rstd, dx, dweight, dbias;
};

// Straight from the definition; dx goes through the Jacobian of xhat,
// d xhat_k / d x_j = rstd * ([k == j] - 1/C - xhat_k * xhat_j / C), not the simplified formula.
Reference oracle(const std::vector<double>& x, const std::vector<double>& weight,
                 const std::vector<double>& bias, const std::vector<double>& dy, int64_t N,
                 int64_t C, double eps) {
  Reference ref{std::vector<double>(N * C), std::vector<double>(N), std::vector<double>(N),
                std::vector<double>(N * C), std::vector<double>(C, 0.0),
                std::vector<double>(C, 0.0)};
  std::vector<double> xhat(C), g(C);
  for (int64_t i = 0; i < N; ++i) {
    const double* xr = &x[i * C];
    const double* dyr = &dy[i * C];
    double mean = 0.0, var = 0.0;
    for (int64_t j = 0; j < C; ++j) mean += xr[j];
    mean /= C;
    for (int64_t j = 0; j < C; ++j) var += (xr[j] - mean) * (xr[j] - mean);
    var /= C;
    const double rstd = 1.0 / std::sqrt(var + eps);
    ref.mean[i] = mean;
    ref.rstd[i] = rstd;
    for (int64_t j = 0; j < C; ++j) {
      const double w = weight.empty() ? 1.0 : weight[j];
      xhat[j] = (xr[j] - mean) * rstd;
      g[j] = dyr[j] * w;
      ref.y[i * C + j] = xhat[j] * w + (bias.empty() ? 0.0 : bias[j]);
      ref.dweight[j] += dyr[j] * xhat[j];
      ref.dbias[j] += dyr[j];
    }
    for (int64_t j = 0; j < C; ++j) {
      double d = 0.0;
      for (int64_t k = 0; k < C; ++k) {
        d += g[k] * rstd * ((k == j ? 1.0 : 0.0) - 1.0 / C - xhat[k] * xhat[j] / C);
      }
      ref.dx[i * C + j] = d;
    }
  }
  return ref;
}

template <typename T>
const T* data_or_null(const std::vector<T>& v) {
  return v.empty() ? nullptr : v.data();
}

template <typename T>
struct Inputs {
  int64_t N, C;
  double eps;
  std::vector<T> x, weight, bias, dy;  // weight/bias empty when absent
};

template <typename T>
struct Outputs {
  std::vector<T> y, mean, rstd;
};

template <typename T>
Outputs<T> forward(const Inputs<T>& in, const std::vector<int64_t>& bounds) {
  Outputs<T> out{std::vector<T>(in.N * in.C), std::vector<T>(in.N), std::vector<T>(in.N)};
  for (size_t r = 0; r + 1 < bounds.size(); ++r) {
    layer_norm_forward(in.x.data(), data_or_null(in.weight), data_or_null(in.bias), out.y.data(),
                       out.mean.data(), out.rstd.data(), in.C, in.eps, bounds[r], bounds[r + 1]);
  }
  return out;
}

// dx over each range of bounds; weight/bias gradients all added into dweight/dbias when non-null.
template <typename T>
std::vector<T> backward(const Inputs<T>& in, const Outputs<T>& saved,
                        const std::vector<int64_t>& bounds, T* dweight, T* dbias) {
  std::vector<T> dx(in.N * in.C);
  for (size_t r = 0; r + 1 < bounds.size(); ++r) {
    layer_norm_backward(in.dy.data(), in.x.data(), data_or_null(in.weight), saved.mean.data(),
                        saved.rstd.data(), dx.data(), dweight, dbias, in.C, bounds[r],
                        bounds[r + 1]);
  }
  return dx;
}

// Splitting [0, N) into sub-ranges must give identical rows, and partial weight/bias gradients
// that add up (either into one buffer in turn or into per-range buffers) to the full-range ones.
template <typename T>
void check_range_splits(const std::string& name, const Inputs<T>& in, const Outputs<T>& full,
                        const std::vector<T>& full_dx, const std::vector<T>& full_dweight,
                        const std::vector<T>& full_dbias) {
  const std::vector<int64_t> bounds = {0, in.N / 3, in.N / 3 + (in.N + 1) / 3, in.N};
  const Outputs<T> split = forward(in, bounds);
  expect_identical(name + " split y", split.y, full.y);
  expect_identical(name + " split mean", split.mean, full.mean);
  expect_identical(name + " split rstd", split.rstd, full.rstd);

  std::vector<T> dweight(in.C, T(0)), dbias(in.C, T(0));
  expect_identical(name + " split dx", backward(in, full, bounds, dweight.data(), dbias.data()),
                   full_dx);
  std::vector<T> dweight_sum(in.C, T(0)), dbias_sum(in.C, T(0));
  for (size_t r = 0; r + 1 < bounds.size(); ++r) {
    std::vector<T> dweight_part(in.C, T(0)), dbias_part(in.C, T(0));
    backward(in, full, {bounds[r], bounds[r + 1]}, dweight_part.data(), dbias_part.data());
    for (int64_t j = 0; j < in.C; ++j) {
      dweight_sum[j] += dweight_part[j];
      dbias_sum[j] += dbias_part[j];
    }
  }
  const std::vector<double> full_dw = to_double(full_dweight), full_db = to_double(full_dbias);
  expect_matches_oracle(name + " split dweight (one buffer)", dweight, full_dw);
  expect_matches_oracle(name + " split dbias (one buffer)", dbias, full_db);
  expect_matches_oracle(name + " split dweight (summed partials)", dweight_sum, full_dw);
  expect_matches_oracle(name + " split dbias (summed partials)", dbias_sum, full_db);
}

template <typename T>
void run_case(const Case& c, Rng& rng) {
  const std::string name =
      format("layer_norm<%s> N=%ld C=%ld weight=%d bias=%d mean=%g", type_name<T>(),
             static_cast<long>(c.N), static_cast<long>(c.C), c.weight, c.bias, c.mean);
  Inputs<T> in{c.N, c.C, c.eps, rng.normal_vector<T>(c.N * c.C, c.mean, c.stddev),
               c.weight ? rng.normal_vector<T>(c.C, 1.0, 0.5) : std::vector<T>(),
               c.bias ? rng.normal_vector<T>(c.C) : std::vector<T>(),
               rng.normal_vector<T>(c.N * c.C)};
  const Reference ref = oracle(to_double(in.x), to_double(in.weight), to_double(in.bias),
                               to_double(in.dy), c.N, c.C, c.eps);

  const std::vector<int64_t> whole = {0, c.N};
  const Outputs<T> out = forward(in, whole);
  expect_matches_oracle(name + " y", out.y, ref.y);
  expect_matches_oracle(name + " mean", out.mean, ref.mean);
  expect_matches_oracle(name + " rstd", out.rstd, ref.rstd);

  std::vector<T> dweight(c.C, T(0)), dbias(c.C, T(0));
  const std::vector<T> dx = backward(in, out, whole, dweight.data(), dbias.data());
  expect_matches_oracle(name + " dx", dx, ref.dx);
  expect_matches_oracle(name + " dweight", dweight, ref.dweight);
  expect_matches_oracle(name + " dbias", dbias, ref.dbias);
  expect_identical(name + " dx without weight/bias grads",
                   backward<T>(in, out, whole, nullptr, nullptr), dx);

  check_range_splits(name, in, out, dx, dweight, dbias);
}

// A row mean far from zero relative to the spread, where a one-pass variance cancels.
template <typename T>
Case large_mean_case() {
  return std::is_same_v<T, float> ? Case{16, 384, true, true, 30.0, 1.0, 1e-5}
                                  : Case{16, 384, true, true, 1e3, 1e-2, 1e-12};
}

template <typename T>
void run_all(Rng& rng) {
  const Case cases[] = {
      {1, 1, true, true, 0.0, 1.0, 1e-5},    {3, 1, false, false, 0.0, 1.0, 1e-5},
      {4, 2, true, false, 0.5, 2.0, 1e-5},   {5, 3, false, true, 0.0, 1.0, 1e-5},
      {7, 7, true, true, -1.0, 3.0, 1e-5},   {2, 8, false, false, 0.0, 1.0, 0.1},
      {9, 16, true, true, 0.0, 1.0, 1e-5},   {1, 65, true, false, 0.0, 1.0, 1e-5},
      {6, 127, false, true, 2.0, 0.5, 1e-5}, {4, 128, true, true, 0.0, 1.0, 1e-5},
      {33, 384, true, true, 0.0, 1.0, 1e-5}, {3, 1000, false, false, 0.0, 1.0, 1e-5},
      {2, 1031, true, true, 0.0, 1.0, 1e-5}, {2, 4099, true, true, 0.0, 1.0, 1e-5},
      {64, 33, true, true, 0.0, 1.0, 1e-5},  large_mean_case<T>(),
  };
  for (const Case& c : cases) run_case<T>(c, rng);
}

// The double backward against central differences of sum(dy * y) through the double forward.
void check_finite_differences(Rng& rng) {
  const int64_t N = 3, C = 7;
  const double eps = 1e-5;
  std::vector<double> x = rng.normal_vector<double>(N * C), weight = rng.normal_vector<double>(C),
                      bias = rng.normal_vector<double>(C), dy = rng.normal_vector<double>(N * C);
  auto loss = [&] {
    std::vector<double> y(N * C), mean(N), rstd(N);
    layer_norm_forward(x.data(), weight.data(), bias.data(), y.data(), mean.data(), rstd.data(), C,
                       eps, 0, N);
    double l = 0.0;
    for (int64_t i = 0; i < N * C; ++i) l += dy[i] * y[i];
    return l;
  };
  std::vector<double> y(N * C), mean(N), rstd(N), dx(N * C), dweight(C, 0.0), dbias(C, 0.0);
  layer_norm_forward(x.data(), weight.data(), bias.data(), y.data(), mean.data(), rstd.data(), C,
                     eps, 0, N);
  layer_norm_backward(dy.data(), x.data(), weight.data(), mean.data(), rstd.data(), dx.data(),
                      dweight.data(), dbias.data(), C, 0, N);
  const double tol = 1e-6;
  expect_close("layer_norm finite differences dx", dx, numerical_gradient(loss, x), tol, tol);
  expect_close("layer_norm finite differences dweight", dweight, numerical_gradient(loss, weight),
               tol, tol);
  expect_close("layer_norm finite differences dbias", dbias, numerical_gradient(loss, bias), tol,
               tol);
}

}  // namespace

int main() {
  Rng rng(20240611);
  run_all<float>(rng);
  run_all<double>(rng);
  check_finite_differences(rng);
  return Tally::get().finish("test_layer_norm");
}
