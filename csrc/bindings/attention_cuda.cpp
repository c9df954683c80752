// CUDA binding of pygpt.attention: the CPU binding's checks, contiguous inputs, outputs
// allocated here, kernels enqueued on the current stream. lse is float32 on CUDA.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros_like.h>
#include <torch/library.h>

#include "bindings/attention_args.h"
#include "bindings/checks.h"
#include "bindings/cuda_utils.h"
#include "cuda/attention.h"
#include "cuda/attention_tc.h"

namespace pygpt {
namespace {

// The checked arguments, the bias tensors converted to float32 (the kernels compute in float32).
AttentionArgs checked_args(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           bool causal, std::optional<double> scale,
                           const std::optional<at::Tensor>& q_lengths,
                           const std::optional<at::Tensor>& kv_lengths,
                           const std::optional<at::Tensor>& rel_bias,
                           const std::optional<at::Tensor>& alibi_slopes, const char* op) {
  check_cuda_float(q, op, "q");
  AttentionArgs args = attention_args(q, k, v, causal, scale, q_lengths, kv_lengths, rel_bias,
                                      alibi_slopes, op);
  for (at::Tensor* bias : {&args.rel_bias, &args.alibi_slopes}) {
    if (bias->defined()) *bias = bias->to(at::kFloat).contiguous();
  }
  const AttentionShape& s = args.shape;
  TORCH_CHECK(s.Dk <= cuda::kMaxHeadDim && s.Dv <= cuda::kMaxHeadDim, op,
              ": head dims up to ", cuda::kMaxHeadDim, " on CUDA, got Dk=", s.Dk, " Dv=", s.Dv);
  return args;
}

// Whether a call may run on the tensor-core kernels (cuda/attention_tc.h): bfloat16 or float16
// on sm_80 and later; the kernels then take head dims 64 and 128 (Dk == Dv) with aligned tensors,
// which their own *_supported checks say. Other calls keep the float32-math kernels, whose out,
// lse and gradients have the same contract, so either pass may run on either kernel.
bool tensor_core_device(const at::Tensor& q) {
  return (q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf) &&
         at::cuda::getDeviceProperties(q.get_device())->major >= 8;
}

cuda::HalfType half_type(const at::Tensor& q) {
  return q.scalar_type() == at::kHalf ? cuda::HalfType::kFloat16 : cuda::HalfType::kBFloat16;
}

bool uses_tensor_cores(const AttentionShape& s, const at::Tensor& q, const at::Tensor& k,
                       const at::Tensor& v, const at::Tensor& out) {
  return tensor_core_device(q) &&
         cuda::attention_forward_tc_supported(s, q.const_data_ptr(), k.const_data_ptr(),
                                              v.const_data_ptr(), out.const_data_ptr());
}

std::tuple<at::Tensor, at::Tensor> attention_cuda(const at::Tensor& q, const at::Tensor& k,
                                                  const at::Tensor& v, bool causal,
                                                  std::optional<double> scale,
                                                  const std::optional<at::Tensor>& q_lengths,
                                                  const std::optional<at::Tensor>& kv_lengths,
                                                  const std::optional<at::Tensor>& rel_bias,
                                                  const std::optional<at::Tensor>& alibi_slopes) {
  const AttentionArgs args = checked_args(q, k, v, causal, scale, q_lengths, kv_lengths, rel_bias,
                                          alibi_slopes, "pygpt.attention");
  const AttentionShape& s = args.shape;
  const c10::cuda::CUDAGuard guard(q.device());
  const at::Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
  const AttentionOutputs o = attention_outputs(s, q, at::kFloat);
  if (uses_tensor_cores(s, qc, kc, vc, o.out)) {
    C10_CUDA_CHECK(cuda::attention_forward_tc(s, half_type(q), qc.const_data_ptr(),
                                              kc.const_data_ptr(), vc.const_data_ptr(),
                                              o.out.data_ptr(), o.lse.data_ptr<float>(),
                                              current_stream(), args.bias<float>()));
  } else {
    C10_CUDA_CHECK(cuda::attention_forward(s, cuda_dtype(q), qc.const_data_ptr(),
                                           kc.const_data_ptr(), vc.const_data_ptr(),
                                           o.out.data_ptr(), o.lse.data_ptr<float>(),
                                           current_stream(), args.bias<float>()));
  }
  return {o.out, o.lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> attention_backward_cuda(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, bool causal, std::optional<double> scale,
    const std::optional<at::Tensor>& q_lengths, const std::optional<at::Tensor>& kv_lengths,
    const std::optional<at::Tensor>& rel_bias, const std::optional<at::Tensor>& alibi_slopes) {
  const char* op = "pygpt.attention_backward";
  const AttentionArgs args = checked_args(q, k, v, causal, scale, q_lengths, kv_lengths, rel_bias,
                                          alibi_slopes, op);
  const AttentionShape& s = args.shape;
  check_matches(grad_out, "grad_out", q, "q", op);
  check_matches(out, "out", q, "q", op);
  TORCH_CHECK(lse.device() == q.device() && lse.scalar_type() == at::kFloat, op,
              ": lse must be a float32 tensor on ", q.device());
  const std::vector<int64_t> out_shape{s.B, s.H, s.Tq, s.Dv};
  TORCH_CHECK(out.sizes() == out_shape && grad_out.sizes() == out_shape, op,
              ": out and grad_out must have shape ", at::IntArrayRef(out_shape));
  TORCH_CHECK(lse.sizes() == at::IntArrayRef({s.B, s.H, s.Tq}), op, ": lse must have shape (",
              s.B, ", ", s.H, ", ", s.Tq, "), got ", lse.sizes());
  const c10::cuda::CUDAGuard guard(q.device());
  const at::Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
  const at::Tensor oc = out.contiguous(), gc = grad_out.contiguous(), lc = lse.contiguous();
  const AttentionInputGrads g = attention_input_grads(s, q);
  const bool tc = tensor_core_device(q) && cuda::attention_backward_tc_supported(
      s, qc.const_data_ptr(), kc.const_data_ptr(), vc.const_data_ptr(), oc.const_data_ptr(),
      gc.const_data_ptr(), g.dq.const_data_ptr(), g.dk.const_data_ptr(), g.dv.const_data_ptr());
  at::Tensor scratch = workspace(tc ? cuda::attention_backward_tc_workspace_bytes(s)
                                    : cuda::attention_backward_workspace_bytes(s), q);
  // The bias gradients, accumulated atomically in float32: (0,) without that input.
  const auto f32 = q.options().dtype(at::kFloat);
  auto zeros_or_empty = [&](const at::Tensor& input) {
    return input.defined() ? at::zeros_like(input) : at::empty({0}, f32);
  };
  at::Tensor dtable = zeros_or_empty(args.rel_bias), dslopes = zeros_or_empty(args.alibi_slopes);
  if (tc) {
    C10_CUDA_CHECK(cuda::attention_backward_tc(
        s, half_type(q), qc.const_data_ptr(), kc.const_data_ptr(),
        vc.const_data_ptr(), oc.const_data_ptr(), gc.const_data_ptr(), lc.const_data_ptr<float>(),
        g.dq.data_ptr(), g.dk.data_ptr(), g.dv.data_ptr(), scratch.data_ptr(), current_stream(),
        args.bias<float>(), dtable.data_ptr<float>(), dslopes.data_ptr<float>()));
  } else {
    C10_CUDA_CHECK(cuda::attention_backward(
        s, cuda_dtype(q), qc.const_data_ptr(), kc.const_data_ptr(), vc.const_data_ptr(),
        oc.const_data_ptr(), gc.const_data_ptr(), lc.const_data_ptr<float>(), g.dq.data_ptr(),
        g.dk.data_ptr(), g.dv.data_ptr(), scratch.data_ptr(), current_stream(),
        args.bias<float>(), dtable.data_ptr<float>(), dslopes.data_ptr<float>()));
  }
  return {g.dq, g.dk, g.dv, dtable.to(q.scalar_type()), dslopes.to(q.scalar_type())};
}

}  // namespace

TORCH_LIBRARY_IMPL(pygpt, CUDA, m) {
  m.impl("attention", &attention_cuda);
  m.impl("attention_backward", &attention_backward_cuda);
}

}  // namespace pygpt
