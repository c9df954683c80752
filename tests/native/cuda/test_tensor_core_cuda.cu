// Tests the tensor-core wrappers of csrc/cuda/tensor_core.cuh lane by lane against the PTX ISA's
// fragment tables and plain matrix products: on a GPU that proves the tables (MmaLayout and the
// ldmatrix comments) are the hardware's, and on the host emulator that its warp_matrix.h follows
// the same tables. Every kernel runs two warps with different data, so a warp that read another
// warp's fragments would show.
//   - pack2: float pairs to bf16x2 / fp16x2 registers, bit for bit against the host's rounding
//     (ties, subnormals, overflow, NaN);
//   - mma_m16n8k16 (bf16 and fp16, accumulating in place onto a non-zero C): with small integers
//     every element of D must be exact (the sums are exact in any order); with normal values it
//     must be within float rounding of a double product;
//   - ldmatrix x1 / x2 / x4, plain and .trans, from a padded shared tile: every lane's every
//     register against the table; and ldmatrix feeding mma (A by x4, B by x2 from a K-major tile,
//     B by x2.trans from a row-major K x N tile, as attention's K and V);
//   - cp.async: full and zero-filled copies (src-size 0, 4, 8, 12, 16), commit / wait_group 1 /
//     wait_group 0 / wait_all, each thread's data after its wait and every thread's after a
//     barrier; on the emulator also that a copy is invisible before the wait that covers it (on a
//     GPU it may land sooner).
// Exits with 77 (ctest: skipped) without a CUDA device.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/kernel_utils.cuh"
#include "cuda/tensor_core.cuh"
#include "cuda_test_support.h"
#include "../test_support.h"

namespace {

using namespace pygpt::test;
using pygpt::cuda::detail::cp_async_16;
using pygpt::cuda::detail::cp_async_commit;
using pygpt::cuda::detail::cp_async_wait;
using pygpt::cuda::detail::cp_async_wait_all;
using pygpt::cuda::detail::dynamic_shared;
using pygpt::cuda::detail::launch;
using pygpt::cuda::detail::ldmatrix;
using pygpt::cuda::detail::mma_m16n8k16;
using pygpt::cuda::detail::MmaLayout;
using pygpt::cuda::detail::pack2;

constexpr int kWarps = 2;
constexpr int kThreads = 32 * kWarps;

// ---- pack2 ----

template <typename T>
__global__ void pack_kernel(const float* in, uint32_t* out, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = pack2<T>(in[2 * i], in[2 * i + 1]);
}

bool same_half_bits(uint16_t got, uint16_t want, bool bf16) {
  const uint16_t exponent = bf16 ? 0x7f80 : 0x7c00, fraction = bf16 ? 0x7f : 0x3ff;
  const bool got_nan = (got & exponent) == exponent && (got & fraction);
  const bool want_nan = (want & exponent) == exponent && (want & fraction);
  return want_nan ? got_nan : got == want;  // a NaN's payload is not specified
}

template <typename T>
void test_pack(bool bf16, Rng& rng) {
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 65519.0f, 65520.0f, -1e6f,
                          INFINITY, -INFINITY, NAN, 0x1p-24f, 0x1p-25f, 0x1.8p-25f, 0x1p-26f,
                          0x1.002p0f, 0x1.006p0f, 0x1.01p0f, 0x1.03p0f, 3e-39f, 0x1.ffep-15f,
                          0x1.fffp-15f};
  for (int i = 0; i < 490; ++i) {
    v.push_back(static_cast<float>(std::ldexp(rng.normal(), static_cast<int>(rng.integer(-30, 20)))));
  }
  if (v.size() % 2) v.push_back(1.0f);
  const int n = static_cast<int>(v.size() / 2);
  DeviceBuffer in_d(v.size() * 4), out_d(n * 4);
  upload(in_d.get(), v.data(), v.size() * 4);
  check(launch(pack_kernel<T>, dim3(1), dim3(kThreads), 0, nullptr, in_d.get<const float>(),
               out_d.get<uint32_t>(), n) == cudaSuccess, "pack2 launch");
  PYGPT_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint32_t> out(n);
  download(out.data(), out_d.get(), n * 4);
  int bad = 0;
  for (int i = 0; i < n; ++i) {
    for (int h = 0; h < 2; ++h) {
      const float x = v[2 * i + h];
      const uint16_t want = bf16 ? float_to_bf16_bits(x) : float_to_fp16_bits(x);
      const auto got = static_cast<uint16_t>(h ? out[i] >> 16 : out[i] & 0xffff);
      if (!same_half_bits(got, want, bf16) && bad++ < 5) {
        std::printf("  pack2<%s>(%a): got 0x%04x, want 0x%04x\n", bf16 ? "bf16" : "fp16", x, got,
                    want);
      }
    }
  }
  check(bad == 0, format("pack2<%s>: %d of %d halves differ", bf16 ? "bf16" : "fp16", bad, 2 * n));
}

// ---- mma ----

// Per warp w: A (16x16), B (16x8, k by n) and C (16x8) row-major at w * their size; D like C.
template <typename T>
__global__ void mma_kernel(const float* A, const float* B, const float* C, float* D) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  A += warp * 256;
  B += warp * 128;
  C += warp * 128;
  D += warp * 128;
  uint32_t a[4], b[2];
  float acc[4];
  for (int j = 0; j < 4; ++j) {
    a[j] = pack2<T>(A[MmaLayout::a_row(lane, 2 * j) * 16 + MmaLayout::a_col(lane, 2 * j)],
                    A[MmaLayout::a_row(lane, 2 * j + 1) * 16 + MmaLayout::a_col(lane, 2 * j + 1)]);
  }
  for (int j = 0; j < 2; ++j) {
    b[j] = pack2<T>(B[MmaLayout::b_row(lane, 2 * j) * 8 + MmaLayout::b_col(lane)],
                    B[MmaLayout::b_row(lane, 2 * j + 1) * 8 + MmaLayout::b_col(lane)]);
  }
  for (int i = 0; i < 4; ++i) acc[i] = C[MmaLayout::c_row(lane, i) * 8 + MmaLayout::c_col(lane, i)];
  mma_m16n8k16<T>(acc, a, b, acc);
  for (int i = 0; i < 4; ++i) D[MmaLayout::c_row(lane, i) * 8 + MmaLayout::c_col(lane, i)] = acc[i];
}

// D = A * B + C per warp, in double, with the per-element bound sum |A B| + |C| for tolerances.
void host_product(const std::vector<float>& A, const std::vector<float>& B,
                  const std::vector<float>& C, std::vector<double>& D, std::vector<double>& mag) {
  D.assign(kWarps * 128, 0.0);
  mag.assign(kWarps * 128, 0.0);
  for (int w = 0; w < kWarps; ++w) {
    for (int m = 0; m < 16; ++m) {
      for (int n = 0; n < 8; ++n) {
        double sum = C[w * 128 + m * 8 + n], abs_sum = std::fabs(sum);
        for (int k = 0; k < 16; ++k) {
          const double p = static_cast<double>(A[w * 256 + m * 16 + k]) * B[w * 128 + k * 8 + n];
          sum += p;
          abs_sum += std::fabs(p);
        }
        D[w * 128 + m * 8 + n] = sum;
        mag[w * 128 + m * 8 + n] = abs_sum;
      }
    }
  }
}

// Every element of got against ref within rtol * mag (rtol 0: exact), naming warp, row and
// column of the first few that are not.
void expect_tile(const std::string& what, const std::vector<float>& got,
                 const std::vector<double>& ref, const std::vector<double>& mag, double rtol) {
  int bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!(std::fabs(got[i] - ref[i]) <= rtol * mag[i]) && bad++ < 5) {
      std::printf("  %s: warp %zu D[%zu][%zu] = %.9g, want %.9g\n", what.c_str(), i / 128,
                  i % 128 / 8, i % 8, got[i], ref[i]);
    }
  }
  check(bad == 0, format("%s: %d of %zu elements wrong", what.c_str(), bad, ref.size()));
}

template <typename T>
void test_mma(bool bf16, bool integers, Rng& rng) {
  const std::string name = format("mma_m16n8k16<%s> %s", bf16 ? "bf16" : "fp16",
                                  integers ? "integers" : "normal");
  std::vector<float> A(kWarps * 256), B(kWarps * 128), C(kWarps * 128);
  auto draw = [&](std::vector<float>& v, bool input) {
    for (float& e : v) {
      e = integers ? static_cast<float>(rng.integer(input ? -8 : -100, input ? 9 : 101))
                   : static_cast<float>(rng.normal());
      if (input) e = bf16 ? round_to_bf16(e) : round_to_fp16(e);
    }
  };
  draw(A, true);
  draw(B, true);
  draw(C, false);
  std::vector<double> ref, mag;
  host_product(A, B, C, ref, mag);
  DeviceBuffer A_d(A.size() * 4), B_d(B.size() * 4), C_d(C.size() * 4), D_d(C.size() * 4);
  upload(A_d.get(), A.data(), A.size() * 4);
  upload(B_d.get(), B.data(), B.size() * 4);
  upload(C_d.get(), C.data(), C.size() * 4);
  check(launch(mma_kernel<T>, dim3(1), dim3(kThreads), 0, nullptr, A_d.get<const float>(),
               B_d.get<const float>(), C_d.get<const float>(), D_d.get<float>()) == cudaSuccess,
        name + ": launch");
  PYGPT_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> D(C.size());
  download(D.data(), D_d.get(), D.size() * 4);
  // Integers: |products| <= 64, sums below 2^11: exact whatever the order. Normal values: a few
  // float roundings of the largest partial sum (the hardware's order and precision are its own).
  expect_tile(name, D, ref, mag, integers ? 0.0 : 1e-5);
}

// ---- ldmatrix ----

// A 16x24 tile of 16-bit elements per warp in shared memory (rows 48 bytes apart: 16 of data
// and padding), matrix m of an xN load at rows 8 (m % 2), columns 8 (m / 2): the order of the
// registers of an mma A fragment. Lane l gives the address of row l % 8 of matrix (l / 8) % N
// (lanes past 8N repeat the first 8N). out: per warp, lane and register.
constexpr int kTileRow = 24;

template <int N, bool kTrans>
__global__ void ldmatrix_kernel(const uint16_t* in, uint32_t* out) {
  uint16_t* tile = dynamic_shared<uint16_t>();
  for (int i = threadIdx.x; i < kWarps * 16 * kTileRow; i += blockDim.x) tile[i] = in[i];
  __syncthreads();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, m = lane / 8 % N;
  const uint16_t* row = tile + warp * 16 * kTileRow + (8 * (m % 2) + lane % 8) * kTileRow + 8 * (m / 2);
  uint32_t r[N];
  ldmatrix<N, kTrans>(r, row);
  for (int j = 0; j < N; ++j) out[(warp * 32 + lane) * N + j] = r[j];
}

template <int N, bool kTrans>
void test_ldmatrix(Rng& rng) {
  const std::string name = format("ldmatrix x%d%s", N, kTrans ? ".trans" : "");
  std::vector<uint16_t> tile(kWarps * 16 * kTileRow);
  for (uint16_t& e : tile) e = static_cast<uint16_t>(rng.next_u64());
  DeviceBuffer in_d(tile.size() * 2), out_d(kThreads * N * 4);
  upload(in_d.get(), tile.data(), tile.size() * 2);
  check(launch(ldmatrix_kernel<N, kTrans>, dim3(1), dim3(kThreads), tile.size() * 2, nullptr,
               in_d.get<const uint16_t>(), out_d.get<uint32_t>()) == cudaSuccess,
        name + ": launch");
  PYGPT_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint32_t> out(kThreads * N);
  download(out.data(), out_d.get(), out.size() * 4);
  int bad = 0;
  for (int w = 0; w < kWarps; ++w) {
    for (int l = 0; l < 32; ++l) {
      for (int m = 0; m < N; ++m) {
        // Element (i, j) of matrix m as the table numbers it; .trans swaps the stored indices.
        auto element = [&](int i, int j) {
          const int r = kTrans ? j : i, c = kTrans ? i : j;
          return static_cast<uint32_t>(tile[w * 16 * kTileRow + (8 * (m % 2) + r) * kTileRow + 8 * (m / 2) + c]);
        };
        const uint32_t want = element(l / 4, 2 * (l % 4)) | element(l / 4, 2 * (l % 4) + 1) << 16;
        const uint32_t got = out[(w * 32 + l) * N + m];
        if (got != want && bad++ < 5) {
          std::printf("  %s: warp %d lane %d register %d = 0x%08x, want 0x%08x\n", name.c_str(), w,
                      l, m, got, want);
        }
      }
    }
  }
  check(bad == 0, format("%s: %d of %d registers wrong", name.c_str(), bad, kThreads * N));
}

// ldmatrix feeding mma as attention will: per warp, A (16x16 row-major) by x4; B from Kt (8x16:
// n by k, as the rows of K) by x2, or from V (16x8: k by n, row-major) by x2.trans. Shared
// memory: A, then Kt, then V, per warp, all rows 16-byte aligned.
template <typename T, bool kFromV>
__global__ void ldmatrix_mma_kernel(const uint16_t* A, const uint16_t* Bsrc, const float* C,
                                    float* D) {
  uint16_t* a_tile = dynamic_shared<uint16_t>();
  uint16_t* b_tile = a_tile + kWarps * 256;
  for (int i = threadIdx.x; i < kWarps * 256; i += blockDim.x) a_tile[i] = A[i];
  for (int i = threadIdx.x; i < kWarps * 128; i += blockDim.x) b_tile[i] = Bsrc[i];
  __syncthreads();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, m = lane / 8, r = lane % 8;
  uint32_t a[4], b[2];
  ldmatrix<4, false>(a, a_tile + warp * 256 + (8 * (m % 2) + r) * 16 + 8 * (m / 2));
  if constexpr (kFromV) {  // V[k][n]: matrix m is rows k = 8m..8m+7, read as columns
    ldmatrix<2, true>(b, b_tile + warp * 128 + (8 * (m % 2) + r) * 8);
  } else {  // Kt[n][k]: matrix m is columns k = 8m..8m+7 of rows n
    ldmatrix<2, false>(b, b_tile + warp * 128 + r * 16 + 8 * (m % 2));
  }
  float acc[4];
  C += warp * 128;
  D += warp * 128;
  for (int i = 0; i < 4; ++i) acc[i] = C[MmaLayout::c_row(lane, i) * 8 + MmaLayout::c_col(lane, i)];
  mma_m16n8k16<T>(acc, a, b, acc);
  for (int i = 0; i < 4; ++i) D[MmaLayout::c_row(lane, i) * 8 + MmaLayout::c_col(lane, i)] = acc[i];
}

template <typename T, bool kFromV>
void test_ldmatrix_mma(bool bf16, Rng& rng) {
  const std::string name = format("ldmatrix -> mma<%s>, B from %s", bf16 ? "bf16" : "fp16",
                                  kFromV ? "V (x2.trans)" : "K (x2)");
  std::vector<float> A(kWarps * 256), B(kWarps * 128), C(kWarps * 128);
  for (float& e : A) e = static_cast<float>(rng.integer(-8, 9));
  for (float& e : B) e = static_cast<float>(rng.integer(-8, 9));
  for (float& e : C) e = static_cast<float>(rng.integer(-100, 101));
  auto bits = [bf16](float x) { return bf16 ? float_to_bf16_bits(x) : float_to_fp16_bits(x); };
  std::vector<uint16_t> A16(A.size()), B16(B.size());  // B as stored: V[k][n] or Kt[n][k]
  for (size_t i = 0; i < A.size(); ++i) A16[i] = bits(A[i]);
  for (int w = 0; w < kWarps; ++w) {
    for (int k = 0; k < 16; ++k) {
      for (int n = 0; n < 8; ++n) {
        B16[w * 128 + (kFromV ? k * 8 + n : n * 16 + k)] = bits(B[w * 128 + k * 8 + n]);
      }
    }
  }
  std::vector<double> ref, mag;
  host_product(A, B, C, ref, mag);
  DeviceBuffer A_d(A16.size() * 2), B_d(B16.size() * 2), C_d(C.size() * 4), D_d(C.size() * 4);
  upload(A_d.get(), A16.data(), A16.size() * 2);
  upload(B_d.get(), B16.data(), B16.size() * 2);
  upload(C_d.get(), C.data(), C.size() * 4);
  check(launch(ldmatrix_mma_kernel<T, kFromV>, dim3(1), dim3(kThreads),
               (A16.size() + B16.size()) * 2, nullptr, A_d.get<const uint16_t>(),
               B_d.get<const uint16_t>(), C_d.get<const float>(), D_d.get<float>()) == cudaSuccess,
        name + ": launch");
  PYGPT_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> D(C.size());
  download(D.data(), D_d.get(), D.size() * 4);
  expect_tile(name, D, ref, mag, 0.0);
}

// ---- cp.async ----

// Four regions of shared memory, 16 bytes per thread each, filled from src (same layout):
// region 0 in group 1, region 1 (zero-filled past (t % 5) * 4 bytes) in group 2, region 2 issued
// and left uncommitted, region 3 issued just before wait_all. seen: what thread t reads of its
// own chunks at each step (5 x 16 bytes); after: every region as thread (t + 17) % 64 reads it
// after the barrier.
constexpr int kSeen = 5;

__global__ void cp_async_kernel(const uint4* src, uint4* seen, uint4* after) {
  uint4* sh = dynamic_shared<uint4>();
  const int t = threadIdx.x, n = blockDim.x;
  cp_async_wait<0>();  // nothing committed: returns at once
  cp_async_16(&sh[t], &src[t]);
  cp_async_commit();
  cp_async_16(&sh[n + t], &src[n + t], (t % 5) * 4);
  cp_async_commit();
  cp_async_16(&sh[2 * n + t], &src[2 * n + t]);
  cp_async_wait<1>();  // group 1 has landed
  seen[t * kSeen + 0] = sh[t];
  seen[t * kSeen + 1] = sh[n + t];
  seen[t * kSeen + 2] = sh[2 * n + t];
  cp_async_wait<0>();  // group 2 too; region 2 is in no group
  seen[t * kSeen + 3] = sh[n + t];
  seen[t * kSeen + 4] = sh[2 * n + t];
  cp_async_16(&sh[3 * n + t], &src[3 * n + t]);
  cp_async_wait_all();
  __syncthreads();
  const int other = (t + 17) % n;
  for (int region = 0; region < 4; ++region) after[region * n + t] = sh[region * n + other];
}

void test_cp_async(Rng& rng) {
  const int n = kThreads;
  std::vector<uint32_t> src(4 * n * 4);
  for (uint32_t& e : src) e = (static_cast<uint32_t>(rng.next_u64()) | 1u) & ~2u;  // not 0, ~0
  DeviceBuffer src_d(src.size() * 4), seen_d(n * kSeen * 16), after_d(4 * n * 16);
  upload(src_d.get(), src.data(), src.size() * 4);
  check(launch(cp_async_kernel, dim3(1), dim3(n), 4 * n * 16, nullptr, src_d.get<const uint4>(),
               seen_d.get<uint4>(), after_d.get<uint4>()) == cudaSuccess,
        "cp.async: launch");
  PYGPT_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint32_t> seen(n * kSeen * 4), after(4 * n * 4);
  download(seen.data(), seen_d.get(), seen.size() * 4);
  download(after.data(), after_d.get(), after.size() * 4);
  // The 16 bytes thread t's copy to region r must leave: the source's, zero past src-size.
  auto chunk_word = [&](int region, int t, int word) {
    const bool filled = region != 1 || word < t % 5;
    return filled ? src[(region * n + t) * 4 + word] : 0u;
  };
  auto matches = [&](const uint32_t* got, int region, int t) {
    for (int word = 0; word < 4; ++word) {
      if (got[word] != chunk_word(region, t, word)) return false;
    }
    return true;
  };
  int own = 0, stale = 0, crossed = 0;
  for (int t = 0; t < n; ++t) {
    const uint32_t* s = &seen[t * kSeen * 4];
    own += !matches(s, 0, t) + !matches(s + 12, 1, t);
    // On the emulator a copy lands at the wait that covers it, not before: the chunks read before
    // their wait still hold the NaN bytes shared memory starts with (a GPU may finish earlier).
    for (const uint32_t* early : {s + 4, s + 8, s + 16}) {
      stale += early[0] != ~0u || early[1] != ~0u || early[2] != ~0u || early[3] != ~0u;
    }
    for (int region = 0; region < 4; ++region) {
      crossed += !matches(&after[(region * n + t) * 4], region, (t + 17) % n);
    }
  }
  check(own == 0, format("cp.async: %d of %d own chunks wrong after their wait", own, 2 * n));
#ifdef PYGPT_CUDA_EMULATOR
  check(stale == 0, format("cp.async: %d of %d chunks visible before their wait", stale, 3 * n));
#endif
  check(crossed == 0, format("cp.async: %d of %d chunks wrong after wait_all and the barrier",
                             crossed, 4 * n));
}

}  // namespace

int main() {
  if (!cuda_device_available()) return kSkipExitCode;
  Rng rng(20261129);
  test_pack<__nv_bfloat16>(true, rng);
  test_pack<__half>(false, rng);
  for (bool integers : {true, false}) {
    test_mma<__nv_bfloat16>(true, integers, rng);
    test_mma<__half>(false, integers, rng);
  }
  test_ldmatrix<1, false>(rng);
  test_ldmatrix<2, false>(rng);
  test_ldmatrix<4, false>(rng);
  test_ldmatrix<1, true>(rng);
  test_ldmatrix<2, true>(rng);
  test_ldmatrix<4, true>(rng);
  test_ldmatrix_mma<__nv_bfloat16, false>(true, rng);
  test_ldmatrix_mma<__nv_bfloat16, true>(true, rng);
  test_ldmatrix_mma<__half, false>(false, rng);
  test_ldmatrix_mma<__half, true>(false, rng);
  test_cp_async(rng);
  return Tally::get().finish("test_tensor_core_cuda");
}
