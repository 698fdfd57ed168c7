// The seed's decision: MlaAttention derives need_to_return_lse_for_decode = (W > 1 &&
// can_return_lse_for_decode), asks the kernel for the LSE only then, and refuses DCP on a backend
// that cannot return it. Tested with a backend that declares the capability as the test needs and
// delegates its math to "cpu", recording what the kernel was asked for.
#include "mladcp/attention.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/decode_check.h"

namespace mladcp::test {
namespace {

// What the kernel saw, shared with the test after the backend moved into MlaAttention.
struct CallLog {
  int calls = 0;
  std::vector<const float*> lse_seen;
  std::vector<LseBase> base_seen;
  std::vector<DcpShard> shard_seen;
};

class RecordingBackend final : public Backend {
 public:
  RecordingBackend(std::string name, bool can_return_lse, std::shared_ptr<CallLog> log)
      : inner_(make_backend("cpu")), log_(std::move(log)) {
    caps_ = inner_->capabilities();
    caps_.name = std::move(name);
    caps_.description = "test backend delegating to cpu";
    caps_.can_return_lse_for_decode = can_return_lse;
  }
  const BackendCapabilities& capabilities() const override { return caps_; }
  Status decode(const MlaDecodeParams& p, const ExecContext& ctx) override {
    MLADCP_RETURN_IF_ERROR(validate_decode(p, caps_));
    ++log_->calls;
    log_->lse_seen.push_back(p.lse);
    log_->base_seen.push_back(p.lse_base);
    log_->shard_seen.push_back(p.shard);
    return inner_->decode(p, ctx);
  }
  Status merge(const MergeParams& p, const ExecContext& ctx) override { return inner_->merge(p, ctx); }
  Status rescale(const RescaleParams& p, const ExecContext& ctx) override { return inner_->rescale(p, ctx); }

 private:
  std::unique_ptr<Backend> inner_;
  std::shared_ptr<CallLog> log_;
  BackendCapabilities caps_;
};

synthetic::Config config_for(const DcpShard& shard) {
  synthetic::Config c;
  c.seed = 77;
  c.num_seqs = 2;
  c.q_len = 2;
  c.num_heads = 8;
  c.block_size = 16;
  c.seq_lens = {50, 9};
  c.shard = shard;
  return c;
}

TEST(AttentionTest, DcpOnABackendWithoutLseFailsAtConstructionNamingBackendAndWayOut) {
  for (int world : {2, 4}) {
    auto log = std::make_shared<CallLog>();
    std::unique_ptr<MlaAttention> attn;
    const Status s = MlaAttention::create(std::make_unique<RecordingBackend>("no-lse-test", false, log),
                                          DcpShard{world, 1, 1}, &attn);
    EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.to_string();
    EXPECT_NE(s.message().find("no-lse-test"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("can_return_lse_for_decode"), std::string::npos) << s.message();
    // The way out: another backend, or no DCP.
    EXPECT_NE(s.message().find("shard.world=1"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("backend"), std::string::npos) << s.message();
    EXPECT_EQ(attn, nullptr);
    EXPECT_EQ(log->calls, 0);
  }
}

TEST(AttentionTest, WithoutDcpTheKernelIsNotAskedForLse) {
  for (bool capable : {false, true}) {
    auto log = std::make_shared<CallLog>();
    std::unique_ptr<MlaAttention> attn;
    ASSERT_TRUE(MlaAttention::create(std::make_unique<RecordingBackend>("rec", capable, log), DcpShard{}, &attn).ok());
    EXPECT_FALSE(attn->need_to_return_lse_for_decode());
    const synthetic::Problem pr = make_problem(config_for(DcpShard{}));
    DecodeBuffers got(pr.num_tokens(), 8, DType::kFP32, std::nullopt);
    std::vector<float> scratch(size_t(pr.num_tokens()) * 8);
    fill_sentinel(scratch);
    ASSERT_TRUE(attn->decode(pr.params(got.out.data(), DType::kFP32, nullptr), {}, scratch.data()).ok());
    ASSERT_EQ(log->calls, 1);
    EXPECT_EQ(log->lse_seen[0], nullptr) << "capable=" << capable;
    EXPECT_EQ(count_sentinels(scratch), scratch.size());  // the scratch was not used
    EXPECT_TRUE(compare_decode(got, expected_decode(pr, std::nullopt), "world 1 through MlaAttention"));
  }
}

TEST(AttentionTest, WithDcpOnACapableBackendTheKernelReturnsLse) {
  for (int world : {2, 3}) {
    for (int rank = 0; rank < world; ++rank) {
      auto log = std::make_shared<CallLog>();
      const DcpShard shard{world, rank, 2};
      std::unique_ptr<MlaAttention> attn;
      ASSERT_TRUE(MlaAttention::create(std::make_unique<RecordingBackend>("rec", true, log), shard, &attn).ok());
      EXPECT_TRUE(attn->need_to_return_lse_for_decode());
      const synthetic::Problem pr = make_problem(config_for(shard));
      DecodeBuffers got(pr.num_tokens(), 8, DType::kFP32, std::nullopt);
      std::vector<float> scratch(size_t(pr.num_tokens()) * 8);
      fill_sentinel(scratch);
      MlaDecodeParams p = pr.params(got.out.data(), DType::kFP32, nullptr);
      p.shard = DcpShard{};  // the attention object applies its own shard
      ASSERT_TRUE(attn->decode(p, {}, scratch.data()).ok());
      ASSERT_EQ(log->calls, 1);
      EXPECT_EQ(log->lse_seen[0], scratch.data());
      EXPECT_EQ(log->base_seen[0], attn->lse_base());
      EXPECT_EQ(log->shard_seen[0].world, world);
      EXPECT_EQ(log->shard_seen[0].rank, rank);
      EXPECT_EQ(log->shard_seen[0].interleave, 2);
      // The LSE landed in the scratch and matches the oracle's on this shard.
      const DecodeBuffers want = expected_decode(pr, attn->lse_base());
      got.lse = scratch;
      got.lse_base = attn->lse_base();
      EXPECT_TRUE(compare_decode(got, want, "DCP shard through MlaAttention"));

      // Needing the LSE without somewhere to put it is an argument error, and nothing runs.
      const Status s = attn->decode(p, {}, nullptr);
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
      EXPECT_NE(s.message().find("lse_scratch"), std::string::npos) << s.message();
      EXPECT_EQ(log->calls, 1);
    }
  }
}

TEST(AttentionTest, MalformedShardIsRejected) {
  auto log = std::make_shared<CallLog>();
  for (const DcpShard& bad : {DcpShard{0, 0, 1}, DcpShard{2, 2, 1}, DcpShard{2, -1, 1}, DcpShard{2, 0, 0}}) {
    std::unique_ptr<MlaAttention> attn;
    const Status s = MlaAttention::create(std::make_unique<RecordingBackend>("rec", true, log), bad, &attn);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
    EXPECT_NE(s.message().find("shard."), std::string::npos) << s.message();
  }
  std::unique_ptr<MlaAttention> attn;
  EXPECT_EQ(MlaAttention::create(nullptr, DcpShard{}, &attn).code(), StatusCode::kInvalidArgument);
}

// Every registered host backend declares what DCP needs, so DCP works on each of them.
TEST(AttentionTest, BuiltInHostBackendsSupportDcp) {
  for (const std::string& name : host_backend_names()) {
    std::unique_ptr<MlaAttention> attn;
    const Status s = MlaAttention::create(make_backend(name), DcpShard{4, 3, 1}, &attn);
    EXPECT_TRUE(s.ok()) << name << ": " << s.to_string();
    if (s.ok()) EXPECT_TRUE(attn->need_to_return_lse_for_decode()) << name;
  }
}

}  // namespace
}  // namespace mladcp::test
