// Linking mladcp::cuda keeps the cuda backend in the program. The host registry refers to the backend
// only weakly (a program without mladcp::cuda has no "cuda" backend and no CUDA dependency); the
// target's link option (-u mladcp_cuda_linked) makes the linker load this object from the static
// library, and its references load the backend and the device-memory API.
#include "cuda/cuda_backend.h"
#include "mladcp/device_memory.h"
#include "mladcp/kv_cache.h"

extern "C" const void* mladcp_cuda_linked() {
  static const void* const parts[] = {
      reinterpret_cast<const void*>(static_cast<std::unique_ptr<mladcp::Backend> (*)()>(&mladcp::make_cuda_backend)),
      reinterpret_cast<const void*>(&mladcp::cuda_device_count),
      reinterpret_cast<const void*>(&mladcp::write_kv_cache_cuda),
      reinterpret_cast<const void*>(&mladcp::device_alloc)};
  return parts;
}
