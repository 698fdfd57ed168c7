// The "cuda" decode against the oracle ("cpu-reference") on synthetic problems: head counts, q_len
// 1-4, block sizes, fp8, long sequences (several splits), DCP shards with interleave 1/2/64 (empty
// shards included). Every case runs three ways: fp32 out + natural LSE, bf16 out + base-2 LSE, bf16
// out without LSE (the LSE buffer must stay untouched), each output surrounded by sentinel bands.
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_test_util.h"

namespace mladcp::test {
namespace {

struct Case {
  std::string name;
  synthetic::Config cfg;
};

// What gtest prints for a failing parameter: the case name and its shape, not the struct's bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name << " (" << describe(c.cfg) << ")"; }

::testing::AssertionResult matches_oracle_on_device(Backend& cuda, const synthetic::Config& cfg) {
  const synthetic::Problem prob = make_problem(cfg);
  const DecodeBuffers want = expected_decode(prob, LseBase::kE);
  const DeviceProblem dev(prob);
  struct Variant {
    DType out;
    std::optional<LseBase> base;
  };
  const Variant variants[] = {{DType::kFP32, LseBase::kE}, {DType::kBF16, LseBase::k2}, {DType::kBF16, std::nullopt}};
  for (const Variant& v : variants) {
    const std::string what = describe(cfg) + " out=" + dtype_name(v.out) +
                             (v.base ? std::string(" lse base ") + lse_base_name(*v.base) : " no lse");
    ::testing::AssertionResult r = device_decode_matches(cuda, prob, dev, want, v.out, v.base, what);
    if (!r) return r;
  }
  return ::testing::AssertionSuccess();
}

std::vector<Case> shape_cases() {
  std::vector<Case> cases;
  uint64_t seed = 100;
  auto add = [&](std::string name, synthetic::Config c) {
    c.seed = ++seed;
    cases.push_back({std::move(name), std::move(c)});
  };
  // Head counts: 16/32/64 rows per CTA, several row chunks, odd counts.
  for (int h : {1, 3, 16, 24, 64, 128}) add("heads" + std::to_string(h), config(h, 1, 64, {0, 1, 63, 65, 700}, 0));
  // Speculative tokens: the causal rule per query token.
  for (int q : {2, 3, 4})
    for (int h : {16, 128})
      add("qlen" + std::to_string(q) + "_h" + std::to_string(h), config(h, q, 16, {0, q, 17, 300}, 0));
  // Block sizes (any size is accepted; 48 is not a power of two).
  for (int bs : {1, 16, 32, 48, 64}) {
    std::vector<int32_t> lens = {0, 2, bs + 1, 3 * bs + 5, 250};
    if (bs > 2) lens.push_back(bs - 1);
    if (bs >= 2) lens.push_back(bs);
    add("block" + std::to_string(bs), config(16, 2, bs, lens, 0));
  }
  // fp8-e4m3 cache with a per-tensor scale.
  for (int h : {16, 128})
    for (int q : {1, 3})
      add("fp8_h" + std::to_string(h) + "_q" + std::to_string(q),
          config(h, q, 64, h == 16 ? std::vector<int32_t>{0, 3, 100, 700, 2100} : std::vector<int32_t>{0, 3, 100, 700},
                 0, DType::kFP8E4M3));
  // Long sequences: several splits merged by the combine kernel, mixed with single-split sequences.
  add("long_h16", config(16, 1, 64, {4096, 2500, 1500, 1, 0}, 0));
  add("long_h8_q4_fp8", config(8, 4, 32, {4096, 2100, 4}, 0, DType::kFP8E4M3));
  add("long_h64", config(64, 1, 64, {9000}, 0));
  add("long_h32_q4", config(32, 4, 64, {4396}, 0));
  // DCP shards of one global problem: every rank, interleave 1, 2 and 64, empty shards.
  for (int w : {2, 4})
    for (int il : {1, 2, 64}) {
      if (w == 4 && il == 2) continue;
      for (int r = 0; r < w; ++r)
        for (int q : {1, 4}) {
          if (w == 4 && q == 1 && il == 1) continue;
          add("dcp_w" + std::to_string(w) + "_i" + std::to_string(il) + "_r" + std::to_string(r) + "_q" +
                  std::to_string(q),
              config(16, q, 64, {0, q, 5, 67, 130, 2500, 4200}, 0, r % 2 ? DType::kFP8E4M3 : DType::kBF16, {w, r, il}));
        }
    }
  return cases;
}

class CudaOracle : public ::testing::TestWithParam<Case> {};

// The single-buffered portable pipeline (the layout of devices with less shared memory), on any device.
std::unique_ptr<Backend> single_stage_backend() {
  CudaBackendOptions o;
  o.single_stage = true;
  return make_cuda_backend(o);
}

TEST_P(CudaOracle, MatchesReference) {
  MLADCP_SKIP_WITHOUT_GPU();
  auto cuda = make_backend("cuda");
  EXPECT_TRUE(matches_oracle_on_device(*cuda, GetParam().cfg));
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaOracle, ::testing::ValuesIn(shape_cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

// The single-buffered key pipeline (used on devices with less shared memory), forced by the knob.
TEST(CudaDecode, SingleStagePipelineMatchesReference) {
  MLADCP_SKIP_WITHOUT_GPU();
  auto cuda = single_stage_backend();
  EXPECT_TRUE(matches_oracle_on_device(*cuda, config(128, 2, 64, {300, 1100, 0}, 7)));
  EXPECT_TRUE(matches_oracle_on_device(*cuda, config(16, 1, 16, {2100, 33}, 8, DType::kFP8E4M3)));
  EXPECT_TRUE(matches_oracle_on_device(*cuda, config(24, 1, 32, {2100, 65}, 9)));
}

// Small shapes that still reach every code path (both cache dtypes, 16/32/64 rows, several splits,
// DCP, the single-buffered pipeline): the subset run under compute-sanitizer.
TEST(CudaSanitize, DecodeSmallShapes) {
  MLADCP_SKIP_WITHOUT_GPU();
  auto cuda = make_backend("cuda");
  EXPECT_TRUE(matches_oracle_on_device(*cuda, config(16, 1, 16, {0, 2, 37, 2100}, 11)));
  EXPECT_TRUE(matches_oracle_on_device(*cuda, config(24, 1, 64, {0, 5, 2100}, 12, DType::kFP8E4M3)));
  EXPECT_TRUE(matches_oracle_on_device(*cuda, config(16, 1, 32, {0, 3, 130}, 18, DType::kFP8E4M3)));
  EXPECT_TRUE(matches_oracle_on_device(*cuda, config(64, 2, 32, {2, 200}, 13)));
  EXPECT_TRUE(matches_oracle_on_device(*cuda, config(16, 3, 64, {3, 150}, 14, DType::kBF16, {2, 1, 2})));
  // The pair merge (two splits per sequence: clusters of two Hopper CTAs), 16 and 256 rows, one sequence of one split.
  EXPECT_TRUE(matches_oracle_on_device(*cuda, config(128, 2, 64, {2100, 0, 4000, 3}, 27)));
  // The Hopper kernel's balanced schedule, forced (several sequences per part, a sequence over parts).
  CudaBackendOptions o;
  o.fill_schedule = cuda_plan::Schedule::kBalanced;
  auto balanced = make_cuda_backend(o);
  EXPECT_TRUE(matches_oracle_on_device(*balanced, config(64, 1, 32, {0, 3, 65, 700, 2}, 17)));
  // fp8 with 64 rows: the Hopper kernel converting its tiles in the ring, under both schedules.
  EXPECT_TRUE(matches_oracle_on_device(*cuda, config(64, 1, 64, {0, 70, 2100}, 19, DType::kFP8E4M3)));
  EXPECT_TRUE(matches_oracle_on_device(*balanced, config(32, 2, 16, {2, 3, 130, 700}, 20, DType::kFP8E4M3)));
  // fp8 with 16 rows: the Hopper fp8 kernel's balanced schedule (pieces handed on in one CTA).
  EXPECT_TRUE(matches_oracle_on_device(*balanced, config(16, 1, 32, {0, 3, 65, 700, 2, 130}, 23, DType::kFP8E4M3)));
  // Equal lengths under the balanced schedule, on both Hopper kernels: each sequence cut over many parts.
  EXPECT_TRUE(matches_oracle_on_device(*balanced, config(128, 1, 64, {700, 700, 700}, 24)));
  EXPECT_TRUE(matches_oracle_on_device(*balanced, config(16, 1, 64, {20000, 20000, 20000}, 25, DType::kFP8E4M3)));
  EXPECT_TRUE(matches_oracle_on_device(*balanced, config(64, 1, 32, {9000, 9000}, 26)));
  // Equal lengths with one empty sequence: the uniform cut (one piece per part) writes the empty row directly.
  EXPECT_TRUE(matches_oracle_on_device(*balanced, config(64, 1, 32, {4000, 0, 4000, 4000}, 28)));
  // The fused merge (at most 4 states per sequence, merged by the Hopper kernel): splits, then the balanced schedule.
  CudaBackendOptions f;
  f.fused_merge = true;
  auto fused = make_cuda_backend(f);
  f.fill_schedule = cuda_plan::Schedule::kBalanced;
  auto fused_balanced = make_cuda_backend(f);
  EXPECT_TRUE(matches_oracle_on_device(*fused, config(128, 1, 64, {900, 1000, 5, 0, 1000, 700, 950, 64}, 21)));
  EXPECT_TRUE(matches_oracle_on_device(
      *fused_balanced,
      config(128, 1, 32, {0, 3, 65, 700, 2, 130, 900, 1, 64, 400, 0, 5, 333, 1000, 77, 640, 9, 2, 512, 70}, 22)));
  auto single = single_stage_backend();
  EXPECT_TRUE(matches_oracle_on_device(*single, config(16, 1, 64, {2100}, 15)));
  EXPECT_TRUE(matches_oracle_on_device(*single, config(16, 1, 64, {150}, 16, DType::kFP8E4M3)));
}

}  // namespace
}  // namespace mladcp::test
