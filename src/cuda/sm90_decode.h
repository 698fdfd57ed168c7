// Hopper (sm_90a) split kernel of the "cuda" decode: 64 query rows per CTA, bf16 cache in pages of 16,
// 32 or a multiple of 64 keys, a producer warpgroup issuing bulk tensor copies (TMA) and two consumer
// warpgroups on wgmma. Built only for sm_90a (src/cuda/CMakeLists.txt); call these only on a compute
// capability 9.0 device. The plan, the workspace and the combine kernel are the portable kernel's
// (decode_plan.h).
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

// Launches the split kernel (p.rows_per_cta == 64, bf16 cache, p.num_blocks >= 1) on `stream`; the
// caller launches the combine kernel when p.max_splits > 1.
cudaError_t launch_sm90_decode(const DecodeKernelParams& p, int64_t grid, cudaStream_t stream);

}  // namespace mladcp::cuda_impl
