// A register-blocked GEMM for the small tiles of the attention kernels:
//   C[M x N] (+)= A[M x K] * B[K x N]
// B and C are row-major with unit column stride; A is addressed through a row and a k stride, so
// a transposed tile (P^T, dS^T) needs no copy. M must be a multiple of kTileRows and N of
// tile_cols<T>() (callers zero-pad their tiles); K is free.
//
// GCC/Clang vector extensions keep the accumulators in registers without intrinsics. The block is
// sized to the register file of the ISA this copy is compiled for (two vectors per row):
//   AVX-512 (32 registers of 64 bytes): 12 rows, 24 accumulators, 2 B vectors, 1 broadcast;
//   AVX2 (16 registers of 32 bytes): 6 rows, 12 accumulators, 2 B vectors, 1 broadcast;
//   baseline SSE2 (16 registers of 16 bytes): 4 rows, 8 accumulators.
// Measured on an AMD EPYC Zen 5 (attention forward+backward, B=8 H=6 T=256 D=64, one thread):
// with AVX2 forced, 6 rows beat 4 by about a quarter, since 8 accumulators barely cover the FMA
// latency; with AVX-512, 12 rows beat 8 by 15-30%. Attention's tiles follow the block.
#pragma once

#include "cpu/isa.h"

#include <cstdint>
#include <cstring>

namespace pygpt::cpu {
inline namespace PYGPT_CPU_ISA {

#if defined(__AVX512F__)
constexpr int kVectorBytes = 64;
constexpr int64_t kTileRows = 12;
#elif defined(__AVX2__)
constexpr int kVectorBytes = 32;
constexpr int64_t kTileRows = 6;
#else
constexpr int kVectorBytes = 16;
constexpr int64_t kTileRows = 4;
#endif

template <typename T>
struct Vec {
  typedef T type __attribute__((vector_size(kVectorBytes)));
  static constexpr int lanes = kVectorBytes / sizeof(T);
};

// Columns per register block: two vectors.
template <typename T>
constexpr int64_t tile_cols() {
  return 2 * Vec<T>::lanes;
}

template <typename T>
inline void gemm_block(int64_t K, const T* A, int64_t a_row, int64_t a_k, const T* B, int64_t ldb,
                       T* C, int64_t ldc, bool accumulate) {
  using V = typename Vec<T>::type;
  constexpr int W = Vec<T>::lanes;
  V c[kTileRows][2];
  for (int r = 0; r < kTileRows; ++r) {
    if (accumulate) {
      std::memcpy(&c[r][0], C + r * ldc, sizeof(V));
      std::memcpy(&c[r][1], C + r * ldc + W, sizeof(V));
    } else {
      c[r][0] = V{};
      c[r][1] = V{};
    }
  }
  for (int64_t k = 0; k < K; ++k) {
    V b0, b1;
    std::memcpy(&b0, B + k * ldb, sizeof(V));
    std::memcpy(&b1, B + k * ldb + W, sizeof(V));
    const T* a = A + k * a_k;
    for (int r = 0; r < kTileRows; ++r) {
      const T ar = a[r * a_row];
      c[r][0] += ar * b0;
      c[r][1] += ar * b1;
    }
  }
  for (int r = 0; r < kTileRows; ++r) {
    std::memcpy(C + r * ldc, &c[r][0], sizeof(V));
    std::memcpy(C + r * ldc + W, &c[r][1], sizeof(V));
  }
}

template <typename T>
inline void tile_gemm(int64_t M, int64_t N, int64_t K, const T* A, int64_t a_row, int64_t a_k,
                      const T* B, int64_t ldb, T* C, int64_t ldc, bool accumulate) {
  constexpr int64_t NR = tile_cols<T>();
  for (int64_t i = 0; i < M; i += kTileRows) {
    for (int64_t j = 0; j < N; j += NR) {
      gemm_block<T>(K, A + i * a_row, a_row, a_k, B + j, ldb, C + i * ldc + j, ldc, accumulate);
    }
  }
}

// Rounds n up to a multiple of m.
constexpr int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

}  // namespace PYGPT_CPU_ISA
}  // namespace pygpt::cpu
