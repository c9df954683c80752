// Compiled once, for the baseline ISA: it must run on every CPU in order to pick for it.
#include "dispatch/cpu_dispatch.h"

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <stdexcept>

extern "C" {
extern const pygpt::cpu::KernelTable pygpt_cpu_kernels_base;
#if defined(__x86_64__)
extern const pygpt::cpu::KernelTable pygpt_cpu_kernels_avx2;
extern const pygpt::cpu::KernelTable pygpt_cpu_kernels_avx512;
#endif
}

namespace pygpt::cpu {
namespace {

struct Isa {
  const KernelTable* table;
  bool (*runs_here)();
};

// Best first. x86-64-v3 is AVX2 + FMA + BMI1/2 + F16C + MOVBE + LZCNT; x86-64-v4 adds
// AVX-512 F/BW/CD/DQ/VL: exactly the -march levels setup.py compiles for. The checks include
// the operating system's support for the wider registers (XGETBV).
const std::vector<Isa>& isas() {
  static const std::vector<Isa> all = {
#if defined(__x86_64__)
      {&pygpt_cpu_kernels_avx512, [] { return bool(__builtin_cpu_supports("x86-64-v4")); }},
      {&pygpt_cpu_kernels_avx2, [] { return bool(__builtin_cpu_supports("x86-64-v3")); }},
#endif
      {&pygpt_cpu_kernels_base, [] { return true; }},
  };
  return all;
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

const KernelTable* find(const std::string& name, const char* source) {
  for (const Isa& isa : isas()) {
    if (name != isa.table->isa) continue;
    if (!isa.runs_here()) {
      throw std::invalid_argument(std::string(source) + ": this CPU cannot run the " + name +
                                  " kernels; it runs: " + joined(supported_isas()));
    }
    return isa.table;
  }
  throw std::invalid_argument(std::string(source) + ": unknown CPU ISA '" + name +
                              "'; this build has: " + joined(built_isas()));
}

std::atomic<const KernelTable*> active{nullptr};
std::mutex choosing;

}  // namespace

std::vector<std::string> built_isas() {
  std::vector<std::string> names;
  for (const Isa& isa : isas()) names.emplace_back(isa.table->isa);
  return names;
}

std::vector<std::string> supported_isas() {
  std::vector<std::string> names;
  for (const Isa& isa : isas()) {
    if (isa.runs_here()) names.emplace_back(isa.table->isa);
  }
  return names;
}

void use_isa(const std::string& isa) { active.store(find(isa, "pygpt: use_isa")); }

const KernelTable& kernel_table() {
  const KernelTable* table = active.load(std::memory_order_acquire);
  if (table != nullptr) return *table;
  std::lock_guard<std::mutex> lock(choosing);
  if (active.load() == nullptr) {
    const char* forced = std::getenv("PYGPT_CPU_ISA");
    active.store(forced != nullptr && *forced != '\0'
                     ? find(forced, "PYGPT_CPU_ISA")
                     : find(supported_isas().front(), "pygpt"));
  }
  return *active.load();
}

template <>
const KernelSet<float>& kernels<float>() {
  return kernel_table().f32;
}

template <>
const KernelSet<double>& kernels<double>() {
  return kernel_table().f64;
}

}  // namespace pygpt::cpu
