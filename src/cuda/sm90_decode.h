// Hopper (sm_90a) split kernels of the "cuda" decode. Built only for sm_90a (src/cuda/CMakeLists.txt); call
// these only on a compute capability 9.0 device. The plan, the workspace and the combine kernel are the
// portable kernel's (decode_plan.h).
//  - 64 query rows per CTA, pages of 16, 32 or a multiple of 64 keys, a producer warpgroup issuing bulk
//    tensor copies (TMA; fp8-e4m3 caches converted to bf16 in the ring) and two consumer warpgroups on wgmma
//    (sm90_decode_kernel.cu, sm90_decode_ring.cuh);
//  - fp8-e4m3 caches with at most 32 query rows per sequence: 16 or 32 query rows per CTA, any page size, a
//    copying warp (bulk copies of the fp8 key rows into a five-tile ring) and a warpgroup converting its operand
//    fragments in registers and multiplying keys × rows (sm90_fp8_decode_kernel.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/decode_kernels.h"

namespace mladcp::cuda_impl {

// Page sizes the kernel's copies handle (16, 32, or a multiple of 64 keys).
bool sm90_decode_block_size_ok(int block_size);

// Dynamic shared memory of the kernel (bytes; about 217 KiB: the queries and two key stages).
size_t sm90_decode_smem_bytes();

// Raises the kernel's dynamic shared-memory limit on the current device; fails when the driver
// offers no tensor-map encoder.
cudaError_t set_sm90_decode_smem();

// How many Hopper decode CTAs the current device runs at once in clusters of `cluster` (2: the pair merge, 4: balanced
// plans of four parts per sequence; after set_sm90_decode_smem), for every kernel that runs in such clusters: 0 where
// cluster launches are unavailable or no such cluster fits.
int64_t sm90_cluster_ctas(int cluster);

// Launches the split kernel (p.rows_per_cta == 64, bf16 or (fp8) fp8-e4m3 cache, p.num_blocks >= 1) on
// `stream`; the caller launches the combine kernel when p.max_splits > 1 or p.parts > 0 (not for a split plan with
// p.pair_merge: clusters of 2).
cudaError_t launch_sm90_decode(const DecodeKernelParams& p, bool fp8, int64_t grid, cudaStream_t stream);

#if MLADCP_SM90_TIMELINE
// The timeline (sm90_timeline.cuh) of the Hopper kernel's last launches: cleared, or read into
// points[sm90_timeline::kCtas][sm90_timeline::kPoints]; the combine kernel's first start and last end (combine[2]).
cudaError_t sm90_timeline_reset();
cudaError_t sm90_timeline_read(uint64_t* points);
cudaError_t combine_timeline_reset();
cudaError_t combine_timeline_read(uint64_t* combine);
// The pair trace: cleared, or read into events[kTraceCtas][kTraceWindow][kPairEvents] (SM clock, low 32 bits; 0: none).
cudaError_t sm90_trace_reset();
cudaError_t sm90_trace_read(uint32_t* events);
// Experiment: CTAs of row chunks past the first exit at once (their rows are not computed).
cudaError_t sm90_chunk0_only(bool on);
// Experiment: a balanced plan's CTAs mapped chunk-major, so that a part's row chunks do not share a TPC.
cudaError_t sm90_chunk_major(bool on);
// Experiment (timing only): a segment without keys writes no rows.
cudaError_t sm90_skip_empty_writes(bool on);
#endif

// fp8 kernel: dynamic shared memory for 16 or 32 rows per CTA (bytes; about 206 and 226 KiB).
size_t sm90_fp8_decode_smem_bytes(int rows_per_cta);

// Raises the fp8 kernel's dynamic shared-memory limit (both row counts) on the current device.
cudaError_t set_sm90_fp8_decode_smem();

// Launches the fp8 split kernel (p.rows_per_cta == 16 or 32, fp8-e4m3 cache) on `stream`; the caller
// launches the combine kernel when p.max_splits > 1.
cudaError_t launch_sm90_fp8_decode(const DecodeKernelParams& p, int64_t grid, cudaStream_t stream);

}  // namespace mladcp::cuda_impl
