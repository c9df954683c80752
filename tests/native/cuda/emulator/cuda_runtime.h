// A host emulator of the CUDA subset that csrc/cuda and tests/native/cuda use, so that the native
// CUDA tests run unchanged on a machine without a GPU (CMake option PYGPT_CUDA_EMULATOR): the
// kernels compile as C++ against this header instead of the CUDA toolkit's.
//
// What it checks: the kernels' arithmetic, indexing and synchronisation logic. Every CUDA thread
// of a block is a fiber (a stack of its own) that runs from barrier to barrier; which ready
// thread runs next is drawn at random (seeded, PYGPT_EMU_SEED), in half the blocks by a random
// priority so that some threads run far ahead of others. A missing __syncthreads or __syncwarp
// then shows as a read of data not yet written, or already overwritten. Barriers are strict:
// every thread of the block must reach the same __syncthreads count, every lane of a warp the
// same warp-barrier count (__syncwarp and each shuffle), and no thread may exit while others
// wait, else the run aborts naming the kernel, block and thread. Dynamic shared memory starts
// NaN-filled; it and every cudaMalloc buffer end at an inaccessible guard page, so reading past
// the end faults. Launch limits are enforced: 1024 threads, grid sizes, 48 KB of dynamic shared
// memory unless the kernel opted in, up to PYGPT_EMU_SMEM_OPTIN bytes (default 166912, the
// A100's; 65536 emulates an sm_75 card). The tensor-core instructions behind csrc/cuda/
// tensor_core.cuh (mma, ldmatrix, cp.async) are in warp_matrix.h, float16 in cuda_fp16.h.
//
// What it cannot check: anything about the real hardware (the memory model between blocks,
// which run one after another here; warp-synchronous code without __syncwarp happens to work;
// exp accuracy, speed). Atomics are plain read-modify-writes (blocks never overlap).
#pragma once

#include <math.h>  // the device's global expf, isfinite, ...
#include <setjmp.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static  // blocks run one at a time, so a static is per block

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

inline dim3 threadIdx, blockIdx, blockDim, gridDim;

inline float __fmul_rn(float a, float b) { return a * b; }  // a lone product is rounded
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorNoDevice = 100,
};
enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
                      cudaMemcpyDeviceToDevice, cudaMemcpyDefault };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum cudaDeviceAttr { cudaDevAttrMaxSharedMemoryPerBlockOptin = 97 };
using cudaStream_t = struct CUstream_st*;
struct cudaDeviceProp {
  char name[256];
  int major, minor;
  size_t sharedMemPerBlockOptin;
};

namespace emu {

constexpr size_t kDefaultDynamicShared = 48 * 1024;
constexpr size_t kStackBytes = 256 * 1024;
constexpr size_t kPage = 4096;

inline size_t optin_limit() {
  static const size_t limit = [] {
    const char* env = std::getenv("PYGPT_EMU_SMEM_OPTIN");
    return env ? static_cast<size_t>(std::strtoull(env, nullptr, 10)) : size_t{166912};
  }();
  return limit;
}

// `bytes` of memory that end at an inaccessible page (and start after one): an access past the
// end faults. The start is 16-byte aligned (bytes rounded up to 16 end at the guard).
class GuardedAllocator {
 public:
  void* allocate(size_t bytes) {
    const size_t padded = (std::max<size_t>(bytes, 1) + 15) / 16 * 16;
    const size_t data_pages = (padded + kPage - 1) / kPage;
    const size_t map_bytes = (data_pages + 2) * kPage;
    void* mapped = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapped == MAP_FAILED) return nullptr;
    char* base = static_cast<char*>(mapped);
    mprotect(base, kPage, PROT_NONE);
    mprotect(base + (data_pages + 1) * kPage, kPage, PROT_NONE);
    char* p = base + (data_pages + 1) * kPage - padded;
    maps_[p] = {base, map_bytes};
    return p;
  }
  bool release(void* p) {
    const auto it = maps_.find(p);
    if (it == maps_.end()) return false;
    munmap(it->second.first, it->second.second);
    maps_.erase(it);
    return true;
  }

 private:
  std::map<void*, std::pair<void*, size_t>> maps_;
};

inline GuardedAllocator& allocator() {
  static GuardedAllocator a;
  return a;
}

struct Fiber {
  ucontext_t context;  // used once, to enter the fiber's stack
  jmp_buf resume;      // where the fiber continues
  std::vector<char> stack;
  long block_barriers = 0, warp_barriers = 0;  // passed in this block
  dim3 tid;
};

// The emulated device: its threads' fibers and the running block. Switches between a fiber and
// the scheduler are _setjmp/_longjmp (no signal-mask system calls).
struct Device {
  std::vector<Fiber> fibers;
  int current = -1;  // the running thread's index in its block; -1 in host code
  int threads = 0;
  int done = 0, at_block_barrier = 0;
  std::vector<int> at_warp_barrier;  // per warp
  std::vector<int> ready;            // runnable threads
  std::vector<uint64_t> priority;    // per thread, when the block runs by priority
  jmp_buf scheduler;
  std::function<void()> body;
  std::vector<uint64_t> lane_slots[2];  // shuffle exchange, one per thread, alternating
  uint64_t blocks_started = 0;          // tells per-thread state of an earlier block (cp.async)
  void* dynamic_shared = nullptr;
  const char* kernel_name = "";
  std::map<const void*, size_t> optin;  // per-kernel dynamic shared memory limit
  cudaError_t last_error = cudaSuccess;
  uint64_t rng = [] {
    const char* env = std::getenv("PYGPT_EMU_SEED");
    return env ? std::strtoull(env, nullptr, 10) : 1ull;
  }();

  uint64_t random() {  // SplitMix64
    uint64_t z = (rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
};

inline Device& device() {
  static Device d;
  return d;
}

[[noreturn]] inline void fail(const char* what) {
  const Device& d = device();
  std::fprintf(stderr, "CUDA EMULATOR: %s (in %s, block (%u,%u,%u), thread %d)\n", what,
               d.kernel_name, blockIdx.x, blockIdx.y, blockIdx.z, d.current);
  std::fflush(stderr);
  std::abort();
}

// Suspends the running thread; it resumes when the scheduler next picks it (once it is ready).
inline void switch_to_scheduler() {
  Device& d = device();
  Fiber& f = d.fibers[d.current];
  if (!_setjmp(f.resume)) _longjmp(d.scheduler, 1);
}

// A fiber runs one thread of a block per turn of its loop, for every block of every launch: its
// stack is set up once, so starting a block costs no system call.
inline void fiber_main() {
  for (;;) {
    Device& d = device();
    d.body();
    ++d.done;
    if (d.at_block_barrier > 0) fail("a thread exited while others wait at __syncthreads");
    if (d.at_warp_barrier[d.current / 32] > 0) fail("a lane exited while others wait at a warp barrier");
    switch_to_scheduler();
  }
}

// The last thread to arrive releases the others and goes on; the rest wait for the scheduler.
inline void sync_block() {
  Device& d = device();
  Fiber& self = d.fibers[d.current];
  if (d.done > 0) fail("__syncthreads reached after other threads of the block exited");
  ++self.block_barriers;
  if (++d.at_block_barrier < d.threads) return switch_to_scheduler();
  d.at_block_barrier = 0;
  for (int t = 0; t < d.threads; ++t) {
    Fiber& f = d.fibers[t];
    if (f.block_barriers != self.block_barriers) fail("threads met at different __syncthreads");
    if (t != d.current) d.ready.push_back(t);
  }
}

inline void sync_warp() {
  Device& d = device();
  if (d.threads % 32 != 0) fail("warp-synchronous call in a block whose last warp is partial");
  Fiber& self = d.fibers[d.current];
  const int warp = d.current / 32;
  ++self.warp_barriers;
  if (++d.at_warp_barrier[warp] < 32) return switch_to_scheduler();
  d.at_warp_barrier[warp] = 0;
  for (int t = warp * 32; t < warp * 32 + 32; ++t) {
    Fiber& f = d.fibers[t];
    if (f.warp_barriers != self.warp_barriers) fail("lanes met at different warp barriers");
    if (t != d.current) d.ready.push_back(t);
  }
}

// Runs thread t until it next waits at a barrier or finishes.
__attribute__((noinline)) inline void run_thread(int t) {
  Device& d = device();
  Fiber& f = d.fibers[t];
  d.current = t;
  threadIdx = f.tid;
  if (_setjmp(d.scheduler)) return;
  if (f.stack.empty()) {
    f.stack.resize(kStackBytes);
    getcontext(&f.context);
    f.context.uc_stack.ss_sp = f.stack.data();
    f.context.uc_stack.ss_size = f.stack.size();
    f.context.uc_link = nullptr;
    makecontext(&f.context, fiber_main, 0);
    ucontext_t unused;
    swapcontext(&unused, &f.context);
  }
  _longjmp(f.resume, 1);
}

// Runs the block blockIdx: each turn, one runnable thread runs until it waits or ends. Half the
// blocks pick it uniformly at random (threads advance nearly together); the others give every
// thread a random priority and always run the highest ready one (some threads run far ahead of
// others), so that both a reader that falls behind and a writer that runs ahead get caught.
inline void run_block(size_t shared_bytes) {
  Device& d = device();
  std::memset(d.dynamic_shared, 0xff, shared_bytes);  // NaN in float32, bfloat16 and float16
  ++d.blocks_started;
  d.done = d.at_block_barrier = 0;
  d.at_warp_barrier.assign((d.threads + 31) / 32, 0);
  d.ready.clear();
  for (int t = 0; t < d.threads; ++t) {
    Fiber& f = d.fibers[t];
    f.block_barriers = f.warp_barriers = 0;
    f.tid = dim3(t % blockDim.x, t / blockDim.x % blockDim.y, t / (blockDim.x * blockDim.y));
    d.ready.push_back(t);
  }
  const bool by_priority = d.random() % 2 == 0;
  if (by_priority) {
    d.priority.resize(d.threads);
    for (uint64_t& p : d.priority) p = d.random();
  }
  while (!d.ready.empty()) {
    size_t i = 0;
    if (by_priority) {
      for (size_t j = 1; j < d.ready.size(); ++j) {
        if (d.priority[d.ready[j]] > d.priority[d.ready[i]]) i = j;
      }
    } else {
      i = d.random() % d.ready.size();
    }
    const int t = d.ready[i];
    d.ready[i] = d.ready.back();
    d.ready.pop_back();
    run_thread(t);
  }
  if (d.done < d.threads) fail("deadlock: a barrier that threads wait at is never completed");
  d.current = -1;
}

template <typename... P, size_t... I>
void call_with_args(void (*kernel)(P...), void** args, std::index_sequence<I...>) {
  kernel(*static_cast<std::remove_reference_t<P>*>(args[I])...);
}

}  // namespace emu

// The runtime API subset.

template <typename... P>
cudaError_t cudaLaunchKernel(void (*kernel)(P...), dim3 grid, dim3 block, void** args,
                             size_t shared_bytes = 0, cudaStream_t = nullptr) {
  emu::Device& d = emu::device();
  const unsigned long long threads = 1ull * block.x * block.y * block.z;
  cudaError_t err = cudaSuccess;
  if (threads == 0 || threads > 1024 || block.z > 64 || grid.x == 0 || grid.y == 0 ||
      grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535) {
    err = cudaErrorInvalidConfiguration;
  }
  const auto optin = d.optin.find(reinterpret_cast<const void*>(kernel));
  const size_t limit = optin == d.optin.end() ? emu::kDefaultDynamicShared : optin->second;
  if (shared_bytes > limit) err = cudaErrorInvalidValue;
  if (err != cudaSuccess) return d.last_error = err;

  d.threads = static_cast<int>(threads);
  if (d.fibers.empty()) d.fibers.resize(1024);  // never again: fibers must not move
  d.lane_slots[0].assign(threads, 0);
  d.lane_slots[1].assign(threads, 0);
  d.kernel_name = __PRETTY_FUNCTION__;
  d.body = [&] { emu::call_with_args(kernel, args, std::index_sequence_for<P...>{}); };
  gridDim = grid;
  blockDim = block;
  d.dynamic_shared = emu::allocator().allocate(shared_bytes);
  if (d.dynamic_shared == nullptr) return d.last_error = cudaErrorMemoryAllocation;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        blockIdx = dim3(x, y, z);
        emu::run_block(shared_bytes);
      }
  emu::allocator().release(d.dynamic_shared);
  d.dynamic_shared = nullptr;
  return cudaSuccess;
}

template <typename... P>
cudaError_t cudaFuncSetAttribute(void (*kernel)(P...), cudaFuncAttribute, int value) {
  if (value < 0 || static_cast<size_t>(value) > emu::optin_limit()) return cudaErrorInvalidValue;
  emu::device().optin[reinterpret_cast<const void*>(kernel)] = static_cast<size_t>(value);
  return cudaSuccess;
}

inline cudaError_t cudaGetLastError() {
  const cudaError_t e = emu::device().last_error;
  emu::device().last_error = cudaSuccess;
  return e;
}
inline const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
  }
  return "unknown error";
}
inline cudaError_t cudaGetDeviceCount(int* n) { *n = 1; return cudaSuccess; }
inline cudaError_t cudaGetDevice(int* d) { *d = 0; return cudaSuccess; }
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) {
  std::snprintf(p->name, sizeof(p->name), "host emulator");
  p->major = 8;
  p->minor = 0;
  p->sharedMemPerBlockOptin = emu::optin_limit();
  return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr, int) {
  *value = static_cast<int>(emu::optin_limit());
  return cudaSuccess;
}
inline cudaError_t cudaMalloc(void** p, size_t bytes) {
  *p = emu::allocator().allocate(bytes);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
inline cudaError_t cudaFree(void* p) {
  return p == nullptr || emu::allocator().release(p) ? cudaSuccess : cudaErrorInvalidValue;
}
inline cudaError_t cudaMemset(void* p, int v, size_t n) { std::memset(p, v, n); return cudaSuccess; }
inline cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t = nullptr) {
  std::memset(p, v, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind) {
  std::memmove(dst, src, n);
  return cudaSuccess;
}
inline cudaError_t cudaStreamCreate(cudaStream_t* s) { *s = nullptr; return cudaSuccess; }
inline cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

// Device intrinsics.

inline void __syncthreads() { emu::sync_block(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  if (mask != 0xffffffffu) emu::fail("__syncwarp with a partial mask");
  emu::sync_warp();
}

template <typename T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask) {
  static_assert(sizeof(T) <= 8, "a shuffle moves at most 8 bytes");
  if (mask != 0xffffffffu) emu::fail("shuffle with a partial mask");
  if (lane_mask < 0 || lane_mask > 31) emu::fail("shuffle lane mask outside 0..31");
  emu::Device& d = emu::device();
  const int t = d.current, partner = (t & ~31) | ((t & 31) ^ lane_mask);
  // Consecutive shuffles use alternate slots: a lane reaching shuffle n + 2 (after the barrier
  // of n + 1) finds every lane done reading the slots of shuffle n.
  std::vector<uint64_t>& slots = d.lane_slots[d.fibers[t].warp_barriers % 2];
  std::memcpy(&slots[t], &value, sizeof(T));
  emu::sync_warp();  // every lane has published
  T result;
  std::memcpy(&result, &slots[partner], sizeof(T));
  return result;
}

inline float atomicAdd(float* p, float v) {
  const float old = *p;
  *p = old + v;
  return old;
}

// st.global.wb.v4: checks the 16-byte alignment the real instruction needs.
inline void __stwb(uint4* p, uint4 v) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) emu::fail("misaligned 16-byte store");
  *p = v;
}

// The kernels' dynamic shared memory (see csrc/cuda/kernel_utils.cuh).
template <typename T>
T* pygpt_emulated_dynamic_shared() {
  return static_cast<T*>(emu::device().dynamic_shared);
}
