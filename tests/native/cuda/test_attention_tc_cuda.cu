// Tests the tensor-core flash attention forward (csrc/cuda/attention_tc.cu) and backward
// (csrc/cuda/attention_tc_backward.cu) in bf16 and fp16 at head dims 64 and 128, on a GPU and on
// the host emulator, by FlashAttention-2's rule: against a
// float64 reference, our largest error must be at most twice that of a plain low-precision
// implementation (plus a small absolute floor, so that two exact results pass). The plain
// implementation (plain_row below) is the obvious one in the input type: S in float from
// the rounded inputs, softmax in float, P rounded to the input type, P V in float, the output
// rounded. The same rule holds lse to the plain float lse (with a floor of 1e-5: both are float
// roundings of values up to about 10, errors near 1e-6, so twice the plain error alone would
// judge rounding noise).
//
// The backward runs on the kernel forward's out and lse with a random dO (NaN at padded rows)
// and is held by the same rule for dq, dk, dv and the bias gradients d table and d slopes. The
// reference (backward_rows in float64) evaluates the backward's formulas on the inputs the
// kernel gets: q, k, v, dO and the rounded out, delta = rowsum(dO * out), P from its own exact
// softmax. Taking delta from the rounded out, as the kernel must, keeps out's rounding (the
// forward's, judged above) out of both errors: it shifts every dS of a row alike, which the bias
// gradients, sums of thousands of dS weighted by distance, would show as an error both
// implementations share. The plain implementation (backward_rows with a Half) takes the same
// out and lse as the kernel, computes S, P, dP, delta and dS in float, rounds P and dS to the
// input type before the products P^T dO, dS^T q and dS k (and before summing dS into the bias
// gradients), accumulates in float and rounds dq, dk, dv. Gradients that nothing reaches (rows that see no key, keys no
// row sees, padded positions) must be exact zeros, and every output starts NaN-filled.
//
// Cases: T in {1, 17, 1000, 1024} (B = H = 1 at 1000 and 1024, where the emulator is slow),
// causal and not, per-row lengths (padded queries must be exact zeros and lse -inf; padded q, k,
// v hold NaN, so a kernel that read them would show), ALiBi slopes, a relative-position table,
// both, Tq < Tk (decode steps) and Tq > Tk (causal rows that see no key: zeros and -inf). Every
// output starts NaN-filled, so an unwritten element fails. And the launcher refuses what it does
// not take (head dims other than 64 and 128, Dk != Dv, pointers not 16-byte aligned), forward
// and backward.
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
using pygpt::cuda::attention_backward_tc;
using pygpt::cuda::attention_backward_tc_workspace_bytes;
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

// The gradients of the backward, in float64 whatever computed them.
struct Grads {
  std::vector<double> dq, dk, dv, dtable, dslopes;
  std::vector<bool> reached_q, reached_k;  // rows and keys some visible (query, key) pair touches
};

// The backward of every row. Without `t` (nullptr): the float64 reference (F = double), its own
// exact softmax, delta from the given out. With it: the plain implementation (F = float) on the given out and lse, P and
// dS rounded to the input type before the products and the bias sums, dq, dk, dv rounded.
template <typename F>
void backward_rows(const Case& c, int64_t D, const Inputs& in, const std::vector<float>& dout,
                   const Half* t, const std::vector<float>& out, const std::vector<float>& lse,
                   const std::vector<int32_t>& lq, const std::vector<int32_t>& lk, double scale,
                   Grads& g) {
  const auto round = [t](F x) { return t != nullptr ? F(t->round(float(x))) : x; };
  const int64_t width = 2 * in.R + 1;
  std::vector<F> dq(c.B * c.H * c.Tq * D, F(0)), dk(c.B * c.H * c.Tk * D, F(0));
  std::vector<F> dv(dk.size(), F(0)), dtable(c.H * width, F(0)), dslopes(c.H, F(0));
  g.reached_q.assign(c.B * c.H * c.Tq, false);
  g.reached_k.assign(c.B * c.H * c.Tk, false);
  std::vector<F> s, pr;
  for (int64_t b = 0; b < c.B; ++b) {
    for (int64_t h = 0; h < c.H; ++h) {
      const int64_t bh = b * c.H + h;
      for (int64_t i = 0; i < c.Tq; ++i) {
        const int64_t n = visible(i, lq[b], lk[b], c.causal), row = bh * c.Tq + i;
        if (n == 0) continue;
        g.reached_q[row] = true;
        const int64_t pos = i + lk[b] - lq[b];
        const float* q = &in.q[row * D];
        const float* go = &dout[row * D];
        s.assign(n, F(0));
        for (int64_t j = 0; j < n; ++j) {
          const float* k = &in.k[(bh * c.Tk + j) * D];
          F dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += F(q[d]) * F(k[d]);
          const int64_t dist = j - pos;
          F bias = 0;
          if (c.table) bias += in.table[h * width + std::clamp(dist, -in.R, in.R) + in.R];
          if (c.alibi) bias -= F(in.slopes[h]) * F(std::llabs(dist));
          s[j] = F(scale) * dot + bias;
        }
        F row_lse = F(lse[row]);
        if (t == nullptr) {  // the exact softmax's own lse
          F m = -INFINITY, sum = 0;
          for (int64_t j = 0; j < n; ++j) m = std::max(m, s[j]);
          for (int64_t j = 0; j < n; ++j) sum += std::exp(s[j] - m);
          row_lse = m + std::log(sum);
        }
        std::vector<F> p(n), dp(n);
        for (int64_t j = 0; j < n; ++j) {
          const float* v = &in.v[(bh * c.Tk + j) * D];
          p[j] = std::exp(s[j] - row_lse);
          F dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += F(go[d]) * F(v[d]);
          dp[j] = dot;
        }
        F delta = 0;
        for (int64_t d = 0; d < D; ++d) delta += F(go[d]) * F(out[row * D + d]);
        for (int64_t j = 0; j < n; ++j) {
          const int64_t key = bh * c.Tk + j;
          g.reached_k[key] = true;
          const F pj = round(p[j]), ds = round(p[j] * (dp[j] - delta));
          const float* k = &in.k[key * D];
          for (int64_t d = 0; d < D; ++d) {
            dv[key * D + d] += pj * F(go[d]);
            dk[key * D + d] += ds * F(q[d]);
            dq[row * D + d] += ds * F(k[d]);
          }
          const int64_t dist = j - pos;
          dtable[h * width + std::clamp(dist, -in.R, in.R) + in.R] += ds;
          dslopes[h] -= F(std::llabs(dist)) * ds;
        }
      }
    }
  }
  const auto finish = [&](const std::vector<F>& x, F mul, bool rounded) {
    std::vector<double> r(x.size());
    for (size_t e = 0; e < x.size(); ++e) r[e] = double(rounded ? round(mul * x[e]) : mul * x[e]);
    return r;
  };
  g.dq = finish(dq, F(scale), true);
  g.dk = finish(dk, F(scale), true);
  g.dv = finish(dv, F(1), true);
  g.dtable = finish(dtable, F(1), false);
  g.dslopes = finish(dslopes, F(1), false);
}

// Largest |got - ref| (NaN: infinity).
double max_error(const std::vector<double>& got, const std::vector<double>& ref) {
  double e = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(got[i] - ref[i]);
    e = std::max(e, std::isnan(d) ? INFINITY : d);
  }
  return e;
}

// The backward of one case on the kernel forward's out and lse (device buffers), checked as the
// top says.
void run_backward(const Case& c, int64_t D, const Half& t, Rng& rng, const Inputs& in,
                  const AttentionShape& s, const AttentionBias<float>& bias,
                  const DeviceBuffer& q_d, const DeviceBuffer& k_d, const DeviceBuffer& v_d,
                  const DeviceBuffer& out_d, const DeviceBuffer& lse_d,
                  const std::vector<uint16_t>& out_bits, const std::vector<float>& lse,
                  const std::string& name) {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int32_t> lq = q_lengths_of(c), lk = kv_lengths_of(c);
  std::vector<float> dout(in.q.size());
  for (int64_t row = 0; row < c.B * c.H * c.Tq; ++row) {
    const bool real = row % c.Tq < lq[row / c.Tq / c.H];
    for (int64_t d = 0; d < D; ++d) dout[row * D + d] = real ? t.round(float(rng.normal())) : NAN;
  }
  std::vector<float> out(out_bits.size());
  for (size_t e = 0; e < out.size(); ++e) out[e] = t.value(out_bits[e]);

  const int64_t width = 2 * in.R + 1;
  DeviceBuffer dout_d(dout.size() * 2), dq_d(in.q.size() * 2), dk_d(in.k.size() * 2),
      dv_d(in.v.size() * 2), ws_d(attention_backward_tc_workspace_bytes(s));
  DeviceBuffer dtable_d(c.H * width * 4), dslopes_d(c.H * 4);
  upload(dout_d.get(), to_bits(dout, t).data(), dout.size() * 2);
  const std::vector<float> zeros(c.H * width, 0.f);
  upload(dtable_d.get(), zeros.data(), c.H * width * 4);
  upload(dslopes_d.get(), zeros.data(), c.H * 4);
  const cudaError_t err = attention_backward_tc(
      s, t.bf16 ? HalfType::kBFloat16 : HalfType::kFloat16, q_d.get(), k_d.get(), v_d.get(),
      out_d.get(), dout_d.get(), lse_d.get<float>(), dq_d.get(), dk_d.get(), dv_d.get(),
      ws_d.get(), nullptr, bias, dtable_d.get<float>(), dslopes_d.get<float>());
  check(err == cudaSuccess, name + ": backward launch " + cudaGetErrorString(err));
  PYGPT_CUDA_CHECK(cudaDeviceSynchronize());
  const auto fetch = [&](const DeviceBuffer& buf, size_t n) {
    std::vector<uint16_t> bits(n);
    download(bits.data(), buf.get(), n * 2);
    std::vector<double> v(n);
    for (size_t e = 0; e < n; ++e) v[e] = t.value(bits[e]);
    return v;
  };
  Grads ours;
  ours.dq = fetch(dq_d, in.q.size());
  ours.dk = fetch(dk_d, in.k.size());
  ours.dv = fetch(dv_d, in.v.size());
  std::vector<float> dtable(c.H * width), dslopes(c.H);
  download(dtable.data(), dtable_d.get(), c.H * width * 4);
  download(dslopes.data(), dslopes_d.get(), c.H * 4);
  ours.dtable.assign(dtable.begin(), dtable.end());
  ours.dslopes.assign(dslopes.begin(), dslopes.end());

  const double scale = s.scale;
  Grads ref, plain;
  backward_rows<double>(c, D, in, dout, nullptr, out, lse, lq, lk, scale, ref);
  backward_rows<float>(c, D, in, dout, &t, out, lse, lq, lk, scale, plain);

  // Exact zeros where nothing reaches.
  int64_t unreached = 0, unreached_wrong = 0;
  const auto zero_check = [&](const std::vector<double>& x, const std::vector<bool>& reached) {
    for (size_t r = 0; r < reached.size(); ++r) {
      if (reached[r]) continue;
      ++unreached;
      bool ok = true;
      for (int64_t d = 0; d < D; ++d) ok = ok && x[r * D + d] == 0.0;
      unreached_wrong += !ok;
    }
  };
  zero_check(ours.dq, ref.reached_q);
  zero_check(ours.dk, ref.reached_k);
  zero_check(ours.dv, ref.reached_k);

  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::string report;
  const auto judge = [&](const char* what, const std::vector<double>& got,
                         const std::vector<double>& r, const std::vector<double>& pl) {
    const double e = max_error(got, r), ep = max_error(pl, r);
    report += format("  %s %.3g (%.3g)", what, e, ep);
    check(e <= 2 * ep + 1e-5, format("%s: %s error %g above twice the plain %s error %g (+1e-5)",
                                     name.c_str(), what, e, t.name(), ep));
  };
  judge("dq", ours.dq, ref.dq, plain.dq);
  judge("dk", ours.dk, ref.dk, plain.dk);
  judge("dv", ours.dv, ref.dv, plain.dv);
  if (c.table) judge("dtable", ours.dtable, ref.dtable, plain.dtable);
  if (c.alibi) judge("dslopes", ours.dslopes, ref.dslopes, plain.dslopes);
  std::printf("%-28s backward%s  %.1f s\n", name.c_str(), report.c_str(), seconds);
  check(unreached_wrong == 0,
        format("%s: %lld of %lld unreached gradient rows not exact zeros", name.c_str(),
               static_cast<long long>(unreached_wrong), static_cast<long long>(unreached)));
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
  run_backward(c, D, t, rng, in, s, bias, q_d, k_d, v_d, out_d, lse_d, out_bits, lse, name);
}

// The launchers take Dk == Dv in {64, 128} and 16-byte aligned 16-bit tensors; nothing else.
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

  // The backward likewise, with its own pointers (grad_out, dq) in the alignment check.
  DeviceBuffer ws(attention_backward_tc_workspace_bytes({1, 1, 4, 4, 128, 128, false, 1.0}));
  const auto backward = [&](int64_t Dk, int64_t Dv, size_t shift) {
    const AttentionShape s{1, 1, 4, 4, Dk, Dv, false, 1.0};
    return attention_backward_tc(s, HalfType::kFloat16, p, p, p, p, buf.get(4096 + shift), lse,
                                 buf.get(8192 + shift), buf.get(12288), buf.get(16384), ws.get(),
                                 nullptr);
  };
  check(backward(32, 32, 0) == cudaErrorInvalidValue, "backward refuses head dim 32");
  check(backward(64, 128, 0) == cudaErrorInvalidValue, "backward refuses Dk != Dv");
  check(backward(64, 64, 8) == cudaErrorInvalidValue, "backward refuses grad_out, dq unaligned");
  check(backward(128, 128, 0) == cudaSuccess, "backward takes head dim 128, aligned");
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
