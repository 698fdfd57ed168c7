// Split kernel for 64 query rows per CTA, bf16 cache.
#include "cuda/decode_kernel.cuh"

namespace mladcp::cuda_impl {
MLADCP_INSTANTIATE_SPLIT_KERNEL(4, false)
}  // namespace mladcp::cuda_impl
