// What the C++ autograd of the pygpt ops (autograd.cpp, autograd_fused.cpp) shares: typed handles
// of the ops, called through the dispatcher, and optional tensors as saved for backward.
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
