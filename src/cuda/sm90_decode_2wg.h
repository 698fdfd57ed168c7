// The two-warpgroup Hopper kernel for bf16 caches (sm90_decode_2wg_kernel.cu), launched by launch_sm90_decode
// (sm90_decode_kernel.cu), which encodes the tensor maps and the launch configuration for both 64-row kernels.
// Included by the sm_90a sources only.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "cuda/decode_kernels.h"

namespace mladcp::cuda_impl {

// Dynamic shared memory of the kernel (bytes).
size_t sm90_2wg_decode_smem_bytes();

// Raises the kernel's dynamic shared-memory limit on the current device.
cudaError_t set_sm90_2wg_decode_smem();

// Launches the kernel with cfg's grid, stream and attributes (its block and shared-memory size are set here):
// kv_map over the bf16 cache, q_map over the query rows where q_copied.
cudaError_t launch_sm90_2wg_decode(const DecodeKernelParams& p, const CUtensorMap& kv_map, const CUtensorMap& q_map,
                                   bool q_copied, cudaLaunchConfig_t cfg);

}  // namespace mladcp::cuda_impl
