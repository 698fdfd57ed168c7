// Merging partial attention states by their LSE: one primitive for split-KV, DCP all-to-all and
// DCP all-gather + reduce-scatter.
#pragma once

#include <cstdint>

#include "mladcp/dtype.h"
#include "mladcp/status.h"

namespace mladcp {

// N-way merge: out[t,h,:] = Σ_n w_n · in_out[n,t,h,:], lse = log_b Σ_n b^{in_lse[n,t,h]}.
// Empty states (LSE -inf, +inf or NaN) get weight exactly 0 whatever their output holds; all empty
// gives out = 0, lse = -inf. fp32 accumulation.
struct MergeParams {
  int num_states = 0;  // N ≥ 1
  int num_tokens = 0;  // T ≥ 0
  int num_heads = 0;   // H ≥ 1
  int head_dim = 512;  // D ≥ 1

  const void* in_out = nullptr;   // [N, T, H, D]
  DType in_dtype = DType::kFP32;  // bf16, fp16 or fp32
  int64_t in_stride_state = 0;    // default (0): T · H · D
  int64_t in_stride_token = 0;    // default (0): H · D
  int64_t in_stride_head = 0;     // default (0): D

  const float* in_lse = nullptr;  // [N, T, H]
  int64_t lse_stride_state = 0;   // default (0): T · H
  int64_t lse_stride_token = 0;   // default (0): H
  LseBase in_base = LseBase::kE;  // the base the producer of in_lse used

  void* out = nullptr;  // [T, H, D]
  DType out_dtype = DType::kBF16;
  int64_t out_stride_token = 0;  // default (0): H · D
  int64_t out_stride_head = 0;   // default (0): D

  float* out_lse = nullptr;          // [T, H], optional
  int64_t out_lse_stride_token = 0;  // default (0): H
  LseBase out_base = LseBase::kE;
};

// Rescale form used by DCP all-gather + reduce-scatter: this rank's partial output is multiplied in
// place by b^{lse[rank] - lse_global} (exactly 0 when empty) so that a sum over ranks gives the
// merged output. Rows are independent: a row is one (token, head) of whatever layout the caller has
// (DCP passes every rank's heads of every token, [W, T, H/W] = W·T·H/W rows).
struct RescaleParams {
  int world = 0;       // W ≥ 1 (number of LSE rows gathered)
  int rank = 0;        // which row is this rank's own
  int64_t rows = 0;    // R ≥ 0
  int head_dim = 512;  // D

  const float* all_lse = nullptr;  // [W, R] contiguous, gathered from every rank
  LseBase base = LseBase::kE;

  void* out = nullptr;  // [R, D] contiguous, rescaled in place
  DType out_dtype = DType::kFP32;

  float* merged_lse = nullptr;  // [R] optional, in `base`
};

Status validate(const MergeParams& p);
Status validate(const RescaleParams& p);

// The same params with every zero stride replaced by its contiguous default.
MergeParams with_default_strides(const MergeParams& p);

// Host implementations (any thread count; deterministic: fixed summation order over n).
Status merge_states_host(const MergeParams& p);
Status rescale_states_host(const RescaleParams& p);

}  // namespace mladcp
