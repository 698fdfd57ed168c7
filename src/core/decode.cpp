// Generic validation of MlaDecodeParams (shared by every backend) and small host helpers.
#include "mladcp/decode.h"

#include <algorithm>
#include <cmath>

#include "core/validate.h"
#include "mladcp/backend.h"
#include "mladcp/kv_cache.h"

namespace mladcp {

const char* split_policy_name(SplitPolicy s) {
  switch (s) {
    case SplitPolicy::kBatchInvariant:
      return "invariant";
    case SplitPolicy::kFillDevice:
      return "fill";
  }
  return "?";
}

namespace detail {

std::string join_dtypes(const std::vector<DType>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::string(dtype_name(v[i]));
  return s;
}

std::string join_ints(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

bool contains(const std::vector<DType>& v, DType t) { return std::find(v.begin(), v.end(), t) != v.end(); }

Status validate_shard_fields(const DcpShard& s) {
  if (s.world < 1) return invalid("shard.world=", s.world, ": must be >= 1");
  if (s.rank < 0 || s.rank >= s.world)
    return invalid("shard.rank=", s.rank, ": must be in [0, shard.world=", s.world, ")");
  if (s.interleave < 1) return invalid("shard.interleave=", s.interleave, ": must be >= 1");
  return Status::Ok();
}

Status check_shard_matches(const DcpShard& g, const DcpShard& f) {
  const DcpShard none;
  const bool is_default = g.world == none.world && g.rank == none.rank && g.interleave == none.interleave;
  if (is_default || (g.world == f.world && g.rank == f.rank && g.interleave == f.interleave)) return Status::Ok();
  return invalid("shard={world ", g.world, ", rank ", g.rank, ", interleave ", g.interleave,
                 "}: differs from the shard this object was created with {world ", f.world, ", rank ", f.rank,
                 ", interleave ", f.interleave, "}; leave it default or pass the same");
}

}  // namespace detail

using detail::invalid;

Status validate_shard(const DcpShard& s, int block_size) {
  MLADCP_RETURN_IF_ERROR(detail::validate_shard_fields(s));
  if (block_size < 1) return invalid("block_size=", block_size, ": must be >= 1");
  if (block_size % s.interleave != 0)
    return invalid("block_size=", block_size, ": must be a multiple of shard.interleave=", s.interleave,
                   " (a rank stores whole interleave runs in each block)");
  return Status::Ok();
}

MlaDecodeParams with_default_strides(const MlaDecodeParams& in) {
  MlaDecodeParams p = in;
  if (p.head_group_size <= 0) p.head_group_size = p.num_heads > 0 ? p.num_heads : 1;
  const int64_t T = int64_t(p.num_seqs) * p.q_len, Hg = p.head_group_size;
  if (!p.q_stride_head) p.q_stride_head = kQkDim;
  if (!p.q_stride_token) p.q_stride_token = Hg * p.q_stride_head;
  if (!p.q_stride_group) p.q_stride_group = T * p.q_stride_token;
  if (!p.kv_stride_token) p.kv_stride_token = kQkDim;
  if (!p.kv_stride_block) p.kv_stride_block = int64_t(p.block_size) * p.kv_stride_token;
  if (!p.block_table_stride) p.block_table_stride = p.max_blocks_per_seq;
  if (!p.out_stride_head) p.out_stride_head = kLatentDim;
  if (!p.out_stride_token) p.out_stride_token = Hg * p.out_stride_head;
  if (!p.out_stride_group) p.out_stride_group = T * p.out_stride_token;
  if (!p.lse_stride_token) p.lse_stride_token = Hg;
  if (!p.lse_stride_group) p.lse_stride_group = T * p.lse_stride_token;
  return p;
}

Status validate_decode(const MlaDecodeParams& p, const BackendCapabilities& caps) {
  const std::string& be = caps.name;
  if (p.num_seqs < 0) return invalid("num_seqs=", p.num_seqs, ": must be >= 0");
  if (p.q_len < caps.min_q_len || p.q_len > caps.max_q_len)
    return invalid("q_len=", p.q_len, ": backend '", be, "' accepts ", caps.min_q_len, "..", caps.max_q_len);
  if (p.num_heads < caps.min_heads || p.num_heads > caps.max_heads)
    return invalid("num_heads=", p.num_heads, ": backend '", be, "' accepts ", caps.min_heads, "..", caps.max_heads);
  if (p.head_group_size < 0 || (p.head_group_size > 0 && p.num_heads % p.head_group_size != 0))
    return invalid("head_group_size=", p.head_group_size,
                   ": must be 0 (one group) or a divisor of num_heads=", p.num_heads);
  const DcpShard& s = p.shard;
  MLADCP_RETURN_IF_ERROR(detail::validate_shard_fields(s));
  if (s.interleave > 1 && !caps.supports_dcp_interleave)
    return Status::Unsupported(
        detail::cat("shard.interleave=", s.interleave, ": backend '", be, "' supports only interleave 1"));
  if (!detail::contains(caps.q_dtypes, p.q_dtype))
    return invalid("q_dtype=", dtype_name(p.q_dtype), ": backend '", be, "' accepts ",
                   detail::join_dtypes(caps.q_dtypes));
  if (!detail::contains(caps.kv_dtypes, p.kv_dtype))
    return invalid("kv_dtype=", dtype_name(p.kv_dtype), ": backend '", be, "' accepts ",
                   detail::join_dtypes(caps.kv_dtypes));
  if (!detail::contains(caps.out_dtypes, p.out_dtype))
    return invalid("out_dtype=", dtype_name(p.out_dtype), ": backend '", be, "' accepts ",
                   detail::join_dtypes(caps.out_dtypes));
  MLADCP_RETURN_IF_ERROR(validate_shard(s, p.block_size));
  if (!caps.block_sizes.empty() &&
      std::find(caps.block_sizes.begin(), caps.block_sizes.end(), p.block_size) == caps.block_sizes.end())
    return invalid("block_size=", p.block_size, ": backend '", be, "' accepts ", detail::join_ints(caps.block_sizes));
  if (!(std::isfinite(p.softmax_scale) && p.softmax_scale > 0.0f))
    return invalid("softmax_scale=", p.softmax_scale, ": must be finite and > 0");
  if (!(std::isfinite(p.kv_scale) && p.kv_scale > 0.0f))
    return invalid("kv_scale=", p.kv_scale, ": must be finite and > 0");
  if (p.max_seq_len < 0) return invalid("max_seq_len=", p.max_seq_len, ": must be >= 0");
  if (!detail::valid_lse_base(p.lse_base))
    return invalid("lse_base=", int(p.lse_base), ": ", detail::kAcceptedLseBases);
  if (p.split_policy != SplitPolicy::kBatchInvariant && p.split_policy != SplitPolicy::kFillDevice)
    return invalid("split_policy=", int(p.split_policy), ": accepted kBatchInvariant (0), kFillDevice (1)");
  if (p.num_seqs == 0) return Status::Ok();  // nothing to read or write
  if (!p.q) return invalid("q: null pointer (expected [T, H, 576])");
  if (!p.out) return invalid("out: null pointer (expected [T, H, 512])");
  if (!p.seq_lens) return invalid("seq_lens: null pointer (expected [num_seqs] int32)");
  if (p.num_blocks < 0) return invalid("num_blocks=", p.num_blocks, ": must be >= 0");
  if (p.num_blocks > 0 && !p.kv_cache) return invalid("kv_cache: null pointer with num_blocks=", p.num_blocks);
  if (p.max_blocks_per_seq < 0) return invalid("max_blocks_per_seq=", p.max_blocks_per_seq, ": must be >= 0");
  if (p.max_blocks_per_seq > 0 && !p.block_table)
    return invalid("block_table: null pointer with max_blocks_per_seq=", p.max_blocks_per_seq);
  if (p.lse && !caps.can_return_lse_for_decode)
    return Status::Unsupported(detail::cat("lse: backend '", be, "' cannot return the LSE for decode"));
  if (p.lse && p.lse_base != caps.native_lse_base && !caps.lse_base_selectable)
    return invalid("lse_base=", lse_base_name(p.lse_base), ": backend '", be, "' returns only base ",
                   lse_base_name(caps.native_lse_base));
  if (p.kv_dtype != DType::kFP8E4M3 && p.kv_scale != 1.0f)
    return invalid("kv_scale=", p.kv_scale, ": only fp8_e4m3 caches take a scale (use 1.0)");
  // Explicit strides must not make rows overlap.
  const int64_t Hg = p.head_group_size ? p.head_group_size : p.num_heads;
  if (p.q_stride_head && p.q_stride_head < kQkDim)
    return invalid("q_stride_head=", p.q_stride_head, ": must be >= 576");
  if (p.q_stride_token && p.q_stride_token < Hg * (p.q_stride_head ? p.q_stride_head : kQkDim))
    return invalid("q_stride_token=", p.q_stride_token, ": must be >= head_group_size * q_stride_head");
  if (p.kv_stride_token && p.kv_stride_token < kQkDim)
    return invalid("kv_stride_token=", p.kv_stride_token, ": must be >= 576");
  if (p.kv_stride_block && p.kv_stride_block < int64_t(p.block_size) * (p.kv_stride_token ? p.kv_stride_token : kQkDim))
    return invalid("kv_stride_block=", p.kv_stride_block, ": must be >= block_size * kv_stride_token");
  if (p.block_table_stride && p.block_table_stride < p.max_blocks_per_seq)
    return invalid("block_table_stride=", p.block_table_stride, ": must be >= max_blocks_per_seq");
  if (p.out_stride_head && p.out_stride_head < kLatentDim)
    return invalid("out_stride_head=", p.out_stride_head, ": must be >= 512");
  if (p.out_stride_token && p.out_stride_token < Hg * (p.out_stride_head ? p.out_stride_head : kLatentDim))
    return invalid("out_stride_token=", p.out_stride_token, ": must be >= head_group_size * out_stride_head");
  if (p.lse_stride_token && p.lse_stride_token < Hg)
    return invalid("lse_stride_token=", p.lse_stride_token, ": must be >= head_group_size");
  // The largest global length whose local shard fits in the block table.
  if (p.max_seq_len > 0) {
    const int64_t local = sharding::local_len(p.max_seq_len, s.world, 0, s.interleave);  // rank 0 holds the most
    if ((local + p.block_size - 1) / p.block_size > p.max_blocks_per_seq)
      return invalid("max_seq_len=", p.max_seq_len, ": needs ", (local + p.block_size - 1) / p.block_size,
                     " blocks per sequence on a shard, but max_blocks_per_seq=", p.max_blocks_per_seq);
  }
  return Status::Ok();
}

Status check_host_indices(const MlaDecodeParams& in) {
  const MlaDecodeParams p = with_default_strides(in);
  const DcpShard& s = p.shard;
  for (int b = 0; b < p.num_seqs; ++b) {
    const int32_t len = p.seq_lens[b];
    if (len < 0) return invalid("seq_lens[", b, "]=", len, ": must be >= 0");
    if (p.max_seq_len > 0 && len > p.max_seq_len)
      return invalid("seq_lens[", b, "]=", len, ": exceeds max_seq_len=", p.max_seq_len);
    if (len > 0 && len < p.q_len)
      return invalid("seq_lens[", b, "]=", len, ": a non-empty sequence holds at least q_len=", p.q_len,
                     " tokens (its new tokens)");
    const int64_t local = sharding::local_len(len, s.world, s.rank, s.interleave);
    const int64_t blocks = (local + p.block_size - 1) / p.block_size;
    if (blocks > p.max_blocks_per_seq)
      return invalid("seq_lens[", b, "]=", len, ": needs ", blocks, " blocks on shard ", s.rank,
                     " but max_blocks_per_seq=", p.max_blocks_per_seq);
    if (!p.check_block_ids) continue;
    for (int64_t i = 0; i < blocks; ++i) {
      const int32_t id = p.block_table[b * p.block_table_stride + i];
      if (id < 0 || id >= p.num_blocks)
        return invalid("block_table[", b, "][", i, "]=", id, ": block id out of range [0, num_blocks=", p.num_blocks,
                       ")");
    }
  }
  return Status::Ok();
}

}  // namespace mladcp
