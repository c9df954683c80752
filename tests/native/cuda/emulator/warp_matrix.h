// The tensor-core instructions of the host CUDA emulator (see cuda_runtime.h beside it), behind
// the wrappers of csrc/cuda/tensor_core.cuh: mma.sync.aligned.m16n8k16 (bf16 and fp16 inputs,
// float accumulators), ldmatrix.sync.aligned.m8n8 (.x1/.x2/.x4, .trans) and cp.async (16 bytes,
// commit_group, wait_group, wait_all), each as the PTX ISA defines it.
//
// mma and ldmatrix are warp-collective like the shuffles: every lane of the warp must arrive (a
// strict warp barrier, counted with __syncwarp and the shuffles), each lane deposits its operands
// in a per-thread slot, and after the barrier each lane computes its own results from all 32
// slots. The lanes must all be at the same instruction with the same qualifiers, else the run
// aborts. The matrices are rebuilt from the fragments with the PTX ISA's tables ("Matrix
// Fragments for mma.m16n8k16 with floating point type"), written here independently of the
// kernels' copy in tensor_core.cuh, so that a test that checks one against a plain matrix product
// checks the other.
//
// mma arithmetic: each product of two bf16 or two fp16 values is exact; the 16 products and C's
// element are summed in double in k order, then rounded once to float. The hardware's order and
// internal precision are not specified (it is not an exactly rounded sum), so kernels' tests
// compare with float tolerances, never bit for bit with the emulator.
//
// cp.async: the 16 source bytes are read when the copy is issued (an out-of-bounds read faults
// there, at the guard page) but written to shared memory only when a wait covers the copy's
// group, so a kernel that reads its tile before cp_async_wait sees the old contents (shared
// memory starts NaN). The pending copies are per thread and per block.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <vector>

#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "cuda_runtime.h"

namespace emu {

// One lane's deposit for a warp-collective instruction: which instruction, and its operands.
struct WarpMatrixSlot {
  uint64_t block;  // Device::blocks_started and the lane's warp-barrier count at the deposit
  long barrier;
  const char* op;
  uint32_t words[10];
};

// Two slots per thread of the largest block, alternating with the warp-barrier count as the
// shuffles' do: a lane that reaches collective n + 2 finds every lane done reading those of n.
inline WarpMatrixSlot& warp_matrix_slot(int thread, long barrier) {
  static WarpMatrixSlot slots[2][1024];
  return slots[barrier % 2][thread];
}

// Deposits this lane's operands, waits for the whole warp, checks that all 32 lanes are at the
// same instruction; returns the warp's 32 slots (lane order) for this lane to read.
inline WarpMatrixSlot* warp_collective(const char* op, const uint32_t* words, int n) {
  Device& d = device();
  const int t = d.current, first = t & ~31;
  const long barrier = d.fibers[t].warp_barriers;
  WarpMatrixSlot& mine = warp_matrix_slot(t, barrier);
  mine.block = d.blocks_started;
  mine.barrier = barrier;
  mine.op = op;
  std::memcpy(mine.words, words, n * sizeof(uint32_t));
  sync_warp();  // every lane has deposited
  for (int lane = 0; lane < 32; ++lane) {
    const WarpMatrixSlot& slot = warp_matrix_slot(first + lane, barrier);
    // A lane at a shuffle or __syncwarp deposited nothing here at this count.
    const bool deposited = slot.block == d.blocks_started && slot.barrier == barrier;
    const char* other = deposited ? slot.op : "a shuffle or __syncwarp";
    if (std::strcmp(other, op) != 0) {
      static char what[160];
      std::snprintf(what, sizeof(what), "lanes of a warp met at different instructions: %s and %s",
                    op, other);
      fail(what);
    }
  }
  return &warp_matrix_slot(first, barrier);
}

inline float element16(bool bf16, uint32_t word, int half) {
  const unsigned short bits = static_cast<unsigned short>(half ? word >> 16 : word & 0xffffu);
  return bf16 ? __bfloat162float(__nv_bfloat16{bits}) : __half2float(__half{bits});
}

// Per-thread cp.async state: copies not yet committed, and committed groups, oldest first.
struct AsyncCopy {
  unsigned char* dst;
  unsigned char bytes[16];
};
struct AsyncCopies {
  uint64_t block = 0;  // Device::blocks_started when last used: stale state is discarded
  std::vector<AsyncCopy> uncommitted;
  std::deque<std::vector<AsyncCopy>> groups;
};

inline AsyncCopies& async_copies() {
  static AsyncCopies per_thread[1024];
  Device& d = device();
  AsyncCopies& mine = per_thread[d.current];
  if (mine.block != d.blocks_started) {  // a new block: its threads start with nothing pending
    mine = AsyncCopies{};
    mine.block = d.blocks_started;
  }
  return mine;
}

}  // namespace emu

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 d, a, b, c.
inline void pygpt_emulated_mma_m16n8k16(bool bf16, float (&d)[4], const uint32_t (&a)[4],
                                        const uint32_t (&b)[2], const float (&c)[4]) {
  uint32_t words[10];
  std::memcpy(words, a, 16);
  std::memcpy(words + 4, b, 8);
  std::memcpy(words + 6, c, 16);
  const emu::WarpMatrixSlot* lanes = emu::warp_collective(
      bf16 ? "mma.m16n8k16.row.col.f32.bf16.bf16.f32" : "mma.m16n8k16.row.col.f32.f16.f16.f32",
      words, 10);
  // The whole A (16x16) and B (16x8, k by n) from the 32 fragments. Register j of a lane holds
  // elements 2j (low half) and 2j + 1; groupID = lane / 4, threadID_in_group = lane % 4.
  float A[16][16], B[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const int group = lane / 4, in_group = lane % 4;
    for (int i = 0; i < 8; ++i) {  // a0..a7
      const int row = (i == 0 || i == 1 || i == 4 || i == 5) ? group : group + 8;
      const int col = i < 4 ? in_group * 2 + (i & 1) : in_group * 2 + (i & 1) + 8;
      A[row][col] = emu::element16(bf16, lanes[lane].words[i / 2], i % 2);
    }
    for (int i = 0; i < 4; ++i) {  // b0..b3
      const int row = i < 2 ? in_group * 2 + (i & 1) : in_group * 2 + (i & 1) + 8;
      B[row][group] = emu::element16(bf16, lanes[lane].words[4 + i / 2], i % 2);
    }
  }
  const int lane = emu::device().current % 32, group = lane / 4, in_group = lane % 4;
  float out[4];
  for (int i = 0; i < 4; ++i) {  // c0..c3 / d0..d3 of this lane
    const int row = i < 2 ? group : group + 8, col = in_group * 2 + (i & 1);
    double sum = c[i];
    for (int k = 0; k < 16; ++k) sum += static_cast<double>(A[row][k]) * B[k][col];
    out[i] = static_cast<float>(sum);
  }
  std::memcpy(d, out, sizeof(out));  // after reading c: d may alias it
}

// ldmatrix.sync.aligned.m8n8.x{n}{.trans}.shared.b16 {r}, [address].
inline void pygpt_emulated_ldmatrix(int n, bool trans, uint32_t* r, const void* address) {
  static const char* const names[2][5] = {
      {"", "ldmatrix.m8n8.x1.b16", "ldmatrix.m8n8.x2.b16", "", "ldmatrix.m8n8.x4.b16"},
      {"", "ldmatrix.m8n8.x1.trans.b16", "ldmatrix.m8n8.x2.trans.b16", "",
       "ldmatrix.m8n8.x4.trans.b16"}};
  const int lane = emu::device().current % 32;
  // Lanes 0..8n-1 give the row addresses: each row is 16 bytes, read as one aligned access.
  if (lane < 8 * n && reinterpret_cast<uintptr_t>(address) % 16 != 0) {
    emu::fail("ldmatrix row address not 16-byte aligned");
  }
  uint32_t words[2];
  std::memcpy(words, &address, sizeof(address));
  const emu::WarpMatrixSlot* lanes = emu::warp_collective(names[trans][n], words, 2);
  auto row = [&](int matrix, int r_) {  // the 8 elements at the address lane 8 matrix + r_ gave
    const void* p;
    std::memcpy(&p, lanes[8 * matrix + r_].words, sizeof(p));
    return static_cast<const unsigned short*>(p);
  };
  // Lane l holds elements (l / 4, 2 (l % 4)) and (l / 4, 2 (l % 4) + 1), the first in the low
  // half; with .trans the addresses are the matrix's columns, so element (i, j) is at row j's
  // address, position i.
  const int i = lane / 4, j = 2 * (lane % 4);
  for (int m = 0; m < n; ++m) {
    const unsigned lo = trans ? row(m, j)[i] : row(m, i)[j];
    const unsigned hi = trans ? row(m, j + 1)[i] : row(m, i)[j + 1];
    r[m] = lo | hi << 16;
  }
}

// cp.async.cg.shared.global [dst], [src], 16, src_bytes: issue time, the source is read now.
inline void pygpt_emulated_cp_async(void* dst, const void* src, int src_bytes) {
  if (reinterpret_cast<uintptr_t>(dst) % 16 != 0 || reinterpret_cast<uintptr_t>(src) % 16 != 0) {
    emu::fail("cp.async of 16 bytes with an address not 16-byte aligned");
  }
  if (src_bytes < 0 || src_bytes > 16) emu::fail("cp.async src-size outside 0..16");
  emu::AsyncCopy copy{static_cast<unsigned char*>(dst), {}};
  std::memcpy(copy.bytes, src, src_bytes);  // the rest stays zero: the zero fill
  emu::async_copies().uncommitted.push_back(copy);
}

// cp.async.commit_group.
inline void pygpt_emulated_cp_async_commit() {
  emu::AsyncCopies& state = emu::async_copies();
  state.groups.push_back(std::move(state.uncommitted));
  state.uncommitted.clear();
}

// cp.async.wait_group pending, or cp.async.wait_all (commit, then wait_group 0): the copies of
// all but the `pending` newest groups land in shared memory, oldest first.
inline void pygpt_emulated_cp_async_wait(int pending, bool all) {
  if (all) pygpt_emulated_cp_async_commit();
  emu::AsyncCopies& state = emu::async_copies();
  while (state.groups.size() > static_cast<size_t>(pending)) {
    for (const emu::AsyncCopy& copy : state.groups.front()) std::memcpy(copy.dst, copy.bytes, 16);
    state.groups.pop_front();
  }
}
