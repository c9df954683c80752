// Support shared by the native CUDA kernel tests: the ctest skip code when there is no device,
// a checked device buffer, host-side bfloat16 and float16 rounding (round to nearest even, as
// the kernels' __float2bfloat16_rn and __float2half_rn do), host tensors in any of the kernels'
// element types (pygpt::cuda::DType), and the rounding error each type's storage adds, from
// which the tests derive their tolerances.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cuda/common.h"

namespace pygpt::test {

using pygpt::cuda::DType;

// ctest treats this exit code as "skipped" (SKIP_RETURN_CODE 77).
constexpr int kSkipExitCode = 77;

// Extra bytes allocated with every test buffer, so that a tensor can start up to kPad bytes into
// it (misaligned pointers); tests check their shift is below kPad.
constexpr size_t kPad = 64;

// True when a CUDA device can be used; prints why not otherwise.
inline bool cuda_device_available() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("no usable CUDA device (%s): skipped\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "device count is 0");
    return false;
  }
  return true;
}

// Aborts the test program on a CUDA API error (a broken device is not a test result).
#define PYGPT_CUDA_CHECK(expr)                                                                  \
  do {                                                                                          \
    const cudaError_t pygpt_err_ = (expr);                                                      \
    if (pygpt_err_ != cudaSuccess) {                                                            \
      std::printf("%s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr,                          \
                  cudaGetErrorString(pygpt_err_));                                              \
      std::exit(2);                                                                             \
    }                                                                                           \
  } while (0)

inline uint16_t float_to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);  // keep it a quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                    // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

inline float bf16_bits_to_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline float round_to_bf16(float f) { return bf16_bits_to_float(float_to_bf16_bits(f)); }

// float16 bits of f rounded to nearest even, worked out in double arithmetic (a different route
// from the emulator's integer one, so that each checks the other): the value is scaled by its
// float16 quantum, rounded with nearbyint (the default mode rounds half to even) and re-encoded.
// Overflow gives infinity; a NaN gives a NaN (its payload is not specified here).
inline uint16_t float_to_fp16_bits(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (std::isnan(f)) return 0x7e00;
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 65520.0) return sign | 0x7c00;  // past the largest finite value, 65504, by half a step
  int e;
  std::frexp(a, &e);                              // a = m * 2^e, m in [0.5, 1)
  const int quantum_exp = std::max(e - 1, -14) - 10;  // 10 fraction bits; subnormals below 2^-14
  const double r = std::nearbyint(std::ldexp(a, -quantum_exp));  // a in quanta, rounded
  const double v = std::ldexp(r, quantum_exp);
  if (v == 0.0) return sign;
  if (v < 0x1p-14) return sign | static_cast<uint16_t>(std::ldexp(v, 24));  // subnormal
  const int ve = std::ilogb(v);  // v = 1.f * 2^ve, ve in [-14, 15]
  const auto fraction = static_cast<uint16_t>(std::ldexp(v, 10 - ve) - 1024.0);
  return sign | static_cast<uint16_t>((ve + 15) << 10) | fraction;
}

inline float fp16_bits_to_float(uint16_t h) {
  const int exponent = (h >> 10) & 0x1f, fraction = h & 0x3ff;
  double v;
  if (exponent == 0x1f) {
    v = fraction ? std::nan("") : HUGE_VAL;
  } else if (exponent == 0) {
    v = std::ldexp(static_cast<double>(fraction), -24);
  } else {
    v = std::ldexp(1024.0 + fraction, exponent - 25);
  }
  return static_cast<float>((h & 0x8000) ? -v : v);
}

inline float round_to_fp16(float f) { return fp16_bits_to_float(float_to_fp16_bits(f)); }

// `bytes` of device memory, NaN-filled (0xff bytes) so that unwritten outputs show; get() takes a
// byte offset, so that tests can hand kernels pointers that are not 16-byte aligned.
class DeviceBuffer {
 public:
  DeviceBuffer(size_t bytes) : bytes_(bytes) {
    PYGPT_CUDA_CHECK(cudaMalloc(&ptr_, bytes_ > 0 ? bytes_ : 1));
    PYGPT_CUDA_CHECK(cudaMemset(ptr_, 0xff, bytes_ > 0 ? bytes_ : 1));  // NaN-filled
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  template <typename T = void>
  T* get(size_t byte_offset = 0) const {
    return reinterpret_cast<T*>(static_cast<char*>(ptr_) + byte_offset);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

inline void upload(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) PYGPT_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}

inline void download(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) PYGPT_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

// Every element type the kernels take, for the tests' loops over them.
constexpr DType kDTypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};

// The dtype as the tests name it in case names.
inline const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float";
    case DType::kBFloat16: return "bf16";
    case DType::kFloat16: return "fp16";
  }
  return "unknown";
}

// The largest relative error of storing a float32 result in dtype, for results in its normal
// range (round to nearest: half the relative spacing, 2^-p for p significant bits): 2^-8 for
// bfloat16 (8 bits), 2^-11 for float16 (11 bits, so 8x finer), and 0 for float32, whose results
// are stored as the kernels compute them. A test's tolerance for a result rounded to the storage
// type is its float32 tolerance plus a multiple of this, so that float16 is held to its own
// precision rather than to bfloat16's.
constexpr double unit_roundoff(DType dtype) {
  return dtype == DType::kBFloat16 ? 0x1p-8 : dtype == DType::kFloat16 ? 0x1p-11 : 0.0;
}

// The largest absolute error of storing a float32 result below dtype's normal range, where the
// spacing is that of the subnormals and unit_roundoff's relative bound no longer holds: half the
// smallest subnormal, 2^-25 for float16 (normals start at 2^-14 = 6.1e-5, so small gradients
// reach it), 2^-134 for bfloat16 (float32's exponent range) and 0 for float32. Storing x then
// errs by at most unit_roundoff * |x| + underflow_atol.
constexpr double underflow_atol(DType dtype) {
  return dtype == DType::kBFloat16 ? 0x1p-134 : dtype == DType::kFloat16 ? 0x1p-25 : 0.0;
}

// A tolerance for results stored in dtype, given a test's float32 one (its float32 arithmetic)
// and bfloat16 one (that plus the rounding to bfloat16, measured or bounded): the rounding part,
// bf16_tol - float32_tol, scaled by dtype's unit roundoff relative to bfloat16's. float32 gets
// float32_tol, bfloat16 bf16_tol, float16 float32_tol plus an eighth of bfloat16's rounding part.
constexpr double tolerance_for(DType dtype, double float32_tol, double bf16_tol) {
  return float32_tol +
         (bf16_tol - float32_tol) * (unit_roundoff(dtype) / unit_roundoff(DType::kBFloat16));
}

// f rounded to dtype (float32: unchanged).
inline float round_to(float f, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return f;
    case DType::kBFloat16: return round_to_bf16(f);
    case DType::kFloat16: return round_to_fp16(f);
  }
  return f;
}

// Element storage of one test dtype: float32, or the 16-bit types kept as bits.
struct HostTensor {
  DType dtype;
  std::vector<float> values;  // what the kernel sees, as floats (already rounded to dtype)

  size_t element_bytes() const { return pygpt::cuda::dtype_bytes(dtype); }
  size_t bytes() const { return values.size() * element_bytes(); }

  // The raw bytes to upload.
  std::vector<unsigned char> raw() const {
    std::vector<unsigned char> out(bytes());
    for (size_t i = 0; i < values.size(); ++i) {
      if (dtype == DType::kFloat32) {
        std::memcpy(&out[4 * i], &values[i], 4);
      } else {
        const uint16_t b = dtype == DType::kBFloat16 ? float_to_bf16_bits(values[i])
                                                     : float_to_fp16_bits(values[i]);
        std::memcpy(&out[2 * i], &b, 2);
      }
    }
    return out;
  }
};

// Rounds v to dtype in place; returns it.
inline std::vector<float> rounded(std::vector<float> v, DType dtype) {
  for (float& e : v) e = round_to(e, dtype);
  return v;
}

// Downloads n elements of dtype from device memory as floats.
inline std::vector<float> download_values(const void* src, size_t n, DType dtype) {
  std::vector<float> out(n);
  if (dtype == DType::kFloat32) {
    download(out.data(), src, n * 4);
  } else {
    std::vector<uint16_t> bits(n);
    download(bits.data(), src, n * 2);
    for (size_t i = 0; i < n; ++i) {
      out[i] = dtype == DType::kBFloat16 ? bf16_bits_to_float(bits[i])
                                         : fp16_bits_to_float(bits[i]);
    }
  }
  return out;
}

// Uploads float values (already representable in dtype) as dtype's bytes.
inline void upload_values(void* dst, const std::vector<float>& v, DType dtype) {
  const HostTensor t{dtype, v};
  const std::vector<unsigned char> raw = t.raw();
  upload(dst, raw.data(), raw.size());
}

// Bitwise equality of two downloaded results (NaN payloads included).
inline bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace pygpt::test
