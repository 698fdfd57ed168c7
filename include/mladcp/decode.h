// Parameters of one MLA decode call (absorbed form, paged latent KV cache, optional LSE).
#pragma once

#include <cstdint>

#include "mladcp/config.h"
#include "mladcp/dtype.h"
#include "mladcp/sharding.h"

namespace mladcp {

// How a device backend cuts sequences into split-KV work units (host backends ignore it).
enum class SplitPolicy {
  // Split lengths depend only on each sequence's own length and the head count: a sequence's result
  // is bitwise the same whatever else is in the batch and on every device (opt in for that).
  kBatchInvariant = 0,
  // Split lengths chosen so that the grid fills the device (about one to two waves of CTAs) from the
  // batch shape (num_seqs, max_seq_len, heads) and the device's SM count: the same splits as
  // kBatchInvariant when the batch fills the device, shorter ones for few long sequences, one split of up
  // to 4096 keys per sequence when that saves a wave; results may
  // depend on the batch and the device (still deterministic run to run for the same batch on the
  // same device). The default.
  kFillDevice = 1,
};
const char* split_policy_name(SplitPolicy s);  // "invariant", "fill"

// All strides are in elements of the tensor's own dtype. Memory lives where the backend runs
// (host for "cpu*", device for "cuda"). T = num_seqs · q_len; token index t = seq · q_len + i.
//
// Head groups: heads may be stored as G groups of Hg heads, head h = g · Hg + j living at
// g · stride_group + t · stride_token + j · stride_head. This is the layout of a DCP all-gather
// ([W, T, H/W, ...], one group per rank) and of an all-to-all send buffer, so the decode reads the
// gathered query and writes the exchange buffer directly, without packing copies. With
// head_group_size = 0 (default) there is one group and the group strides are unused.
struct MlaDecodeParams {
  int num_seqs = 0;         // B ≥ 0
  int q_len = 1;            // tokens per sequence, 1..kMaxQLen (speculative decoding when > 1)
  int num_heads = 0;        // H, query heads seen by the kernel (H_local · W after the DCP gather)
  int head_group_size = 0;  // Hg: 0 (one group) or a divisor of H

  const void* q = nullptr;  // [T, H, 576] or [G, T, Hg, 576]; [q_nope·W_UK (512) | q_pe (64)]
  DType q_dtype = DType::kBF16;
  int64_t q_stride_token = 0;  // default (0): Hg · 576
  int64_t q_stride_head = 0;   // default (0): 576
  int64_t q_stride_group = 0;  // default (0): T · q_stride_token

  const void* kv_cache = nullptr;  // [num_blocks, block_size, 576]  [kv_c (512) | k_pe (64)]
  DType kv_dtype = DType::kBF16;   // bf16 or fp8_e4m3
  float kv_scale = 1.0f;           // per-tensor dequantization scale (fp8); value = stored · kv_scale
  int num_blocks = 0;
  int block_size = 0;
  int64_t kv_stride_block = 0;  // default (0): block_size · 576
  int64_t kv_stride_token = 0;  // default (0): 576

  const int32_t* block_table = nullptr;  // [B, max_blocks_per_seq], physical block ids
  int max_blocks_per_seq = 0;
  int64_t block_table_stride = 0;  // default (0): max_blocks_per_seq

  // [B] GLOBAL sequence lengths (including the q_len new tokens). Under DCP each rank receives the
  // same global lengths and derives its local lengths and the causal rule from `shard`.
  const int32_t* seq_lens = nullptr;
  // Upper bound of seq_lens (global). Device backends size their grids from it without reading
  // seq_lens on the host; 0 lets a host backend compute it.
  int max_seq_len = 0;

  float softmax_scale = 0.0f;  // s_j = softmax_scale · <q, c_j> (e.g. 1/sqrt(192) · mscale²)

  void* out = nullptr;             // [T, H, 512] or [G, T, Hg, 512]
  DType out_dtype = DType::kBF16;  // bf16 or fp32
  int64_t out_stride_token = 0;    // default (0): Hg · 512
  int64_t out_stride_head = 0;     // default (0): 512
  int64_t out_stride_group = 0;    // default (0): T · out_stride_token

  float* lse = nullptr;          // [T, H] or [G, T, Hg] fp32, optional: nullptr asks for no LSE (none is computed)
  int64_t lse_stride_token = 0;  // default (0): Hg
  int64_t lse_stride_group = 0;  // default (0): T · lse_stride_token
  LseBase lse_base = LseBase::kE;

  DcpShard shard;  // which shard of the sequence this cache holds (world 1: all of it)

  // Validate every block id a sequence can touch against [0, num_blocks) before running. Costs a
  // pass over the block table (a host read for device backends is not done: they check in-kernel
  // and clamp, see the backend's capabilities).
  bool check_block_ids = true;

  // Split-KV planning of device backends (see SplitPolicy); host backends accept and ignore it.
  // Device backends' workspace_bytes() depend on it.
  SplitPolicy split_policy = SplitPolicy::kFillDevice;
};

// The same params with every zero stride (and head_group_size) replaced by its contiguous default.
MlaDecodeParams with_default_strides(const MlaDecodeParams& p);

// Element offsets of head h of token t (after with_default_strides).
inline int64_t q_offset(const MlaDecodeParams& p, int64_t t, int h) {
  return (h / p.head_group_size) * p.q_stride_group + t * p.q_stride_token + (h % p.head_group_size) * p.q_stride_head;
}
inline int64_t out_offset(const MlaDecodeParams& p, int64_t t, int h) {
  return (h / p.head_group_size) * p.out_stride_group + t * p.out_stride_token +
         (h % p.head_group_size) * p.out_stride_head;
}
inline int64_t lse_offset(const MlaDecodeParams& p, int64_t t, int h) {
  return (h / p.head_group_size) * p.lse_stride_group + t * p.lse_stride_token + (h % p.head_group_size);
}

}  // namespace mladcp
