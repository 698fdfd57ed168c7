// Every validation error of decode (validate_decode, check_host_indices) and merge (validate):
// each bad argument returns kInvalidArgument or kUnsupported with the argument's name in the
// message, and nothing is written (outputs stay sentinel-filled).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "common/decode_check.h"
#include "mladcp/merge.h"
#include "testkit/dcp_command.h"

namespace mladcp::test {
namespace {

struct BadDecode {
  std::string name;  // must appear in the message
  std::function<void(MlaDecodeParams&)> mutate;
  StatusCode code = StatusCode::kInvalidArgument;
};

std::vector<BadDecode> bad_decodes() {
  using P = MlaDecodeParams&;
  return {
      {"num_seqs", [](P p) { p.num_seqs = -1; }},
      {"q_len", [](P p) { p.q_len = 0; }},
      {"q_len", [](P p) { p.q_len = kMaxQLen + 1; }},
      {"num_heads", [](P p) { p.num_heads = 0; }},
      {"num_heads", [](P p) { p.num_heads = kMaxHeads + 1; }},
      {"head_group_size", [](P p) { p.head_group_size = 3; }},
      {"head_group_size", [](P p) { p.head_group_size = -1; }},
      {"shard.world", [](P p) { p.shard.world = 0; }},
      {"shard.rank", [](P p) { p.shard.rank = 2; }},
      {"shard.rank", [](P p) { p.shard.rank = -1; }},
      {"shard.interleave", [](P p) { p.shard.interleave = 0; }},
      {"q_dtype", [](P p) { p.q_dtype = DType::kFP32; }},
      {"kv_dtype", [](P p) { p.kv_dtype = DType::kFP16; }},
      {"out_dtype", [](P p) { p.out_dtype = DType::kFP8E4M3; }},
      {"block_size", [](P p) { p.block_size = 0; }},
      {"block_size", [](P p) { p.shard.interleave = 3; }},  // 16 is not a multiple of 3
      {"softmax_scale", [](P p) { p.softmax_scale = 0.0f; }},
      {"softmax_scale", [](P p) { p.softmax_scale = NAN; }},
      {"softmax_scale", [](P p) { p.softmax_scale = INFINITY; }},
      {"kv_scale", [](P p) { p.kv_scale = 0.0f; }},
      {"kv_scale", [](P p) { p.kv_scale = NAN; }},
      {"kv_scale", [](P p) { p.kv_scale = 2.0f; }},  // a bf16 cache takes no scale
      {"max_seq_len", [](P p) { p.max_seq_len = -1; }},
      {"max_seq_len", [](P p) { p.max_seq_len = 1 << 20; }},  // more blocks than the table holds
      {"q:", [](P p) { p.q = nullptr; }},
      {"out:", [](P p) { p.out = nullptr; }},
      {"seq_lens", [](P p) { p.seq_lens = nullptr; }},
      {"num_blocks", [](P p) { p.num_blocks = -1; }},
      {"kv_cache", [](P p) { p.kv_cache = nullptr; }},
      {"max_blocks_per_seq", [](P p) { p.max_blocks_per_seq = -1; }},
      {"block_table", [](P p) { p.block_table = nullptr; }},
      {"q_stride_head", [](P p) { p.q_stride_head = 575; }},
      {"q_stride_token", [](P p) { p.q_stride_token = 576; }},
      {"kv_stride_token", [](P p) { p.kv_stride_token = 100; }},
      {"kv_stride_block", [](P p) { p.kv_stride_block = 576; }},
      {"block_table_stride", [](P p) { p.block_table_stride = 1; }},
      {"out_stride_head", [](P p) { p.out_stride_head = 511; }},
      {"out_stride_token", [](P p) { p.out_stride_token = 512; }},
      {"lse_stride_token", [](P p) { p.lse_stride_token = 1; }},
      // Enum fields holding a value outside the enum (a caller's cast or an uninitialized field).
      {"lse_base", [](P p) { p.lse_base = static_cast<LseBase>(7); }},
      {"lse_base", [](P p) { p.lse_base = static_cast<LseBase>(-1); }},
      {"q_dtype", [](P p) { p.q_dtype = static_cast<DType>(9); }},
      {"kv_dtype", [](P p) { p.kv_dtype = static_cast<DType>(-3); }},
      {"out_dtype", [](P p) { p.out_dtype = static_cast<DType>(42); }},
      {"split_policy", [](P p) { p.split_policy = static_cast<SplitPolicy>(2); }},
  };
}

// Problems whose indices are wrong: check_host_indices() catches them (the index is in the message).
struct BadIndices {
  std::string name;
  std::function<void(synthetic::Problem&, MlaDecodeParams&)> mutate;
};

std::vector<BadIndices> bad_indices() {
  using Pr = synthetic::Problem&;
  using P = MlaDecodeParams&;
  return {
      {"seq_lens[1]", [](Pr pr, P) { pr.seq_lens[1] = -1; }},
      {"seq_lens[2]", [](Pr pr, P) { pr.seq_lens[2] = pr.max_seq_len + 1; }},
      {"seq_lens[0]", [](Pr pr, P) { pr.seq_lens[0] = 1; }},  // q_len is 2: a non-empty sequence holds its new tokens
      {"seq_lens[2]",
       [](Pr pr, P p) {
         p.max_seq_len = 0;  // unknown bound: the host check sees the table is too short
         pr.seq_lens[2] = 1 << 20;
       }},
      {"block_table[0][0]", [](Pr pr, P) { pr.block_table[0] = pr.num_blocks; }},
      {"block_table[2][1]", [](Pr pr, P) { pr.block_table[size_t(2) * pr.max_blocks_per_seq + 1] = -1; }},
  };
}

synthetic::Config small_config() {
  synthetic::Config c;
  c.seed = 5;
  c.num_seqs = 3;
  c.q_len = 2;
  c.num_heads = 4;
  c.block_size = 16;
  c.seq_lens = {5, 0, 40};
  return c;
}

TEST(ValidationTest, EveryBadDecodeArgumentIsNamedAndNothingIsWritten) {
  for (const std::string& backend_name : host_backend_names()) {
    std::unique_ptr<Backend> backend = make_backend(backend_name);
    for (const BadDecode& bad : bad_decodes()) {
      const synthetic::Problem pr = make_problem(small_config());
      DecodeBuffers buf(pr.num_tokens(), 4, DType::kFP32, LseBase::kE);
      MlaDecodeParams p = pr.params(buf.out.data(), DType::kFP32, buf.lse_ptr());
      bad.mutate(p);
      const Status s = backend->decode(p, {});
      EXPECT_EQ(s.code(), bad.code) << backend_name << " / " << bad.name << ": " << s.to_string();
      EXPECT_NE(s.message().find(bad.name), std::string::npos)
          << backend_name << ": '" << s.message() << "' does not name " << bad.name;
      EXPECT_TRUE(buf.untouched()) << backend_name << " wrote outputs on error " << bad.name;
    }
  }
}

TEST(ValidationTest, EveryBadIndexIsNamedAndNothingIsWritten) {
  for (const std::string& backend_name : host_backend_names()) {
    std::unique_ptr<Backend> backend = make_backend(backend_name);
    for (const BadIndices& bad : bad_indices()) {
      synthetic::Problem pr = make_problem(small_config());
      DecodeBuffers buf(pr.num_tokens(), 4, DType::kBF16, LseBase::k2);
      MlaDecodeParams p = pr.params(buf.out.data(), DType::kBF16, buf.lse_ptr(), LseBase::k2);
      bad.mutate(pr, p);
      const Status s = backend->decode(p, {});
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << backend_name << " / " << bad.name << ": " << s.to_string();
      EXPECT_NE(s.message().find(bad.name), std::string::npos)
          << backend_name << ": '" << s.message() << "' does not name " << bad.name;
      EXPECT_TRUE(buf.untouched()) << backend_name << " wrote outputs on error " << bad.name;
    }
  }
}

// Unchecked block ids are the caller's promise: with check_block_ids = false an out-of-range id in
// an unused entry is still fine, and the check is skipped.
TEST(ValidationTest, BlockIdCheckCanBeTurnedOff) {
  synthetic::Problem pr = make_problem(small_config());
  pr.block_table[size_t(1) * pr.max_blocks_per_seq] = -5;  // sequence 1 is empty: the entry is unused
  for (const std::string& backend_name : host_backend_names()) {
    std::unique_ptr<Backend> backend = make_backend(backend_name);
    DecodeBuffers buf(pr.num_tokens(), 4, DType::kFP32, LseBase::kE);
    MlaDecodeParams p = pr.params(buf.out.data(), DType::kFP32, buf.lse_ptr());
    p.check_block_ids = false;
    EXPECT_TRUE(backend->decode(p, {}).ok()) << backend_name;
    EXPECT_EQ(count_sentinels(buf.out.data(), DType::kFP32, buf.out_elems()), 0u);
  }
}

// Capability checks, through validate_decode with declared capabilities.
TEST(ValidationTest, CapabilityLimitsAreNamed) {
  const synthetic::Problem pr = make_problem(small_config());
  std::vector<float> out(size_t(pr.num_tokens()) * 4 * kLatentDim), lse(size_t(pr.num_tokens()) * 4);
  BackendCapabilities caps;
  caps.name = "narrow";
  caps.q_dtypes = {DType::kBF16};
  caps.kv_dtypes = {DType::kBF16};
  caps.out_dtypes = {DType::kFP32};
  caps.block_sizes = {64};
  caps.can_return_lse_for_decode = false;
  caps.supports_dcp_interleave = false;
  caps.max_q_len = 1;
  MlaDecodeParams p = pr.params(out.data(), DType::kFP32, nullptr);
  p.q_len = 1;
  {
    const Status s = validate_decode(p, caps);
    EXPECT_NE(s.message().find("block_size"), std::string::npos) << s.to_string();
    EXPECT_NE(s.message().find("64"), std::string::npos) << s.to_string();
    EXPECT_NE(s.message().find("narrow"), std::string::npos) << s.to_string();
  }
  caps.block_sizes = {};
  {
    MlaDecodeParams q = p;
    q.q_len = 2;
    const Status s = validate_decode(q, caps);
    EXPECT_NE(s.message().find("q_len"), std::string::npos) << s.to_string();
  }
  {
    MlaDecodeParams q = p;
    q.lse = lse.data();
    const Status s = validate_decode(q, caps);
    EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.to_string();
    EXPECT_NE(s.message().find("lse"), std::string::npos) << s.to_string();
  }
  caps.can_return_lse_for_decode = true;
  caps.native_lse_base = LseBase::k2;
  caps.lse_base_selectable = false;
  {
    MlaDecodeParams q = p;
    q.lse = lse.data();
    q.lse_base = LseBase::kE;
    const Status s = validate_decode(q, caps);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
    EXPECT_NE(s.message().find("lse_base"), std::string::npos) << s.to_string();
  }
  {
    MlaDecodeParams q = p;
    q.shard = DcpShard{2, 0, 2};
    const Status s = validate_decode(q, caps);
    EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.to_string();
    EXPECT_NE(s.message().find("shard.interleave"), std::string::npos) << s.to_string();
  }
}

// A call with no sequences is valid and writes nothing.
TEST(ValidationTest, NoSequencesIsANoOp) {
  for (const std::string& backend_name : host_backend_names()) {
    std::unique_ptr<Backend> backend = make_backend(backend_name);
    MlaDecodeParams p;
    p.num_seqs = 0;
    p.num_heads = 16;
    p.block_size = 64;
    p.softmax_scale = 0.1f;
    EXPECT_TRUE(backend->decode(p, {}).ok()) << backend_name;
  }
}

// Synthetic problems are sized in 64 bits: a cache that int32 block ids cannot index is an error
// naming the arguments, not an overflow, an exception or an abort.
TEST(ValidationTest, SyntheticProblemTooLargeForInt32BlockIdsIsAnError) {
  synthetic::Config c;
  c.num_seqs = 1000;
  c.num_heads = 1;
  c.block_size = 64;
  c.seq_lens.assign(1000, 1 << 30);
  synthetic::Problem p;
  const Status s = synthetic::make_problem(c, &p);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("seq_lens, block_size=64"), std::string::npos) << s.message();
  EXPECT_TRUE(p.kv_cache.empty());
}

// `mladcp dcp` ranks agree on their flags: the error names each differing flag with every rank's value.
TEST(ValidationTest, DcpFlagAgreementNamesEachDifferingFlag) {
  testkit::DcpCommandOptions a, b;
  a.iters = 2;
  b.iters = 5;
  b.merge = "ag-rs";
  const std::vector<testkit::SharedFlag> mine = testkit::shared_flags(a);
  std::vector<double> all;
  for (const auto& f : mine) all.push_back(f.value);
  EXPECT_TRUE(testkit::flags_agree(mine, all, 1, 0).ok());
  for (const auto& f : testkit::shared_flags(b)) all.push_back(f.value);
  const Status s = testkit::flags_agree(mine, all, 2, 0);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("--iters (rank 0: 2, rank 1: 5)"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("--merge (a2a on rank 0, another value elsewhere)"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find("--heads"), std::string::npos) << s.message();
}

struct BadMerge {
  std::string name;
  std::function<void(MergeParams&)> mutate;
};

TEST(ValidationTest, EveryBadMergeArgumentIsNamedAndNothingIsWritten) {
  const std::vector<BadMerge> cases = {
      {"num_states", [](MergeParams& m) { m.num_states = 0; }},
      {"num_tokens", [](MergeParams& m) { m.num_tokens = -1; }},
      {"num_heads", [](MergeParams& m) { m.num_heads = 0; }},
      {"head_dim", [](MergeParams& m) { m.head_dim = 0; }},
      {"in_dtype", [](MergeParams& m) { m.in_dtype = DType::kFP8E4M3; }},
      {"out_dtype", [](MergeParams& m) { m.out_dtype = DType::kFP8E4M3; }},
      {"in_out", [](MergeParams& m) { m.in_out = nullptr; }},
      {"in_lse", [](MergeParams& m) { m.in_lse = nullptr; }},
      {"out:", [](MergeParams& m) { m.out = nullptr; }},
      {"in_dtype", [](MergeParams& m) { m.in_dtype = static_cast<DType>(17); }},
      {"in_base", [](MergeParams& m) { m.in_base = static_cast<LseBase>(2); }},
      {"in_base", [](MergeParams& m) { m.in_base = static_cast<LseBase>(-1); }},
      {"out_base", [](MergeParams& m) { m.out_base = static_cast<LseBase>(5); }},
  };
  std::vector<float> in(2 * 3 * 4 * 8, 1.0f), in_lse(2 * 3 * 4, 0.5f);
  for (const std::string& backend_name : host_backend_names()) {
    std::unique_ptr<Backend> backend = make_backend(backend_name);
    for (const BadMerge& bad : cases) {
      std::vector<float> out(3 * 4 * 8), out_lse(3 * 4);
      fill_sentinel(out);
      fill_sentinel(out_lse);
      MergeParams m;
      m.num_states = 2;
      m.num_tokens = 3;
      m.num_heads = 4;
      m.head_dim = 8;
      m.in_out = in.data();
      m.in_lse = in_lse.data();
      m.out = out.data();
      m.out_dtype = DType::kFP32;
      m.out_lse = out_lse.data();
      ASSERT_TRUE(validate(m).ok());
      bad.mutate(m);
      for (const Status& s : {backend->merge(m, {}), merge_states_host(m)}) {
        EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad.name << ": " << s.to_string();
        EXPECT_NE(s.message().find(bad.name), std::string::npos)
            << "'" << s.message() << "' does not name " << bad.name;
      }
      EXPECT_EQ(count_sentinels(out), out.size()) << backend_name << " / " << bad.name;
      EXPECT_EQ(count_sentinels(out_lse), out_lse.size()) << backend_name << " / " << bad.name;
    }
  }
}

struct BadRescale {
  std::string name;
  std::function<void(RescaleParams&)> mutate;
};

TEST(ValidationTest, EveryBadRescaleArgumentIsNamedAndNothingIsWritten) {
  const std::vector<BadRescale> cases = {
      {"world", [](RescaleParams& r) { r.world = 0; }},
      {"rank", [](RescaleParams& r) { r.rank = 2; }},
      {"rank", [](RescaleParams& r) { r.rank = -1; }},
      {"rows", [](RescaleParams& r) { r.rows = -1; }},
      {"head_dim", [](RescaleParams& r) { r.head_dim = 0; }},
      {"out_dtype", [](RescaleParams& r) { r.out_dtype = DType::kFP8E4M3; }},
      {"all_lse", [](RescaleParams& r) { r.all_lse = nullptr; }},
      {"out:", [](RescaleParams& r) { r.out = nullptr; }},
      {"base=", [](RescaleParams& r) { r.base = static_cast<LseBase>(2); }},
      {"out_dtype", [](RescaleParams& r) { r.out_dtype = static_cast<DType>(11); }},
  };
  std::vector<float> all_lse(2 * 3 * 4, 0.5f);
  for (const std::string& backend_name : host_backend_names()) {
    std::unique_ptr<Backend> backend = make_backend(backend_name);
    for (const BadRescale& bad : cases) {
      std::vector<float> out(3 * 4 * 8), merged(3 * 4);
      fill_sentinel(out);
      fill_sentinel(merged);
      RescaleParams r;
      r.world = 2;
      r.rank = 1;
      r.rows = 3 * 4;
      r.head_dim = 8;
      r.all_lse = all_lse.data();
      r.out = out.data();
      r.out_dtype = DType::kFP32;
      r.merged_lse = merged.data();
      ASSERT_TRUE(validate(r).ok());
      bad.mutate(r);
      for (const Status& s : {backend->rescale(r, {}), rescale_states_host(r)}) {
        EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad.name << ": " << s.to_string();
        EXPECT_NE(s.message().find(bad.name), std::string::npos)
            << "'" << s.message() << "' does not name " << bad.name;
      }
      EXPECT_EQ(count_sentinels(out), out.size()) << backend_name << " / " << bad.name;
      EXPECT_EQ(count_sentinels(merged), merged.size()) << backend_name << " / " << bad.name;
    }
  }
}

}  // namespace
}  // namespace mladcp::test
