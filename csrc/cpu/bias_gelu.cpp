// Bias + GELU kernels declared in bias_gelu.h. Plain counted loops over contiguous rows; erf and
// exp are the branch-free erf_fast and exp_fast, so the compiler vectorises every loop.
#include "cpu/bias_gelu.h"

#include "cpu/erf_fast.h"
#include "cpu/vec_math.h"

namespace pygpt::cpu {
inline namespace PYGPT_CPU_ISA {
namespace {

constexpr double kSqrtHalf = 0.70710678118654752440;     // 1 / sqrt(2)
constexpr double kInvSqrt2Pi = 0.39894228040143267794;   // 1 / sqrt(2 pi)

// Phi(h) = (1 + erf(h / sqrt 2)) / 2.
template <typename T>
inline T normal_cdf(T h) {
  return T(0.5) * (T(1) + erf_fast(h * static_cast<T>(kSqrtHalf)));
}

template <typename T, bool kDBias>
void backward_rows(const T* grad_y, const T* x, const T* bias, T* dx, T* dbias_partial, int64_t C,
                   int64_t row_begin, int64_t row_end) {
  for (int64_t i = row_begin; i < row_end; ++i) {
    const T* dy = grad_y + i * C;
    const T* xr = x + i * C;
    T* dxr = dx + i * C;
#pragma omp simd  // each j touches only [j]
    for (int64_t j = 0; j < C; ++j) {
      const T h = xr[j] + bias[j];
      const T pdf = static_cast<T>(kInvSqrt2Pi) * exp_fast(T(-0.5) * h * h);
      const T d = dy[j] * (normal_cdf(h) + h * pdf);
      dxr[j] = d;
      if constexpr (kDBias) dbias_partial[j] += d;
    }
  }
}

}  // namespace

template <typename T>
void bias_gelu_forward(const T* x, const T* bias, T* y, int64_t C, int64_t row_begin,
                       int64_t row_end) {
  for (int64_t i = row_begin; i < row_end; ++i) {
    const T* xr = x + i * C;
    T* yr = y + i * C;
#pragma omp simd
    for (int64_t j = 0; j < C; ++j) {
      const T h = xr[j] + bias[j];
      yr[j] = h * normal_cdf(h);
    }
  }
}

template <typename T>
void bias_gelu_backward(const T* grad_y, const T* x, const T* bias, T* dx, T* dbias_partial,
                        int64_t C, int64_t row_begin, int64_t row_end) {
  if (dbias_partial != nullptr) {
    backward_rows<T, true>(grad_y, x, bias, dx, dbias_partial, C, row_begin, row_end);
  } else {
    backward_rows<T, false>(grad_y, x, bias, dx, dbias_partial, C, row_begin, row_end);
  }
}

template void bias_gelu_forward<float>(const float*, const float*, float*, int64_t, int64_t,
                                       int64_t);
template void bias_gelu_forward<double>(const double*, const double*, double*, int64_t, int64_t,
                                        int64_t);
template void bias_gelu_backward<float>(const float*, const float*, const float*, float*, float*,
                                        int64_t, int64_t, int64_t);
template void bias_gelu_backward<double>(const double*, const double*, const double*, double*,
                                         double*, int64_t, int64_t, int64_t);

}  // namespace PYGPT_CPU_ISA
}  // namespace pygpt::cpu
