// Synthetic MLA decode problems on the host: random queries and a random paged cache, built the way
// an engine lays them out (permuted block table, huge ids in unused entries, NaN in every slot no
// sequence owns). Values are a pure function of (seed, sequence, global position), so every DCP rank
// can build its own shard of one global problem independently. Used by the tool, tests and benches.
#pragma once

#include <cstdint>
#include <vector>

#include "mladcp/decode.h"
#include "mladcp/status.h"

namespace mladcp::synthetic {

inline constexpr int32_t kUnusedBlockId = 2147480000;  // poison for block-table entries past a sequence

struct Config {
  int num_seqs = 4;
  int q_len = 1;
  int num_heads = 128;  // all heads (H); a DCP rank's local q holds H / W of them
  int block_size = 64;
  std::vector<int32_t> seq_lens;  // global lengths, one per sequence (size num_seqs)
  DType kv_dtype = DType::kBF16;
  float kv_scale = 1.0f;                       // fp8: stored = value / kv_scale; bf16: 1
  float softmax_scale = 0.07216878364870322f;  // 1/sqrt(192), DeepSeek-V3
  DcpShard shard;                              // which shard of the cache to build (world 1: the whole cache)
  int spare_blocks = 3;                        // extra NaN-filled blocks in the pool that no sequence uses
  uint64_t seed = 1;
  bool poison = true;  // NaN in unused slots and blocks (else zeros)
};

struct Problem {
  Config config;
  std::vector<uint16_t> q;        // [T, H, 576] bf16 (all heads)
  std::vector<uint8_t> kv_cache;  // [num_blocks, block_size, 576] in kv_dtype
  int num_blocks = 0;
  int max_blocks_per_seq = 0;
  std::vector<int32_t> block_table;  // [num_seqs, max_blocks_per_seq]
  std::vector<int32_t> seq_lens;     // [num_seqs] global
  int max_seq_len = 0;

  int num_tokens() const { return config.num_seqs * config.q_len; }
  size_t kv_bytes_used() const;  // bytes of cache actually holding this shard's tokens
  // Host params over this problem's buffers: all heads, contiguous strides, shard from config.
  MlaDecodeParams params(void* out, DType out_dtype, float* lse, LseBase lse_base = LseBase::kE) const;
};

// A deterministic value in about N(0, 1) for (seed, a, b, c).
float value(uint64_t seed, uint64_t a, uint64_t b, uint64_t c);

// Builds the problem (the shard given by config.shard). Errors name the bad field.
Status make_problem(const Config& config, Problem* out);

// Sequence lengths helper: `num_seqs` copies of `len`.
std::vector<int32_t> uniform_lengths(int num_seqs, int len);

}  // namespace mladcp::synthetic
