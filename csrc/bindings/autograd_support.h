// What the C++ autograd of the pygpt ops shares: typed handles of the ops, called through the
// dispatcher, and optional tensors as saved for backward.
//
// Each op's Autograd kernel (in the op's own <op>.cpp) is a torch::autograd::Function whose
// forward runs the op below autograd (its CPU or CUDA kernel) and whose backward calls the op's
// backward kernel, so a training step runs no Python per op call (pygpt/ops.py registers only
// the fake implementations). The gradients are those the ops' schemas document; the auxiliary
// outputs (lse, mean, rstd) are not differentiable.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>

#include <optional>

namespace pygpt {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using OptTensor = std::optional<Tensor>;

// The op `name` of the pygpt library, called through the dispatcher with signature Fn.
template <typename Fn>
c10::TypedOperatorHandle<Fn> op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Fn>();
}

// A saved optional tensor comes back undefined when it was not given.
inline OptTensor given(const Tensor& t) { return t.defined() ? OptTensor(t) : std::nullopt; }

}  // namespace pygpt
