// Run-time choice of the CPU kernels' instruction set, as ATen chooses its own: the extension
// holds the kernels compiled for several ISAs (kernel_table.h), and the first kernel call picks
// the best one this CPU runs, unless the environment variable PYGPT_CPU_ISA names one. Tests
// and benchmarks switch ISAs within one process with use_isa.
#pragma once

#include <string>
#include <vector>

#include "cpu/kernel_table.h"

namespace pygpt::cpu {

// The ISAs compiled into this build, best first (x86-64: avx512, avx2, base; else: base).
std::vector<std::string> built_isas();

// Those of them this CPU (and its operating system) can run, best first; "base" always.
std::vector<std::string> supported_isas();

// Makes the kernels run with `isa`. Throws std::invalid_argument, naming the choices, when the
// build lacks it or this CPU cannot run it.
void use_isa(const std::string& isa);

// The table in use: PYGPT_CPU_ISA's ISA when that is set, else the best supported. Throws
// std::invalid_argument on a bad PYGPT_CPU_ISA.
const KernelTable& kernel_table();

template <typename T>
const KernelSet<T>& kernels();

}  // namespace pygpt::cpu
