// Static declaration of the "cuda" backend (plain data; usable in builds without CUDA, e.g. for the
// generated backend table).
#pragma once

#include "mladcp/backend.h"

namespace mladcp {

inline BackendCapabilities cuda_backend_capabilities() {
  BackendCapabilities c;
  c.name = "cuda";
  c.description = "split-KV tensor-core decode (mma.sync bf16, fp32 accumulation), paged cache, sm_80+";
  c.device = Device::kCuda;
  c.can_return_lse_for_decode = true;
  c.native_lse_base = LseBase::kE;
  c.lse_base_selectable = true;
  c.q_dtypes = {DType::kBF16};
  c.kv_dtypes = {DType::kBF16, DType::kFP8E4M3};
  c.out_dtypes = {DType::kBF16, DType::kFP32};
  c.block_sizes = {};  // any >= 1: keys are gathered token by token through the block table
  c.min_heads = 1;
  c.max_heads = kMaxHeads;
  c.min_q_len = 1;
  c.max_q_len = kMaxQLen;
  c.supports_dcp_interleave = true;
  c.cuda_graph_safe = true;
  c.deterministic = true;
  return c;
}

}  // namespace mladcp
