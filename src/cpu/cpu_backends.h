// Factories of the host backends.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "mladcp/backend.h"

namespace mladcp {

// "cpu-reference": the oracle. Naive loops, fp64 accumulation, obviously correct.
std::unique_ptr<Backend> make_cpu_reference_backend();
// "cpu": multi-threaded, vectorized, blocked so that each KV tile is read once for all heads.
std::unique_ptr<Backend> make_cpu_backend();

// What both host backends declare: LSE in either base, bf16 queries, bf16/fp8 caches, bf16/fp32 output,
// any block size, every head count and q_len of the API, any DCP interleave, deterministic.
inline BackendCapabilities host_backend_capabilities(std::string name, std::string description) {
  BackendCapabilities c;
  c.name = std::move(name);
  c.description = std::move(description);
  c.device = Device::kHost;
  c.can_return_lse_for_decode = true;
  c.native_lse_base = LseBase::kE;
  c.lse_base_selectable = true;
  c.q_dtypes = {DType::kBF16};
  c.kv_dtypes = {DType::kBF16, DType::kFP8E4M3};
  c.out_dtypes = {DType::kBF16, DType::kFP32};
  c.block_sizes = {};  // any >= 1
  c.min_heads = 1;
  c.max_heads = kMaxHeads;
  c.min_q_len = 1;
  c.max_q_len = kMaxQLen;
  c.supports_dcp_interleave = true;
  c.cuda_graph_safe = false;
  c.deterministic = true;  // the cpu plan does not depend on the thread count
  return c;
}

}  // namespace mladcp
