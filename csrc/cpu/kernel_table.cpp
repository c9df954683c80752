// This ISA's table of kernels, under the C name pygpt_cpu_kernels_<isa> (the one global symbol
// setup.py keeps from the ISA's objects; everything else in them becomes local to them).
#include "cpu/kernel_table.h"

#define PYGPT_JOIN2(a, b) a##b
#define PYGPT_JOIN(a, b) PYGPT_JOIN2(a, b)
#define PYGPT_STRING2(a) #a
#define PYGPT_STRING(a) PYGPT_STRING2(a)

namespace pygpt::cpu {
namespace {

template <typename T>
constexpr KernelSet<T> kernel_set() {
  return {&attention_forward<T>, &attention_backward<T>, &layer_norm_forward<T>,
          &layer_norm_backward<T>, &cross_entropy_forward<T>, &cross_entropy_backward<T>,
          &rotary<T>, &bias_gelu_forward<T>, &bias_gelu_backward<T>,
          &add_layer_norm_forward<T>, &add_layer_norm_backward<T>};
}

}  // namespace
}  // namespace pygpt::cpu

extern "C" {
extern const pygpt::cpu::KernelTable PYGPT_JOIN(pygpt_cpu_kernels_, PYGPT_CPU_ISA);
const pygpt::cpu::KernelTable PYGPT_JOIN(pygpt_cpu_kernels_, PYGPT_CPU_ISA) = {
    PYGPT_STRING(PYGPT_CPU_ISA), &pygpt::cpu::attention_forward_items,
    &pygpt::cpu::attention_backward_items, pygpt::cpu::kernel_set<float>(),
    pygpt::cpu::kernel_set<double>()};
}
