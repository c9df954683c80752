// Bias + GELU kernels declared in bias_gelu.h. Plain counted loops over contiguous rows; erf and
// exp are the branch-free erf_fast and exp_fast, so the compiler vectorises every loop. Each
// GELU is a small struct of its value and derivative, and the loops are templates over it, so
// the choice of GELU is made once per call, outside the loops.
#include "cpu/bias_gelu.h"

#include "cpu/erf_fast.h"
#include "cpu/vec_math.h"

namespace pygpt::cpu {
inline namespace PYGPT_CPU_ISA {
namespace {

constexpr double kSqrtHalf = 0.70710678118654752440;     // 1 / sqrt(2)
constexpr double kInvSqrt2Pi = 0.39894228040143267794;   // 1 / sqrt(2 pi)
constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2 / pi)
constexpr double kCubic = 0.044715;                      // the tanh GELU's cubic coefficient

// The exact GELU: h * Phi(h), Phi(h) = (1 + erf(h / sqrt 2)) / 2.
struct ErfGelu {
  template <typename T>
  static T normal_cdf(T h) {
    return T(0.5) * (T(1) + erf_fast(h * static_cast<T>(kSqrtHalf)));
  }
  template <typename T>
  static T value(T h) {
    return h * normal_cdf(h);
  }
  template <typename T>
  static T derivative(T h) {
    const T pdf = static_cast<T>(kInvSqrt2Pi) * exp_fast(T(-0.5) * h * h);
    return normal_cdf(h) + h * pdf;
  }
};

// The tanh GELU, h * (1 + tanh(u)) / 2 written as h * s with s = sigmoid(2u) = 1 / (1 + e^-2u):
// the same function without 1 + tanh(u)'s cancellation for negative h. exp_fast's +inf for
// large -2u gives s = 0, its 0 for large 2u gives s = 1.
struct TanhGelu {
  template <typename T>
  static T sigmoid_2u(T h) {
    const T u = static_cast<T>(kSqrt2OverPi) * (h + static_cast<T>(kCubic) * h * h * h);
    return T(1) / (T(1) + exp_fast(T(-2) * u));
  }
  template <typename T>
  static T value(T h) {
    return h * sigmoid_2u(h);
  }
  template <typename T>
  static T derivative(T h) {
    const T s = sigmoid_2u(h);
    const T du = static_cast<T>(kSqrt2OverPi) * (T(1) + static_cast<T>(3 * kCubic) * h * h);
    return s + h * (s * (T(1) - s)) * (T(2) * du);
  }
};

template <typename Gelu, typename T>
void forward_rows(const T* x, const T* bias, T* y, int64_t C, int64_t row_begin,
                  int64_t row_end) {
  for (int64_t i = row_begin; i < row_end; ++i) {
    const T* xr = x + i * C;
    T* yr = y + i * C;
#pragma omp simd
    for (int64_t j = 0; j < C; ++j) yr[j] = Gelu::value(xr[j] + bias[j]);
  }
}

template <typename Gelu, bool kDBias, typename T>
void backward_rows(const T* grad_y, const T* x, const T* bias, T* dx, T* dbias_partial, int64_t C,
                   int64_t row_begin, int64_t row_end) {
  for (int64_t i = row_begin; i < row_end; ++i) {
    const T* dy = grad_y + i * C;
    const T* xr = x + i * C;
    T* dxr = dx + i * C;
#pragma omp simd  // each j touches only [j]
    for (int64_t j = 0; j < C; ++j) {
      const T d = dy[j] * Gelu::derivative(xr[j] + bias[j]);
      dxr[j] = d;
      if constexpr (kDBias) dbias_partial[j] += d;
    }
  }
}

template <typename Gelu, typename T>
void backward_with(const T* grad_y, const T* x, const T* bias, T* dx, T* dbias_partial,
                   int64_t C, int64_t row_begin, int64_t row_end) {
  if (dbias_partial != nullptr) {
    backward_rows<Gelu, true>(grad_y, x, bias, dx, dbias_partial, C, row_begin, row_end);
  } else {
    backward_rows<Gelu, false>(grad_y, x, bias, dx, dbias_partial, C, row_begin, row_end);
  }
}

}  // namespace

template <typename T>
void bias_gelu_forward(const T* x, const T* bias, T* y, int64_t C, int64_t row_begin,
                       int64_t row_end, GeluApproximation approximate) {
  if (approximate == GeluApproximation::kTanh) {
    forward_rows<TanhGelu>(x, bias, y, C, row_begin, row_end);
  } else {
    forward_rows<ErfGelu>(x, bias, y, C, row_begin, row_end);
  }
}

template <typename T>
void bias_gelu_backward(const T* grad_y, const T* x, const T* bias, T* dx, T* dbias_partial,
                        int64_t C, int64_t row_begin, int64_t row_end,
                        GeluApproximation approximate) {
  if (approximate == GeluApproximation::kTanh) {
    backward_with<TanhGelu>(grad_y, x, bias, dx, dbias_partial, C, row_begin, row_end);
  } else {
    backward_with<ErfGelu>(grad_y, x, bias, dx, dbias_partial, C, row_begin, row_end);
  }
}

template void bias_gelu_forward<float>(const float*, const float*, float*, int64_t, int64_t,
                                       int64_t, GeluApproximation);
template void bias_gelu_forward<double>(const double*, const double*, double*, int64_t, int64_t,
                                        int64_t, GeluApproximation);
template void bias_gelu_backward<float>(const float*, const float*, const float*, float*, float*,
                                        int64_t, int64_t, int64_t, GeluApproximation);
template void bias_gelu_backward<double>(const double*, const double*, const double*, double*,
                                         double*, int64_t, int64_t, int64_t, GeluApproximation);

}  // namespace PYGPT_CPU_ISA
}  // namespace pygpt::cpu
