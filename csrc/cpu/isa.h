// The instruction set one compilation of the CPU kernels targets. setup.py compiles every
// csrc/cpu/*.cpp once per ISA (base, avx2, avx512 on x86-64) with PYGPT_CPU_ISA set to its name
// and that ISA's compiler flags, so each copy of the kernels, and of the inline helpers they
// use, lives in its own namespace pygpt::cpu::<isa>: no two copies share a symbol. The namespace
// is inline, so kernel code and tests written against pygpt::cpu find their own copy; the torch
// bindings reach the copy the CPU runs through kernel_table.h. A build that compiles the kernels
// once, for the machine it runs on (the native tests), gets the namespace `native`.
#pragma once

#ifndef PYGPT_CPU_ISA
#define PYGPT_CPU_ISA native
#endif
