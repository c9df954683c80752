// CPU binding of pygpt.attention: checks arguments, allocates outputs, and runs the kernel's
// independent work items on ATen's thread pool.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "bindings/attention_args.h"
#include "bindings/checks.h"
#include "dispatch/cpu_dispatch.h"

namespace pygpt {
namespace {

template <typename T>
cpu::View4<T> view4(const at::Tensor& t) {
  return {t.const_data_ptr<T>(), t.stride(0), t.stride(1), t.stride(2), t.stride(3)};
}

// A bias input's gradient from its per-(batch, head) parts: summed over the batch; (0,) without
// that input.
at::Tensor bias_grad(const at::Tensor& per_batch, const at::Tensor& input) {
  if (!input.defined()) return at::empty({0}, per_batch.options());
  return per_batch.sum(0);
}

std::tuple<at::Tensor, at::Tensor> attention_cpu(const at::Tensor& q, const at::Tensor& k,
                                                 const at::Tensor& v, bool causal,
                                                 std::optional<double> scale,
                                                 const std::optional<at::Tensor>& q_lengths,
                                                 const std::optional<at::Tensor>& kv_lengths,
                                                 const std::optional<at::Tensor>& rel_bias,
                                                 const std::optional<at::Tensor>& alibi_slopes) {
  const char* op = "pygpt.attention";
  check_cpu_float(q, op, "q");
  const AttentionArgs args = attention_args(q, k, v, causal, scale, q_lengths, kv_lengths,
                                            rel_bias, alibi_slopes, op);
  const AttentionShape& s = args.shape;
  const AttentionOutputs o = attention_outputs(s, q, q.scalar_type());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "pygpt.attention", [&] {
    at::parallel_for(0, cpu::kernel_table().attention_forward_items(s), 1, [&](int64_t begin, int64_t end) {
      cpu::kernels<scalar_t>().attention_forward(s, view4<scalar_t>(q), view4<scalar_t>(k),
                                       view4<scalar_t>(v), o.out.data_ptr<scalar_t>(),
                                       o.lse.data_ptr<scalar_t>(), begin, end,
                                       args.bias<scalar_t>());
    });
  });
  return {o.out, o.lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> attention_backward_cpu(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, bool causal, std::optional<double> scale,
    const std::optional<at::Tensor>& q_lengths, const std::optional<at::Tensor>& kv_lengths,
    const std::optional<at::Tensor>& rel_bias, const std::optional<at::Tensor>& alibi_slopes) {
  const char* op = "pygpt.attention_backward";
  check_cpu_float(q, op, "q");
  const AttentionArgs args = attention_args(q, k, v, causal, scale, q_lengths, kv_lengths,
                                            rel_bias, alibi_slopes, op);
  const AttentionShape& s = args.shape;
  check_matches(grad_out, "grad_out", q, "q", op);
  check_matches(out, "out", q, "q", op);
  check_matches(lse, "lse", q, "q", op);
  const std::vector<int64_t> out_shape{s.B, s.H, s.Tq, s.Dv};
  TORCH_CHECK(out.sizes() == out_shape, op, ": out must have shape ", at::IntArrayRef(out_shape),
              ", got ", out.sizes());
  TORCH_CHECK(grad_out.sizes() == out_shape, op, ": grad_out must have shape ",
              at::IntArrayRef(out_shape), ", got ", grad_out.sizes());
  TORCH_CHECK(lse.sizes() == at::IntArrayRef({s.B, s.H, s.Tq}), op, ": lse must have shape (",
              s.B, ", ", s.H, ", ", s.Tq, "), got ", lse.sizes());
  const at::Tensor lse_c = lse.contiguous();
  const AttentionInputGrads g = attention_input_grads(s, q);
  // The bias gradients per (batch, head), summed over the batch below; (0,): no such input.
  const int64_t width = args.rel_bias.defined() ? args.rel_bias.size(1) : 0;
  at::Tensor dtable = at::empty({s.B, s.H, width}, q.options());
  at::Tensor dslopes = at::empty({s.B, s.H}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "pygpt.attention_backward", [&] {
    at::parallel_for(0, cpu::kernel_table().attention_backward_items(s), 1, [&](int64_t begin, int64_t end) {
      cpu::kernels<scalar_t>().attention_backward(
          s, view4<scalar_t>(q), view4<scalar_t>(k), view4<scalar_t>(v), view4<scalar_t>(out),
          view4<scalar_t>(grad_out), lse_c.const_data_ptr<scalar_t>(), g.dq.data_ptr<scalar_t>(),
          g.dk.data_ptr<scalar_t>(), g.dv.data_ptr<scalar_t>(), begin, end, args.bias<scalar_t>(),
          dtable.data_ptr<scalar_t>(), dslopes.data_ptr<scalar_t>());
    });
  });
  return {g.dq, g.dk, g.dv, bias_grad(dtable, args.rel_bias),
          bias_grad(dslopes, args.alibi_slopes)};
}

}  // namespace

TORCH_LIBRARY_IMPL(pygpt, CPU, m) {
  m.impl("attention", &attention_cpu);
  m.impl("attention_backward", &attention_backward_cpu);
}

}  // namespace pygpt
