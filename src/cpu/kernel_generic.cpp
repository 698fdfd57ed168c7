// The fp32 chunk kernel for any x86-64/other CPU (baseline vectors).
#define MLADCP_CPU_NS generic
#define MLADCP_CPU_VW 4
#define MLADCP_CPU_ACC_REGS 8
#define MLADCP_CPU_ISA ::mladcp::cpu::Isa::kGeneric
#include "cpu/kernel_impl.h"
