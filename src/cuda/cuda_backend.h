// Factory of the CUDA backend (host-visible; no CUDA headers needed to include it).
#pragma once

#include <memory>

#include "mladcp/backend.h"

namespace mladcp {

// Number of CUDA devices visible (0 when the driver or device is missing; never fails).
int cuda_device_count();

// "cuda": split-KV MLA decode over the paged cache on the current device.
std::unique_ptr<Backend> make_cuda_backend();

}  // namespace mladcp
