// Sums over a row with several independent vector accumulators per sum. A `#pragma omp simd
// reduction` keeps one vector accumulator per sum, so each addition waits for the one before it
// (3-4 cycles): over a row of a few hundred floats that latency, not the arithmetic, bounds a
// layer norm, and twice as hard with AVX2's 8 lanes as with AVX-512's 16.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>

#include "cpu/isa.h"
#include "cpu/tile_gemm.h"

namespace pygpt::cpu {
inline namespace PYGPT_CPU_ISA {

// One value of type V (a vector of T, or T itself) from p, which needs no vector alignment.
template <typename V, typename T>
inline V load_as(const T* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}

// The kSums sums over j in [0, n) of the terms that term(load, j, acc) adds into acc[0..kSums):
// with `load` returning vectors, the terms of elements [j, j + lanes); with it returning T, of
// element j alone (the row's tail). Summation order differs from a plain loop's by rounding only.
template <typename T, int kSums, typename Term>
inline std::array<T, kSums> vector_sums(int64_t n, Term&& term) {
  using V = typename Vec<T>::type;
  constexpr int W = Vec<T>::lanes;
  constexpr int kChains = 4;  // the horizontal sum below adds exactly four
  std::array<V, kSums> acc[kChains] = {};
  const auto vector_load = [](const T* p) { return load_as<V>(p); };
  int64_t j = 0;
  for (; j + kChains * W <= n; j += kChains * W) {
    for (int c = 0; c < kChains; ++c) term(vector_load, j + c * W, acc[c]);
  }
  for (; j + W <= n; j += W) term(vector_load, j, acc[0]);
  std::array<T, kSums> total{};
  for (int s = 0; s < kSums; ++s) {
    const V chains = (acc[0][s] + acc[1][s]) + (acc[2][s] + acc[3][s]);
    for (int l = 0; l < W; ++l) total[s] += chains[l];
  }
  const auto scalar_load = [](const T* p) { return *p; };
  for (; j < n; ++j) term(scalar_load, j, total);
  return total;
}

}  // namespace PYGPT_CPU_ISA
}  // namespace pygpt::cpu
