// Tests the CUDA flash-attention kernels (csrc/cuda/attention.h) against the CPU kernels
// (csrc/cpu/attention.h) run in double on the same inputs: out, lse, dq, dk, dv in float32,
// bfloat16 and float16 over causal and full attention, lengths 1 and odd, Tq != Tk both ways
// (rows that see no key included), Dk != Dv, head dims 1 to 128, a long case, empty sizes, more
// than 65535 blocks, pointers that are only element-aligned, right-padded batches (per-row
// lengths, NaN in every padded position of q, k, v, out, lse and grad_out; padded outputs must be
// exactly 0 and -inf), NaN propagation (../attention_nonfinite_cases.h), and the rejected head
// dim. Outputs and the workspace start NaN-filled, so anything the kernels leave unwritten (or
// read) shows.
// Exits with 77 (ctest's skip code) when there is no GPU.
//
// Inputs are rounded to the dtype on the host first, so the double reference and the kernel see
// the same values. Tolerances (|got - ref| <= tol * max|ref| + tol * |ref|):
//   float32: 1e-4 (float32 accumulation against double);
//   bfloat16: 2e-2 for out, dq, dk, dv (each result is rounded to bfloat16, a relative step of
//     2^-8, on top of float32 accumulation);
//   float16: 1e-4 + (2e-2 - 1e-4) / 8 = 2.6e-3, bfloat16's rounding part scaled to float16's 8x
//     finer unit roundoff (2^-11; cuda_test_support.h's tolerance_for);
//   lse is float32 in every dtype, so 1e-4.
// The backward is checked twice: once fed the reference out (rounded to the dtype) and lse
// (rounded to float32), exactly the values the reference backward gets, and once fed the GPU
// forward's own out and lse, as training does.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../attention_nonfinite_cases.h"
#include "../test_support.h"
#include "cpu/attention.h"
#include "cuda/attention.h"
#include "cuda_test_support.h"

namespace {

using namespace pygpt::test;
using pygpt::AttentionShape;
using pygpt::cpu::View4;
using pygpt::cuda::DType;

// Aborts on a CUDA runtime failure outside the calls under test (allocation, copies).
void cuda_check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::printf("CUDA error in %s: %s\n", what, cudaGetErrorString(err));
    std::exit(1);
  }
}

// Values as the kernel sees them: the bytes in the dtype and the same values in double.
struct Encoded {
  std::vector<unsigned char> bytes;
  std::vector<double> values;
};

Encoded encode(const std::vector<double>& x, DType dtype) {
  const HostTensor t{dtype, rounded(std::vector<float>(x.begin(), x.end()), dtype)};
  return {t.raw(), std::vector<double>(t.values.begin(), t.values.end())};
}

std::vector<double> decode(const std::vector<unsigned char>& bytes, DType dtype) {
  const size_t n = bytes.size() / pygpt::cuda::dtype_bytes(dtype);
  std::vector<double> x(n);
  for (size_t i = 0; i < n; ++i) {
    if (dtype == DType::kFloat32) {
      float f;
      std::memcpy(&f, &bytes[4 * i], 4);
      x[i] = f;
    } else {
      uint16_t b;
      std::memcpy(&b, &bytes[2 * i], 2);
      x[i] = dtype == DType::kBFloat16 ? bf16_bits_to_float(b) : fp16_bits_to_float(b);
    }
  }
  return x;
}

// `bytes` of device memory starting `shift` bytes into an allocation (so tensors need not be
// 16-byte aligned), filled with 0xff bytes: NaN in float32, bfloat16 and float16, so anything
// left unwritten shows. Never a null pointer, even when empty. (cuda_test_support.h's
// DeviceBuffer takes the shift at each get() instead.)
class ShiftedBuffer {
 public:
  explicit ShiftedBuffer(size_t bytes, size_t shift = 0) : bytes_(bytes), shift_(shift) {
    cuda_check(cudaMalloc(&base_, bytes + shift + 1), "cudaMalloc");
    cuda_check(cudaMemset(base_, 0xff, bytes + shift + 1), "cudaMemset");
  }
  ShiftedBuffer(const ShiftedBuffer&) = delete;
  ShiftedBuffer& operator=(const ShiftedBuffer&) = delete;
  ~ShiftedBuffer() { cudaFree(base_); }

  void* get() const { return static_cast<char*>(base_) + shift_; }
  float* as_float() const { return static_cast<float*>(get()); }

  void upload(const void* src) {
    if (bytes_ > 0) cuda_check(cudaMemcpy(get(), src, bytes_, cudaMemcpyHostToDevice), "upload");
  }
  std::vector<unsigned char> download() const {
    std::vector<unsigned char> out(bytes_);
    if (bytes_ > 0) {
      cuda_check(cudaMemcpy(out.data(), get(), bytes_, cudaMemcpyDeviceToHost), "download");
    }
    return out;
  }

 private:
  void* base_ = nullptr;
  size_t bytes_, shift_;
};

std::vector<double> download_floats(const ShiftedBuffer& buffer) {
  const std::vector<unsigned char> bytes = buffer.download();
  std::vector<double> x(bytes.size() / 4);
  for (size_t i = 0; i < x.size(); ++i) {
    float f;
    std::memcpy(&f, &bytes[4 * i], 4);
    x[i] = f;
  }
  return x;
}

View4<double> contiguous(const std::vector<double>& x, const AttentionShape& s, int64_t T,
                         int64_t D) {
  return {x.data(), s.H * T * D, T * D, D, 1};
}

struct Case {
  int64_t B, H, Tq, Tk, Dk, Dv;
  bool causal;
  double scale;   // 0: 1 / sqrt(Dk)
  double stddev;  // of q, k, v (and grad_out is standard normal)
};

// A right-padded batch: batch row b has q[b] real queries and kv[b] real keys. Empty: no lengths.
struct Lengths {
  std::vector<int32_t> q, kv;
};

std::string describe(const Case& c, DType dtype, bool shifted, const Lengths& lengths) {
  std::string name = format("%s B=%ld H=%ld Tq=%ld Tk=%ld Dk=%ld Dv=%ld %s%s", dtype_name(dtype),
                            (long)c.B, (long)c.H, (long)c.Tq, (long)c.Tk, (long)c.Dk, (long)c.Dv,
                            c.causal ? "causal" : "full", shifted ? " shifted" : "");
  if (!lengths.q.empty()) name += " lengths q/kv:";
  for (size_t b = 0; b < lengths.q.size(); ++b) {
    name += format(" %d/%d", lengths.q[b], lengths.kv[b]);
  }
  return name;
}

// The rows of a (B, H, T, D) tensor past each batch row's length (none without lengths).
template <typename F>
void for_each_padded_row(const AttentionShape& s, int64_t T, const std::vector<int32_t>& len,
                         F&& f) {
  for (size_t b = 0; b < len.size(); ++b) {
    for (int64_t h = 0; h < s.H; ++h) {
      for (int64_t t = len[b]; t < T; ++t) f((static_cast<int64_t>(b) * s.H + h) * T + t);
    }
  }
}

// x with `value` written into every padded row (the inputs' padding holds NaN, as a caller's may).
std::vector<double> with_padding(std::vector<double> x, const AttentionShape& s, int64_t T,
                                 int64_t D, const std::vector<int32_t>& len, double value) {
  for_each_padded_row(s, T, len, [&](int64_t row) {
    std::fill(x.begin() + row * D, x.begin() + (row + 1) * D, value);
  });
  return x;
}

// A result's padded rows hold exactly `value` (0, or -inf for lse), and nothing in it is NaN.
void expect_padding(const std::string& what, const std::vector<double>& got,
                    const AttentionShape& s, int64_t T, int64_t D,
                    const std::vector<int32_t>& len, double value) {
  size_t bad = 0, nan = 0;
  for_each_padded_row(s, T, len, [&](int64_t row) {
    for (int64_t c = 0; c < D; ++c) bad += got[row * D + c] != value;
  });
  for (const double x : got) nan += std::isnan(x);
  check(bad == 0 && nan == 0, format("%s: %zu padded elements not %g, %zu NaN", what.c_str(), bad,
                                     value, nan));
}

void expect_near(const std::string& what, const std::vector<double>& got,
                 const std::vector<double>& ref, double tol) {
  expect_close(what, got, ref, tol * scale_of(ref), tol);
}

// The enqueued call's return code and the stream's completion, both cudaSuccess.
bool expect_launch(const std::string& what, cudaError_t launched, cudaStream_t stream) {
  const cudaError_t done = cudaStreamSynchronize(stream);
  const bool ok = launched == cudaSuccess && done == cudaSuccess;
  check(ok, format("%s: launch %s, sync %s", what.c_str(), cudaGetErrorString(launched),
                   cudaGetErrorString(done)));
  if (done != cudaSuccess) {  // a kernel fault leaves the context unusable
    std::printf("aborting after a device error\n");
    std::exit(1);
  }
  return ok;
}

// shifted: every tensor starts one element past a 16-byte boundary (lse and workspace 4 bytes).
// lengths (one entry per batch row, or none): the CPU reference gets them as host pointers, the
// kernels as device pointers; every padded position of the inputs holds NaN.
void run_case(const Case& c, DType dtype, uint64_t seed, cudaStream_t stream,
              bool shifted = false, const Lengths& lengths = {}) {
  const std::string name = describe(c, dtype, shifted, lengths);
  const size_t esize = pygpt::cuda::dtype_bytes(dtype);
  const size_t shift = shifted ? esize : 0, float_shift = shifted ? 4 : 0;
  AttentionShape s{c.B, c.H, c.Tq, c.Tk, c.Dk, c.Dv, c.causal,
                   c.scale != 0.0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.Dk))};
  AttentionShape s_device = s;
  ShiftedBuffer q_lengths_d(lengths.q.size() * sizeof(int32_t));
  ShiftedBuffer kv_lengths_d(lengths.kv.size() * sizeof(int32_t));
  if (!lengths.q.empty()) {
    q_lengths_d.upload(lengths.q.data());
    kv_lengths_d.upload(lengths.kv.data());
    s.q_lengths = lengths.q.data();
    s.kv_lengths = lengths.kv.data();
    s_device.q_lengths = static_cast<const int32_t*>(q_lengths_d.get());
    s_device.kv_lengths = static_cast<const int32_t*>(kv_lengths_d.get());
  }
  const int64_t BH = s.B * s.H;
  const double tol = tolerance_for(dtype, 1e-4, 2e-2);
  const double lse_tol = 1e-4;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();

  Rng rng(seed);
  auto draw = [&](int64_t T, int64_t D, const std::vector<int32_t>& len, double stddev) {
    return encode(with_padding(rng.normal_vector<double>(BH * T * D, 0.0, stddev), s, T, D, len,
                               nan),
                  dtype);
  };
  const Encoded q = draw(s.Tq, s.Dk, lengths.q, c.stddev);
  const Encoded k = draw(s.Tk, s.Dk, lengths.kv, c.stddev);
  const Encoded v = draw(s.Tk, s.Dv, lengths.kv, c.stddev);
  const Encoded dout = draw(s.Tq, s.Dv, lengths.q, 1.0);

  // Reference forward in double.
  std::vector<double> out_ref(BH * s.Tq * s.Dv), lse_ref(BH * s.Tq);
  pygpt::cpu::attention_forward<double>(
      s, contiguous(q.values, s, s.Tq, s.Dk), contiguous(k.values, s, s.Tk, s.Dk),
      contiguous(v.values, s, s.Tk, s.Dv), out_ref.data(), lse_ref.data(), 0,
      pygpt::cpu::attention_forward_items(s));

  // The backward's out and lse inputs, as the kernel gets them: out in dtype, lse in float32;
  // their padded rows hold NaN (the kernels must not read them).
  const Encoded out_in = encode(with_padding(out_ref, s, s.Tq, s.Dv, lengths.q, nan), dtype);
  const std::vector<double> lse_padded = with_padding(lse_ref, s, s.Tq, 1, lengths.q, nan);
  std::vector<float> lse_in(lse_ref.size());
  std::vector<double> lse_in_values(lse_ref.size());
  for (size_t i = 0; i < lse_ref.size(); ++i) {
    lse_in[i] = static_cast<float>(lse_padded[i]);  // -inf stays -inf
    lse_in_values[i] = lse_in[i];
  }
  std::vector<double> dq_ref(BH * s.Tq * s.Dk), dk_ref(BH * s.Tk * s.Dk), dv_ref(BH * s.Tk * s.Dv);
  pygpt::cpu::attention_backward<double>(
      s, contiguous(q.values, s, s.Tq, s.Dk), contiguous(k.values, s, s.Tk, s.Dk),
      contiguous(v.values, s, s.Tk, s.Dv), contiguous(out_in.values, s, s.Tq, s.Dv),
      contiguous(dout.values, s, s.Tq, s.Dv), lse_in_values.data(), dq_ref.data(), dk_ref.data(),
      dv_ref.data(), 0, pygpt::cpu::attention_backward_items(s));

  // With lengths, the inputs' device copies end at the last real row of the last batch row: its
  // padding lies past the allocation, so that reading it faults on the emulator (whose buffers end
  // at a guard page) even where the NaN there would not reach an output.
  auto input_bytes = [&](int64_t T, int64_t D, const std::vector<int32_t>& len, size_t element) {
    const int64_t rows = len.empty() || BH == 0 ? BH * T : (BH - 1) * T + len.back();
    return static_cast<size_t>(rows * D) * element;
  };
  ShiftedBuffer q_d(input_bytes(s.Tq, s.Dk, lengths.q, esize), shift);
  ShiftedBuffer k_d(input_bytes(s.Tk, s.Dk, lengths.kv, esize), shift);
  ShiftedBuffer v_d(input_bytes(s.Tk, s.Dv, lengths.kv, esize), shift);
  ShiftedBuffer dout_d(input_bytes(s.Tq, s.Dv, lengths.q, esize), shift);
  ShiftedBuffer out_in_d(input_bytes(s.Tq, s.Dv, lengths.q, esize), shift);
  ShiftedBuffer lse_in_d(input_bytes(s.Tq, 1, lengths.q, sizeof(float)), float_shift);
  q_d.upload(q.bytes.data());
  k_d.upload(k.bytes.data());
  v_d.upload(v.bytes.data());
  dout_d.upload(dout.bytes.data());
  out_in_d.upload(out_in.bytes.data());
  lse_in_d.upload(lse_in.data());

  // Forward.
  ShiftedBuffer out_d(out_in.bytes.size(), shift);
  ShiftedBuffer lse_d(lse_in.size() * sizeof(float), float_shift);
  if (!expect_launch(name + " forward",
                     pygpt::cuda::attention_forward(s_device, dtype, q_d.get(), k_d.get(),
                                                    v_d.get(), out_d.get(), lse_d.as_float(),
                                                    stream),
                     stream)) {
    return;
  }
  const std::vector<double> out = decode(out_d.download(), dtype), lse = download_floats(lse_d);
  expect_near(name + " out", out, out_ref, tol);
  expect_near(name + " lse", lse, lse_ref, lse_tol);
  expect_padding(name + " out", out, s, s.Tq, s.Dv, lengths.q, 0.0);
  expect_padding(name + " lse", lse, s, s.Tq, 1, lengths.q, -inf);

  // Backward, twice: from the reference's out and lse, and from the GPU forward's.
  const size_t ws_bytes = pygpt::cuda::attention_backward_workspace_bytes(s_device);
  check(ws_bytes >= static_cast<size_t>(BH * s.Tq * (s.Dk + 1)) * sizeof(float),
        name + ": workspace too small for dQ and delta");
  for (int pass = 0; pass < 2; ++pass) {
    const bool from_reference = pass == 0;
    const std::string what = name + (from_reference ? " backward" : " backward(gpu out)");
    ShiftedBuffer dq_d(BH * s.Tq * s.Dk * esize, shift);
    ShiftedBuffer dk_d(BH * s.Tk * s.Dk * esize, shift);
    ShiftedBuffer dv_d(BH * s.Tk * s.Dv * esize, shift);
    ShiftedBuffer workspace(ws_bytes, float_shift);  // NaN-filled: its contents must not matter
    const cudaError_t err = pygpt::cuda::attention_backward(
        s_device, dtype, q_d.get(), k_d.get(), v_d.get(),
        from_reference ? out_in_d.get() : out_d.get(), dout_d.get(),
        from_reference ? lse_in_d.as_float() : lse_d.as_float(), dq_d.get(), dk_d.get(),
        dv_d.get(), workspace.get(), stream);
    if (!expect_launch(what, err, stream)) continue;
    const std::vector<double> dq = decode(dq_d.download(), dtype);
    const std::vector<double> dk = decode(dk_d.download(), dtype);
    const std::vector<double> dv = decode(dv_d.download(), dtype);
    expect_near(what + " dq", dq, dq_ref, tol);
    expect_near(what + " dk", dk, dk_ref, tol);
    expect_near(what + " dv", dv, dv_ref, tol);
    expect_padding(what + " dq", dq, s, s.Tq, s.Dk, lengths.q, 0.0);
    expect_padding(what + " dk", dk, s, s.Tk, s.Dk, lengths.kv, 0.0);
    expect_padding(what + " dv", dv, s, s.Tk, s.Dv, lengths.kv, 0.0);
  }
}

// The CUDA kernels in float32 on dense inputs, results in double (for the NaN cases).
AttentionResults run_dense(const AttentionShape& s, const std::vector<double>& q,
                           const std::vector<double>& k, const std::vector<double>& v,
                           const std::vector<double>& dout) {
  const DType dtype = DType::kFloat32;
  cudaStream_t stream = nullptr;
  auto device = [&](const std::vector<double>& x) {
    auto buffer = std::make_unique<ShiftedBuffer>(x.size() * 4);
    buffer->upload(encode(x, dtype).bytes.data());
    return buffer;
  };
  const auto q_d = device(q), k_d = device(k), v_d = device(v), dout_d = device(dout);
  ShiftedBuffer out_d(s.B * s.H * s.Tq * s.Dv * 4), lse_d(s.B * s.H * s.Tq * 4);
  ShiftedBuffer dq_d(q.size() * 4), dk_d(k.size() * 4), dv_d(v.size() * 4);
  ShiftedBuffer workspace(pygpt::cuda::attention_backward_workspace_bytes(s));
  expect_launch("nan forward", pygpt::cuda::attention_forward(s, dtype, q_d->get(), k_d->get(),
                                                              v_d->get(), out_d.get(),
                                                              lse_d.as_float(), stream),
                stream);
  expect_launch("nan backward",
                pygpt::cuda::attention_backward(s, dtype, q_d->get(), k_d->get(), v_d->get(),
                                                out_d.get(), dout_d->get(), lse_d.as_float(),
                                                dq_d.get(), dk_d.get(), dv_d.get(),
                                                workspace.get(), stream),
                stream);
  return {decode(out_d.download(), dtype), download_floats(lse_d), decode(dq_d.download(), dtype),
          decode(dk_d.download(), dtype), decode(dv_d.download(), dtype)};
}

// Head dims the kernels reject come back as cudaErrorInvalidValue without a launch.
void check_rejects_large_head_dim(cudaStream_t stream) {
  for (const auto& [Dk, Dv] : {std::pair<int64_t, int64_t>{129, 64}, {64, 129}}) {
    const AttentionShape s{1, 1, 4, 4, Dk, Dv, false, 1.0};
    ShiftedBuffer dummy(4096);
    const cudaError_t fwd = pygpt::cuda::attention_forward(
        s, DType::kFloat32, dummy.get(), dummy.get(), dummy.get(), dummy.get(), dummy.as_float(),
        stream);
    const cudaError_t bwd = pygpt::cuda::attention_backward(
        s, DType::kFloat32, dummy.get(), dummy.get(), dummy.get(), dummy.get(), dummy.get(),
        dummy.as_float(), dummy.get(), dummy.get(), dummy.get(), dummy.get(), stream);
    check(fwd == cudaErrorInvalidValue && bwd == cudaErrorInvalidValue,
          format("Dk=%ld Dv=%ld rejected (forward %s, backward %s)", (long)Dk, (long)Dv,
                 cudaGetErrorString(fwd), cudaGetErrorString(bwd)));
    check(cudaGetLastError() == cudaSuccess, "a rejected call leaves no pending error");
  }
}

}  // namespace

int main() {
  int devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess || devices == 0) {
    std::printf("test_attention_cuda: no CUDA device (%s); skipped\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    return 77;
  }
  cudaDeviceProp prop;
  cuda_check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("device: %s (sm_%d%d, %zu KB of shared memory per block)\n", prop.name, prop.major,
              prop.minor, prop.sharedMemPerBlockOptin / 1024);

  cudaStream_t stream;
  cuda_check(cudaStreamCreate(&stream), "cudaStreamCreate");

  // B, H, Tq, Tk, Dk, Dv, causal, scale (0: 1/sqrt(Dk)), stddev.
  std::vector<Case> cases;
  for (const bool causal : {false, true}) {
    const std::vector<Case> shapes = {
        {1, 1, 1, 1, 1, 1, causal, 0, 1},         // smallest
        {2, 3, 17, 17, 17, 17, causal, 0, 1},     // odd sizes
        {1, 2, 5, 70, 32, 32, causal, 0, 1},      // Tq < Tk, two key tiles
        {1, 2, 70, 5, 32, 32, causal, 0, 1},      // Tq > Tk: causal rows that see no key
        {1, 1, 1, 200, 64, 64, causal, 0, 1},     // one query (decode step)
        {2, 2, 64, 64, 64, 64, causal, 0, 1},     // exactly one tile
        {1, 3, 65, 129, 64, 40, causal, 0, 1},    // Dk != Dv, tile edges + 1
        {1, 1, 33, 31, 128, 128, causal, 0, 1},   // largest head dim
        {1, 2, 100, 100, 128, 17, causal, 0, 1},  // Dk > Dv
        {1, 2, 130, 97, 16, 128, causal, 0, 1},   // Dk < Dv (bucket from Dv)
        {1, 1, 7, 200, 1, 1, causal, 0, 1},       // head dim 1
        {1, 2, 100, 133, 32, 32, causal, 0, 1},   // first row seeing key 64 ends a query tile
        {1, 1, 200, 150, 64, 64, causal, 0, 1},   // whole warps see none of a key tile
        {1, 1, 96, 96, 48, 48, causal, 0, 1},     // head dim between buckets
        {3, 1, 40, 41, 100, 90, causal, 0, 1},    // odd head dims in the 128 bucket
        {1, 2, 50, 80, 32, 32, causal, 0, 3},     // peaked softmax: running max rescaling
        {1, 1, 45, 45, 24, 24, causal, 2.5, 1},   // explicit scale
        {1, 2, 0, 9, 8, 8, causal, 0, 1},         // Tq = 0: dk = dv = 0
        {1, 2, 9, 0, 8, 8, causal, 0, 1},         // Tk = 0: out = 0, lse = -inf, dq = 0
        {0, 2, 9, 9, 8, 8, causal, 0, 1},         // B = 0
    };
    cases.insert(cases.end(), shapes.begin(), shapes.end());
  }
  cases.push_back({1, 2, 1024, 1024, 64, 64, true, 0, 1});     // long, causal
  cases.push_back({1, 1, 1030, 1100, 128, 128, false, 0, 1});  // long, full
  cases.push_back({1, 1, 1100, 1030, 80, 80, true, 0, 1});     // long, causal, Tq > Tk

  uint64_t seed = 1;
  for (const DType dtype : kDTypes) {
    for (const Case& c : cases) run_case(c, dtype, seed++, stream);
    // Pointers only element-aligned (torch views with a storage offset): odd head dims.
    run_case({2, 2, 37, 45, 17, 33, true, 0, 1}, dtype, seed++, stream, /*shifted=*/true);
    run_case({1, 2, 70, 70, 64, 64, false, 0, 1}, dtype, seed++, stream, /*shifted=*/true);
  }
  // Right-padded batches: lengths 0, 1, full and in between, every batch row different; Tq == Tk
  // and Tq != Tk both ways, Dk != Dv, all three head-dim buckets; query tiles and key tiles that
  // lie wholly past a row's length, and ones its length cuts.
  const std::vector<std::pair<Case, Lengths>> padded = {
      {{4, 2, 70, 70, 32, 24, true, 0, 1}, {{70, 1, 0, 37}, {70, 1, 0, 37}}},
      {{4, 2, 70, 70, 32, 24, false, 0, 1}, {{70, 1, 0, 33}, {1, 70, 65, 0}}},
      {{5, 2, 12, 130, 16, 40, true, 0, 1}, {{12, 3, 5, 0, 1}, {130, 65, 2, 7, 0}}},
      {{4, 1, 100, 33, 48, 64, false, 0, 1}, {{100, 1, 50, 0}, {33, 1, 0, 20}}},
      {{4, 1, 100, 33, 48, 64, true, 0, 1}, {{100, 1, 50, 7}, {33, 20, 2, 0}}},
      {{3, 1, 40, 40, 128, 100, true, 0, 1}, {{40, 17, 0}, {40, 17, 33}}},
      {{3, 2, 1, 200, 64, 64, true, 0, 1}, {{1, 0, 1}, {200, 7, 0}}},  // decode over a cache
      {{3, 1, 200, 200, 64, 64, true, 0, 1}, {{200, 130, 65}, {200, 129, 66}}},  // many tiles
      {{2, 1, 150, 300, 80, 72, false, 0, 1}, {{150, 97}, {300, 129}}},
  };
  for (const DType dtype : kDTypes) {
    for (const auto& [c, lengths] : padded) run_case(c, dtype, seed++, stream, false, lengths);
  }
  // 70000 blocks, more than gridDim.y allows: once, as the host emulator runs blocks one by one.
  run_case({700, 100, 1, 3, 2, 2, true, 0, 1}, DType::kFloat32, seed++, stream);
  check_rejects_large_head_dim(stream);
  Rng rng(99);
  check_nan_propagation("cuda<float32>", run_dense, rng);

  cuda_check(cudaStreamDestroy(stream), "cudaStreamDestroy");
  return Tally::get().finish("test_attention_cuda");
}
