// Split kernel for 32 query rows per CTA, bf16 cache.
#include "cuda/decode_kernel.cuh"

namespace mladcp::cuda_impl {
MLADCP_INSTANTIATE_SPLIT_KERNEL(2, false)
}  // namespace mladcp::cuda_impl
