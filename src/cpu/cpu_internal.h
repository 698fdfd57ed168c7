// Internals of the "cpu" backend visible to its tests and benchmarks.
#pragma once

#include <memory>

#include "cpu/kernel.h"
#include "mladcp/backend.h"

namespace mladcp::cpu {

// The "cpu" backend running a given kernel variant (see kernel_for()).
std::unique_ptr<Backend> make_cpu_backend_with(const KernelVariant& kernel);

// Split plan knobs, exposed so tests can force many small chunks.
struct PlanOptions {
  // Aim for about this many work items per call; 0: four per hardware thread (at least 8). The
  // plan never depends on ExecContext::num_threads, so a call gives the same bits on any number
  // of threads.
  int target_items = 0;
  int64_t min_chunk_keys = 256;
  int64_t max_chunk_keys = 4096;
};
std::unique_ptr<Backend> make_cpu_backend_with(const KernelVariant& kernel, const PlanOptions& plan);

}  // namespace mladcp::cpu
