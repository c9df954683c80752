// Tests the tensor-core flash attention forward (csrc/cuda/attention_tc.cu) in bf16 and fp16 at
// head dims 64 and 128, on a GPU and on the host emulator, by FlashAttention-2's rule: against a
// float64 reference, our largest error must be at most twice that of a plain low-precision
// implementation (plus a small absolute floor, so that two exact results pass). The plain
// implementation (plain_row below) is the obvious one in the input type: S in float from
// the rounded inputs, softmax in float, P rounded to the input type, P V in float, the output
// rounded. The same rule holds lse to the plain float lse (with a floor of 1e-5: both are float
// roundings of values up to about 10, errors near 1e-6, so twice the plain error alone would
// judge rounding noise).
//
// Cases: T in {1, 17, 1000, 1024} (B = H = 1 at 1000 and 1024, where the emulator is slow),
// causal and not, per-row lengths (padded queries must be exact zeros and lse -inf; padded q, k,
// v hold NaN, so a kernel that read them would show), ALiBi slopes, a relative-position table,
// both, Tq < Tk (decode steps) and Tq > Tk (causal rows that see no key: zeros and -inf). Every
// output starts NaN-filled, so an unwritten element fails. And the launcher refuses what it does
// not take (head dims other than 64 and 128, Dk != Dv, pointers not 16-byte aligned).
// Exits with 77 (ctest: skipped) without a CUDA device.
#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/attention_tc.h"
#include "cuda_test_support.h"
#include "../test_support.h"

namespace {

using namespace pygpt::test;
using pygpt::AttentionBias;
using pygpt::AttentionShape;
using pygpt::cuda::attention_forward_tc;
using pygpt::cuda::HalfType;

struct Case {
  const char* name;
  int64_t B, H, Tq, Tk;
  bool causal;
  bool lengths;  // padded rows: per-row q_lengths and kv_lengths
  bool alibi;
  bool table;    // relative-position bias table, R = 16
};

struct Half {
  bool bf16;
  const char* name() const { return bf16 ? "bf16" : "fp16"; }
  float round(float f) const { return bf16 ? round_to_bf16(f) : round_to_fp16(f); }
  uint16_t bits(float f) const { return bf16 ? float_to_bf16_bits(f) : float_to_fp16_bits(f); }
  float value(uint16_t b) const { return bf16 ? bf16_bits_to_float(b) : fp16_bits_to_float(b); }
};

// Per batch row: real queries and keys (all of them without lengths). With lengths, B = 3 rows:
// full queries and about half the keys, two thirds of the queries and all keys, a third of the
// queries and no key at all.
std::vector<int32_t> q_lengths_of(const Case& c) {
  std::vector<int32_t> v(c.B, static_cast<int32_t>(c.Tq));
  if (c.lengths) v = {int32_t(c.Tq), int32_t((2 * c.Tq + 2) / 3), int32_t(c.Tq / 3)};
  return v;
}

std::vector<int32_t> kv_lengths_of(const Case& c) {
  std::vector<int32_t> v(c.B, static_cast<int32_t>(c.Tk));
  if (c.lengths) v = {int32_t((c.Tk + 1) / 2), int32_t(c.Tk), 0};
  return v;
}

int64_t visible(int64_t i, int64_t Lq, int64_t Lk, bool causal) {
  if (i >= Lq) return 0;
  if (!causal) return Lk;
  return std::min(std::max<int64_t>(i + 1 + Lk - Lq, 0), Lk);
}

struct Inputs {
  std::vector<float> q, k, v;  // rounded to the input type; NaN at padded positions
  std::vector<float> table, slopes;
  int64_t R = 16;
};

// The float64 reference out and lse of one row (i of batch row b, head h), n visible keys.
void reference_row(const Case& c, int64_t D, const Inputs& in, int64_t b, int64_t h, int64_t i,
                   int64_t n, int64_t pos, double scale, std::vector<double>& out, double& lse) {
  const int64_t bh = b * c.H + h;
  const float* q = &in.q[(bh * c.Tq + i) * D];
  std::vector<double> s(n);
  double m = -INFINITY;
  for (int64_t j = 0; j < n; ++j) {
    const float* k = &in.k[(bh * c.Tk + j) * D];
    double dot = 0;
    for (int64_t d = 0; d < D; ++d) dot += double(q[d]) * double(k[d]);
    const int64_t dist = j - pos;
    double bias = 0;
    if (c.table) bias += in.table[h * (2 * in.R + 1) + std::clamp(dist, -in.R, in.R) + in.R];
    if (c.alibi) bias -= double(in.slopes[h]) * double(std::llabs(dist));
    s[j] = scale * dot + bias;
    m = std::max(m, s[j]);
  }
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) sum += (s[j] = std::exp(s[j] - m));
  out.assign(D, 0.0);
  for (int64_t j = 0; j < n; ++j) {
    const float* v = &in.v[(bh * c.Tk + j) * D];
    for (int64_t d = 0; d < D; ++d) out[d] += s[j] / sum * double(v[d]);
  }
  lse = m + std::log(sum);
}

// The plain low-precision implementation of the same row: float S, float softmax, P rounded
// to the input type, float P V, output rounded.
void plain_row(const Case& c, int64_t D, const Inputs& in, const Half& t, int64_t b, int64_t h,
               int64_t i, int64_t n, int64_t pos, float scale, std::vector<float>& out,
               float& lse) {
  const int64_t bh = b * c.H + h;
  const float* q = &in.q[(bh * c.Tq + i) * D];
  std::vector<float> s(n);
  float m = -INFINITY;
  for (int64_t j = 0; j < n; ++j) {
    const float* k = &in.k[(bh * c.Tk + j) * D];
    float dot = 0;
    for (int64_t d = 0; d < D; ++d) dot += q[d] * k[d];
    const int64_t dist = j - pos;
    float bias = 0;
    if (c.table) bias += in.table[h * (2 * in.R + 1) + std::clamp(dist, -in.R, in.R) + in.R];
    if (c.alibi) bias -= in.slopes[h] * float(std::llabs(dist));
    s[j] = scale * dot + bias;
    m = std::max(m, s[j]);
  }
  float sum = 0;
  for (int64_t j = 0; j < n; ++j) sum += (s[j] = std::exp(s[j] - m));
  out.assign(D, 0.f);
  for (int64_t j = 0; j < n; ++j) {
    const float p = t.round(s[j] / sum);
    const float* v = &in.v[(bh * c.Tk + j) * D];
    for (int64_t d = 0; d < D; ++d) out[d] += p * v[d];
  }
  for (float& o : out) o = t.round(o);
  lse = m + std::log(sum);
}

std::vector<uint16_t> to_bits(const std::vector<float>& v, const Half& t) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = t.bits(v[i]);
  return b;
}

void run_case(const Case& c, int64_t D, const Half& t, Rng& rng) {
  const std::string name = format("%s %s D=%lld", c.name, t.name(), static_cast<long long>(D));
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int32_t> lq = q_lengths_of(c), lk = kv_lengths_of(c);
  Inputs in;
  const auto fill = [&](std::vector<float>& x, int64_t T, const std::vector<int32_t>& len) {
    x.resize(c.B * c.H * T * D);
    for (int64_t b = 0; b < c.B; ++b) {
      for (int64_t h = 0; h < c.H; ++h) {
        for (int64_t r = 0; r < T; ++r) {
          for (int64_t d = 0; d < D; ++d) {
            const float e = r < len[b] ? t.round(float(rng.normal())) : NAN;
            x[((b * c.H + h) * T + r) * D + d] = e;
          }
        }
      }
    }
  };
  fill(in.q, c.Tq, lq);
  fill(in.k, c.Tk, lk);
  fill(in.v, c.Tk, lk);
  for (int64_t i = 0; i < c.H * (2 * in.R + 1); ++i) in.table.push_back(float(rng.normal()));
  for (int64_t h = 0; h < c.H; ++h) in.slopes.push_back(std::ldexp(1.0f, -int(h + 1)));

  const size_t out_bytes = c.B * c.H * c.Tq * D * 2, lse_bytes = c.B * c.H * c.Tq * 4;
  DeviceBuffer q_d(in.q.size() * 2), k_d(in.k.size() * 2), v_d(in.v.size() * 2);
  DeviceBuffer out_d(out_bytes), lse_d(lse_bytes);
  DeviceBuffer lq_d(c.B * 4), lk_d(c.B * 4);
  DeviceBuffer table_d(in.table.size() * 4), slopes_d(in.slopes.size() * 4);
  upload(q_d.get(), to_bits(in.q, t).data(), in.q.size() * 2);
  upload(k_d.get(), to_bits(in.k, t).data(), in.k.size() * 2);
  upload(v_d.get(), to_bits(in.v, t).data(), in.v.size() * 2);
  upload(lq_d.get(), lq.data(), c.B * 4);
  upload(lk_d.get(), lk.data(), c.B * 4);
  upload(table_d.get(), in.table.data(), in.table.size() * 4);
  upload(slopes_d.get(), in.slopes.data(), in.slopes.size() * 4);

  const double scale = 1.0 / std::sqrt(double(D));
  AttentionShape s{c.B, c.H, c.Tq, c.Tk, D, D, c.causal, scale};
  if (c.lengths) s.q_lengths = lq_d.get<int32_t>(), s.kv_lengths = lk_d.get<int32_t>();
  AttentionBias<float> bias;
  if (c.table) bias.table = table_d.get<float>(), bias.max_distance = in.R;
  if (c.alibi) bias.slopes = slopes_d.get<float>();
  const cudaError_t err =
      attention_forward_tc(s, t.bf16 ? HalfType::kBFloat16 : HalfType::kFloat16, q_d.get(),
                           k_d.get(), v_d.get(), out_d.get(), lse_d.get<float>(), nullptr, bias);
  check(err == cudaSuccess, name + ": launch " + cudaGetErrorString(err));
  PYGPT_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint16_t> out_bits(out_bytes / 2);
  std::vector<float> lse(lse_bytes / 4);
  download(out_bits.data(), out_d.get(), out_bytes);
  download(lse.data(), lse_d.get(), lse_bytes);

  double err_out = 0, err_plain = 0, err_lse = 0, err_lse_plain = 0;
  int64_t empty_rows = 0, empty_wrong = 0, real_rows = 0;
  std::vector<double> ref;
  std::vector<float> plain;
  for (int64_t b = 0; b < c.B; ++b) {
    for (int64_t h = 0; h < c.H; ++h) {
      for (int64_t i = 0; i < c.Tq; ++i) {
        const int64_t row = (b * c.H + h) * c.Tq + i;
        const int64_t n = visible(i, lq[b], lk[b], c.causal);
        const uint16_t* o = &out_bits[row * D];
        if (n == 0) {  // padded or sees no key: exact zeros (either sign) and -inf
          ++empty_rows;
          bool ok = lse[row] == -INFINITY;
          for (int64_t d = 0; d < D; ++d) ok = ok && (o[d] & 0x7fff) == 0;
          empty_wrong += !ok;
          continue;
        }
        ++real_rows;
        const int64_t pos = i + lk[b] - lq[b];
        double lse_ref;
        float lse_plain;
        reference_row(c, D, in, b, h, i, n, pos, scale, ref, lse_ref);
        plain_row(c, D, in, t, b, h, i, n, pos, float(scale), plain, lse_plain);
        for (int64_t d = 0; d < D; ++d) {
          const double got = t.value(o[d]);
          err_out = std::max(err_out, std::isnan(got) ? INFINITY : std::fabs(got - ref[d]));
          err_plain = std::max(err_plain, std::fabs(double(plain[d]) - ref[d]));
        }
        const double lse_err = std::fabs(double(lse[row]) - lse_ref);
        err_lse = std::max(err_lse, std::isnan(lse_err) ? INFINITY : lse_err);
        err_lse_plain = std::max(err_lse_plain, std::fabs(double(lse_plain) - lse_ref));
      }
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%-28s rows %5lld (+%lld empty)  out err %.3g (plain %.3g)  lse err %.3g "
              "(plain %.3g)  %.1f s\n",
              name.c_str(), static_cast<long long>(real_rows), static_cast<long long>(empty_rows),
              err_out, err_plain, err_lse, err_lse_plain, seconds);
  check(err_out <= 2 * err_plain + 1e-5,
        format("%s: out error %g above twice the plain %s error %g", name.c_str(), err_out,
               t.name(), err_plain));
  check(err_lse <= 2 * err_lse_plain + 1e-5,
        format("%s: lse error %g above twice the plain error %g (+1e-5)", name.c_str(), err_lse,
               err_lse_plain));
  check(empty_wrong == 0, format("%s: %lld of %lld empty rows not zeros and -inf", name.c_str(),
                                 static_cast<long long>(empty_wrong),
                                 static_cast<long long>(empty_rows)));
}

// The launcher takes Dk == Dv in {64, 128} and 16-byte aligned q, k, v, out; nothing else.
void test_refusals() {
  DeviceBuffer buf(64 * 1024);
  const void* p = buf.get();
  float* lse = buf.get<float>(32 * 1024);
  const auto call = [&](int64_t Dk, int64_t Dv, size_t shift) {
    const AttentionShape s{1, 1, 4, 4, Dk, Dv, false, 1.0};
    return attention_forward_tc(s, HalfType::kBFloat16, p, p, buf.get(4096 + shift),
                                buf.get(8192 + shift), lse, nullptr);
  };
  check(call(32, 32, 0) == cudaErrorInvalidValue, "refuses head dim 32");
  check(call(96, 96, 0) == cudaErrorInvalidValue, "refuses head dim 96");
  check(call(64, 128, 0) == cudaErrorInvalidValue, "refuses Dk != Dv");
  check(call(64, 64, 8) == cudaErrorInvalidValue, "refuses v, out not 16-byte aligned");
  check(call(128, 128, 0) == cudaSuccess, "takes head dim 128, aligned");
  PYGPT_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace

int main() {
  if (!cuda_device_available()) return kSkipExitCode;
  Rng rng(20261129);
  const std::vector<Case> cases = {
      // name, B, H, Tq, Tk, causal, lengths, alibi, table
      {"T=1", 2, 2, 1, 1, false, false, false, false},
      {"T=1 causal", 2, 2, 1, 1, true, false, false, false},
      {"T=17", 2, 2, 17, 17, false, false, false, false},
      {"T=17 causal", 2, 2, 17, 17, true, false, false, false},
      {"T=1000 causal", 1, 1, 1000, 1000, true, false, false, false},
      {"T=1024", 1, 1, 1024, 1024, false, false, false, false},
      {"T=100 causal lengths", 3, 2, 100, 100, true, true, false, false},
      {"T=77 lengths", 3, 1, 77, 77, false, true, false, false},
      {"T=130 causal alibi", 1, 3, 130, 130, true, false, true, false},
      {"T=77 table", 2, 2, 77, 77, false, false, false, true},
      {"T=90 causal alibi+table", 2, 2, 90, 90, true, false, true, true},
      {"decode Tq=1 Tk=300 causal", 2, 2, 1, 300, true, false, false, false},
      {"Tq=5 Tk=200 causal alibi", 2, 2, 5, 200, true, false, true, false},
      {"Tq=150 Tk=40 causal", 2, 2, 150, 40, true, false, false, false},
      {"Tq=70 Tk=33 lengths table", 3, 1, 70, 33, false, true, false, true},
  };
  for (const bool bf16 : {true, false}) {
    for (const int64_t D : {64, 128}) {
      for (const Case& c : cases) run_case(c, D, Half{bf16}, rng);
    }
  }
  test_refusals();
  return Tally::get().finish("test_attention_tc_cuda");
}
