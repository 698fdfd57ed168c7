// Device-side parameters and launchers of the "cuda" decode kernels (no CUDA headers here).
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/decode_plan.h"
#include "mladcp/sharding.h"
#include "mladcp/status.h"

namespace mladcp::cuda_impl {

// Everything the split and combine kernels read, with defaults resolved. Offsets in elements.
struct DecodeKernelParams {
  int num_seqs = 0, q_len = 1, num_heads = 0, head_group_size = 1;
  int rows_per_seq = 0, rows_per_cta = 16, row_chunks = 0, split_len = 0, max_splits = 1;
  int parts = 0;  // > 0: the balanced schedule of the Hopper kernel (decode_plan.h), grid parts · row_chunks
  bool whole_short = false;  // balanced: sequences of at most one part's positions are never cut
  int kv_stages = 2;         // 2: double-buffered key tiles; 1: single buffer (devices with less shared memory)
  bool sm90 = false;         // 64-row bf16 CTAs run the Hopper kernel (sm90_decode.h) instead of the portable one
  bool sm90_fp8 = false;     // 16- or 32-row fp8 CTAs run the Hopper fp8 kernel (sm90_decode.h)
  int sm_count = 0;          // the device's SMs (bounds the combine kernel's grid; 0: one CTA per 8 rows)
  bool copy_queries = true;  // Hopper kernel, bf16: query rows copied by the producer where they form one matrix

  const uint16_t* q = nullptr;  // bf16
  int64_t q_stride_token = 0, q_stride_head = 0, q_stride_group = 0;

  const uint8_t* kv = nullptr;  // bf16 or fp8 bytes
  int64_t kv_stride_block = 0, kv_stride_token = 0;
  int num_blocks = 0, block_size = 1;
  int block_shift = -1;  // log2(block_size) when a power of two, else -1

  const int32_t* block_table = nullptr;
  int64_t block_table_stride = 0;
  int max_blocks_per_seq = 0;
  const int32_t* seq_lens = nullptr;
  int max_seq_len = 0;

  float score_scale_log2 = 0.0f;  // softmax_scale · kv_scale · log2(e)
  float out_scale = 1.0f;         // kv_scale

  void* out = nullptr;
  bool out_fp32 = false;
  int64_t out_stride_token = 0, out_stride_head = 0, out_stride_group = 0;

  float* lse = nullptr;
  bool lse_base2 = false;
  int64_t lse_stride_token = 0, lse_stride_group = 0;

  DcpShard shard;

  // Partial states: [B, max_splits, R] (splits) or [parts, 2 slots, R] (balanced), base-2 LSE and
  // normalized outputs [.., 512]; the balanced schedule's merge records [B, row_chunks].
  float* ws_lse = nullptr;
  float* ws_o = nullptr;
  cuda_plan::BalancedRecord* ws_record = nullptr;
  // Fused merge (the Hopper 64-row kernel, decode_plan.h): arrivals of partial states [B, row_chunks], zeroed by
  // launch_decode before the split kernel; no combine kernel.
  bool fused_merge = false;
  int* ws_counter = nullptr;
  // Balanced schedule with the combine kernel: set to 1 by the split kernel once a partial state is written (zeroed by
  // launch_decode before it; the combine kernel exits at once while it is 0).
  int* ws_merges = nullptr;
  // Pair merge (the Hopper 64-row kernel, decode_plan.h): a split plan of two splits per sequence, CTA index split +
  // 2 · (row chunk + row_chunks · sequence), launched in clusters of 2 that merge the two states; no combine kernel.
  // With parts > 0: a balanced plan of cluster_parts (2 or 4) parts per sequence, CTA index part % C + C · (row chunk +
  // row_chunks · (part / C)), launched in clusters of C that merge the uniform cut's C pieces of a sequence (the
  // combine kernel runs as well); with the positional cut the kernel maps CTA index row chunk + row_chunks · part
  // instead, the plain balanced plan's, so that a cluster holds the row chunks of one part.
  bool pair_merge = false;
  int cluster_parts = 0;
};

// Dynamic shared memory of the split kernel for a shape (bytes).
size_t decode_smem_bytes(int rows_per_cta, bool fp8, int kv_stages);

// Raises the dynamic shared-memory limit of every split kernel on the current device (once per
// device; not a stream operation, so safe before graph capture).
Status prepare_decode_kernels(size_t max_smem_optin);

// Launches the split kernel (and the combine kernel when max_splits > 1, unless the split kernel merges) on `stream`.
Status launch_decode(const DecodeKernelParams& p, bool fp8, int64_t grid, void* stream);

}  // namespace mladcp::cuda_impl
