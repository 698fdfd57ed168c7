// Split kernel for 16 query rows per CTA, bf16 cache.
#include "cuda/decode_kernel.cuh"

namespace mladcp::cuda_impl {
MLADCP_INSTANTIATE_SPLIT_KERNEL(1, false)
}  // namespace mladcp::cuda_impl
