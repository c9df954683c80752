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

}  // namespace pygpt
