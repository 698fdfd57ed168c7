// Device merge, rescale and cache-write (host-visible declarations; no CUDA headers).
#pragma once

#include "mladcp/kv_cache.h"
#include "mladcp/merge.h"
#include "mladcp/status.h"

namespace mladcp::cuda_impl {

// MergeParams / RescaleParams on device memory, queued on `stream`. Validation is the caller's.
Status launch_merge(const MergeParams& p, void* stream);
Status launch_rescale(const RescaleParams& p, void* stream);
// CacheWriteParams on device memory (strides resolved by the caller).
Status launch_cache_write(const CacheWriteParams& p, void* stream);

}  // namespace mladcp::cuda_impl
