// Tensor-core flash attention forward and backward on CUDA (sm_80 and later): bf16 or fp16
// inputs, float32 accumulators, head dim 64 or 128. Same contracts as attention_forward and
// attention_backward (cuda/attention.h) for the shapes they take; see attention_tc.cu and
// attention_tc_backward.cu for the algorithms.
#pragma once

#include "common/attention_shape.h"
#include "cuda/common.h"

namespace pygpt::cuda {

// The 16-bit input types of the tensor-core kernels (DType has no float16).
enum class HalfType { kBFloat16, kFloat16 };

// Whether attention_forward_tc takes this call: Dk == Dv, 64 or 128, and q, k, v, out 16-byte
// aligned (its copies move 16 bytes at a time). The device must also be sm_80 or later (mma.sync
// m16n8k16 and cp.async); that is the caller's to check, as the wrappers trap before sm_80.
bool attention_forward_tc_supported(const AttentionShape& s, const void* q, const void* k,
                                    const void* v, const void* out);

// out (B,H,Tq,D) in dtype and lse (B,H,Tq) in float32 (natural log), from q (B,H,Tq,D),
// k (B,H,Tk,D), v (B,H,Tk,D) in dtype, contiguous, device memory. As attention_forward: the
// bottom-right causal mask, per-row q_lengths / kv_lengths (device int32, already within
// [0, Tq] / [0, Tk]; padded queries get out = 0 and lse = -inf, no padded position of q, k or v
// is read), rows that see no key get out = 0 and lse = -inf, and bias (float32 device memory)
// is added to the scores. cudaErrorInvalidValue where attention_forward_tc_supported is false.
cudaError_t attention_forward_tc(const AttentionShape& s, HalfType dtype, const void* q,
                                 const void* k, const void* v, void* out, float* lse,
                                 cudaStream_t stream, const AttentionBias<float>& bias = {});

// Whether attention_backward_tc takes this call: Dk == Dv, 64 or 128, and every 16-bit tensor
// 16-byte aligned. sm_80 or later, as for the forward.
bool attention_backward_tc_supported(const AttentionShape& s, const void* q, const void* k,
                                     const void* v, const void* out, const void* grad_out,
                                     const void* dq, const void* dk, const void* dv);

// Bytes of float32 scratch attention_backward_tc needs: a dQ accumulator (B,H,Tq,D), then
// delta = rowsum(dO * O) (B,H,Tq).
size_t attention_backward_tc_workspace_bytes(const AttentionShape& s);

// dq, dk, dv (dtype, shapes of q, k, v) from grad_out and the forward's out (dtype) and lse;
// otherwise attention_backward's contract: padded queries' dq and padded keys' dk, dv are zero
// and no padded position of the inputs (lse included) is read; with the forward's bias its
// gradients are added (float32 atomics) into dtable (H, 2R + 1) where bias.table is set and
// dslopes (H,) where bias.slopes is set, both zeroed by the caller (nullptr: not wanted).
// workspace: attention_backward_tc_workspace_bytes(s) bytes of device memory, contents ignored.
// cudaErrorInvalidValue where attention_backward_tc_supported is false.
cudaError_t attention_backward_tc(const AttentionShape& s, HalfType dtype, const void* q,
                                  const void* k, const void* v, const void* out,
                                  const void* grad_out, const float* lse, void* dq, void* dk,
                                  void* dv, void* workspace, cudaStream_t stream,
                                  const AttentionBias<float>& bias = {}, float* dtable = nullptr,
                                  float* dslopes = nullptr);

}  // namespace pygpt::cuda
