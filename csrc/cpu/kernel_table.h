// The CPU kernels' entry points as a table of function pointers: one table per compiled ISA
// (kernel_table.cpp, compiled with each), chosen at run time by cpu_dispatch.h. The torch
// bindings call the kernels only through it.
#pragma once

#include <cstdint>

#include "cpu/add_layer_norm.h"
#include "cpu/attention.h"
#include "cpu/bias_gelu.h"
#include "cpu/cross_entropy.h"
#include "cpu/layer_norm.h"
#include "cpu/rotary.h"

namespace pygpt::cpu {

// The kernels of one element type. The pointer types come from the declarations, so a table
// and its kernels cannot disagree on a signature.
template <typename T>
struct KernelSet {
  decltype(&cpu::attention_forward<T>) attention_forward;
  decltype(&cpu::attention_backward<T>) attention_backward;
  decltype(&cpu::layer_norm_forward<T>) layer_norm_forward;
  decltype(&cpu::layer_norm_backward<T>) layer_norm_backward;
  decltype(&cpu::cross_entropy_forward<T>) cross_entropy_forward;
  decltype(&cpu::cross_entropy_backward<T>) cross_entropy_backward;
  decltype(&cpu::rotary<T>) rotary;
  decltype(&cpu::bias_gelu_forward<T>) bias_gelu_forward;
  decltype(&cpu::bias_gelu_backward<T>) bias_gelu_backward;
  decltype(&cpu::add_layer_norm_forward<T>) add_layer_norm_forward;
  decltype(&cpu::add_layer_norm_backward<T>) add_layer_norm_backward;
};

struct KernelTable {
  const char* isa;  // "base", "avx2", "avx512" (or "native")
  decltype(&cpu::attention_forward_items) attention_forward_items;
  decltype(&cpu::attention_backward_items) attention_backward_items;
  KernelSet<float> f32;
  KernelSet<double> f64;
};

}  // namespace pygpt::cpu
