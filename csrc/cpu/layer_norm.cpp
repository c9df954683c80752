// Layer normalisation kernels declared in layer_norm.h: per-row statistics, the affine output and
// the fused backward. Plain counted loops over contiguous rows so the compiler vectorises them.
#include "cpu/layer_norm.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "cpu/vec_sum.h"

namespace pygpt::cpu {
inline namespace PYGPT_CPU_ISA {
namespace {

// Mean and rstd of one row in two passes over the cached row: a first mean, then the centred sums
// of d = x - mean and d^2. The sum of d corrects the rounding of the first mean, and centring keeps
// the variance of rows with a large mean (a one-pass sum of squares cancels catastrophically).
template <typename T>
void row_statistics(const T* x, int64_t C, double eps, T& mean, T& rstd) {
  const T sum = vector_sums<T, 1>(C, [&](auto load, int64_t j, auto& a) { a[0] += load(x + j); })[0];
  const T rough_mean = sum / static_cast<T>(C);
  const auto [sum_d, sum_d2] = vector_sums<T, 2>(C, [&](auto load, int64_t j, auto& a) {
    const auto d = load(x + j) - rough_mean;
    a[0] += d;
    a[1] += d * d;
  });
  const double n = static_cast<double>(C);
  const double shift = static_cast<double>(sum_d) / n;
  const double var = std::max(static_cast<double>(sum_d2) / n - shift * shift, 0.0);
  mean = static_cast<T>(static_cast<double>(rough_mean) + shift);
  rstd = static_cast<T>(1.0 / std::sqrt(var + eps));
}

// Calls f(std::true_type{}) or f(std::false_type{}): turns a runtime flag (is a pointer non-null?)
// into a compile-time one, so the per-element loops carry no branches.
template <typename F>
void with_flag(bool flag, F&& f) {
  if (flag) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

template <typename T, bool kWeight, bool kBias>
void normalize_rows(const T* x, const T* weight, const T* bias, T* y, T* mean, T* rstd, int64_t C,
                    double eps, int64_t row_begin, int64_t row_end) {
  for (int64_t i = row_begin; i < row_end; ++i) {
    const T* xr = x + i * C;
    T* yr = y + i * C;
    T m, r;
    row_statistics(xr, C, eps, m, r);
    mean[i] = m;
    rstd[i] = r;
    for (int64_t j = 0; j < C; ++j) {
      T v = (xr[j] - m) * r;
      if constexpr (kWeight) v *= weight[j];
      if constexpr (kBias) v += bias[j];
      yr[j] = v;
    }
  }
}

// Per row, dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = grad_y * weight: one pass
// for the two means, and one that writes dx while adding the row into the weight/bias gradients.
template <typename T, bool kWeight, bool kDWeight, bool kDBias>
void backward_rows(const T* grad_y, const T* x, const T* weight, const T* mean, const T* rstd,
                   T* dx, T* dweight_partial, T* dbias_partial, int64_t C, int64_t row_begin,
                   int64_t row_end) {
  for (int64_t i = row_begin; i < row_end; ++i) {
    const T* dy = grad_y + i * C;
    const T* xr = x + i * C;
    T* dxr = dx + i * C;
    const T m = mean[i], r = rstd[i];
    const auto [sum_g, sum_g_xhat] = vector_sums<T, 2>(C, [&](auto load, int64_t j, auto& a) {
      auto g = load(dy + j);
      if constexpr (kWeight) g = g * load(weight + j);
      a[0] += g;
      a[1] += g * ((load(xr + j) - m) * r);
    });
    const T mean_g = sum_g / static_cast<T>(C);
    const T mean_g_xhat = sum_g_xhat / static_cast<T>(C);
#pragma omp simd  // too many pointers for GCC's runtime alias checks; each j touches only [j]
    for (int64_t j = 0; j < C; ++j) {
      const T dyj = dy[j];
      const T g = kWeight ? dyj * weight[j] : dyj;
      const T xhat = (xr[j] - m) * r;
      dxr[j] = r * (g - mean_g - xhat * mean_g_xhat);
      if constexpr (kDWeight) dweight_partial[j] += dyj * xhat;
      if constexpr (kDBias) dbias_partial[j] += dyj;
    }
  }
}

}  // namespace

template <typename T>
void layer_norm_forward(const T* x, const T* weight, const T* bias, T* y, T* mean, T* rstd,
                        int64_t C, double eps, int64_t row_begin, int64_t row_end) {
  with_flag(weight != nullptr, [&](auto has_weight) {
    with_flag(bias != nullptr, [&](auto has_bias) {
      normalize_rows<T, has_weight, has_bias>(x, weight, bias, y, mean, rstd, C, eps, row_begin,
                                              row_end);
    });
  });
}

template <typename T>
void layer_norm_backward(const T* grad_y, const T* x, const T* weight, const T* mean, const T* rstd,
                         T* dx, T* dweight_partial, T* dbias_partial, int64_t C, int64_t row_begin,
                         int64_t row_end) {
  with_flag(weight != nullptr, [&](auto has_weight) {
    with_flag(dweight_partial != nullptr, [&](auto has_dweight) {
      with_flag(dbias_partial != nullptr, [&](auto has_dbias) {
        backward_rows<T, has_weight, has_dweight, has_dbias>(grad_y, x, weight, mean, rstd, dx,
                                                             dweight_partial, dbias_partial, C,
                                                             row_begin, row_end);
      });
    });
  });
}

template void layer_norm_forward<float>(const float*, const float*, const float*, float*, float*,
                                        float*, int64_t, double, int64_t, int64_t);
template void layer_norm_forward<double>(const double*, const double*, const double*, double*,
                                         double*, double*, int64_t, double, int64_t, int64_t);
template void layer_norm_backward<float>(const float*, const float*, const float*, const float*,
                                         const float*, float*, float*, float*, int64_t, int64_t,
                                         int64_t);
template void layer_norm_backward<double>(const double*, const double*, const double*,
                                          const double*, const double*, double*, double*, double*,
                                          int64_t, int64_t, int64_t);

}  // namespace PYGPT_CPU_ISA
}  // namespace pygpt::cpu
