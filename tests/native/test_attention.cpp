// Tests the flash-attention kernels (csrc/cpu/attention.h) in float and double against a naive
// double oracle that builds the full score matrix: out, lse, dq, dk, dv for causal and full
// attention, Tq != Tk both ways, Dk != Dv, strided views, split item ranges, finite differences,
// right-padded batches (per-row lengths, padding filled with NaN), and NaN propagation
// (attention_nonfinite_cases.h) in float and double.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "attention_nonfinite_cases.h"
#include "cpu/attention.h"
#include "test_support.h"

namespace {

using namespace pygpt::test;
using pygpt::AttentionShape;
using pygpt::cpu::View4;

// How a (B, H, T, D) tensor is laid out in its buffer.
enum class Layout {
  kContiguous,  // (B, H, T, D)
  kTokenMajor,  // a (B, T, H, D + 3) buffer viewed as (B, H, T, D), as a fused QKV projection is
  kEveryOther,  // (B, H, T, 2D) with only the even last-dim entries belonging to the view
};

// A strided (B, H, T, D) tensor owning its buffer; entries outside the view hold NaN, so a kernel
// that reads outside the view poisons its results.
template <typename T>
struct Tensor4 {
  int64_t B, H, Tlen, D;
  int64_t stride_b, stride_h, stride_t, stride_d;
  std::vector<T> buffer;

  Tensor4(int64_t b, int64_t h, int64_t t, int64_t d, Layout layout) : B(b), H(h), Tlen(t), D(d) {
    if (layout == Layout::kContiguous) {
      stride_d = 1, stride_t = D, stride_h = Tlen * D, stride_b = H * Tlen * D;
    } else if (layout == Layout::kTokenMajor) {
      stride_d = 1, stride_h = D + 3, stride_t = H * (D + 3), stride_b = Tlen * H * (D + 3);
    } else {  // kEveryOther
      stride_d = 2, stride_t = 2 * D, stride_h = Tlen * 2 * D, stride_b = H * Tlen * 2 * D;
    }
    buffer.assign(B * stride_b, std::numeric_limits<T>::quiet_NaN());
  }

  T& at(int64_t b, int64_t h, int64_t t, int64_t d) {
    return buffer[b * stride_b + h * stride_h + t * stride_t + d * stride_d];
  }

  View4<T> view() const { return {buffer.data(), stride_b, stride_h, stride_t, stride_d}; }

  // Copies a dense (B, H, T, D) array into the view.
  void assign(const std::vector<T>& dense) {
    for (int64_t b = 0, n = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = 0; t < Tlen; ++t)
          for (int64_t d = 0; d < D; ++d) at(b, h, t, d) = dense[n++];
  }
};

struct Case {
  int64_t B, H, Tq, Tk, Dk, Dv;
  bool causal;
  Layout layout;  // of q, k, v, out (as fed to the backward) and grad_out
  double scale;   // 0: 1 / sqrt(Dk)
  double stddev;  // of q, k, v
};

struct Reference {
  std::vector<double> out, lse, dq, dk, dv;
};

// Dense (B, H, T, D) inputs; P is built in full per (batch, head).
Reference oracle(const AttentionShape& s, const std::vector<double>& q,
                 const std::vector<double>& k, const std::vector<double>& v,
                 const std::vector<double>& dout) {
  const int64_t BH = s.B * s.H, Tq = s.Tq, Tk = s.Tk, Dk = s.Dk, Dv = s.Dv;
  Reference ref{std::vector<double>(BH * Tq * Dv, 0.0), std::vector<double>(BH * Tq),
                std::vector<double>(BH * Tq * Dk, 0.0), std::vector<double>(BH * Tk * Dk, 0.0),
                std::vector<double>(BH * Tk * Dv, 0.0)};
  std::vector<double> P(Tq * Tk), dS(Tq * Tk);
  for (int64_t bh = 0; bh < BH; ++bh) {
    const double* Q = &q[bh * Tq * Dk];
    const double* K = &k[bh * Tk * Dk];
    const double* V = &v[bh * Tk * Dv];
    const double* dO = &dout[bh * Tq * Dv];
    double* O = &ref.out[bh * Tq * Dv];
    for (int64_t i = 0; i < Tq; ++i) {
      const int64_t last_key = s.causal ? i + (Tk - Tq) : Tk - 1;  // visible: j <= last_key
      double max = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < Tk; ++j) {
        double dot = 0.0;
        for (int64_t c = 0; c < Dk; ++c) dot += Q[i * Dk + c] * K[j * Dk + c];
        P[i * Tk + j] = s.scale * dot;
        if (j <= last_key) max = std::max(max, P[i * Tk + j]);
      }
      double sum = 0.0;
      for (int64_t j = 0; j <= last_key; ++j) sum += std::exp(P[i * Tk + j] - max);
      const double lse = last_key >= 0 ? max + std::log(sum) : max;  // -inf: no visible key
      ref.lse[bh * Tq + i] = lse;
      for (int64_t j = 0; j < Tk; ++j) {
        P[i * Tk + j] = j <= last_key ? std::exp(P[i * Tk + j] - lse) : 0.0;
        for (int64_t c = 0; c < Dv; ++c) O[i * Dv + c] += P[i * Tk + j] * V[j * Dv + c];
      }
    }
    for (int64_t i = 0; i < Tq; ++i) {
      double delta = 0.0;  // rowsum(dO * O)
      for (int64_t c = 0; c < Dv; ++c) delta += dO[i * Dv + c] * O[i * Dv + c];
      for (int64_t j = 0; j < Tk; ++j) {
        double dP = 0.0;
        for (int64_t c = 0; c < Dv; ++c) dP += dO[i * Dv + c] * V[j * Dv + c];
        dS[i * Tk + j] = P[i * Tk + j] * (dP - delta);
      }
    }
    for (int64_t i = 0; i < Tq; ++i) {
      for (int64_t j = 0; j < Tk; ++j) {
        for (int64_t c = 0; c < Dk; ++c) {
          ref.dq[(bh * Tq + i) * Dk + c] += s.scale * dS[i * Tk + j] * K[j * Dk + c];
          ref.dk[(bh * Tk + j) * Dk + c] += s.scale * dS[i * Tk + j] * Q[i * Dk + c];
        }
        for (int64_t c = 0; c < Dv; ++c) {
          ref.dv[(bh * Tk + j) * Dv + c] += P[i * Tk + j] * dO[i * Dv + c];
        }
      }
    }
  }
  return ref;
}

template <typename T>
struct Forward {
  std::vector<T> out, lse;
};

template <typename T>
struct Backward {
  std::vector<T> dq, dk, dv;
};

// item_bounds: the kernel runs over [item_bounds[r], item_bounds[r + 1]) for each r.
template <typename T>
Forward<T> run_forward(const AttentionShape& s, const Tensor4<T>& q, const Tensor4<T>& k,
                       const Tensor4<T>& v, const std::vector<int64_t>& item_bounds) {
  // Outputs start as NaN: the kernel must write every element.
  const T nan = std::numeric_limits<T>::quiet_NaN();
  Forward<T> f{std::vector<T>(s.B * s.H * s.Tq * s.Dv, nan), std::vector<T>(s.B * s.H * s.Tq, nan)};
  for (size_t r = 0; r + 1 < item_bounds.size(); ++r) {
    pygpt::cpu::attention_forward(s, q.view(), k.view(), v.view(), f.out.data(), f.lse.data(),
                                  item_bounds[r], item_bounds[r + 1]);
  }
  return f;
}

template <typename T>
Backward<T> run_backward(const AttentionShape& s, const Tensor4<T>& q, const Tensor4<T>& k,
                         const Tensor4<T>& v, const Tensor4<T>& out, const Tensor4<T>& dout,
                         const std::vector<T>& lse, const std::vector<int64_t>& item_bounds) {
  const T nan = std::numeric_limits<T>::quiet_NaN();  // the kernel must write every element
  Backward<T> g{std::vector<T>(s.B * s.H * s.Tq * s.Dk, nan),
                std::vector<T>(s.B * s.H * s.Tk * s.Dk, nan),
                std::vector<T>(s.B * s.H * s.Tk * s.Dv, nan)};
  for (size_t r = 0; r + 1 < item_bounds.size(); ++r) {
    pygpt::cpu::attention_backward(s, q.view(), k.view(), v.view(), out.view(), dout.view(),
                                   lse.data(), g.dq.data(), g.dk.data(), g.dv.data(),
                                   item_bounds[r], item_bounds[r + 1]);
  }
  return g;
}

// Queries that see no key must give exactly out = 0, lse = -inf and dq = 0.
template <typename T>
void check_keyless_rows(const std::string& name, const AttentionShape& s, const Forward<T>& f,
                        const Backward<T>& g) {
  if (!s.causal || s.Tq <= s.Tk) return;
  bool exact = true;
  for (int64_t bh = 0; bh < s.B * s.H; ++bh) {
    for (int64_t i = 0; i < s.Tq - s.Tk; ++i) {
      const int64_t row = bh * s.Tq + i;
      exact = exact && f.lse[row] == -std::numeric_limits<T>::infinity();
      for (int64_t c = 0; c < s.Dv; ++c) exact = exact && f.out[row * s.Dv + c] == T(0);
      for (int64_t c = 0; c < s.Dk; ++c) exact = exact && g.dq[row * s.Dk + c] == T(0);
    }
  }
  check(exact, name + ": rows without keys have out = 0, lse = -inf, dq = 0");
}

template <typename T>
void run_case(const Case& c, Rng& rng) {
  const AttentionShape s{c.B, c.H, c.Tq, c.Tk, c.Dk, c.Dv, c.causal,
                         c.scale != 0.0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.Dk))};
  const std::string name = format(
      "attention<%s> B=%ld H=%ld Tq=%ld Tk=%ld Dk=%ld Dv=%ld causal=%d layout=%d", type_name<T>(),
      static_cast<long>(c.B), static_cast<long>(c.H), static_cast<long>(c.Tq),
      static_cast<long>(c.Tk), static_cast<long>(c.Dk), static_cast<long>(c.Dv), c.causal,
      static_cast<int>(c.layout));
  const int64_t BH = c.B * c.H;
  const std::vector<T> q_dense = rng.normal_vector<T>(BH * c.Tq * c.Dk, 0.0, c.stddev);
  const std::vector<T> k_dense = rng.normal_vector<T>(BH * c.Tk * c.Dk, 0.0, c.stddev);
  const std::vector<T> v_dense = rng.normal_vector<T>(BH * c.Tk * c.Dv, 0.0, c.stddev);
  const std::vector<T> dout_dense = rng.normal_vector<T>(BH * c.Tq * c.Dv);
  Tensor4<T> q(c.B, c.H, c.Tq, c.Dk, c.layout), k(c.B, c.H, c.Tk, c.Dk, c.layout);
  Tensor4<T> v(c.B, c.H, c.Tk, c.Dv, c.layout), dout(c.B, c.H, c.Tq, c.Dv, c.layout);
  q.assign(q_dense);
  k.assign(k_dense);
  v.assign(v_dense);
  dout.assign(dout_dense);
  const Reference ref =
      oracle(s, to_double(q_dense), to_double(k_dense), to_double(v_dense), to_double(dout_dense));

  const int64_t fwd_items = pygpt::cpu::attention_forward_items(s);
  const Forward<T> f = run_forward(s, q, k, v, {0, fwd_items});
  expect_matches_oracle(name + " out", f.out, ref.out);
  expect_matches_oracle(name + " lse", f.lse, ref.lse);

  Tensor4<T> out(c.B, c.H, c.Tq, c.Dv, c.layout);
  out.assign(f.out);
  const int64_t bwd_items = pygpt::cpu::attention_backward_items(s);
  const Backward<T> g = run_backward(s, q, k, v, out, dout, f.lse, {0, bwd_items});
  expect_matches_oracle(name + " dq", g.dq, ref.dq);
  expect_matches_oracle(name + " dk", g.dk, ref.dk);
  expect_matches_oracle(name + " dv", g.dv, ref.dv);
  check_keyless_rows(name, s, f, g);

  const Forward<T> f_split = run_forward(s, q, k, v, {0, fwd_items / 2, fwd_items});
  expect_identical(name + " split out", f_split.out, f.out);
  expect_identical(name + " split lse", f_split.lse, f.lse);
  const Backward<T> g_split =
      run_backward(s, q, k, v, out, dout, f.lse, {0, bwd_items / 2, bwd_items});
  expect_identical(name + " split dq", g_split.dq, g.dq);
  expect_identical(name + " split dk", g_split.dk, g.dk);
  expect_identical(name + " split dv", g_split.dv, g.dv);
}

template <typename T>
void run_all(Rng& rng) {
  // Every (Tq, Tk) pair of these lengths, causal and not, with small heads; batch, heads, head
  // sizes and layouts rotate through the cases.
  const int64_t lengths[] = {1, 5, 31, 32, 33, 64, 100, 257};
  const int64_t batch_heads[][2] = {{1, 1}, {2, 1}, {1, 3}, {3, 2}, {2, 2}};
  const int64_t head_sizes[][2] = {{16, 24}, {7, 5}, {8, 8}};
  const Layout layouts[] = {Layout::kContiguous, Layout::kTokenMajor, Layout::kContiguous,
                            Layout::kEveryOther};
  int64_t n = 0;
  for (int64_t tq : lengths) {
    for (int64_t tk : lengths) {
      for (bool causal : {false, true}) {
        const auto& bh = batch_heads[n % 5];
        const auto& d = head_sizes[n % 3];
        run_case<T>({bh[0], bh[1], tq, tk, d[0], d[1], causal, layouts[n % 4], 0.0, 1.0}, rng);
        ++n;
      }
    }
  }
  // Model-sized heads, another scale, larger scores.
  const Case wide[] = {
      {1, 2, 100, 100, 64, 64, true, Layout::kTokenMajor, 0.0, 1.0},
      {1, 1, 257, 257, 128, 128, true, Layout::kContiguous, 0.0, 1.0},
      {2, 1, 33, 257, 64, 64, true, Layout::kContiguous, 0.0, 1.0},
      {1, 2, 257, 64, 128, 128, true, Layout::kTokenMajor, 0.0, 1.0},
      {1, 1, 64, 100, 128, 128, false, Layout::kEveryOther, 0.0, 1.0},
      {1, 1, 1, 257, 64, 64, true, Layout::kContiguous, 0.0, 1.0},
      {2, 3, 65, 65, 32, 48, true, Layout::kTokenMajor, 0.3, 2.0},
      {1, 1, 100, 100, 64, 64, false, Layout::kContiguous, 1.0, 1.5},
  };
  for (const Case& c : wide) run_case<T>(c, rng);
}

// Right-padded batches: each batch row b has its own real lengths (lq[b], lk[b]); the padding of
// q, k, v and grad_out holds NaN. The oracle runs every row alone on its real prefix; padded
// outputs and gradients must be exactly zero (lse -inf), and nothing may turn NaN.
template <typename T>
void run_padded_case(int64_t H, int64_t Tq, int64_t Tk, int64_t Dk, int64_t Dv, bool causal,
                     const std::vector<int32_t>& lq, const std::vector<int32_t>& lk, Layout layout,
                     Rng& rng) {
  const int64_t B = static_cast<int64_t>(lq.size());
  AttentionShape s{B, H, Tq, Tk, Dk, Dv, causal, 1.0 / std::sqrt(static_cast<double>(Dk))};
  s.q_lengths = lq.data();
  s.kv_lengths = lk.data();
  std::string lengths;
  for (int64_t b = 0; b < B; ++b) lengths += format(" %d/%d", lq[b], lk[b]);
  const std::string name = format("attention<%s> padded H=%ld Tq=%ld Tk=%ld Dk=%ld Dv=%ld "
                                  "causal=%d lengths q/kv:%s", type_name<T>(), static_cast<long>(H),
                                  static_cast<long>(Tq), static_cast<long>(Tk),
                                  static_cast<long>(Dk), static_cast<long>(Dv), causal,
                                  lengths.c_str());
  const T nan = std::numeric_limits<T>::quiet_NaN();
  // Dense inputs with NaN at every padded position.
  auto draw = [&](int64_t T_, int64_t D, const std::vector<int32_t>& len, double stddev) {
    std::vector<T> x = rng.normal_vector<T>(B * H * T_ * D, 0.0, stddev);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = len[b]; t < T_; ++t)
          std::fill_n(x.begin() + ((b * H + h) * T_ + t) * D, D, nan);
    return x;
  };
  const std::vector<T> q_dense = draw(Tq, Dk, lq, 1.0), k_dense = draw(Tk, Dk, lk, 1.0);
  const std::vector<T> v_dense = draw(Tk, Dv, lk, 1.0), dout_dense = draw(Tq, Dv, lq, 1.0);
  Tensor4<T> q(B, H, Tq, Dk, layout), k(B, H, Tk, Dk, layout), v(B, H, Tk, Dv, layout);
  Tensor4<T> dout(B, H, Tq, Dv, layout);
  q.assign(q_dense);
  k.assign(k_dense);
  v.assign(v_dense);
  dout.assign(dout_dense);

  // The oracle on each row's real prefix, scattered into full-size results.
  Reference ref{std::vector<double>(B * H * Tq * Dv, 0.0),
                std::vector<double>(B * H * Tq, -std::numeric_limits<double>::infinity()),
                std::vector<double>(B * H * Tq * Dk, 0.0), std::vector<double>(B * H * Tk * Dk, 0.0),
                std::vector<double>(B * H * Tk * Dv, 0.0)};
  for (int64_t b = 0; b < B; ++b) {
    if (lq[b] == 0 || lk[b] == 0) continue;  // no query, or no key to see: zeros and -inf
    const AttentionShape row{1, H, lq[b], lk[b], Dk, Dv, causal, s.scale};
    auto prefix = [&](const std::vector<T>& x, int64_t T_, int64_t len, int64_t D) {
      std::vector<double> out;
      for (int64_t h = 0; h < H; ++h) {
        const auto first = x.begin() + ((b * H + h) * T_) * D;
        out.insert(out.end(), first, first + len * D);
      }
      return out;
    };
    const Reference r = oracle(row, prefix(q_dense, Tq, lq[b], Dk), prefix(k_dense, Tk, lk[b], Dk),
                               prefix(v_dense, Tk, lk[b], Dv), prefix(dout_dense, Tq, lq[b], Dv));
    auto scatter = [&](const std::vector<double>& from, std::vector<double>& to, int64_t T_,
                       int64_t len, int64_t D) {
      for (int64_t h = 0; h < H; ++h)
        std::copy_n(from.begin() + h * len * D, len * D, to.begin() + ((b * H + h) * T_) * D);
    };
    scatter(r.out, ref.out, Tq, lq[b], Dv);
    scatter(r.lse, ref.lse, Tq, lq[b], 1);
    scatter(r.dq, ref.dq, Tq, lq[b], Dk);
    scatter(r.dk, ref.dk, Tk, lk[b], Dk);
    scatter(r.dv, ref.dv, Tk, lk[b], Dv);
  }

  const int64_t fwd_items = pygpt::cpu::attention_forward_items(s);
  const Forward<T> f = run_forward(s, q, k, v, {0, fwd_items / 3, fwd_items});
  expect_matches_oracle(name + " out", f.out, ref.out);
  expect_matches_oracle(name + " lse", f.lse, ref.lse);
  Tensor4<T> out(B, H, Tq, Dv, layout);
  std::vector<T> out_dense = f.out;  // padded rows of out hold NaN too, as a caller's might
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = lq[b]; t < Tq; ++t)
        std::fill_n(out_dense.begin() + ((b * H + h) * Tq + t) * Dv, Dv, nan);
  out.assign(out_dense);
  const Backward<T> g = run_backward(s, q, k, v, out, dout, f.lse, {0, B * H});
  expect_matches_oracle(name + " dq", g.dq, ref.dq);
  expect_matches_oracle(name + " dk", g.dk, ref.dk);
  expect_matches_oracle(name + " dv", g.dv, ref.dv);
}

template <typename T>
void run_padded(Rng& rng) {
  // Lengths 0, 1, full and in between, every row different; Tq == Tk (self-attention over a
  // padded batch) and Tq != Tk (cross-attention, a decode step over a cache).
  run_padded_case<T>(2, 37, 37, 16, 24, true, {37, 1, 0, 20}, {37, 1, 0, 20}, Layout::kTokenMajor,
                     rng);
  run_padded_case<T>(2, 37, 37, 16, 24, false, {37, 1, 0, 20}, {37, 1, 0, 20},
                     Layout::kContiguous, rng);
  run_padded_case<T>(1, 70, 70, 8, 8, true, {64, 33, 65, 70, 31}, {64, 33, 65, 70, 31},
                     Layout::kEveryOther, rng);
  run_padded_case<T>(3, 12, 130, 7, 5, false, {12, 3, 0, 12}, {130, 65, 9, 0}, Layout::kContiguous,
                     rng);
  run_padded_case<T>(3, 12, 130, 7, 5, true, {12, 3, 5, 12}, {130, 65, 2, 0}, Layout::kTokenMajor,
                     rng);  // rows 2 and 3: more queries than keys, some see none
  run_padded_case<T>(2, 1, 100, 32, 32, true, {1, 1, 0}, {100, 7, 50}, Layout::kContiguous, rng);
  run_padded_case<T>(1, 100, 1, 16, 16, false, {100, 50}, {1, 1}, Layout::kContiguous, rng);
}

// The double backward against central differences of sum(grad_out * out) through the forward.
void check_finite_differences(Rng& rng, int64_t Tq, int64_t Tk, bool causal) {
  const AttentionShape s{1, 2, Tq, Tk, 3, 5, causal, 0.6};
  const int64_t BH = s.B * s.H;
  std::vector<double> q = rng.normal_vector<double>(BH * Tq * s.Dk);
  std::vector<double> k = rng.normal_vector<double>(BH * Tk * s.Dk);
  std::vector<double> v = rng.normal_vector<double>(BH * Tk * s.Dv);
  const std::vector<double> dout = rng.normal_vector<double>(BH * Tq * s.Dv);
  auto dense_view = [&s](const std::vector<double>& x, int64_t T, int64_t D) {
    return View4<double>{x.data(), s.H * T * D, T * D, D, 1};
  };
  std::vector<double> out(BH * Tq * s.Dv), lse(BH * Tq);
  auto loss = [&] {
    pygpt::cpu::attention_forward(s, dense_view(q, Tq, s.Dk), dense_view(k, Tk, s.Dk),
                                  dense_view(v, Tk, s.Dv), out.data(), lse.data(), 0,
                                  pygpt::cpu::attention_forward_items(s));
    double l = 0.0;
    for (size_t i = 0; i < out.size(); ++i) l += dout[i] * out[i];
    return l;
  };
  const std::vector<double> num_dq = numerical_gradient(loss, q);
  const std::vector<double> num_dk = numerical_gradient(loss, k);
  const std::vector<double> num_dv = numerical_gradient(loss, v);
  loss();
  std::vector<double> dq(q.size()), dk(k.size()), dv(v.size());
  pygpt::cpu::attention_backward(s, dense_view(q, Tq, s.Dk), dense_view(k, Tk, s.Dk),
                                 dense_view(v, Tk, s.Dv), dense_view(out, Tq, s.Dv),
                                 dense_view(dout, Tq, s.Dv), lse.data(), dq.data(), dk.data(),
                                 dv.data(), 0, pygpt::cpu::attention_backward_items(s));
  const std::string name =
      format("attention finite differences Tq=%ld Tk=%ld causal=%d", static_cast<long>(Tq),
             static_cast<long>(Tk), causal);
  const double tol = 1e-6;
  expect_close(name + " dq", dq, num_dq, tol, tol);
  expect_close(name + " dk", dk, num_dk, tol, tol);
  expect_close(name + " dv", dv, num_dv, tol, tol);
}

// The kernels in T on dense double inputs (rounded to T), results back in double.
template <typename T>
AttentionResults run_dense(const AttentionShape& s, const std::vector<double>& q,
                           const std::vector<double>& k, const std::vector<double>& v,
                           const std::vector<double>& dout) {
  auto tensor = [&s](const std::vector<double>& x, int64_t T_, int64_t D) {
    Tensor4<T> t(s.B, s.H, T_, D, Layout::kContiguous);
    t.assign(std::vector<T>(x.begin(), x.end()));
    return t;
  };
  const Tensor4<T> qt = tensor(q, s.Tq, s.Dk), kt = tensor(k, s.Tk, s.Dk);
  const Tensor4<T> vt = tensor(v, s.Tk, s.Dv), dt = tensor(dout, s.Tq, s.Dv);
  const Forward<T> f = run_forward(s, qt, kt, vt, {0, pygpt::cpu::attention_forward_items(s)});
  const Tensor4<T> ot = tensor(to_double(f.out), s.Tq, s.Dv);
  const Backward<T> g =
      run_backward(s, qt, kt, vt, ot, dt, f.lse, {0, pygpt::cpu::attention_backward_items(s)});
  return {to_double(f.out), to_double(f.lse), to_double(g.dq), to_double(g.dk), to_double(g.dv)};
}

}  // namespace

int main() {
  Rng rng(4242);
  run_all<float>(rng);
  run_all<double>(rng);
  run_padded<float>(rng);
  run_padded<double>(rng);
  check_finite_differences(rng, 5, 7, true);
  check_finite_differences(rng, 6, 4, true);  // two queries see no key
  check_finite_differences(rng, 4, 6, false);
  check_nan_propagation("cpu<float>", run_dense<float>, rng);
  check_nan_propagation("cpu<double>", run_dense<double>, rng);
  return Tally::get().finish("test_attention");
}
