// Fused softmax cross-entropy kernels declared in cross_entropy.h. The forward reads each row of
// logits once from memory and keeps only its log-sum-exp (and, with label smoothing, the row's sum
// of logits, taken in the same sweep); the backward rebuilds the softmax from that lse while
// writing the gradient, so no (N, V) intermediate is ever stored.
#include "cpu/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu/vec_math.h"

namespace pygpt::cpu {
inline namespace PYGPT_CPU_ISA {
namespace {

// Logits are consumed in blocks that stay in L1 between the max and the exp pass. 1024 measured
// fastest at (2048, 50257) on AVX-512 (2048 and up were ~30% slower; a two-pass row as well).
constexpr int64_t kBlock = 1024;

// Max of x[0, n) and whether any element is NaN (the vectorised max silently skips NaNs); with
// kSum, also adds the sum of x[0, n) to sum in the same loop (without, sum is left alone and the
// loop is the max alone).
template <bool kSum, typename T>
T block_max(const T* x, int64_t n, bool& has_nan, double& sum) {
  T m = -std::numeric_limits<T>::infinity();
  T block_sum = 0;
  int nan_seen = 0;
#pragma omp simd reduction(max : m) reduction(| : nan_seen) reduction(+ : block_sum)
  for (int64_t j = 0; j < n; ++j) {
    m = x[j] > m ? x[j] : m;
    nan_seen |= x[j] != x[j];
    if constexpr (kSum) block_sum += x[j];
  }
  has_nan = has_nan || nan_seen != 0;
  if constexpr (kSum) sum += static_cast<double>(block_sum);
  return m;
}

// sum of exp(x[j] - shift) over x[0, n); shift is finite and >= every x[j].
template <typename T>
T block_sum_exp(const T* x, int64_t n, T shift) {
  T sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) sum += exp_fast(x[j] - shift);
  return sum;
}

// log(sum_j exp(x[j])) of one row in a single sweep over memory: per block, the max and then the
// exps run on L1-resident data, and the running sum (in double) is rescaled when the max grows.
// Rows with a NaN or +inf give NaN (as softmax does); rows that are all -inf give -inf. With kSum,
// row_sum (zero on entry) gets sum_j x[j] from the same sweep (meaningless when the lse is NaN).
template <bool kSum, typename T>
T row_logsumexp(const T* x, int64_t V, double& row_sum) {
  T running_max = -std::numeric_limits<T>::infinity();
  double running_sum = 0.0;
  bool has_nan = false;
  for (int64_t start = 0; start < V; start += kBlock) {
    const int64_t n = std::min(kBlock, V - start);
    const T m = block_max<kSum>(x + start, n, has_nan, row_sum);
    if (has_nan || m == std::numeric_limits<T>::infinity()) {
      return std::numeric_limits<T>::quiet_NaN();
    }
    if (m == -std::numeric_limits<T>::infinity()) continue;  // contributes exp(-inf) = 0
    if (m > running_max) {
      if (running_sum > 0.0) {  // rescale what earlier blocks summed; the first block has nothing
        running_sum *= std::exp(static_cast<double>(running_max) - static_cast<double>(m));
      }
      running_max = m;
    }
    running_sum += static_cast<double>(block_sum_exp(x + start, n, running_max));
  }
  if (running_max == -std::numeric_limits<T>::infinity()) return running_max;
  // running_sum >= 1 (the max term is exp(0)), so its log in T's precision loses nothing.
  return running_max + std::log(static_cast<T>(running_sum));
}

// The forward over rows [row_begin, row_end); kSmooth: label smoothing s > 0, which also takes
// each row's sum of logits (without, the loop is the unsmoothed one, nothing added).
template <bool kSmooth, typename T>
double forward_rows(const T* logits, int64_t row_stride, const int64_t* targets, int64_t V,
                    int64_t ignore_index, double s, T* lse, int64_t row_begin, int64_t row_end) {
  double loss_sum = 0.0;
  for (int64_t i = row_begin; i < row_end; ++i) {
    const T* row = logits + i * row_stride;
    double row_sum = 0.0;
    lse[i] = row_logsumexp<kSmooth>(row, V, row_sum);
    if (targets[i] == ignore_index) continue;
    const double nll = static_cast<double>(lse[i]) - static_cast<double>(row[targets[i]]);
    if constexpr (kSmooth) {  // V > 0 here: a row with a counted target has a class
      loss_sum += (1.0 - s) * nll + s * (static_cast<double>(lse[i]) - row_sum / double(V));
    } else {
      loss_sum += nll;
    }
  }
  return loss_sum;
}

// The backward over rows [row_begin, row_end). kSmooth: uniform = s / V is taken from every
// probability and target_offset = (1 - s) + s / V from the target's (without, 0 and 1).
template <bool kSmooth, typename T>
void backward_rows(const T* logits, int64_t row_stride, const int64_t* targets, const T* lse,
                   int64_t V, int64_t ignore_index, T uniform, T target_offset, T grad_scale,
                   T* grad_logits, int64_t row_begin, int64_t row_end) {
  for (int64_t i = row_begin; i < row_end; ++i) {
    const T* row = logits + i * row_stride;
    T* grad = grad_logits + i * V;
    const int64_t target = targets[i];
    if (target == ignore_index) {
      for (int64_t j = 0; j < V; ++j) grad[j] = 0;
      continue;
    }
    const T row_lse = lse[i];
    if (!std::isfinite(row_lse)) {  // NaN/inf logits: softmax is undefined, so is its gradient
      for (int64_t j = 0; j < V; ++j) grad[j] = std::numeric_limits<T>::quiet_NaN();
      continue;
    }
    const T target_logit = row[target];  // read first: grad_logits may overwrite logits in place
#pragma omp simd
    for (int64_t j = 0; j < V; ++j) {
      const T p = exp_fast(row[j] - row_lse);
      grad[j] = (kSmooth ? p - uniform : p) * grad_scale;
    }
    grad[target] =
        (exp_fast(target_logit - row_lse) - (kSmooth ? target_offset : T(1))) * grad_scale;
  }
}

}  // namespace

template <typename T>
double cross_entropy_forward(const T* logits, int64_t row_stride, const int64_t* targets, int64_t V,
                             int64_t ignore_index, double label_smoothing, T* lse,
                             int64_t row_begin, int64_t row_end) {
  auto rows = label_smoothing != 0.0 ? forward_rows<true, T> : forward_rows<false, T>;
  return rows(logits, row_stride, targets, V, ignore_index, label_smoothing, lse, row_begin,
              row_end);
}

template <typename T>
void cross_entropy_backward(const T* logits, int64_t row_stride, const int64_t* targets,
                            const T* lse, int64_t V, int64_t ignore_index, double label_smoothing,
                            T grad_scale, T* grad_logits, int64_t row_begin, int64_t row_end) {
  const double uniform = V > 0 ? label_smoothing / static_cast<double>(V) : 0.0;
  auto rows = label_smoothing != 0.0 ? backward_rows<true, T> : backward_rows<false, T>;
  rows(logits, row_stride, targets, lse, V, ignore_index, static_cast<T>(uniform),
       static_cast<T>((1.0 - label_smoothing) + uniform), grad_scale, grad_logits, row_begin,
       row_end);
}

template double cross_entropy_forward<float>(const float*, int64_t, const int64_t*, int64_t,
                                             int64_t, double, float*, int64_t, int64_t);
template double cross_entropy_forward<double>(const double*, int64_t, const int64_t*, int64_t,
                                              int64_t, double, double*, int64_t, int64_t);
template void cross_entropy_backward<float>(const float*, int64_t, const int64_t*, const float*,
                                            int64_t, int64_t, double, float, float*, int64_t,
                                            int64_t);
template void cross_entropy_backward<double>(const double*, int64_t, const int64_t*,
                                             const double*, int64_t, int64_t, double, double,
                                             double*, int64_t, int64_t);

}  // namespace PYGPT_CPU_ISA
}  // namespace pygpt::cpu
