// Host implementations of the DCP cache bookkeeping: shard validation, slot mapping, cache writes.
#include <cmath>
#include <cstring>
#include <vector>

#include "core/numeric.h"
#include "core/validate.h"
#include "mladcp/kv_cache.h"

namespace mladcp {

using detail::invalid;

Status compute_slot_mapping_host(const SlotMappingParams& p) {
  MLADCP_RETURN_IF_ERROR(validate_shard(p.shard, p.block_size));
  if (p.num_tokens < 0) return invalid("num_tokens=", p.num_tokens, ": must be >= 0");
  if (p.num_seqs < 0) return invalid("num_seqs=", p.num_seqs, ": must be >= 0");
  if (p.max_blocks_per_seq < 0) return invalid("max_blocks_per_seq=", p.max_blocks_per_seq, ": must be >= 0");
  if (p.num_blocks < 0) return invalid("num_blocks=", p.num_blocks, ": must be >= 0 (0: ids not checked)");
  const int64_t stride = p.block_table_stride ? p.block_table_stride : p.max_blocks_per_seq;
  if (stride < p.max_blocks_per_seq)
    return invalid("block_table_stride=", p.block_table_stride,
                   ": must be >= max_blocks_per_seq=", p.max_blocks_per_seq);
  if (p.num_tokens == 0) return Status::Ok();
  if (!p.seq_ids) return invalid("seq_ids: null pointer (expected [num_tokens] int32)");
  if (!p.positions) return invalid("positions: null pointer (expected [num_tokens] int64)");
  if (!p.slot_mapping) return invalid("slot_mapping: null pointer (expected [num_tokens] int64)");
  if (!p.block_table && p.max_blocks_per_seq > 0)
    return invalid("block_table: null pointer with max_blocks_per_seq=", p.max_blocks_per_seq);
  const int64_t vblock = sharding::virtual_block_size(p.block_size, p.shard.world);
  for (int i = 0; i < p.num_tokens; ++i) {
    const int32_t seq = p.seq_ids[i];
    const int64_t pos = p.positions[i];
    if (seq < 0 || seq >= p.num_seqs)
      return invalid("seq_ids[", i, "]=", seq, ": must be in [0, num_seqs=", p.num_seqs, ")");
    if (pos < 0) return invalid("positions[", i, "]=", pos, ": must be >= 0");
    if (pos / vblock >= p.max_blocks_per_seq)
      return invalid("positions[", i, "]=", pos, ": needs virtual block ", pos / vblock, " (block_size*world=", vblock,
                     " tokens each) but max_blocks_per_seq=", p.max_blocks_per_seq);
    if (p.num_blocks > 0 && sharding::owner(pos, p.shard.world, p.shard.interleave) == p.shard.rank) {
      const int32_t id = p.block_table[seq * stride + pos / vblock];
      if (id < 0 || id >= p.num_blocks)
        return invalid("block_table[", seq, "][", pos / vblock, "]=", id,
                       ": block id out of range [0, num_blocks=", p.num_blocks, ") for positions[", i, "]=", pos);
    }
  }
  for (int i = 0; i < p.num_tokens; ++i)
    p.slot_mapping[i] = sharding::slot_of(p.positions[i], p.block_table + p.seq_ids[i] * stride, p.block_size, p.shard);
  return Status::Ok();
}

Status write_kv_cache_host(const CacheWriteParams& p) {
  if (p.num_tokens < 0) return invalid("num_tokens=", p.num_tokens, ": must be >= 0");
  if (p.src_dtype != DType::kBF16 && p.src_dtype != DType::kFP16 && p.src_dtype != DType::kFP32)
    return invalid("src_dtype=", dtype_name(p.src_dtype), ": accepted bf16, fp16, fp32");
  if (p.cache_dtype != DType::kBF16 && p.cache_dtype != DType::kFP8E4M3)
    return invalid("cache_dtype=", dtype_name(p.cache_dtype), ": accepted bf16, fp8_e4m3");
  if (!(std::isfinite(p.kv_scale) && p.kv_scale > 0.0f))
    return invalid("kv_scale=", p.kv_scale, ": must be finite and > 0");
  if (p.cache_dtype != DType::kFP8E4M3 && p.kv_scale != 1.0f)
    return invalid("kv_scale=", p.kv_scale, ": only fp8_e4m3 caches take a scale (use 1.0)");
  if (p.block_size < 1) return invalid("block_size=", p.block_size, ": must be >= 1");
  if (p.num_blocks < 0) return invalid("num_blocks=", p.num_blocks, ": must be >= 0");
  const int64_t kv_c_stride = p.kv_c_stride ? p.kv_c_stride : kLatentDim;
  const int64_t k_pe_stride = p.k_pe_stride ? p.k_pe_stride : kRopeDim;
  const int64_t st_token = p.kv_stride_token ? p.kv_stride_token : kQkDim;
  const int64_t st_block = p.kv_stride_block ? p.kv_stride_block : int64_t(p.block_size) * st_token;
  if (p.kv_c_stride < 0 || (p.kv_c_stride && p.kv_c_stride < kLatentDim))
    return invalid("kv_c_stride=", p.kv_c_stride, ": must be 0 (packed) or >= 512");
  if (p.k_pe_stride < 0 || (p.k_pe_stride && p.k_pe_stride < kRopeDim))
    return invalid("k_pe_stride=", p.k_pe_stride, ": must be 0 (packed) or >= 64");
  if (st_token < kQkDim) return invalid("kv_stride_token=", p.kv_stride_token, ": must be >= 576");
  if (st_block < int64_t(p.block_size) * st_token)
    return invalid("kv_stride_block=", p.kv_stride_block, ": must be >= block_size * kv_stride_token");
  if (p.num_tokens == 0) return Status::Ok();
  if (!p.slot_mapping) return invalid("slot_mapping: null pointer (expected [num_tokens] int64)");
  if (!p.kv_c) return invalid("kv_c: null pointer (expected [num_tokens, 512])");
  if (!p.k_pe) return invalid("k_pe: null pointer (expected [num_tokens, 64])");
  const int64_t num_slots = int64_t(p.num_blocks) * p.block_size;
  bool any = false;
  for (int i = 0; i < p.num_tokens; ++i) {
    const int64_t slot = p.slot_mapping[i];
    if (slot < -1 || slot >= num_slots)
      return invalid("slot_mapping[", i, "]=", slot, ": must be -1 (skip) or in [0, num_blocks*block_size=", num_slots,
                     ")");
    any = any || slot >= 0;
  }
  if (any && !p.kv_cache) return invalid("kv_cache: null pointer (expected [num_blocks, block_size, 576])");

  // stored = value / kv_scale: a true division (not a multiply by the reciprocal), the same rounding
  // every implementation of this contract produces.
  const float scale = p.kv_scale;
  for (int i = 0; i < p.num_tokens; ++i) {
    const int64_t slot = p.slot_mapping[i];
    if (slot < 0) continue;
    const int64_t dst = (slot / p.block_size) * st_block + (slot % p.block_size) * st_token;
    for (int d = 0; d < kQkDim; ++d) {
      const float v = d < kLatentDim ? numeric::load_as_float(p.kv_c, p.src_dtype, i * kv_c_stride + d)
                                     : numeric::load_as_float(p.k_pe, p.src_dtype, i * k_pe_stride + (d - kLatentDim));
      if (p.cache_dtype == DType::kBF16)
        static_cast<uint16_t*>(p.kv_cache)[dst + d] = numeric::float_to_bf16(v);
      else
        static_cast<uint8_t*>(p.kv_cache)[dst + d] = numeric::float_to_fp8e4m3(v / scale);
    }
  }
  return Status::Ok();
}

Status write_prefill_shard_host(const PrefillShardParams& p) {
  const int n = p.kv.num_tokens;
  if (n < 0) return invalid("kv.num_tokens=", n, ": must be >= 0");
  if (p.first_position < 0) return invalid("first_position=", p.first_position, ": must be >= 0");
  const size_t count = size_t(n);
  std::vector<int32_t> seq_ids(count, 0);
  std::vector<int64_t> positions(count), slots(count);
  for (int i = 0; i < n; ++i) positions[size_t(i)] = p.first_position + i;
  SlotMappingParams sm;
  sm.num_tokens = n;
  sm.seq_ids = seq_ids.data();
  sm.positions = positions.data();
  sm.block_table = p.block_table_row;
  sm.num_seqs = 1;
  sm.max_blocks_per_seq = p.max_blocks_per_seq;
  sm.block_size = p.kv.block_size;
  sm.num_blocks = p.kv.num_blocks;
  sm.shard = p.shard;
  sm.slot_mapping = slots.data();
  MLADCP_RETURN_IF_ERROR(compute_slot_mapping_host(sm));
  CacheWriteParams w = p.kv;
  w.slot_mapping = slots.data();
  return write_kv_cache_host(w);
}

}  // namespace mladcp
