// Every host backend against the oracle on seeded random problems: heads 1/16/64/128, q_len 1-4,
// lengths 0, 1, block_size - 1, block_size, block_size + 1 and 4096, bf16 and fp8 caches, block
// sizes 1/16/32/64, bf16 and fp32 outputs, no LSE or an LSE in either base, and DCP shards.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <random>
#include <vector>

#include "common/decode_check.h"
#include "cpu/backends_under_test.h"
#include "mladcp/cpu.h"

namespace mladcp::test {
namespace {

struct Case {
  synthetic::Config config;
  DType out_dtype = DType::kFP32;
  std::optional<LseBase> lse;
};

// One output/LSE choice per case, rotating so that every combination appears across the grid.
void choose_outputs(Case& c, uint64_t k) {
  c.out_dtype = k % 2 ? DType::kBF16 : DType::kFP32;
  switch ((k / 2) % 3) {
    case 0:
      c.lse = std::nullopt;
      break;
    case 1:
      c.lse = LseBase::kE;
      break;
    default:
      c.lse = LseBase::k2;
      break;
  }
}

// Lengths around the block boundaries (each at least q_len when not 0) and one random length.
std::vector<int32_t> edge_lengths(int block_size, int q_len, std::mt19937_64& rng) {
  std::vector<int32_t> lens;
  for (int len : {0, 1, block_size - 1, block_size, block_size + 1}) {
    if (len <= 0) continue;
    lens.push_back(std::max(len, q_len));
  }
  lens.insert(lens.begin() + 1, 0);  // an empty sequence between non-empty ones
  lens.push_back(int32_t(q_len + rng() % (3 * block_size + 40)));
  return lens;
}

std::vector<Case> grid_cases() {
  std::vector<Case> cases;
  uint64_t k = 0;
  for (int block : {1, 16, 32, 64}) {
    for (DType kv : {DType::kBF16, DType::kFP8E4M3}) {
      for (int heads : {1, 16, 64, 128}) {
        Case c;
        c.config.seed = 100 + k;
        std::mt19937_64 rng(c.config.seed);
        c.config.q_len = 1 + int(rng() % 4);
        c.config.num_heads = heads;
        c.config.block_size = block;
        c.config.kv_dtype = kv;
        c.config.kv_scale = kv == DType::kFP8E4M3 ? 0.25f + float(rng() % 4) * 0.5f : 1.0f;
        c.config.seq_lens = edge_lengths(block, c.config.q_len, rng);
        c.config.num_seqs = int(c.config.seq_lens.size());
        choose_outputs(c, k);
        cases.push_back(c);
        ++k;
      }
    }
  }
  return cases;
}

// Long sequences (4096 keys) with few heads: the oracle costs about a microsecond per (row, key).
std::vector<Case> long_cases() {
  std::vector<Case> cases;
  uint64_t k = 0;
  for (int heads : {1, 16}) {
    for (DType kv : {DType::kBF16, DType::kFP8E4M3}) {
      Case c;
      c.config.seed = 500 + k;
      c.config.q_len = heads == 1 ? 4 : 1;
      c.config.num_heads = heads;
      c.config.block_size = kv == DType::kBF16 ? 64 : 16;
      c.config.kv_dtype = kv;
      c.config.kv_scale = kv == DType::kFP8E4M3 ? 0.5f : 1.0f;
      c.config.seq_lens = {4096};
      c.config.num_seqs = 1;
      choose_outputs(c, k + 1);
      cases.push_back(c);
      ++k;
    }
  }
  return cases;
}

// DCP shards of one global problem: world 2-4, every rank, interleave 1, 2 and block_size.
std::vector<Case> shard_cases() {
  std::vector<Case> cases;
  uint64_t k = 0;
  for (int world : {2, 3, 4}) {
    for (int interleave : {1, 2, 16}) {
      for (int rank = 0; rank < world; ++rank) {
        Case c;
        c.config.seed = 900 + world * 10 + interleave;  // every rank of a group shares the problem
        std::mt19937_64 rng(c.config.seed);
        c.config.q_len = 1 + int(rng() % 4);
        c.config.num_heads = 16;
        c.config.block_size = 16;
        c.config.kv_dtype = k % 3 == 2 ? DType::kFP8E4M3 : DType::kBF16;
        c.config.kv_scale = c.config.kv_dtype == DType::kFP8E4M3 ? 0.5f : 1.0f;
        // Short sequences leave some ranks empty, or empty for the first query tokens only.
        c.config.seq_lens = {int32_t(c.config.q_len), 0, int32_t(c.config.q_len + 1), 17, 33, 150};
        c.config.num_seqs = int(c.config.seq_lens.size());
        c.config.shard = DcpShard{world, rank, interleave};
        choose_outputs(c, k);
        cases.push_back(c);
        ++k;
      }
    }
  }
  return cases;
}

void check_all_backends(const std::vector<Case>& cases) {
  const std::vector<BackendUnderTest> backends = host_backends_under_test();
  ASSERT_FALSE(backends.empty());
  for (const Case& c : cases) {
    const synthetic::Problem problem = make_problem(c.config);
    const DecodeBuffers want = expected_decode(problem, c.lse);
    for (const BackendUnderTest& b : backends) {
      std::unique_ptr<Backend> backend = b.make();
      DecodeBuffers got(problem.num_tokens(), c.config.num_heads, c.out_dtype, c.lse);
      const std::string context = b.label + " on " + describe(c.config) + " out=" + dtype_name(c.out_dtype) +
                                  (c.lse ? std::string(" lse base ") + lse_base_name(*c.lse) : " no lse");
      const Status s = run_decode(*backend, problem, got);
      ASSERT_TRUE(s.ok()) << context << ": " << s.to_string();
      EXPECT_TRUE(compare_decode(got, want, context));
    }
  }
}

TEST(OracleTest, GridOfShapesAndDtypes) { check_all_backends(grid_cases()); }

TEST(OracleTest, LongSequences) { check_all_backends(long_cases()); }

TEST(OracleTest, DcpShardsApplyTheCausalRuleInGlobalCoordinates) { check_all_backends(shard_cases()); }

// Random shapes beyond the grid: any heads, q_len, block size, lengths, shard.
TEST(OracleTest, RandomShapes) {
  std::vector<Case> cases;
  for (uint64_t seed = 7000; seed < 7012; ++seed) {
    std::mt19937_64 rng(seed);
    Case c;
    c.config.seed = seed;
    c.config.q_len = 1 + int(rng() % 4);
    c.config.num_heads = 1 + int(rng() % 40);
    const int block_choices[] = {1, 2, 3, 8, 16, 32, 64, 128};
    c.config.block_size = block_choices[rng() % 8];
    c.config.kv_dtype = rng() % 2 ? DType::kFP8E4M3 : DType::kBF16;
    c.config.kv_scale = c.config.kv_dtype == DType::kFP8E4M3 ? 0.125f * float(1 + rng() % 8) : 1.0f;
    c.config.num_seqs = 1 + int(rng() % 4);
    for (int s = 0; s < c.config.num_seqs; ++s)
      c.config.seq_lens.push_back(rng() % 5 == 0 ? 0 : int32_t(c.config.q_len + rng() % 300));
    const int world = 1 + int(rng() % 3);
    int interleave = 1 + int(rng() % 4);
    while (c.config.block_size % interleave) --interleave;
    c.config.shard = DcpShard{world, int(rng() % uint64_t(world)), interleave};
    choose_outputs(c, rng());
    cases.push_back(c);
  }
  check_all_backends(cases);
}

// The instruction set of the "cpu" backend is an option (not the environment): capped at generic it
// runs the portable kernel, and still matches the oracle; an unknown name is rejected.
TEST(CpuBackendOptions, MaxIsaCapsTheKernel) {
  std::unique_ptr<Backend> b;
  CpuBackendOptions o;
  o.max_isa = "generic";
  ASSERT_TRUE(create_cpu_backend(o, &b).ok());
  EXPECT_NE(b->capabilities().description.find("generic"), std::string::npos) << b->capabilities().description;
  const synthetic::Problem pr =
      make_problem(synthetic::Config{.num_seqs = 2, .num_heads = 4, .block_size = 16, .seq_lens = {70, 3}, .seed = 9});
  EXPECT_TRUE(matches_oracle(*b, pr, DType::kFP32, LseBase::kE));
  o.max_isa = "avx9";
  const Status s = create_cpu_backend(o, &b);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("options.max_isa='avx9': accepted generic, avx2, avx512, amx"), std::string::npos);
}

}  // namespace
}  // namespace mladcp::test
