// Selection of the kernel variant for this machine.
#include <cstdlib>
#include <cstring>

#include "cpu/kernel.h"

namespace mladcp::cpu {
namespace {

bool cpu_has(Isa isa) {
#if defined(__x86_64__) || defined(__i386__)
  switch (isa) {
    case Isa::kGeneric: return true;
    case Isa::kAvx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::kAvx512: return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                              __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma");
    case Isa::kAmx: return false;
  }
  return false;
#else
  return isa == Isa::kGeneric;
#endif
}

const KernelVariant* built_variant(Isa isa) {
  switch (isa) {
    case Isa::kGeneric: return &generic::kVariant;
#if MLADCP_CPU_HAVE_AVX2
    case Isa::kAvx2: return &avx2::kVariant;
#endif
#if MLADCP_CPU_HAVE_AVX512
    case Isa::kAvx512: return &avx512::kVariant;
#endif
    default: return nullptr;
  }
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kGeneric: return "generic";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    case Isa::kAmx: return "amx";
  }
  return "?";
}

const KernelVariant* kernel_for(Isa isa) { return cpu_has(isa) ? built_variant(isa) : nullptr; }

const KernelVariant& best_kernel() {
  static const KernelVariant* chosen = [] {
    Isa cap = Isa::kAmx;
    if (const char* env = std::getenv("MLADCP_CPU_ISA")) {
      for (Isa isa : {Isa::kGeneric, Isa::kAvx2, Isa::kAvx512, Isa::kAmx})
        if (std::strcmp(env, isa_name(isa)) == 0) cap = isa;
    }
    for (Isa isa : {Isa::kAmx, Isa::kAvx512, Isa::kAvx2, Isa::kGeneric})
      if (int(isa) <= int(cap))
        if (const KernelVariant* v = kernel_for(isa)) return v;
    return &generic::kVariant;
  }();
  return *chosen;
}

}  // namespace mladcp::cpu
