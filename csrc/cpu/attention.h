// Flash-style scaled-dot-product attention on the CPU: framework-free math.
//
// Pointers, sizes and strides in; no ATen types, so this file compiles and is tested on its own
// (see tests/native). Work is split into independent "items" so the caller chooses how to run them
// in parallel: the torch binding hands ranges of items to at::parallel_for, the native tests run
// them all on one thread.
#pragma once

#include <cstdint>

#include "common/attention_shape.h"
#include "cpu/isa.h"

namespace pygpt::cpu {

// A strided view of a (B, H, T, D) tensor. Strides are in elements.
template <typename T>
struct View4 {
  const T* data;
  int64_t stride_b, stride_h, stride_t, stride_d;

  const T* at(int64_t b, int64_t h, int64_t t) const {
    return data + b * stride_b + h * stride_h + t * stride_t;
  }
};

inline namespace PYGPT_CPU_ISA {

// Number of independent forward work items: B * H * ceil(Tq / query tile), the query tile
// depending on the ISA (attention.cpp).
int64_t attention_forward_items(const AttentionShape& s);

// Computes out (B, H, Tq, Dv) and lse (B, H, Tq), both contiguous, for work items [begin, end).
// Rows that see no key at all (causal with Tq > Tk) get out = 0 and lse = -inf. bias (none by
// default) is added to the scores, computed per (query, key) pair as it is needed.
template <typename T>
void attention_forward(const AttentionShape& s, View4<T> q, View4<T> k, View4<T> v, T* out, T* lse,
                       int64_t item_begin, int64_t item_end, const AttentionBias<T>& bias = {});

// Number of independent backward work items: B * H.
int64_t attention_backward_items(const AttentionShape& s);

// Gradients dq (B,H,Tq,Dk), dk (B,H,Tk,Dk), dv (B,H,Tk,Dv), all contiguous, for work items
// [begin, end). out and grad_out are strided; lse is contiguous (B, H, Tq) as written by the
// forward. With the forward's bias: the bias's gradients per (batch, head), which the caller sums
// over the batch (so that items running in parallel never write the same element): dtable
// (B, H, 2R + 1) where bias.table is set, dslopes (B, H) where bias.slopes is set (each nullptr:
// not wanted).
template <typename T>
void attention_backward(const AttentionShape& s, View4<T> q, View4<T> k, View4<T> v, View4<T> out,
                        View4<T> grad_out, const T* lse, T* dq, T* dk, T* dv, int64_t item_begin,
                        int64_t item_end, const AttentionBias<T>& bias = {}, T* dtable = nullptr,
                        T* dslopes = nullptr);

}  // namespace PYGPT_CPU_ISA
}  // namespace pygpt::cpu
