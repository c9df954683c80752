// The argument checks and the outputs of pygpt.attention and its backward (attention.cpp),
// shared by their CPU and CUDA bindings.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "common/attention_shape.h"

namespace pygpt {

// A checked attention call: its shape, whose length pointers (if any) point into the int32
// length tensors held here (keep the whole struct alive while the kernels run).
struct AttentionArgs {
  AttentionShape shape;
  at::Tensor q_lengths, kv_lengths;  // contiguous int32 (B,), or undefined
  at::Tensor rel_bias, alibi_slopes;  // contiguous (H, 2R + 1) and (H,), or undefined

  // The score bias over rel_bias and alibi_slopes, whose dtype must be T.
  template <typename T>
  AttentionBias<T> bias() const {
    AttentionBias<T> b;
    if (rel_bias.defined()) {
      b.table = rel_bias.const_data_ptr<T>();
      b.max_distance = (rel_bias.size(1) - 1) / 2;
    }
    if (alibi_slopes.defined()) b.slopes = alibi_slopes.const_data_ptr<T>();
    return b;
  }
};

// q (B,H,Tq,Dk), k (B,H,Tk,Dk), v (B,H,Tk,Dv) agree, and the lengths, when given, are int32 or
// int64 (B,) tensors on q's device with values in [0, Tq] and [0, Tk]; rel_bias, when given, is
// (H, 2R + 1) (an odd width) and alibi_slopes (H,), both with q's dtype and device. Returns the
// shape with the default scale 1/sqrt(Dk) filled in.
AttentionArgs attention_args(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             bool causal, std::optional<double> scale,
                             const std::optional<at::Tensor>& q_lengths,
                             const std::optional<at::Tensor>& kv_lengths,
                             const std::optional<at::Tensor>& rel_bias,
                             const std::optional<at::Tensor>& alibi_slopes, const char* op);

// The forward's outputs, new: out (B, H, Tq, Dv) with q's dtype and device, and lse (B, H, Tq)
// of stats_dtype (q's on the CPU, float32 on CUDA).
struct AttentionOutputs {
  at::Tensor out, lse;
};
AttentionOutputs attention_outputs(const AttentionShape& s, const at::Tensor& q,
                                   at::ScalarType stats_dtype);

// The backward's new gradients of q, k and v, (B, H, Tq, Dk), (B, H, Tk, Dk) and (B, H, Tk, Dv),
// with q's dtype and device.
struct AttentionInputGrads {
  at::Tensor dq, dk, dv;
};
AttentionInputGrads attention_input_grads(const AttentionShape& s, const at::Tensor& q);

}  // namespace pygpt
