// Selection of the kernel variant for this machine.
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "cpu/kernel.h"

namespace mladcp::cpu {
namespace {

// AMX: the CPU feature bits (AMX-TILE, AMX-BF16, with AVX512-BF16 for the conversions) and, on
// Linux, the process's permission to use the tile data state (granted once per process).
bool amx_usable() {
#if defined(__x86_64__)
  static const bool ok = [] {
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
        !__builtin_cpu_supports("avx512vl") || !__builtin_cpu_supports("avx512bf16") || !__builtin_cpu_supports("fma"))
      return false;
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    const bool amx_bf16 = (edx >> 22) & 1u, amx_tile = (edx >> 24) & 1u;
    if (!amx_bf16 || !amx_tile) return false;
#if defined(__linux__)
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) return false;
#endif
    return true;
  }();
  return ok;
#else
  return false;
#endif
}

bool cpu_has(Isa isa) {
#if defined(__x86_64__) || defined(__i386__)
  switch (isa) {
    case Isa::kGeneric:
      return true;
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma");
    case Isa::kAmx:
      return amx_usable();
  }
  return false;
#else
  return isa == Isa::kGeneric;
#endif
}

const KernelVariant* built_variant(Isa isa) {
  switch (isa) {
    case Isa::kGeneric:
      return &generic::kVariant;
#if MLADCP_CPU_HAVE_AVX2
    case Isa::kAvx2:
      return &avx2::kVariant;
#endif
#if MLADCP_CPU_HAVE_AVX512
    case Isa::kAvx512:
      return &avx512::kVariant;
#endif
#if MLADCP_CPU_HAVE_AMX
    case Isa::kAmx:
      return &amx::kVariant;
#endif
    default:
      return nullptr;
  }
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kGeneric:
      return "generic";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAmx:
      return "amx";
  }
  return "?";
}

const KernelVariant* kernel_for(Isa isa) { return cpu_has(isa) ? built_variant(isa) : nullptr; }

const KernelVariant& best_kernel(Isa max_isa) {
  for (Isa isa : {Isa::kAmx, Isa::kAvx512, Isa::kAvx2, Isa::kGeneric})
    if (int(isa) <= int(max_isa))
      if (const KernelVariant* v = kernel_for(isa)) return *v;
  return generic::kVariant;
}

}  // namespace mladcp::cpu
