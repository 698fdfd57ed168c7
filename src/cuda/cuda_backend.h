// Factory of the CUDA backend and the device cache write (host-visible; no CUDA headers needed).
#pragma once

#include <memory>

#include "mladcp/backend.h"
#include "mladcp/kv_cache.h"

namespace mladcp {

// Number of CUDA devices visible (0 when the driver or device is missing; never fails).
int cuda_device_count();

// Kernel selection of the "cuda" backend (the defaults pick the fastest kernel the device runs).
struct CudaBackendOptions {
  bool hopper_kernel = true;  // false: the portable kernel on Hopper too (comparisons, tests)
  bool single_stage = false;  // true: the single-buffered portable pipeline (the layout of devices with
                              // less shared memory), so that it can be tested on any device
};

// "cuda": split-KV MLA decode over the paged cache on the current device.
std::unique_ptr<Backend> make_cuda_backend();
std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& options);

// write_kv_cache on device memory, queued on `stream` (a cudaStream_t; nullptr: the legacy stream).
// The same contract as write_kv_cache_host except for the slots: they live on the device and are
// not read on the host, so a slot outside [0, num_blocks · block_size) is skipped like -1 instead of
// failing the call. No synchronization, no allocation: capturable in a CUDA graph.
Status write_kv_cache_cuda(const CacheWriteParams& p, void* stream);

}  // namespace mladcp
