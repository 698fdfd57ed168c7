// Options of the "cpu" backend (create_backend("cpu") uses the defaults).
#pragma once

#include <memory>
#include <string>

#include "mladcp/backend.h"
#include "mladcp/status.h"

namespace mladcp {

struct CpuBackendOptions {
  // The highest instruction set the kernel may use: "generic", "avx2", "avx512" or "amx" (the
  // default: the best this machine and build run). For comparisons and debugging.
  std::string max_isa = "amx";
};

// The "cpu" backend with `options`. kInvalidArgument names options.max_isa when it is not one of the
// accepted names.
Status create_cpu_backend(const CpuBackendOptions& options, std::unique_ptr<Backend>* out);

}  // namespace mladcp
