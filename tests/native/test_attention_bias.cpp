// Tests the CPU attention kernels' position bias (a relative-position table and ALiBi slopes,
// common/attention_shape.h's AttentionBias) in float and double against the naive double oracle
// of attention_bias_cases.h: out, lse, dq, dk, dv and the table's and slopes' gradients (the
// kernel's per-(batch, head) parts summed over the batch), over causal and full attention,
// Tq != Tk both ways, padded batches, with the work items split over two ranges; and the double
// backward's bias gradients against central differences.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "attention_bias_cases.h"
#include "cpu/attention.h"
#include "test_support.h"

namespace {

using namespace pygpt::test;
using pygpt::AttentionBias;
using pygpt::AttentionShape;
using pygpt::cpu::View4;

template <typename T>
View4<T> dense(const std::vector<T>& x, const AttentionShape& s, int64_t Tlen, int64_t D) {
  return {x.data(), s.H * Tlen * D, Tlen * D, D, 1};
}

template <typename T>
std::vector<T> rounded(const std::vector<double>& x) {
  return std::vector<T>(x.begin(), x.end());
}

// The per-(batch, head) parts (B, H, n) summed over the batch: (H, n).
std::vector<double> batch_sum(const std::vector<double>& parts, int64_t B, int64_t Hn) {
  std::vector<double> total(Hn, 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t e = 0; e < Hn; ++e) total[e] += parts[b * Hn + e];
  return total;
}

template <typename T>
void run_case(const BiasCase& c, Rng& rng) {
  AttentionShape s{c.B, c.H, c.Tq, c.Tk, c.D, c.D, c.causal, 1.0 / std::sqrt(double(c.D))};
  if (!c.q_lengths.empty()) s.q_lengths = c.q_lengths.data(), s.kv_lengths = c.kv_lengths.data();
  const int64_t BH = c.B * c.H, W = c.max_distance >= 0 ? 2 * c.max_distance + 1 : 0;
  const std::vector<T> q = rng.normal_vector<T>(BH * c.Tq * c.D);
  const std::vector<T> k = rng.normal_vector<T>(BH * c.Tk * c.D);
  const std::vector<T> v = rng.normal_vector<T>(BH * c.Tk * c.D);
  const std::vector<T> dout = rng.normal_vector<T>(BH * c.Tq * c.D);
  const std::vector<T> table = rng.normal_vector<T>(c.H * W, 0.0, 0.5);
  std::vector<T> slopes(c.alibi ? c.H : 0);
  for (T& e : slopes) e = T(0.05 + rng.uniform());
  AttentionBias<T> bias;
  if (c.max_distance >= 0) bias.table = table.data(), bias.max_distance = c.max_distance;
  if (c.alibi) bias.slopes = slopes.data();
  AttentionBias<double> bias_d = {nullptr, bias.max_distance, nullptr};
  const std::vector<double> table_d = to_double(table), slopes_d = to_double(slopes);
  if (bias.table) bias_d.table = table_d.data();
  if (bias.slopes) bias_d.slopes = slopes_d.data();
  const BiasReference ref =
      bias_oracle(s, bias_d, to_double(q), to_double(k), to_double(v), to_double(dout));

  const std::string name =
      format("attention bias<%s> B=%ld H=%ld Tq=%ld Tk=%ld %s R=%ld alibi=%d%s", type_name<T>(),
             (long)c.B, (long)c.H, (long)c.Tq, (long)c.Tk, c.causal ? "causal" : "full",
             (long)c.max_distance, c.alibi, c.q_lengths.empty() ? "" : " padded");
  std::vector<T> out(BH * c.Tq * c.D), lse(BH * c.Tq);
  const int64_t fwd_items = pygpt::cpu::attention_forward_items(s);
  const int64_t fwd_half = fwd_items / 2;
  for (const auto& [begin, end] : {std::pair{int64_t{0}, fwd_half}, {fwd_half, fwd_items}}) {
    pygpt::cpu::attention_forward(s, dense(q, s, c.Tq, c.D), dense(k, s, c.Tk, c.D),
                                  dense(v, s, c.Tk, c.D), out.data(), lse.data(), begin, end,
                                  bias);
  }
  expect_matches_oracle(name + " out", out, ref.out);
  expect_matches_oracle(name + " lse", lse, ref.lse);

  std::vector<T> dq(q.size()), dk(k.size()), dv(v.size()), dtable(BH * W), dslopes(BH);
  const int64_t bwd_items = pygpt::cpu::attention_backward_items(s);
  const int64_t bwd_half = bwd_items / 2;
  for (const auto& [begin, end] : {std::pair{int64_t{0}, bwd_half}, {bwd_half, bwd_items}}) {
    pygpt::cpu::attention_backward(s, dense(q, s, c.Tq, c.D), dense(k, s, c.Tk, c.D),
                                   dense(v, s, c.Tk, c.D), dense(out, s, c.Tq, c.D),
                                   dense(dout, s, c.Tq, c.D), lse.data(), dq.data(), dk.data(),
                                   dv.data(), begin, end, bias, dtable.data(), dslopes.data());
  }
  expect_matches_oracle(name + " dq", dq, ref.dq);
  expect_matches_oracle(name + " dk", dk, ref.dk);
  expect_matches_oracle(name + " dv", dv, ref.dv);
  // Sums over up to Tq * Tk nearly cancelling terms (times distances up to T for the slopes).
  const double tol = kTol<T> * double(std::max(c.Tq, c.Tk));
  if (bias.table) {
    const std::vector<double> got = batch_sum(to_double(dtable), c.B, c.H * W);
    expect_close(name + " dtable", got, ref.dtable, tol * scale_of(ref.dtable), kTol<T>);
  }
  if (bias.slopes) {
    const std::vector<double> got = batch_sum(to_double(dslopes), c.B, c.H);
    expect_close(name + " dslopes", got, ref.dslopes, tol * scale_of(ref.dslopes), kTol<T>);
  }
}

// The double backward's bias gradients against central differences of sum(dout * out).
void check_finite_differences(Rng& rng, bool causal) {
  const AttentionShape s{1, 2, 6, 9, 3, 3, causal, 0.7};
  std::vector<double> q = rng.normal_vector<double>(2 * 6 * 3);
  std::vector<double> k = rng.normal_vector<double>(2 * 9 * 3);
  std::vector<double> v = rng.normal_vector<double>(2 * 9 * 3);
  const std::vector<double> dout = rng.normal_vector<double>(2 * 6 * 3);
  std::vector<double> table = rng.normal_vector<double>(2 * 5), slopes = {0.3, 0.8};
  const AttentionBias<double> bias{table.data(), 2, slopes.data()};
  std::vector<double> out(2 * 6 * 3), lse(2 * 6);
  auto loss = [&] {
    pygpt::cpu::attention_forward(s, dense(q, s, 6, 3), dense(k, s, 9, 3), dense(v, s, 9, 3),
                                  out.data(), lse.data(), 0, pygpt::cpu::attention_forward_items(s),
                                  bias);
    double l = 0.0;
    for (size_t i = 0; i < out.size(); ++i) l += dout[i] * out[i];
    return l;
  };
  const std::vector<double> num_table = numerical_gradient(loss, table);
  const std::vector<double> num_slopes = numerical_gradient(loss, slopes);
  loss();
  std::vector<double> dq(q.size()), dk(k.size()), dv(v.size()), dtable(table.size()), dslopes(2);
  pygpt::cpu::attention_backward(s, dense(q, s, 6, 3), dense(k, s, 9, 3), dense(v, s, 9, 3),
                                 dense(out, s, 6, 3), dense(dout, s, 6, 3), lse.data(), dq.data(),
                                 dk.data(), dv.data(), 0, pygpt::cpu::attention_backward_items(s),
                                 bias, dtable.data(), dslopes.data());
  const std::string name = format("attention bias finite differences causal=%d", causal);
  expect_close(name + " dtable", dtable, num_table, 1e-6, 1e-6);
  expect_close(name + " dslopes", dslopes, num_slopes, 1e-6, 1e-6);
}

}  // namespace

int main() {
  Rng rng(1414);
  for (const BiasCase& c : bias_cases()) {
    run_case<float>(c, rng);
    run_case<double>(c, rng);
  }
  check_finite_differences(rng, true);
  check_finite_differences(rng, false);
  return Tally::get().finish("test_attention_bias");
}
