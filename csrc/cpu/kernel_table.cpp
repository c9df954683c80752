// This ISA's table of kernels, under the C name pygpt_cpu_kernels_<isa> (the one global symbol
// setup.py keeps from the ISA's objects; everything else in them becomes local to them).
#include "cpu/kernel_table.h"

#define PYGPT_JOIN2(a, b) a##b
#define PYGPT_JOIN(a, b) PYGPT_JOIN2(a, b)
#define PYGPT_STRING2(a) #a
#define PYGPT_STRING(a) PYGPT_STRING2(a)

namespace pygpt::cpu {
namespace {

// This ISA's kernels of one element type, each pointer assigned to its member by name (the
// build is C++17, which has no designated initialisers), so reordering KernelSet's members
// cannot hand one member another's kernel.
template <typename T>
constexpr KernelSet<T> kernel_set() {
  KernelSet<T> set{};
  set.attention_forward = &attention_forward<T>;
  set.attention_backward = &attention_backward<T>;
  set.layer_norm_forward = &layer_norm_forward<T>;
  set.layer_norm_backward = &layer_norm_backward<T>;
  set.cross_entropy_forward = &cross_entropy_forward<T>;
  set.cross_entropy_backward = &cross_entropy_backward<T>;
  set.rotary = &rotary<T>;
  set.bias_gelu_forward = &bias_gelu_forward<T>;
  set.bias_gelu_backward = &bias_gelu_backward<T>;
  set.add_layer_norm_forward = &add_layer_norm_forward<T>;
  set.add_layer_norm_backward = &add_layer_norm_backward<T>;
  return set;
}

// This ISA's table, each member assigned by name as in kernel_set. constexpr, so the table is
// constant-initialised (no code runs at load time to fill it).
constexpr KernelTable kernel_table_of_this_isa() {
  KernelTable table{};
  table.isa = PYGPT_STRING(PYGPT_CPU_ISA);
  table.attention_forward_items = &attention_forward_items;
  table.attention_backward_items = &attention_backward_items;
  table.f32 = kernel_set<float>();
  table.f64 = kernel_set<double>();
  return table;
}

}  // namespace
}  // namespace pygpt::cpu

extern "C" {
extern const pygpt::cpu::KernelTable PYGPT_JOIN(pygpt_cpu_kernels_, PYGPT_CPU_ISA);
const pygpt::cpu::KernelTable PYGPT_JOIN(pygpt_cpu_kernels_, PYGPT_CPU_ISA) =
    pygpt::cpu::kernel_table_of_this_isa();
}
