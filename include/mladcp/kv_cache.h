// Writing the paged latent KV cache under DCP: slot mapping for new tokens, the cache write, and the
// distribution of a prefilled sequence over the W shards.
//
// Under DCP every rank runs the same two steps for the tokens of a step (prefill chunk or decode):
//   1. compute_slot_mapping: global position → slot on this rank, -1 where another rank owns it;
//   2. write_kv_cache: store each token's [kv_c (512) | k_pe (64)] at its slot, skipping -1.
// The params structs are the contract for host and device implementations alike; the *_host functions
// take host memory, write_kv_cache_cuda device memory.
#pragma once

#include <cstdint>

#include "mladcp/dtype.h"
#include "mladcp/sharding.h"
#include "mladcp/status.h"

namespace mladcp {

// Checks a shard against a cache block size: world ≥ 1, 0 ≤ rank < world, interleave ≥ 1,
// block_size ≥ 1 and block_size % interleave == 0. The message names the field and the accepted values.
Status validate_shard(const DcpShard& shard, int block_size);

// slot_mapping[i] = the cache slot of token i on this rank (block_id · block_size + offset), or -1 when
// another rank of the DCP group owns its position. Shapes:
//   seq_ids      [N] int32, row of block_table each token belongs to (0 ≤ id < num_seqs)
//   positions    [N] int64, global position of each token in its sequence (≥ 0)
//   block_table  [num_seqs, max_blocks_per_seq] int32, virtual-block ids (one id per block_size·W tokens)
//   slot_mapping [N] int64 (output)
struct SlotMappingParams {
  int num_tokens = 0;  // N ≥ 0
  const int32_t* seq_ids = nullptr;
  const int64_t* positions = nullptr;

  const int32_t* block_table = nullptr;
  int num_seqs = 0;
  int max_blocks_per_seq = 0;
  int64_t block_table_stride = 0;  // default (0): max_blocks_per_seq
  int block_size = 0;
  int num_blocks = 0;  // > 0: owned block ids are checked against [0, num_blocks); 0: not checked

  DcpShard shard;

  int64_t* slot_mapping = nullptr;
};

// Validates everything first (nothing is written on error), then fills slot_mapping.
Status compute_slot_mapping_host(const SlotMappingParams& p);

// Stores N tokens' latent vectors into the paged cache: cache[slot] = [kv_c | k_pe], converted to the
// cache dtype. bf16 caches store the value rounded to bf16; fp8-e4m3 caches store value / kv_scale,
// rounded to nearest even and saturated to ±448 (NaN stays NaN). Tokens whose slot is -1 are skipped.
//   kv_c         [N, 512] src_dtype, row stride kv_c_stride
//   k_pe         [N, 64]  src_dtype, row stride k_pe_stride (k_pe = kv_c + 512 for packed [N, 576] rows)
//   slot_mapping [N] int64, -1 or a slot in [0, num_blocks · block_size)
//   kv_cache     [num_blocks, block_size, 576] cache_dtype
struct CacheWriteParams {
  int num_tokens = 0;  // N ≥ 0
  const void* kv_c = nullptr;
  const void* k_pe = nullptr;
  DType src_dtype = DType::kBF16;  // bf16, fp16 or fp32
  int64_t kv_c_stride = 0;         // default (0): 512
  int64_t k_pe_stride = 0;         // default (0): 64

  const int64_t* slot_mapping = nullptr;

  void* kv_cache = nullptr;
  DType cache_dtype = DType::kBF16;  // bf16 or fp8_e4m3
  float kv_scale = 1.0f;             // fp8: stored = value / kv_scale; bf16: must be 1
  int num_blocks = 0;
  int block_size = 0;
  int64_t kv_stride_block = 0;  // default (0): block_size · 576
  int64_t kv_stride_token = 0;  // default (0): 576
};

// Validates shapes, dtypes and every slot first (nothing is written on error), then writes.
Status write_kv_cache_host(const CacheWriteParams& p);

// The same write on CUDA device memory (every pointer on the current device), queued on `stream` (a
// cudaStream_t; nullptr: the legacy stream); no synchronization, no allocation: capturable in a CUDA
// graph. Slots are not read on the host: a slot outside [0, num_blocks · block_size) is skipped like -1.
// kUnsupported in a program without the cuda backend (mladcp::cuda).
Status write_kv_cache_device(const CacheWriteParams& p, void* stream);

// Distributes a prefilled sequence over its shard: positions [first_position, first_position + N) of
// sequence `seq` (rows of `kv` = the CacheWriteParams source; its slot_mapping is ignored) go to this
// rank's cache where this rank owns them. Composed of the two steps above; every rank of the group
// calls it with the same rows and its own shard and cache.
struct PrefillShardParams {
  CacheWriteParams kv;                       // num_tokens, sources and the destination cache
  int64_t first_position = 0;                // global position of row 0
  const int32_t* block_table_row = nullptr;  // [max_blocks_per_seq] virtual-block ids of the sequence
  int max_blocks_per_seq = 0;
  DcpShard shard;
};

Status write_prefill_shard_host(const PrefillShardParams& p);

}  // namespace mladcp
