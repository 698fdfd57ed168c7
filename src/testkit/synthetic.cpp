#include "testkit/synthetic.h"

#include <algorithm>
#include <exception>
#include <limits>
#include <numeric>
#include <random>

#include "core/numeric.h"
#include "core/validate.h"

namespace mladcp::synthetic {
namespace {

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

float value(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
  uint64_t h = splitmix(seed ^ splitmix(a ^ splitmix(b ^ splitmix(c))));
  // Sum of four uniforms in [-0.5, 0.5), scaled to unit variance (Irwin-Hall).
  float s = 0.0f;
  for (int i = 0; i < 4; ++i) {
    s += float(h & 0xffff) / 65536.0f - 0.5f;
    h >>= 16;
  }
  return s * 1.7320508f;
}

std::vector<int32_t> uniform_lengths(int num_seqs, int len) { return std::vector<int32_t>(num_seqs, len); }

size_t Problem::kv_bytes_used() const {
  size_t tokens = 0;
  for (int32_t g : seq_lens)
    tokens += size_t(sharding::local_len(g, config.shard.world, config.shard.rank, config.shard.interleave));
  return tokens * kQkDim * dtype_size(config.kv_dtype);
}

MlaDecodeParams Problem::params(void* out, DType out_dtype, float* lse, LseBase lse_base) const {
  MlaDecodeParams p;
  p.num_seqs = config.num_seqs;
  p.q_len = config.q_len;
  p.num_heads = config.num_heads;
  p.q = q.data();
  p.q_dtype = DType::kBF16;
  p.kv_cache = kv_cache.data();
  p.kv_dtype = config.kv_dtype;
  p.kv_scale = config.kv_scale;
  p.num_blocks = num_blocks;
  p.block_size = config.block_size;
  p.block_table = block_table.data();
  p.max_blocks_per_seq = max_blocks_per_seq;
  p.seq_lens = seq_lens.data();
  p.max_seq_len = max_seq_len;
  p.softmax_scale = config.softmax_scale;
  p.out = out;
  p.out_dtype = out_dtype;
  p.lse = lse;
  p.lse_base = lse_base;
  p.shard = config.shard;
  return p;
}

Status make_problem(const Config& c, Problem* out) {
  using detail::invalid;
  if (!out) return invalid("out: null");
  if (c.num_seqs < 0) return invalid("num_seqs=", c.num_seqs, ": must be >= 0");
  if (c.q_len < 1) return invalid("q_len=", c.q_len, ": must be >= 1");
  if (c.num_heads < 1) return invalid("num_heads=", c.num_heads, ": must be >= 1");
  if (c.block_size < 1) return invalid("block_size=", c.block_size, ": must be >= 1");
  if (int(c.seq_lens.size()) != c.num_seqs)
    return invalid("seq_lens: has ", c.seq_lens.size(), " entries, expected num_seqs=", c.num_seqs);
  if (c.kv_dtype != DType::kBF16 && c.kv_dtype != DType::kFP8E4M3)
    return invalid("kv_dtype=", dtype_name(c.kv_dtype), ": accepted bf16, fp8_e4m3");
  const DcpShard& s = c.shard;
  MLADCP_RETURN_IF_ERROR(detail::validate_shard_fields(s));
  for (int b = 0; b < c.num_seqs; ++b)
    if (c.seq_lens[b] < 0) return invalid("seq_lens[", b, "]=", c.seq_lens[b], ": must be >= 0");

  // Sizes in 64 bits first: a shape whose cache cannot be indexed by int block ids, or whose buffers
  // cannot be allocated, is an error, never an overflow or an exception.
  const int32_t max_len = c.seq_lens.empty() ? 0 : *std::max_element(c.seq_lens.begin(), c.seq_lens.end());
  const int64_t T = int64_t(c.num_seqs) * c.q_len, H = c.num_heads;
  std::vector<int64_t> blocks_per_seq(size_t(c.num_seqs));
  int64_t total = 0;
  for (int b = 0; b < c.num_seqs; ++b) {
    const int64_t local = sharding::local_len(c.seq_lens[b], s.world, s.rank, s.interleave);
    blocks_per_seq[size_t(b)] = (local + c.block_size - 1) / c.block_size;
    total += blocks_per_seq[size_t(b)];
  }
  // Every rank sizes its table for the longest shard (rank 0) of the longest sequence.
  const int64_t max_local = sharding::local_len(max_len, s.world, 0, s.interleave);
  const int64_t max_blocks = std::max<int64_t>(1, (max_local + c.block_size - 1) / c.block_size);
  const int64_t num_blocks = total + std::max(0, c.spare_blocks);
  constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
  if (num_blocks > kIntMax)
    return invalid("seq_lens, block_size=", c.block_size, ": the cache of this shard needs ", num_blocks,
                   " blocks; block ids are int32 (at most ", kIntMax,
                   "): use fewer or shorter sequences or larger blocks");
  if (int64_t(c.num_seqs) * max_blocks > kIntMax)
    return invalid("seq_lens, num_seqs=", c.num_seqs, ": the block table needs ", int64_t(c.num_seqs) * max_blocks,
                   " entries (at most ", kIntMax, ")");
  const size_t esize = dtype_size(c.kv_dtype);
  const size_t block_elems = size_t(c.block_size) * kQkDim;
  const double kv_bytes = double(num_blocks) * double(block_elems) * double(esize);
  const double q_bytes = double(T) * double(H) * kQkDim * 2.0;
  constexpr double kMaxBytes = double(int64_t(1) << 50);  // beyond any host: refuse before size_t arithmetic
  if (kv_bytes + q_bytes > kMaxBytes)
    return invalid("seq_lens, num_seqs=", c.num_seqs, ", num_heads=", c.num_heads, ": the problem needs ",
                   kv_bytes + q_bytes, " bytes of host memory");

  Problem& p = *out;
  p = Problem{};
  p.config = c;
  p.seq_lens = c.seq_lens;
  p.max_seq_len = max_len;
  p.max_blocks_per_seq = int(max_blocks);
  p.num_blocks = int(num_blocks);
  std::vector<int32_t> ids;
  try {
    ids.resize(size_t(p.num_blocks));
    p.q.resize(size_t(T) * size_t(H) * kQkDim);
    p.kv_cache.assign(size_t(p.num_blocks) * block_elems * esize, 0);
    p.block_table.assign(size_t(c.num_seqs) * size_t(p.max_blocks_per_seq), kUnusedBlockId);
  } catch (const std::exception&) {  // std::bad_alloc, std::length_error
    *out = Problem{};
    return Status(StatusCode::kUnavailable,
                  detail::cat("synthetic problem: cannot allocate ", kv_bytes + q_bytes,
                              " bytes of host memory (cache ", kv_bytes, ", q ", q_bytes, ")"));
  }

  // Queries: [T, H, 576] bf16, a function of (seed, token, head, dim).
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int d = 0; d < kQkDim; ++d)
        p.q[(size_t(t) * size_t(H) + size_t(h)) * kQkDim + size_t(d)] =
            numeric::float_to_bf16(value(c.seed, 0x51ull << 40 | uint64_t(t), uint64_t(h), uint64_t(d)));

  // Block pool: the blocks this shard needs, plus spares, in a random order.
  std::iota(ids.begin(), ids.end(), 0);
  std::mt19937_64 rng(c.seed * 7919 + uint64_t(s.rank));
  std::shuffle(ids.begin(), ids.end(), rng);

  auto put = [&](size_t elem, float v, bool nan) {
    if (c.kv_dtype == DType::kBF16) {
      const uint16_t bits = nan ? uint16_t(0x7fc0) : numeric::float_to_bf16(v);
      reinterpret_cast<uint16_t*>(p.kv_cache.data())[elem] = bits;
    } else {
      p.kv_cache[elem] = nan ? uint8_t(0x7f) : numeric::float_to_fp8e4m3(v / c.kv_scale);
    }
  };
  if (c.poison)
    for (size_t e = 0; e < size_t(p.num_blocks) * block_elems; ++e) put(e, 0.0f, true);

  size_t next = 0;
  for (int b = 0; b < c.num_seqs; ++b) {
    const int64_t local = sharding::local_len(c.seq_lens[b], s.world, s.rank, s.interleave);
    for (int64_t i = 0; i < blocks_per_seq[size_t(b)]; ++i)
      p.block_table[size_t(b) * size_t(p.max_blocks_per_seq) + size_t(i)] = ids[next++];
    for (int64_t k = 0; k < local; ++k) {
      const int64_t g = sharding::local_to_global(k, s.world, s.rank, s.interleave);
      const int32_t block = p.block_table[size_t(b) * size_t(p.max_blocks_per_seq) + size_t(k / c.block_size)];
      const size_t base = size_t(block) * block_elems + size_t(k % c.block_size) * kQkDim;
      for (int d = 0; d < kQkDim; ++d)
        put(base + d, value(c.seed, 0xca11ull << 40 | uint64_t(b), uint64_t(g), uint64_t(d)), false);
    }
  }
  return Status::Ok();
}

}  // namespace mladcp::synthetic
