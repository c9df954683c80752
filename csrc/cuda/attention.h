// Flash attention on CUDA: the mirror of cpu/attention.h for contiguous (B, H, T, D) tensors.
#pragma once

#include "common/attention_shape.h"
#include "cuda/common.h"

namespace pygpt::cuda {

// Largest head dimension (Dk and Dv) the kernels support.
constexpr int64_t kMaxHeadDim = 128;

// out (B,H,Tq,Dv) in dtype and lse (B,H,Tq) in float32, from q (B,H,Tq,Dk), k (B,H,Tk,Dk),
// v (B,H,Tk,Dv) in dtype. Rows that see no key get out = 0 and lse = -inf. Padded batches:
// s.q_lengths / s.kv_lengths, where set, point to B int32 lengths in device memory, already
// within [0, Tq] / [0, Tk]; padded queries get out = 0 and lse = -inf, and no padded position of
// q, k or v is read.
// bias (none by default; float32 device memory) is added to the scores as on the CPU.
cudaError_t attention_forward(const AttentionShape& s, DType dtype, const void* q,
                              const void* k, const void* v, void* out, float* lse,
                              cudaStream_t stream, const AttentionBias<float>& bias = {});

// Bytes of float32 scratch attention_backward needs (dQ accumulator and the rowsum(dO * O)).
size_t attention_backward_workspace_bytes(const AttentionShape& s);

// dq, dk, dv (dtype, shapes of q, k, v) from grad_out and the forward's out and lse; with
// lengths, padded queries' dq and padded keys' dk, dv are zero, and no padded position of the
// inputs (lse included) is read.
// workspace: attention_backward_workspace_bytes(s) bytes of device memory, contents ignored.
// With the forward's bias: its gradients are added (atomically, float32) into dtable (H, 2R + 1)
// where bias.table is set and dslopes (H,) where bias.slopes is set; the caller zeroes them
// (nullptr: not wanted).
cudaError_t attention_backward(const AttentionShape& s, DType dtype, const void* q,
                               const void* k, const void* v, const void* out,
                               const void* grad_out, const float* lse, void* dq, void* dk,
                               void* dv, void* workspace, cudaStream_t stream,
                               const AttentionBias<float>& bias = {}, float* dtable = nullptr,
                               float* dslopes = nullptr);

}  // namespace pygpt::cuda
