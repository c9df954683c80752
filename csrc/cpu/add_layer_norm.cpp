// Residual add + layer norm kernels declared in add_layer_norm.h, built on layer_norm.h's
// kernels: each block of rows small enough to stay in the L1/L2 cache is added (forward) or has
// grad_sum added (backward) right before or after the layer norm runs over it, so the fused op
// makes one pass over memory where the separate ops make two.
#include "cpu/add_layer_norm.h"

#include <algorithm>

#include "cpu/layer_norm.h"

namespace pygpt::cpu {
inline namespace PYGPT_CPU_ISA {
namespace {

// Elements per block of rows: 16 K elements (64 KB of float per tensor) stay in cache between
// the add and the layer norm.
constexpr int64_t kBlockElements = 16384;

// Calls f(begin, end) over consecutive blocks of rows covering [row_begin, row_end).
template <typename F>
void for_row_blocks(int64_t C, int64_t row_begin, int64_t row_end, F&& f) {
  const int64_t rows = std::max<int64_t>(1, kBlockElements / std::max<int64_t>(1, C));
  for (int64_t begin = row_begin; begin < row_end; begin += rows) {
    f(begin, std::min(row_end, begin + rows));
  }
}

}  // namespace

template <typename T>
void add_layer_norm_forward(const T* x, const T* residual, const T* weight, const T* bias, T* sum,
                            T* y, T* mean, T* rstd, int64_t C, double eps, int64_t row_begin,
                            int64_t row_end) {
  for_row_blocks(C, row_begin, row_end, [&](int64_t begin, int64_t end) {
    const int64_t first = begin * C, n = (end - begin) * C;
#pragma omp simd
    for (int64_t k = first; k < first + n; ++k) sum[k] = x[k] + residual[k];
    layer_norm_forward(sum, weight, bias, y, mean, rstd, C, eps, begin, end);
  });
}

template <typename T>
void add_layer_norm_backward(const T* grad_y, const T* grad_sum, const T* sum, const T* weight,
                             const T* mean, const T* rstd, T* dx, T* dweight_partial,
                             T* dbias_partial, int64_t C, int64_t row_begin, int64_t row_end) {
  for_row_blocks(C, row_begin, row_end, [&](int64_t begin, int64_t end) {
    layer_norm_backward(grad_y, sum, weight, mean, rstd, dx, dweight_partial, dbias_partial, C,
                        begin, end);
    if (grad_sum == nullptr) return;
    const int64_t first = begin * C, n = (end - begin) * C;
#pragma omp simd
    for (int64_t k = first; k < first + n; ++k) dx[k] += grad_sum[k];
  });
}

template void add_layer_norm_forward<float>(const float*, const float*, const float*,
                                            const float*, float*, float*, float*, float*, int64_t,
                                            double, int64_t, int64_t);
template void add_layer_norm_forward<double>(const double*, const double*, const double*,
                                             const double*, double*, double*, double*, double*,
                                             int64_t, double, int64_t, int64_t);
template void add_layer_norm_backward<float>(const float*, const float*, const float*,
                                             const float*, const float*, const float*, float*,
                                             float*, float*, int64_t, int64_t, int64_t);
template void add_layer_norm_backward<double>(const double*, const double*, const double*,
                                              const double*, const double*, const double*,
                                              double*, double*, double*, int64_t, int64_t,
                                              int64_t);

}  // namespace PYGPT_CPU_ISA
}  // namespace pygpt::cpu
