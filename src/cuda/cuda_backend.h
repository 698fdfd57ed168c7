// Factory of the CUDA backend and the device cache write (host-visible; no CUDA headers needed).
#pragma once

#include <memory>

#include "cuda/decode_plan.h"
#include "mladcp/backend.h"
#include "mladcp/kv_cache.h"

namespace mladcp {

// Number of CUDA devices visible (0 when the driver or device is missing; never fails).
int cuda_device_count();

// Kernel selection of the "cuda" backend (the defaults pick the fastest kernel the device runs).
struct CudaBackendOptions {
  bool hopper_kernel = true;  // false: the portable kernel on Hopper too (comparisons, tests)
  // kFillDevice's schedule on the Hopper kernel (decode_plan.h): kAuto chooses; kSplits and kBalanced
  // force one (tests of both, side-by-side comparisons).
  cuda_plan::Schedule fill_schedule = cuda_plan::Schedule::kAuto;
  // Sequences of at most this many query rows keep the portable kernel on Hopper (comparisons: 0 sends every
  // bf16 call with pages the copies handle to the Hopper kernel).
  int portable_max_rows_on_hopper = cuda_plan::kPortableMaxRowsOnHopper;
  // fp8 caches: sequences of at most this many query rows take the Hopper fp8 kernel (16 or 32 rows per CTA;
  // more rows in chunks of 32, each chunk reading the keys again); the others the portable kernel.
  int hopper_fp8_max_rows = cuda_plan::kHopperFp8MaxRows;
  bool single_stage = false;  // true: the single-buffered portable pipeline (the layout of devices with
                              // less shared memory), so that it can be tested on any device
  // The Hopper kernel on bf16 caches: a producer thread copies the query rows when they form one matrix (false: the
  // consumers load them, as for other layouts; comparisons).
  bool copy_queries = true;
  // true: the Hopper 64-row kernel merges a sequence's partial states itself where they are few (decode_plan.h,
  // kFusedMaxStates) instead of the combine kernel. Off by default: correct and bit-identical, but its merge is
  // still slower than the combine kernel (docs/perf/gpu-sm90-fused-merge-2026-12-02.md).
  bool fused_merge = false;
  // true: a split plan of two splits per sequence on the Hopper 64-row kernel runs each sequence's two split CTAs as a
  // cluster that merges the two states in shared memory (decode_plan.h), with no workspace and no combine kernel; the
  // same bits as the combine kernel. false: the combine kernel (comparisons, tests), also for balanced plans.
  bool pair_merge = true;
  // true (with pair_merge): a balanced plan of two or four parts per sequence on the Hopper 64-row kernel runs its
  // parts in clusters of two or four that merge the uniform cut's pieces of a sequence the same way (decode_plan.h).
  // false: the combine kernel for every balanced plan. Clusters of four only with balanced_quads (off by default:
  // no faster than the combine kernel on an H100, docs/perf/gpu-sm90-balanced-clusters-2026-12-07.md).
  bool balanced_clusters = true;
  bool balanced_quads = false;
};

// The layout rules of the cuda kernels for a call that passed validate_decode (p with default
// strides): max_seq_len > 0, 16-byte aligned rows and strides. Host-only, touches no memory.
Status check_cuda_decode_layout(const MlaDecodeParams& p);

// "cuda": split-KV MLA decode over the paged cache on the current device.
std::unique_ptr<Backend> make_cuda_backend();
std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& options);

// write_kv_cache_device (mladcp/kv_cache.h) of this backend: the cache write on device memory.
Status write_kv_cache_cuda(const CacheWriteParams& p, void* stream);

}  // namespace mladcp
