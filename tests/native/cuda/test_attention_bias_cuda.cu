// Tests the CUDA attention kernels' position bias (a relative-position table and ALiBi slopes,
// common/attention_shape.h's AttentionBias, float32 device memory) in float32, bfloat16 and
// float16 against the naive double oracle of ../attention_bias_cases.h on the same (rounded)
// inputs: out, lse, dq, dk, dv, and the table's and slopes' gradients the backward adds
// atomically into caller-zeroed float32 buffers. Causal and full, Tq != Tk both ways, padded
// batches (NaN in the padding), R = 0 and R past T. Exits with 77 (ctest's skip code) when there
// is no GPU.
// Tolerances (|got - ref| <= tol * max|ref| + tol * |ref|): float32 1e-4, bfloat16 2e-2 (results
// rounded to bfloat16), float16 1e-4 + (2e-2 - 1e-4) / 8 (the rounding part scaled to float16's
// 8x finer unit roundoff; cuda_test_support.h's tolerance_for), lse 1e-4; the bias gradients,
// sums over up to Tq * Tk terms, tol * T.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "../attention_bias_cases.h"
#include "../test_support.h"
#include "cuda/attention.h"
#include "cuda_test_support.h"

namespace {

using namespace pygpt::test;
using pygpt::AttentionBias;
using pygpt::AttentionShape;
using pygpt::cuda::DType;

std::vector<double> widen(const std::vector<float>& x) { return {x.begin(), x.end()}; }

// A dense tensor drawn N(0, stddev^2), rounded to the dtype, NaN in its padded rows.
std::vector<float> draw(Rng& rng, int64_t B, int64_t H, int64_t T, int64_t D,
                        const std::vector<int32_t>& lengths, DType dtype, double stddev = 1.0) {
  std::vector<float> x = rounded(rng.normal_vector<float>(B * H * T * D, 0.0, stddev), dtype);
  for (size_t b = 0; b < lengths.size(); ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = lengths[b]; t < T; ++t)
        for (int64_t c = 0; c < D; ++c) x[((b * H + h) * T + t) * D + c] = NAN;
  return x;
}

// Device memory holding v in the dtype (or float32).
struct Device {
  DeviceBuffer buffer;
  Device(const std::vector<float>& v, DType dtype)
      : buffer(v.size() * pygpt::cuda::dtype_bytes(dtype)) {
    upload_values(buffer.get(), v, dtype);
  }
};

// The oracle's padded rows are 0 (-inf for lse); the kernels' too, so they compare exactly.
void run_case(const BiasCase& c, DType dtype, Rng& rng) {
  AttentionShape s{c.B, c.H, c.Tq, c.Tk, c.D, c.D, c.causal, 1.0 / std::sqrt(double(c.D))};
  AttentionShape s_device = s;
  DeviceBuffer lengths_d(2 * c.q_lengths.size() * sizeof(int32_t));
  if (!c.q_lengths.empty()) {
    const size_t n = c.q_lengths.size() * sizeof(int32_t);
    upload(lengths_d.get(), c.q_lengths.data(), n);
    upload(lengths_d.get(n), c.kv_lengths.data(), n);
    s.q_lengths = c.q_lengths.data(), s.kv_lengths = c.kv_lengths.data();
    s_device.q_lengths = lengths_d.get<const int32_t>();
    s_device.kv_lengths = lengths_d.get<const int32_t>(n);
  }
  const int64_t W = c.max_distance >= 0 ? 2 * c.max_distance + 1 : 0;
  const std::vector<float> q = draw(rng, c.B, c.H, c.Tq, c.D, c.q_lengths, dtype);
  const std::vector<float> k = draw(rng, c.B, c.H, c.Tk, c.D, c.kv_lengths, dtype);
  const std::vector<float> v = draw(rng, c.B, c.H, c.Tk, c.D, c.kv_lengths, dtype);
  const std::vector<float> dout = draw(rng, c.B, c.H, c.Tq, c.D, c.q_lengths, dtype);
  const std::vector<float> table = rng.normal_vector<float>(c.H * W, 0.0, 0.5);
  std::vector<float> slopes(c.alibi ? c.H : 0);
  for (float& e : slopes) e = static_cast<float>(0.05 + rng.uniform());

  const std::vector<double> table_d = widen(table), slopes_d = widen(slopes);
  AttentionBias<double> bias_ref{W ? table_d.data() : nullptr, c.max_distance,
                                 c.alibi ? slopes_d.data() : nullptr};
  const BiasReference ref = bias_oracle(s, bias_ref, widen(q), widen(k), widen(v), widen(dout));

  const Device q_d(q, dtype), k_d(k, dtype), v_d(v, dtype), dout_d(dout, dtype);
  const Device table_dev(table, DType::kFloat32), slopes_dev(slopes, DType::kFloat32);
  const AttentionBias<float> bias{W ? table_dev.buffer.get<const float>() : nullptr,
                                  c.max_distance,
                                  c.alibi ? slopes_dev.buffer.get<const float>() : nullptr};
  const size_t rows = c.B * c.H * c.Tq;
  const size_t es = pygpt::cuda::dtype_bytes(dtype);
  DeviceBuffer out_d(rows * c.D * es), lse_d(rows * 4);
  DeviceBuffer dq_d(q.size() * es), dk_d(k.size() * es), dv_d(v.size() * es);
  DeviceBuffer workspace(pygpt::cuda::attention_backward_workspace_bytes(s_device));
  DeviceBuffer dtable_d(table.size() * 4), dslopes_d(slopes.size() * 4);
  PYGPT_CUDA_CHECK(cudaMemset(dtable_d.get(), 0, dtable_d.bytes()));
  PYGPT_CUDA_CHECK(cudaMemset(dslopes_d.get(), 0, dslopes_d.bytes()));

  const std::string name = format("cuda bias %s B=%ld H=%ld Tq=%ld Tk=%ld %s R=%ld alibi=%d%s",
                                  dtype_name(dtype), (long)c.B, (long)c.H, (long)c.Tq,
                                  (long)c.Tk, c.causal ? "causal" : "full", (long)c.max_distance,
                                  c.alibi, c.q_lengths.empty() ? "" : " padded");
  PYGPT_CUDA_CHECK(pygpt::cuda::attention_forward(s_device, dtype, q_d.buffer.get(),
                                                  k_d.buffer.get(), v_d.buffer.get(),
                                                  out_d.get(), lse_d.get<float>(), nullptr, bias));
  PYGPT_CUDA_CHECK(pygpt::cuda::attention_backward(
      s_device, dtype, q_d.buffer.get(), k_d.buffer.get(), v_d.buffer.get(), out_d.get(),
      dout_d.buffer.get(), lse_d.get<float>(), dq_d.get(), dk_d.get(), dv_d.get(),
      workspace.get(), nullptr, bias, dtable_d.get<float>(), dslopes_d.get<float>()));
  PYGPT_CUDA_CHECK(cudaDeviceSynchronize());

  const double tol = tolerance_for(dtype, 1e-4, 2e-2);
  auto expect = [&](const std::string& what, const std::vector<float>& got,
                    const std::vector<double>& want, double t) {
    expect_close(name + " " + what, widen(got), want, t * scale_of(want), t);
  };
  expect("out", download_values(out_d.get(), rows * c.D, dtype), ref.out, tol);
  expect("lse", download_values(lse_d.get(), rows, DType::kFloat32), ref.lse, 1e-4);
  expect("dq", download_values(dq_d.get(), q.size(), dtype), ref.dq, tol);
  expect("dk", download_values(dk_d.get(), k.size(), dtype), ref.dk, tol);
  expect("dv", download_values(dv_d.get(), v.size(), dtype), ref.dv, tol);
  const double sum_tol = tol * double(std::max(c.Tq, c.Tk));
  if (W) {
    expect("dtable", download_values(dtable_d.get(), table.size(), DType::kFloat32), ref.dtable,
           sum_tol);
  }
  if (c.alibi) {
    expect("dslopes", download_values(dslopes_d.get(), slopes.size(), DType::kFloat32),
           ref.dslopes, sum_tol);
  }
}

}  // namespace

int main() {
  if (!cuda_device_available()) return kSkipExitCode;
  Rng rng(2718);
  for (const DType dtype : kDTypes) {
    for (const BiasCase& c : bias_cases()) run_case(c, dtype, rng);
  }
  return Tally::get().finish("test_attention_bias_cuda");
}
