// Cache writes under DCP: appending a sequence's tokens through slot mappings on each of W ranks must
// rebuild, bit for bit, the shard caches synthetic::make_problem lays out directly (same block table,
// same NaN poison in every slot no token owns). The KV rows come from the unsharded (W = 1) problem.
#include "mladcp/kv_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/decode_check.h"
#include "core/numeric.h"
#include "testkit/synthetic.h"

namespace mladcp {
namespace {

// Row g of sequence b of a W = 1 problem, dequantized to fp32: [576].
std::vector<float> source_row(const synthetic::Problem& full, int b, int64_t g) {
  const synthetic::Config& c = full.config;
  const int32_t block = full.block_table[size_t(b) * full.max_blocks_per_seq + size_t(g / c.block_size)];
  const size_t base = (size_t(block) * c.block_size + size_t(g % c.block_size)) * kQkDim;
  std::vector<float> row(kQkDim);
  for (int d = 0; d < kQkDim; ++d)
    row[size_t(d)] = c.kv_dtype == DType::kBF16
                         ? numeric::bf16_to_float(reinterpret_cast<const uint16_t*>(full.kv_cache.data())[base + d])
                         : numeric::fp8e4m3_to_float(full.kv_cache[base + d]) * c.kv_scale;
  return row;
}

std::vector<uint8_t> poisoned_cache(const synthetic::Problem& shard) {
  std::vector<uint8_t> cache(shard.kv_cache.size());
  const size_t elems = cache.size() / dtype_size(shard.config.kv_dtype);
  if (shard.config.kv_dtype == DType::kBF16)
    std::fill_n(reinterpret_cast<uint16_t*>(cache.data()), elems, uint16_t(0x7fc0));
  else
    std::fill(cache.begin(), cache.end(), uint8_t(0x7f));
  return cache;
}

CacheWriteParams cache_params(const synthetic::Problem& shard, std::vector<uint8_t>& cache) {
  CacheWriteParams w;
  w.kv_cache = cache.data();
  w.cache_dtype = shard.config.kv_dtype;
  w.kv_scale = shard.config.kv_scale;
  w.num_blocks = shard.num_blocks;
  w.block_size = shard.config.block_size;
  return w;
}

struct WriteCase {
  int world, interleave, block_size;
  std::vector<int32_t> lens;
  DType kv_dtype;
  float kv_scale;
};

synthetic::Config config_for(const WriteCase& wc, int rank) {
  synthetic::Config c;
  c.num_seqs = int(wc.lens.size());
  c.num_heads = 1;
  c.block_size = wc.block_size;
  c.seq_lens = wc.lens;
  c.kv_dtype = wc.kv_dtype;
  c.kv_scale = wc.kv_scale;
  c.shard = {wc.world, rank, wc.interleave};
  c.seed = 77 + uint64_t(wc.world) * 13 + uint64_t(wc.interleave);
  return c;
}

std::vector<WriteCase> write_cases() {
  std::vector<WriteCase> cases;
  for (int W : {1, 2, 3, 4})
    for (int I : {1, 2, 4})
      for (DType kv : {DType::kBF16, DType::kFP8E4M3})
        cases.push_back({W, I, 8, {0, 1, W * I + 1, 3 * W * 8 + 5, 2}, kv, kv == DType::kBF16 ? 1.0f : 0.37f});
  cases.push_back({4, 64, 64, {0, 257, 600}, DType::kBF16, 1.0f});
  return cases;
}

// Decode-style appends: step s writes position s of every sequence still that long, with one batched
// slot mapping for all of them (the tokens of one engine step).
TEST(KvCacheWrite, TokenByTokenReproducesSyntheticShards) {
  for (const WriteCase& wc : write_cases()) {
    synthetic::Config full_cfg = config_for(wc, 0);
    full_cfg.shard = {};
    const synthetic::Problem full = test::make_problem(full_cfg);
    const int max_len = *std::max_element(wc.lens.begin(), wc.lens.end());
    for (int r = 0; r < wc.world; ++r) {
      const synthetic::Problem shard = test::make_problem(config_for(wc, r));
      const std::string ctx = test::describe(shard.config);
      std::vector<uint8_t> cache = poisoned_cache(shard);
      for (int step = 0; step < max_len; ++step) {
        std::vector<int32_t> seq_ids;
        std::vector<int64_t> positions;
        std::vector<float> rows;
        for (int b = 0; b < int(wc.lens.size()); ++b) {
          if (step >= wc.lens[size_t(b)]) continue;
          seq_ids.push_back(b);
          positions.push_back(step);
          const std::vector<float> row = source_row(full, b, step);
          rows.insert(rows.end(), row.begin(), row.end());
        }
        std::vector<int64_t> slots(seq_ids.size(), -99);
        SlotMappingParams sm;
        sm.num_tokens = int(seq_ids.size());
        sm.seq_ids = seq_ids.data();
        sm.positions = positions.data();
        sm.block_table = shard.block_table.data();
        sm.num_seqs = shard.config.num_seqs;
        sm.max_blocks_per_seq = shard.max_blocks_per_seq;
        sm.block_size = shard.config.block_size;
        sm.num_blocks = shard.num_blocks;
        sm.shard = shard.config.shard;
        sm.slot_mapping = slots.data();
        ASSERT_TRUE(compute_slot_mapping_host(sm).ok()) << ctx << " step " << step;
        CacheWriteParams w = cache_params(shard, cache);
        w.num_tokens = int(seq_ids.size());
        w.kv_c = rows.data();
        w.k_pe = rows.data() + kLatentDim;
        w.src_dtype = DType::kFP32;
        w.kv_c_stride = kQkDim;
        w.k_pe_stride = kQkDim;
        w.slot_mapping = slots.data();
        ASSERT_TRUE(write_kv_cache_host(w).ok()) << ctx << " step " << step;
      }
      // Whole pool, bitwise: used slots hold the values, every other slot still holds the poison.
      ASSERT_EQ(cache.size(), shard.kv_cache.size()) << ctx;
      size_t first_diff = cache.size();
      for (size_t i = 0; i < cache.size(); ++i)
        if (cache[i] != shard.kv_cache[i]) {
          first_diff = i;
          break;
        }
      EXPECT_EQ(first_diff, cache.size()) << ctx << ": first differing byte " << first_diff;
    }
  }
}

// A prefilled sequence distributed in two chunks (positions [0, c) then [c, L)) gives the same shards.
TEST(KvCacheWrite, PrefillDistributionReproducesSyntheticShards) {
  for (const WriteCase& wc : write_cases()) {
    synthetic::Config full_cfg = config_for(wc, 0);
    full_cfg.shard = {};
    const synthetic::Problem full = test::make_problem(full_cfg);
    for (int r = 0; r < wc.world; ++r) {
      const synthetic::Problem shard = test::make_problem(config_for(wc, r));
      const std::string ctx = test::describe(shard.config);
      std::vector<uint8_t> cache = poisoned_cache(shard);
      for (int b = 0; b < int(wc.lens.size()); ++b) {
        const int len = wc.lens[size_t(b)];
        // bf16 source rows (the engine's usual input), packed [N, 576].
        std::vector<uint16_t> rows;
        for (int g = 0; g < len; ++g)
          for (float v : source_row(full, b, g)) rows.push_back(numeric::float_to_bf16(v));
        const int cut = len / 3;
        for (auto [begin, end] : {std::pair<int, int>{0, cut}, std::pair<int, int>{cut, len}}) {
          PrefillShardParams p;
          p.kv = cache_params(shard, cache);
          p.kv.num_tokens = end - begin;
          p.kv.kv_c = rows.data() + size_t(begin) * kQkDim;
          p.kv.k_pe = rows.data() + size_t(begin) * kQkDim + kLatentDim;
          p.kv.src_dtype = DType::kBF16;
          p.kv.kv_c_stride = kQkDim;
          p.kv.k_pe_stride = kQkDim;
          p.first_position = begin;
          p.block_table_row = shard.block_table.data() + size_t(b) * shard.max_blocks_per_seq;
          p.max_blocks_per_seq = shard.max_blocks_per_seq;
          p.shard = shard.config.shard;
          ASSERT_TRUE(write_prefill_shard_host(p).ok()) << ctx << " seq " << b;
        }
      }
      if (wc.kv_dtype == DType::kBF16) {
        EXPECT_TRUE(cache == shard.kv_cache) << ctx;
      } else {
        // bf16 rows quantized to fp8: compare with fp8(bf16(value) / scale) computed here.
        std::vector<uint8_t> want = shard.kv_cache;
        for (int b = 0; b < int(wc.lens.size()); ++b)
          for (int64_t k = 0; k < sharding::local_len(wc.lens[size_t(b)], wc.world, r, wc.interleave); ++k) {
            const int64_t g = sharding::local_to_global(k, wc.world, r, wc.interleave);
            const int32_t block = shard.block_table[size_t(b) * shard.max_blocks_per_seq + size_t(k / wc.block_size)];
            const std::vector<float> row = source_row(full, b, g);
            for (int d = 0; d < kQkDim; ++d)
              want[(size_t(block) * wc.block_size + size_t(k % wc.block_size)) * kQkDim + size_t(d)] =
                  numeric::float_to_fp8e4m3(numeric::bf16_to_float(numeric::float_to_bf16(row[size_t(d)])) /
                                            wc.kv_scale);
          }
        EXPECT_TRUE(cache == want) << ctx;
      }
    }
  }
}

TEST(KvCacheWrite, Fp8SaturatesAndKeepsNan) {
  std::vector<float> row(kQkDim, 1.0f);
  row[0] = 1e6f;
  row[1] = -1e6f;
  row[2] = std::numeric_limits<float>::quiet_NaN();
  row[3] = 0.5f;
  std::vector<uint8_t> cache(size_t(2) * 2 * kQkDim, 0xAB);
  const int64_t slot = 3;  // block 1, offset 1
  CacheWriteParams w;
  w.num_tokens = 1;
  w.kv_c = row.data();
  w.k_pe = row.data() + kLatentDim;
  w.src_dtype = DType::kFP32;
  w.slot_mapping = &slot;
  w.kv_cache = cache.data();
  w.cache_dtype = DType::kFP8E4M3;
  w.kv_scale = 2.0f;
  w.num_blocks = 2;
  w.block_size = 2;
  w.k_pe_stride = kQkDim;
  w.kv_c_stride = kQkDim;
  ASSERT_TRUE(write_kv_cache_host(w).ok());
  const uint8_t* t = cache.data() + size_t(3) * kQkDim;
  EXPECT_EQ(t[0], 0x7e);  // +448
  EXPECT_EQ(t[1], 0xfe);  // -448
  EXPECT_EQ(t[2] & 0x7f, 0x7f);
  EXPECT_EQ(numeric::fp8e4m3_to_float(t[3]) * 2.0f, 0.5f);
  EXPECT_EQ(numeric::fp8e4m3_to_float(t[kLatentDim]) * 2.0f, 1.0f);
  for (size_t i = 0; i < size_t(3) * kQkDim; ++i) ASSERT_EQ(cache[i], 0xAB) << "byte " << i << " written";
}

TEST(KvCacheWrite, RejectsBadInputWithoutWriting) {
  std::vector<uint16_t> rows(size_t(2) * kQkDim, 0x3f80);
  std::vector<int64_t> slots = {1, -1};
  std::vector<uint16_t> cache(size_t(2) * 4 * kQkDim, 0x7fc0);
  const std::vector<uint16_t> before = cache;
  CacheWriteParams w;
  w.num_tokens = 2;
  w.kv_c = rows.data();
  w.k_pe = rows.data() + kLatentDim;
  w.kv_c_stride = kQkDim;
  w.k_pe_stride = kQkDim;
  w.slot_mapping = slots.data();
  w.kv_cache = cache.data();
  w.num_blocks = 2;
  w.block_size = 4;
  auto expect_error = [&](CacheWriteParams q, const std::string& name) {
    const Status s = write_kv_cache_host(q);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << name;
    EXPECT_NE(s.message().find(name), std::string::npos) << s.message();
    EXPECT_TRUE(cache == before) << name << ": cache written on error";
  };
  CacheWriteParams q = w;
  slots[1] = 8;  // == num_blocks * block_size
  expect_error(q, "slot_mapping[1]=8");
  slots[1] = -2;
  expect_error(q, "slot_mapping[1]=-2");
  slots[1] = -1;
  q.kv_scale = 0.5f;  // bf16 cache with a scale
  expect_error(q, "kv_scale");
  q = w;
  q.cache_dtype = DType::kFP32;
  expect_error(q, "cache_dtype");
  q = w;
  q.src_dtype = DType::kFP8E4M3;
  expect_error(q, "src_dtype");
  q = w;
  q.kv_stride_token = 100;
  expect_error(q, "kv_stride_token");
  q = w;
  q.kv_c = nullptr;
  expect_error(q, "kv_c");
  ASSERT_TRUE(write_kv_cache_host(w).ok());
  EXPECT_EQ(cache[size_t(1) * kQkDim], 0x3f80);
  EXPECT_EQ(cache[0], 0x7fc0);
}

}  // namespace
}  // namespace mladcp
