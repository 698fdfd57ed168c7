// The fp32 chunk kernel for avx512.
#define MLADCP_CPU_NS avx512
#define MLADCP_CPU_VW 16
#define MLADCP_CPU_ACC_REGS 24
#define MLADCP_CPU_ISA ::mladcp::cpu::Isa::kAvx512
#include "cpu/kernel_impl.h"
