// The fp32 chunk kernel for avx2.
#define MLADCP_CPU_NS avx2
#define MLADCP_CPU_VW 8
#define MLADCP_CPU_ACC_REGS 12
#define MLADCP_CPU_ISA ::mladcp::cpu::Isa::kAvx2
#include "cpu/kernel_impl.h"
