// MlaDecodeParams::split_policy. The planner (host arithmetic, runs everywhere); kFillDevice against
// the oracle on shapes that it cuts into many short splits (single long sequences, DCP shards with
// empty shards, q_len > 1, fp8, 128 heads, head groups with padded strides), its determinism and CUDA
// graph capture; validation of an unknown policy on the cuda and the host backends.
#include <cuda_runtime.h>

#include <cstring>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "cuda/decode_plan.h"

namespace mladcp::test {
namespace {

MlaDecodeParams plan_params(int seqs, int heads, int q_len, int max_seq_len, DcpShard shard = {}) {
  MlaDecodeParams p;
  p.num_seqs = seqs;
  p.num_heads = heads;
  p.q_len = q_len;
  p.max_seq_len = max_seq_len;
  p.shard = shard;
  p.split_policy = SplitPolicy::kFillDevice;
  return p;
}

// ---- planner ------------------------------------------------------------------------------------

TEST(SplitPolicyPlan, FillDeviceSplitsFewLongSequences) {
  // One 32K sequence on a DCP rank of two (16K local keys), 128 gathered heads: 2 row chunks.
  MlaDecodeParams p = plan_params(1, 128, 1, 32768, {2, 0, 1});
  const cuda_plan::DecodePlan inv = [&] {
    MlaDecodeParams q = p;
    q.split_policy = SplitPolicy::kBatchInvariant;
    return cuda_plan::make_plan(q, 132);
  }();
  EXPECT_EQ(inv.split_len, 2048);
  EXPECT_EQ(inv.grid, 16);
  const cuda_plan::DecodePlan fill = cuda_plan::make_plan(p, 132);
  EXPECT_EQ(fill.split_len, 256);  // 66 splits wanted, 249 keys each, rounded to the tile: 256
  EXPECT_EQ(fill.max_splits, 64);
  EXPECT_EQ(fill.grid, 128);
  EXPECT_GE(fill.workspace_bytes, size_t(64) * 128 * (kLatentDim + 1) * 4);
  // Eight such sequences: 16 CTAs per split index; 8 splits of 2048 are exactly one wave of 128 CTAs,
  // where 9 shorter splits (144 CTAs) would need a second, nearly empty wave: the invariant length stays.
  EXPECT_EQ(cuda_plan::make_plan(plan_params(8, 128, 1, 32768, {2, 0, 1}), 132).split_len, 2048);
  // 128K on two ranks, one sequence: 64 splits of 1024 (one wave) beat 128 of 512 (two waves).
  EXPECT_EQ(cuda_plan::make_plan(plan_params(1, 128, 1, 131072, {2, 1, 1}), 132).split_len, 1024);
  // 64 sequences of 4K with 16 heads (16-row CTAs, two per SM): 4 splits of 1024 fill one wave of 264.
  EXPECT_EQ(cuda_plan::make_plan(plan_params(64, 16, 1, 4096), 264).split_len, 1024);
  // 64 sequences of 4K with 128 heads: 128 CTAs of one split each (one wave, no combine) beat 256 of
  // 2048 keys (two waves and a combine). 32 sequences of 16K keep 8 splits of 2048: several splits per
  // sequence are never longer than the invariant length.
  EXPECT_EQ(cuda_plan::make_plan(plan_params(64, 128, 1, 4096), 132).split_len, 4096);
  EXPECT_EQ(cuda_plan::make_plan(plan_params(64, 128, 1, 4096), 132).max_splits, 1);
  EXPECT_EQ(cuda_plan::make_plan(plan_params(32, 128, 1, 16384), 132).split_len, 2048);
  const int longest = cuda_plan::kFillMaxSplitFactor * 2048;
  // Never below kFillMinSplit, always a multiple of the tile, never above kFillMaxSplitFactor × the
  // invariant length, and longer than the invariant length only as one split per sequence.
  for (int len : {1, 100, 300, 1000, 5000, 70000, 1 << 20})
    for (int seqs : {1, 2, 7, 64, 300})
      for (int heads : {1, 16, 64, 128})
        for (int64_t wave : {0, 78, 132, 264, 1024}) {
          const cuda_plan::DecodePlan f = cuda_plan::make_plan(plan_params(seqs, heads, 1, len), wave);
          SCOPED_TRACE("len " + std::to_string(len) + " seqs " + std::to_string(seqs) + " heads " +
                       std::to_string(heads) + " wave " + std::to_string(wave));
          EXPECT_LE(f.split_len, longest);
          if (f.split_len > 2048) EXPECT_EQ(f.max_splits, 1);
          if (f.split_len != 2048) {
            EXPECT_GE(f.split_len, cuda_plan::kFillMinSplit);
            EXPECT_EQ(f.split_len % cuda_plan::kTileTokens, 0);
          }
          const int64_t base = int64_t(f.row_chunks) * seqs;
          if (base >= wave) EXPECT_EQ(f.split_len, 2048) << "a batch that fills the device keeps the invariant plan";
          // At most about two waves (or the invariant grid, or one split of every row chunk).
          if (f.split_len > cuda_plan::kFillMinSplit && f.split_len < 2048 && wave > 0)
            EXPECT_LE(f.grid, 2 * wave + base);
          if (f.max_splits > 1) EXPECT_GT(f.workspace_bytes, 0u);
        }
}

// ---- oracle ---------------------------------------------------------------------------------------

// fp32 out + natural LSE and bf16 out + base-2 LSE under kFillDevice, sentinel-guarded.
::testing::AssertionResult fill_matches_oracle(Backend& cuda, const synthetic::Config& cfg) {
  const synthetic::Problem prob = make_problem(cfg);
  const DecodeBuffers want = expected_decode(prob, LseBase::kE);
  const std::vector<float> want_out = want.out_float();
  const DeviceProblem dev(prob);
  const size_t T = size_t(prob.num_tokens()), H = size_t(cfg.num_heads);
  for (const auto& [dt, base] : {std::pair{DType::kFP32, LseBase::kE}, std::pair{DType::kBF16, LseBase::k2}}) {
    const std::string what = describe(cfg) + " split_policy=fill out=" + dtype_name(dt);
    GuardedBuffer out(dt, T * H * kLatentDim), lse(DType::kFP32, T * H);
    MlaDecodeParams p = dev.params(prob, out.data(), dt, lse.as<float>(), base);
    p.split_policy = SplitPolicy::kFillDevice;
    const Status s = run_device_decode(cuda, p);
    if (!s.ok()) return ::testing::AssertionFailure() << what << ": decode failed: " << s.to_string();
    ::testing::AssertionResult ok = ::testing::AssertionSuccess();
    const std::vector<float> got = out.download_float(&ok);
    if (!ok) return ::testing::AssertionFailure() << what << ": out " << ok.message();
    const Comparison c = compare(got, want_out, cuda_decode_tolerance(), "out", want.out_dims());
    if (!c.ok) return ::testing::AssertionFailure() << what << "\n  " << c.report;
    const std::vector<float> got_lse = lse.download_float(&ok);
    if (!ok) return ::testing::AssertionFailure() << what << ": lse " << ok.message();
    const Comparison l = compare(got_lse, lse_in_base(*want.lse, base), lse_tolerance(), "lse", want.lse_dims());
    if (!l.ok) return ::testing::AssertionFailure() << what << "\n  " << l.report;
  }
  return ::testing::AssertionSuccess();
}

// Workspace of the two policies for a problem: kFillDevice must plan more splits on these shapes.
void expect_more_splits(Backend& cuda, const synthetic::Config& cfg) {
  const synthetic::Problem prob = make_problem(cfg);
  MlaDecodeParams p = prob.params(nullptr, DType::kFP32, nullptr);
  p.split_policy = SplitPolicy::kBatchInvariant;
  const size_t inv = cuda.workspace_bytes(p);
  p.split_policy = SplitPolicy::kFillDevice;
  EXPECT_GT(cuda.workspace_bytes(p), inv) << describe(cfg) << ": kFillDevice should cut this shape finer";
}

struct Case {
  std::string name;
  synthetic::Config cfg;
};

// What gtest prints for a failing parameter: the case name and its shape, not the struct's bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name << " (" << describe(c.cfg) << ")"; }

std::vector<Case> fill_cases() {
  std::vector<Case> cases;
  uint64_t seed = 700;
  auto add = [&](std::string name, synthetic::Config c) {
    c.seed = ++seed;
    cases.push_back({std::move(name), std::move(c)});
  };
  add("one_seq_h16", config(16, 1, 64, {3000}, 0));
  add("one_seq_h128", config(128, 1, 64, {5000}, 0));  // 2 row chunks of 64 (the Hopper kernel on sm_90)
  add("two_seqs_h64_empty_rows", config(64, 1, 64, {4100, 0}, 0));
  add("qlen3_h32", config(32, 3, 32, {2600, 3, 700}, 0));  // causal rule across short splits
  add("qlen4_h8_fp8", config(8, 4, 64, {3300, 4}, 0, DType::kFP8E4M3));
  // DCP shards of one global problem: every rank, interleave 1 and 64, an empty shard, q_len 1 and 2.
  for (int il : {1, 64})
    for (int r = 0; r < 2; ++r)
      for (int q : {1, 2})
        add("dcp_w2_i" + std::to_string(il) + "_r" + std::to_string(r) + "_q" + std::to_string(q),
            config(128, q, 64, {q, 40, 6000}, 0, DType::kBF16, {2, r, il}));
  add("dcp_w4_i1_r3_fp8", config(16, 2, 64, {2, 9000}, 0, DType::kFP8E4M3, {4, 3, 1}));
  return cases;
}

class SplitPolicyOracle : public ::testing::TestWithParam<Case> {};

TEST_P(SplitPolicyOracle, FillDeviceMatchesReference) {
  MLADCP_SKIP_WITHOUT_GPU();
  auto cuda = make_backend("cuda");
  expect_more_splits(*cuda, GetParam().cfg);
  EXPECT_TRUE(fill_matches_oracle(*cuda, GetParam().cfg));
}

INSTANTIATE_TEST_SUITE_P(Shapes, SplitPolicyOracle, ::testing::ValuesIn(fill_cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

// Head groups with padded strides under both policies: CudaDecode.HeadGroupsWithPaddedStrides.

// kFillDevice is deterministic for a given batch, eager and in a CUDA graph.
TEST(SplitPolicy, FillDeviceDeterministicAndGraphCapturable) {
  MLADCP_SKIP_WITHOUT_GPU();
  const int H = 128;
  const synthetic::Problem prob = make_problem(config(H, 1, 64, {7000, 33}, 91));
  DeviceProblem dev(prob);
  auto cuda = make_backend("cuda");
  const size_t T = size_t(prob.num_tokens());
  GuardedBuffer out(DType::kBF16, T * H * kLatentDim), lse(DType::kFP32, T * H);
  MlaDecodeParams p = dev.params(prob, out.data(), DType::kBF16, lse.as<float>(), LseBase::kE);
  p.split_policy = SplitPolicy::kFillDevice;
  ::testing::AssertionResult ok = ::testing::AssertionSuccess();
  MLADCP_ASSERT_OK(run_device_decode(*cuda, p));
  std::vector<uint8_t> first_out, first_lse, out_bytes, lse_bytes;
  ASSERT_TRUE(out.download(&first_out));
  ASSERT_TRUE(lse.download(&first_lse));
  MLADCP_ASSERT_OK(run_device_decode(*cuda, p));
  ASSERT_TRUE(out.download(&out_bytes));
  ASSERT_TRUE(lse.download(&lse_bytes));
  EXPECT_EQ(out_bytes, first_out) << "two identical kFillDevice calls gave different bits";
  EXPECT_EQ(lse_bytes, first_lse) << "two identical kFillDevice calls gave different bits";

  DeviceBuffer ws;
  MLADCP_ASSERT_OK(ws.allocate(cuda->workspace_bytes(p)));
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ExecContext ctx;
  ctx.stream = stream;
  ctx.workspace = ws.data();
  ctx.workspace_size = ws.size();
  ASSERT_EQ(cudaMemsetAsync(p.out, 0, T * H * kLatentDim * 2, stream), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  const Status s = cuda->decode(p, ctx);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  MLADCP_ASSERT_OK(s);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ASSERT_TRUE(out.download(&out_bytes));
  ASSERT_TRUE(lse.download(&lse_bytes));
  EXPECT_EQ(out_bytes, first_out) << "the replayed graph differs from the eager call";
  EXPECT_EQ(lse_bytes, first_lse) << "the replayed graph differs from the eager call";
  (void)cudaGraphExecDestroy(exec);
  (void)cudaGraphDestroy(graph);
  (void)cudaStreamDestroy(stream);
  (void)ok;
}

// ---- validation ---------------------------------------------------------------------------------

// An unknown policy is an argument error naming split_policy on every backend, and writes nothing.
TEST(SplitPolicy, UnknownPolicyRejected) {
  const synthetic::Problem prob = make_problem(config(16, 1, 16, {40, 3}, 5));
  for (const char* name : {"cpu-reference", "cpu", "cuda"}) {
    if (std::string(name) == "cuda" && cuda_device_count() == 0) continue;
    auto be = make_backend(name);
    const size_t T = size_t(prob.num_tokens()), H = 16;
    if (std::string(name) == "cuda") {
      DeviceProblem dev(prob);
      GuardedBuffer out(DType::kFP32, T * H * kLatentDim), lse(DType::kFP32, T * H);
      MlaDecodeParams p = dev.params(prob, out.data(), DType::kFP32, lse.as<float>(), LseBase::kE);
      p.split_policy = static_cast<SplitPolicy>(7);
      const Status s = run_device_decode(*be, p);
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << name << ": " << s.to_string();
      EXPECT_NE(s.message().find("split_policy"), std::string::npos) << name << ": " << s.to_string();
      ::testing::AssertionResult ok = ::testing::AssertionSuccess();
      const std::vector<float> got = out.download_float(&ok);
      EXPECT_EQ(count_sentinels(got), got.size()) << name << ": out written on an argument error";
    } else {
      std::vector<float> out(T * H * kLatentDim), lse(T * H);
      fill_sentinel(out.data(), DType::kFP32, out.size());
      fill_sentinel(lse.data(), DType::kFP32, lse.size());
      MlaDecodeParams p = prob.params(out.data(), DType::kFP32, lse.data());
      p.split_policy = static_cast<SplitPolicy>(-1);
      ExecContext ctx;
      const Status s = be->decode(p, ctx);
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << name << ": " << s.to_string();
      EXPECT_NE(s.message().find("split_policy"), std::string::npos) << name << ": " << s.to_string();
      EXPECT_EQ(count_sentinels(out), out.size()) << name << ": out written on an argument error";
      // A valid policy is accepted (and ignored) by host backends.
      p.split_policy = SplitPolicy::kFillDevice;
      EXPECT_TRUE(be->decode(p, ctx).ok()) << name;
    }
  }
}

}  // namespace
}  // namespace mladcp::test
