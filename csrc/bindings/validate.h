// Argument checks shared by the ops' bindings. Each failure raises a c10::Error (RuntimeError or
// ValueError in Python) whose message names the op, the argument and what was expected.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "common/attention_shape.h"

namespace pygpt {

// t is float32 or float64 (the dtypes the CPU kernels implement).
void check_cpu_float(const at::Tensor& t, const char* op, const char* name);

// t is a CUDA tensor of float32 or bfloat16 (the dtypes the CUDA kernels implement).
void check_cuda_float(const at::Tensor& t, const char* op, const char* name);

// t has the dtype and device of ref.
void check_matches(const at::Tensor& t, const char* name, const at::Tensor& ref,
                   const char* ref_name, const char* op);

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

// weight and bias, when given, are (C,) for x (..., C), with x's dtype and device.
void check_layer_norm_args(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                           const std::optional<at::Tensor>& bias, const char* op);

// logits (N, V) floating, targets (N,) int64 on the same device; label_smoothing finite in [0, 1].
void check_cross_entropy_args(const at::Tensor& logits, const at::Tensor& targets,
                              double label_smoothing, const char* op);

}  // namespace pygpt
