// The shape of one scaled-dot-product attention call, shared by the CPU (cpu/attention.h) and
// CUDA (cuda/attention.h) kernels and their bindings: plain sizes, no framework types.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define PYGPT_HOST_DEVICE __host__ __device__
#else
#define PYGPT_HOST_DEVICE
#endif

namespace pygpt {

// q (B, H, Tq, Dk), k (B, H, Tk, Dk), v (B, H, Tk, Dv); out (B, H, Tq, Dv).
//
// Padded batches: row b holds q_lengths[b] real queries and kv_lengths[b] real keys, padding on
// the right (nullptr: all Tq, all Tk). Row b's real queries see its real keys only, and with
// `causal` query i sees keys j <= i + kv_len - q_len (bottom-right aligned per row). Padded
// queries output zeros (lse -inf); the kernels never read padded positions, and their gradients
// are zero. The pointers are host memory for the CPU kernels, device memory for the CUDA ones.
struct AttentionShape {
  int64_t B, H, Tq, Tk, Dk, Dv;
  bool causal;  // bottom-right aligned: query i sees keys j <= i + (Tk - Tq)
  double scale;  // multiplies q k^T before the softmax
  const int32_t* q_lengths = nullptr;
  const int32_t* kv_lengths = nullptr;

  PYGPT_HOST_DEVICE int64_t q_len(int64_t b) const { return q_lengths ? q_lengths[b] : Tq; }
  PYGPT_HOST_DEVICE int64_t kv_len(int64_t b) const { return kv_lengths ? kv_lengths[b] : Tk; }
};

// An additive, per-head bias of the scores that depends only on the distance d = j - pos(i)
// between key j and query i (pos(i) = i + kv_len - q_len: the queries are the last positions of
// their row, the causal mask's bottom-right alignment), so no (Tq, Tk) tensor ever exists:
//   s_ij = scale * q_i . k_j + table[h, clamp(d, -R, R) + R] - slopes[h] * |d|
// table (H, 2R + 1) is a learned relative-position bias (R = max_distance), slopes (H,) ALiBi's;
// either may be absent (nullptr). Host memory for the CPU kernels, device memory for CUDA.
template <typename T>
struct AttentionBias {
  const T* table = nullptr;
  int64_t max_distance = 0;  // R
  const T* slopes = nullptr;

  PYGPT_HOST_DEVICE bool any() const { return table != nullptr || slopes != nullptr; }
  PYGPT_HOST_DEVICE int64_t width() const { return 2 * max_distance + 1; }
  // The table column of distance d.
  PYGPT_HOST_DEVICE int64_t bucket(int64_t d) const {
    return (d < -max_distance ? -max_distance : d > max_distance ? max_distance : d) +
           max_distance;
  }
  // The bias of head h at distance d.
  PYGPT_HOST_DEVICE T at(int64_t h, int64_t d) const {
    T b = T(0);
    if (table != nullptr) b += table[h * width() + bucket(d)];
    if (slopes != nullptr) b -= slopes[h] * static_cast<T>(d < 0 ? -d : d);
    return b;
  }
};

}  // namespace pygpt
