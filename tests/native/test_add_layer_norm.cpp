// Tests the residual add + layer norm kernels (csrc/cpu/add_layer_norm.h) in float and double
// against a naive double oracle (the sum, then layer norm from its definition): sum, y, mean,
// rstd, dx with and without grad_sum, dweight, dbias, row-range splitting across the kernels'
// cache blocks, and finite differences through both outputs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu/add_layer_norm.h"
#include "test_support.h"

namespace {

using namespace pygpt::test;
using pygpt::cpu::add_layer_norm_backward;
using pygpt::cpu::add_layer_norm_forward;

struct Reference {
  std::vector<double> sum, y, mean, rstd, dx, dweight, dbias;
};

// s = x + r (rounded to T first: the kernel's sum is a T, and the norm sees that sum), then the
// layer norm; dx = grad_sum + the norm's backward through the Jacobian of xhat.
template <typename T>
Reference oracle(const std::vector<T>& x, const std::vector<T>& r, const std::vector<double>& w,
                 const std::vector<double>& b, const std::vector<double>& dy,
                 const std::vector<double>& dsum, int64_t N, int64_t C, double eps) {
  Reference ref{std::vector<double>(N * C), std::vector<double>(N * C), std::vector<double>(N),
                std::vector<double>(N),     std::vector<double>(N * C), std::vector<double>(C, 0.0),
                std::vector<double>(C, 0.0)};
  for (int64_t k = 0; k < N * C; ++k) ref.sum[k] = static_cast<double>(static_cast<T>(x[k] + r[k]));
  std::vector<double> xhat(C), g(C);
  for (int64_t i = 0; i < N; ++i) {
    const double* s = &ref.sum[i * C];
    double mean = 0.0, var = 0.0;
    for (int64_t j = 0; j < C; ++j) mean += s[j];
    mean /= C;
    for (int64_t j = 0; j < C; ++j) var += (s[j] - mean) * (s[j] - mean);
    const double rstd = 1.0 / std::sqrt(var / C + eps);
    ref.mean[i] = mean;
    ref.rstd[i] = rstd;
    for (int64_t j = 0; j < C; ++j) {
      const double wj = w.empty() ? 1.0 : w[j];
      xhat[j] = (s[j] - mean) * rstd;
      g[j] = dy[i * C + j] * wj;
      ref.y[i * C + j] = xhat[j] * wj + (b.empty() ? 0.0 : b[j]);
      ref.dweight[j] += dy[i * C + j] * xhat[j];
      ref.dbias[j] += dy[i * C + j];
    }
    for (int64_t j = 0; j < C; ++j) {
      double d = dsum.empty() ? 0.0 : dsum[i * C + j];
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
void run_case(int64_t N, int64_t C, bool affine, bool with_grad_sum, Rng& rng) {
  const std::string name =
      format("add_layer_norm<%s> N=%ld C=%ld affine=%d grad_sum=%d", type_name<T>(),
             static_cast<long>(N), static_cast<long>(C), affine, with_grad_sum);
  const double eps = 1e-5;
  const std::vector<T> x = rng.normal_vector<T>(N * C), r = rng.normal_vector<T>(N * C, 1.0, 2.0);
  const std::vector<T> w = affine ? rng.normal_vector<T>(C, 1.0, 0.5) : std::vector<T>();
  const std::vector<T> b = affine ? rng.normal_vector<T>(C) : std::vector<T>();
  const std::vector<T> dy = rng.normal_vector<T>(N * C);
  const std::vector<T> dsum = with_grad_sum ? rng.normal_vector<T>(N * C) : std::vector<T>();
  const Reference ref = oracle(x, r, to_double(w), to_double(b), to_double(dy), to_double(dsum),
                               N, C, eps);

  // The whole range, then the rows split into three ranges (one with partial gradients each).
  const std::vector<std::vector<int64_t>> splits = {{0, N}, {0, N / 3, N / 3 + (N + 1) / 3, N}};
  std::vector<T> first_y, first_dx;
  for (const auto& bounds : splits) {
    const std::string what = name + (bounds.size() == 2 ? "" : " split");
    std::vector<T> sum(N * C), y(N * C), mean(N), rstd(N), dx(N * C), dw(C, T(0)), db(C, T(0));
    for (size_t k = 0; k + 1 < bounds.size(); ++k) {
      add_layer_norm_forward(x.data(), r.data(), data_or_null(w), data_or_null(b), sum.data(),
                             y.data(), mean.data(), rstd.data(), C, eps, bounds[k],
                             bounds[k + 1]);
    }
    for (size_t k = 0; k + 1 < bounds.size(); ++k) {
      std::vector<T> dw_part(C, T(0)), db_part(C, T(0));
      add_layer_norm_backward(dy.data(), data_or_null(dsum), sum.data(), data_or_null(w),
                              mean.data(), rstd.data(), dx.data(), dw_part.data(), db_part.data(),
                              C, bounds[k], bounds[k + 1]);
      for (int64_t j = 0; j < C; ++j) {
        dw[j] += dw_part[j];
        db[j] += db_part[j];
      }
    }
    expect_identical(what + " sum", sum, std::vector<T>(ref.sum.begin(), ref.sum.end()));
    expect_matches_oracle(what + " y", y, ref.y);
    expect_matches_oracle(what + " mean", mean, ref.mean);
    expect_matches_oracle(what + " rstd", rstd, ref.rstd);
    // Rounding in the norm's backward scales with rstd: 1 / sqrt(eps) = 316 for rows of one
    // element (zero variance), as in layer_norm's own kernels.
    const double rstd_max = *std::max_element(ref.rstd.begin(), ref.rstd.end());
    expect_close(what + " dx", dx, ref.dx, kTol<T> * scale_of(ref.dx) * std::max(1.0, rstd_max),
                 kTol<T>);
    expect_matches_oracle(what + " dweight", dw, ref.dweight);
    expect_matches_oracle(what + " dbias", db, ref.dbias);
    if (first_y.empty()) {
      first_y = y;
      first_dx = dx;
    } else {
      expect_identical(what + " y as the whole range's", y, first_y);
      expect_identical(what + " dx as the whole range's", dx, first_dx);
    }
  }
}

// The double backward against central differences of sum(dsum * s + dy * y) through the double
// forward: the gradient of x and of residual is the same dx.
void check_finite_differences(Rng& rng) {
  const int64_t N = 3, C = 7;
  const double eps = 1e-5;
  std::vector<double> x = rng.normal_vector<double>(N * C), r = rng.normal_vector<double>(N * C),
                      w = rng.normal_vector<double>(C), b = rng.normal_vector<double>(C),
                      dy = rng.normal_vector<double>(N * C),
                      dsum = rng.normal_vector<double>(N * C);
  std::vector<double> s(N * C), y(N * C), mean(N), rstd(N);
  auto loss = [&] {
    add_layer_norm_forward(x.data(), r.data(), w.data(), b.data(), s.data(), y.data(), mean.data(),
                           rstd.data(), C, eps, 0, N);
    double l = 0.0;
    for (int64_t i = 0; i < N * C; ++i) l += dsum[i] * s[i] + dy[i] * y[i];
    return l;
  };
  loss();
  std::vector<double> dx(N * C), dw(C, 0.0), db(C, 0.0);
  add_layer_norm_backward(dy.data(), dsum.data(), s.data(), w.data(), mean.data(), rstd.data(),
                          dx.data(), dw.data(), db.data(), C, 0, N);
  const double tol = 1e-6;
  expect_close("add_layer_norm finite differences dx", dx, numerical_gradient(loss, x), tol, tol);
  expect_close("add_layer_norm finite differences dresidual", dx, numerical_gradient(loss, r), tol,
               tol);
  expect_close("add_layer_norm finite differences dweight", dw, numerical_gradient(loss, w), tol,
               tol);
  expect_close("add_layer_norm finite differences dbias", db, numerical_gradient(loss, b), tol,
               tol);
}

template <typename T>
void run_all(Rng& rng) {
  // Shapes on both sides of the kernels' 16 K-element cache blocks (rows per block = 16384 / C).
  const int64_t shapes[][2] = {{1, 1}, {5, 1}, {3, 7}, {9, 16}, {2, 127}, {33, 384},
                               {130, 128}, {3, 1031}, {5, 4099}, {7, 3000}};
  for (const auto& s : shapes) {
    for (bool affine : {true, false}) {
      for (bool grad_sum : {true, false}) run_case<T>(s[0], s[1], affine, grad_sum, rng);
    }
  }
}

}  // namespace

int main() {
  Rng rng(20261124);
  run_all<float>(rng);
  run_all<double>(rng);
  check_finite_differences(rng);
  return Tally::get().finish("test_add_layer_norm");
}
