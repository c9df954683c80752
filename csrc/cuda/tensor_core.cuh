// Device wrappers for the tensor-core path (sm_80 and later): the warp-level matrix multiply
// mma.sync.aligned.m16n8k16 (bf16 or fp16 inputs, float32 accumulators), the shared-memory
// matrix load ldmatrix (with .trans), and the asynchronous global-to-shared copy cp.async. Each is
// a few lines of inline PTX whose fragment layouts the PTX ISA documents (unlike nvcuda::wmma's),
// so a kernel knows which element of a tile every lane holds and can mask or bias scores in
// registers. Section names below are those of NVIDIA's "Parallel Thread Execution ISA".
//
// Without a GPU the same calls run on the host CUDA emulator (tests/native/cuda/emulator/
// warp_matrix.h), which implements them from the same tables: warp-collective, strict like its
// shuffles. On a device older than sm_80 the wrappers trap: a launcher must pick another kernel
// there (the instructions do not exist), so the header still compiles in a multi-arch build.
//
// Framework-free: CUDA headers only. Internal to csrc/cuda/*.cu.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#ifdef PYGPT_CUDA_EMULATOR
#include "warp_matrix.h"
#endif

namespace pygpt::cuda::detail {

// Fragment layouts of mma.m16n8k16 with .bf16 / .f16 inputs and .f32 accumulators ("Matrix
// Fragments for mma.m16n8k16 with floating point type"), with groupID = laneid >> 2 and
// threadID_in_group = laneid % 4 (written g and t here):
//   A (16x16, row-major), a0..a7 in four .b32 registers, two 16-bit elements each, a(2j) in the
//     low half of register j:
//       row = g for a0, a1, a4, a5;  g + 8 for a2, a3, a6, a7
//       col = 2t + (i & 1) for a0..a3;  2t + (i & 1) + 8 for a4..a7
//   B (16x8, "col": K down the rows), b0..b3 in two .b32 registers:
//       row (k) = 2t + (i & 1) for b0, b1;  2t + (i & 1) + 8 for b2, b3
//       col (n) = g
//   C and D (16x8, float), c0..c3:
//       row = g for c0, c1;  g + 8 for c2, c3
//       col = 2t + (i & 1)
// So lane 4r + t holds columns 2t, 2t+1 of accumulator rows r and r + 8: a row's 8 values lie
// in 4 consecutive lanes (reduce a row with shuffles at lane distance 1 and 2).
struct MmaLayout {
  __device__ __forceinline__ static int group(int lane) { return lane >> 2; }
  __device__ __forceinline__ static int thread_in_group(int lane) { return lane & 3; }
  __device__ __forceinline__ static int a_row(int lane, int i) {
    return group(lane) + ((i & 2) ? 8 : 0);
  }
  __device__ __forceinline__ static int a_col(int lane, int i) {
    return 2 * thread_in_group(lane) + (i & 1) + (i >= 4 ? 8 : 0);
  }
  __device__ __forceinline__ static int b_row(int lane, int i) {
    return 2 * thread_in_group(lane) + (i & 1) + (i >= 2 ? 8 : 0);
  }
  __device__ __forceinline__ static int b_col(int lane) { return group(lane); }
  __device__ __forceinline__ static int c_row(int lane, int i) {
    return group(lane) + (i >= 2 ? 8 : 0);
  }
  __device__ __forceinline__ static int c_col(int lane, int i) {
    return 2 * thread_in_group(lane) + (i & 1);
  }
};

// Two 16-bit elements in one .b32 register, lo in the low half (the element with the smaller
// index in the fragment tables), each rounded to nearest even.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>,
                "tensor-core inputs are bf16 or fp16");
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
           static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16;
  } else {
    return static_cast<uint32_t>(__half_as_ushort(__float2half_rn(lo))) |
           static_cast<uint32_t>(__half_as_ushort(__float2half_rn(hi))) << 16;
  }
}

// D = A * B + C for one 16x8x16 tile, the whole warp together (every lane must call it, with
// the same T; "Warp-level matrix multiply-and-accumulate instruction: mma"). T is __nv_bfloat16
// or __half: mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32. d may alias c.
template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4],
                                             const uint32_t (&b)[2], const float (&c)[4]) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>,
                "tensor-core inputs are bf16 or fp16");
#ifdef PYGPT_CUDA_EMULATOR
  pygpt_emulated_mma_m16n8k16(std::is_same_v<T, __nv_bfloat16>, d, a, b, c);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // no m16n8k16 before sm_80
#else
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]),
          "f"(c[1]), "f"(c[2]), "f"(c[3]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]),
          "f"(c[1]), "f"(c[2]), "f"(c[3]));
  }
#endif
}

// ldmatrix.sync.aligned.m8n8.xN{.trans}.shared.b16 ("Warp-level matrix load instruction:
// ldmatrix"): the warp loads N (1, 2 or 4) 8x8 matrices of 16-bit elements from shared memory,
// every lane calling it. Lanes 8m..8m+7 give the addresses of rows 0..7 of matrix m (16
// contiguous bytes each, 16-byte aligned; other lanes' addresses are ignored), and register m of
// lane l receives elements (l / 4, 2 (l % 4)) and (l / 4, 2 (l % 4) + 1) of matrix m, the first
// in the low half: an A or B fragment register of mma_m16n8k16. With kTrans each address is the
// start of a column instead, so lane l receives elements (2 (l % 4), l / 4) and (2 (l % 4) + 1,
// l / 4) of the 8x8 block as stored: the B fragment of a row-major K x N tile (V in attention).
template <int N, bool kTrans>
__device__ __forceinline__ void ldmatrix(uint32_t (&r)[N], const void* row_address) {
  static_assert(N == 1 || N == 2 || N == 4, "ldmatrix loads 1, 2 or 4 matrices");
#ifdef PYGPT_CUDA_EMULATOR
  pygpt_emulated_ldmatrix(N, kTrans, r, row_address);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // the tensor-core path is sm_80+ (ldmatrix itself is sm_75)
#else
  const uint32_t p = static_cast<uint32_t>(__cvta_generic_to_shared(row_address));
  if constexpr (N == 1 && !kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(p));
  } else if constexpr (N == 1) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n"
                 : "=r"(r[0]) : "r"(p));
  } else if constexpr (N == 2 && !kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(p));
  } else if constexpr (N == 2) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(p));
  } else if constexpr (!kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(p));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(p));
  }
#endif
}

// cp.async.cg.shared.global [dst], [src], 16, src_bytes ("Data Movement and Conversion
// Instructions: cp.async"): this thread starts copying 16 bytes from global src to shared dst,
// both 16-byte aligned, bypassing L1 (.cg). Only the first src_bytes (0..16) are read, the rest of
// dst is zero-filled: src_bytes = 0 writes 16 zero bytes for a row past the end of a tensor
// (src must still be a valid address to form, and is not read). The copy is one of this
// thread's pending copies until a cp_async_commit puts it in a group and a cp_async_wait
// covering that group completes it; only then may this thread read dst (other threads: after a
// barrier that follows the wait).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, int src_bytes = 16) {
#ifdef PYGPT_CUDA_EMULATOR
  pygpt_emulated_cp_async(dst, src, src_bytes);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // no cp.async before sm_80
#else
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
               :: "r"(d), "l"(__cvta_generic_to_global(src)), "r"(src_bytes) : "memory");
#endif
}

// cp.async.commit_group: this thread's pending copies not yet in a group become its newest group
// ("cp.async.commit_group"). With no such copies the group is empty.
__device__ __forceinline__ void cp_async_commit() {
#ifdef PYGPT_CUDA_EMULATOR
  pygpt_emulated_cp_async_commit();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// cp.async.wait_group kPending: waits until at most the kPending most recent of this thread's
// groups are incomplete, so every older group has landed in shared memory
// ("cp.async.wait_group / cp.async.wait_all"). Copies not committed are not waited for; with
// fewer groups than kPending it returns at once.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  static_assert(kPending >= 0, "a count of groups");
#ifdef PYGPT_CUDA_EMULATOR
  pygpt_emulated_cp_async_wait(kPending, false);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  asm volatile("cp.async.wait_group %0;\n" :: "n"(kPending) : "memory");
#endif
}

// cp.async.wait_all: commits this thread's pending copies and waits for every group, so all of
// its copies have landed.
__device__ __forceinline__ void cp_async_wait_all() {
#ifdef PYGPT_CUDA_EMULATOR
  pygpt_emulated_cp_async_wait(0, true);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

}  // namespace pygpt::cuda::detail
