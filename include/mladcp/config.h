// Compile-time configuration shared by host and device code.
#pragma once

#if defined(__CUDACC__)
#define MLADCP_HD __host__ __device__ __forceinline__
#else
#define MLADCP_HD inline
#endif

namespace mladcp {

// MLA (absorbed form) head dimensions. A cached token is one latent vector
// c = [kv_c (512) | k_pe (64)]; a query head is q = [q_nope·W_UK (512) | q_pe (64)].
inline constexpr int kLatentDim = 512;                // kv_lora_rank, also the output ("V") width
inline constexpr int kRopeDim = 64;                   // qk_rope_head_dim
inline constexpr int kQkDim = kLatentDim + kRopeDim;  // 576

inline constexpr int kMaxQLen = 16;     // speculative tokens per sequence accepted by the API
inline constexpr int kMaxHeads = 1024;  // query heads per call (after the DCP gather)

}  // namespace mladcp
