// Factories of the host backends.
#pragma once

#include <memory>

#include "mladcp/backend.h"

namespace mladcp {

// "cpu-reference": the oracle. Naive loops, fp64 accumulation, obviously correct.
std::unique_ptr<Backend> make_cpu_reference_backend();
// "cpu": multi-threaded, vectorized, blocked so that each KV tile is read once for all heads.
std::unique_ptr<Backend> make_cpu_backend();

}  // namespace mladcp
