// The DCP decode step in one process: W threads, each a rank with its own backend, decoder and shard,
// over the in-process thread communicator. Covers correctness against single-rank decode (both merge
// modes), the validation agreement (shared and rank-local errors, nothing written), determinism, and
// faults (a stalled peer, a peer that leaves mid-step) with their deadlines.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <thread>

#include "common/decode_check.h"
#include "dcp/dcp_case.h"
#include "dcp/thread_communicator.h"
#include "mladcp/dcp.h"

namespace mladcp::test {
namespace {

using Clock = std::chrono::steady_clock;

// Runs body(rank, comm) on W threads, one per rank of a fresh thread group.
void run_ranks(int world, const std::function<void(int, Communicator&)>& body) {
  auto comms = make_thread_communicators(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back([&, r] { body(r, *comms[size_t(r)]); });
  for (auto& t : threads) t.join();
}

DcpCase small_case(DcpMergeMode mode) {
  DcpCase c;
  c.local_heads = 2;
  c.q_len = 2;
  c.interleave = 2;
  c.block_size = 8;
  c.seq_lens = {0, 2, 9, 37};
  c.mode = mode;
  c.seed = 42;
  return c;
}

class DcpStepSweep : public ::testing::TestWithParam<int> {};

TEST_P(DcpStepSweep, MatchesSingleRankDecode) {
  const int W = GetParam();
  for (const DcpCase& c : sweep_cases(W, /*quick=*/true)) {
    run_ranks(W, [&](int, Communicator& comm) { EXPECT_TRUE(dcp_matches_single_rank(comm, c)); });
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, DcpStepSweep, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "W" + std::to_string(info.param); });

TEST(DcpStep, AllToAllIsBitwiseDeterministic) {
  for (int W : {2, 3}) {
    DcpCase c = small_case(DcpMergeMode::kAllToAll);
    c.out_dtype = DType::kFP32;
    run_ranks(W, [&](int r, Communicator& comm) {
      const DcpRun a = run_dcp(comm, c);
      const DcpRun b = run_dcp(comm, c);
      ASSERT_TRUE(a.status.ok() && b.status.ok()) << a.status.to_string() << " / " << b.status.to_string();
      EXPECT_TRUE(a.out == b.out) << describe(c, W) << " rank " << r << ": outputs differ between runs";
      EXPECT_EQ(std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * 4), 0) << describe(c, W) << " rank " << r;
    });
  }
}

// Both merge modes agree with each other (fp32 outputs), not only with the single-rank decode.
TEST(DcpStep, MergeModesAgree) {
  const int W = 3;
  DcpCase a = small_case(DcpMergeMode::kAllToAll), g = small_case(DcpMergeMode::kAllGatherReduceScatter);
  a.out_dtype = g.out_dtype = DType::kFP32;
  run_ranks(W, [&](int r, Communicator& comm) {
    const DcpRun x = run_dcp(comm, a), y = run_dcp(comm, g);
    ASSERT_TRUE(x.status.ok() && y.status.ok());
    const auto fx = to_float(x.out.data(), DType::kFP32, x.out.size() / 4);
    const auto fy = to_float(y.out.data(), DType::kFP32, y.out.size() / 4);
    const Comparison c = compare(fx, fy, output_tolerance(DType::kFP32), "a2a vs ag-rs rank " + std::to_string(r));
    EXPECT_TRUE(c.ok) << c.report;
    const Comparison l = compare(x.lse, y.lse, lse_tolerance(), "lse a2a vs ag-rs");
    EXPECT_TRUE(l.ok) << l.report;
  });
}

// ---- Validation: an error on every rank, nothing written, no hang --------------------------------

// A DCP step over a hand-made shard whose params each rank may spoil before calling decode.
struct Manual {
  synthetic::Problem shard;
  std::vector<uint16_t> q;
  std::vector<uint8_t> out;
  std::vector<float> lse;
  std::vector<uint8_t> workspace;
  MlaDecodeParams p;
  ExecContext ctx;
  std::unique_ptr<DcpDecoder> dcp;

  Manual(Communicator& comm, const DcpCase& c) {
    const int W = comm.world_size();
    synthetic::Config cfg;
    cfg.num_seqs = int(c.seq_lens.size());
    cfg.q_len = c.q_len;
    cfg.num_heads = c.local_heads * W;
    cfg.block_size = c.block_size;
    cfg.seq_lens = c.seq_lens;
    cfg.shard = {W, comm.rank(), c.interleave};
    cfg.seed = c.seed;
    shard = make_problem(cfg);
    const int T = shard.num_tokens();
    q.assign(size_t(T) * c.local_heads * kQkDim, 0x3f80);
    out.resize(size_t(T) * c.local_heads * kLatentDim * 2);
    lse.resize(size_t(T) * c.local_heads);
    fill_sentinel(out.data(), DType::kBF16, out.size() / 2);
    fill_sentinel(lse);
    DcpConfig dc;
    dc.merge_mode = c.mode;
    dc.interleave = c.interleave;
    dc.deadline = std::chrono::milliseconds(20000);
    const Status s = DcpDecoder::create(make_backend(default_backend()), &comm, dc, &dcp);
    EXPECT_TRUE(s.ok()) << s.to_string();
    p = shard.params(out.data(), DType::kBF16, lse.data());
    p.num_heads = c.local_heads;
    p.q = q.data();
    workspace.assign(dcp->workspace_bytes(p), 0);
    ctx.workspace = workspace.data();
    ctx.workspace_size = workspace.size();
  }
  bool untouched() const {
    return count_sentinels(out.data(), DType::kBF16, out.size() / 2) == out.size() / 2 &&
           count_sentinels(lse) == lse.size();
  }
};

TEST(DcpStepValidation, SharedBadArgumentFailsOnEveryRank) {
  for (DcpMergeMode mode : {DcpMergeMode::kAllToAll, DcpMergeMode::kAllGatherReduceScatter}) {
    run_ranks(3, [&](int, Communicator& comm) {
      Manual m(comm, small_case(mode));
      m.p.out_dtype = DType::kFP8E4M3;
      const Status s = m.dcp->decode(m.p, m.ctx);
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
      EXPECT_NE(s.message().find("out_dtype"), std::string::npos) << s.message();
      EXPECT_TRUE(m.untouched());
      // The group is still usable afterwards.
      m.p.out_dtype = DType::kBF16;
      EXPECT_TRUE(m.dcp->decode(m.p, m.ctx).ok());
    });
  }
}

// An LSE base outside the enum is rejected before any data moves: named, nothing written, the group
// still usable.
TEST(DcpStepValidation, OutOfRangeLseBaseFailsOnEveryRankBeforeAnyExchange) {
  for (DcpMergeMode mode : {DcpMergeMode::kAllToAll, DcpMergeMode::kAllGatherReduceScatter}) {
    run_ranks(2, [&](int, Communicator& comm) {
      Manual m(comm, small_case(mode));
      m.p.lse_base = static_cast<LseBase>(3);
      const Status s = m.dcp->decode(m.p, m.ctx);
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
      EXPECT_NE(s.message().find("lse_base=3"), std::string::npos) << s.message();
      EXPECT_TRUE(m.untouched());
      m.p.lse_base = LseBase::k2;
      EXPECT_TRUE(m.dcp->decode(m.p, m.ctx).ok());
    });
  }
}

TEST(DcpStepValidation, RankLocalBadBlockIdFailsEverywhereNamingTheRank) {
  for (DcpMergeMode mode : {DcpMergeMode::kAllToAll, DcpMergeMode::kAllGatherReduceScatter}) {
    run_ranks(3, [&](int r, Communicator& comm) {
      Manual m(comm, small_case(mode));
      // Sequence 3 (37 tokens) has local tokens on every rank; rank 1's table names a block it lacks.
      if (r == 1) m.shard.block_table[size_t(3) * m.shard.max_blocks_per_seq] = m.shard.num_blocks + 5;
      const Status s = m.dcp->decode(m.p, m.ctx);
      if (r == 1) {
        EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
        EXPECT_NE(s.message().find("block_table[3][0]"), std::string::npos) << s.message();
      } else {
        EXPECT_EQ(s.code(), StatusCode::kRemoteError) << s.to_string();
        EXPECT_NE(s.message().find("rank 1 of 3"), std::string::npos) << s.message();
      }
      EXPECT_TRUE(m.untouched()) << "rank " << r;
      EXPECT_TRUE(comm.health().ok());
    });
  }
}

TEST(DcpStepValidation, SmallWorkspaceOnOneRankFailsEverywhere) {
  run_ranks(2, [&](int r, Communicator& comm) {
    Manual m(comm, small_case(DcpMergeMode::kAllToAll));
    if (r == 0) m.ctx.workspace_size -= 1;
    const Status s = m.dcp->decode(m.p, m.ctx);
    EXPECT_EQ(s.code(), r == 0 ? StatusCode::kInvalidArgument : StatusCode::kRemoteError) << s.to_string();
    if (r == 0) EXPECT_NE(s.message().find("workspace"), std::string::npos) << s.message();
    EXPECT_TRUE(m.untouched());
  });
}

TEST(DcpStepValidation, RanksDisagreeingOnSeqLensFail) {
  run_ranks(3, [&](int r, Communicator& comm) {
    Manual m(comm, small_case(DcpMergeMode::kAllGatherReduceScatter));
    std::vector<int32_t> lens = m.shard.seq_lens;
    if (r == 2) lens[3] -= 1;
    m.p.seq_lens = lens.data();
    const Status s = m.dcp->decode(m.p, m.ctx);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
    EXPECT_NE(s.message().find("disagree"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("seq_lens (rank 0: hash"), std::string::npos) << s.message();
    EXPECT_TRUE(m.untouched());
  });
}

// A shard in the call that is not the decoder's is an error, not silently replaced.
TEST(DcpStepValidation, ForeignShardInTheCallIsRejected) {
  run_ranks(2, [&](int r, Communicator& comm) {
    Manual m(comm, small_case(DcpMergeMode::kAllToAll));
    m.p.shard = DcpShard{2, 1 - r, 2};
    const Status s = m.dcp->decode(m.p, m.ctx);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
    EXPECT_NE(s.message().find("differs from the shard this object was created with"), std::string::npos)
        << s.message();
    EXPECT_TRUE(m.untouched());
    m.p.shard = DcpShard{};  // default: the decoder's
    EXPECT_TRUE(m.dcp->decode(m.p, m.ctx).ok());
  });
}

// The error names exactly the arguments that differ, with each rank's value.
TEST(DcpStepValidation, DisagreementNamesTheDifferingArguments) {
  run_ranks(2, [&](int r, Communicator& comm) {
    DcpCase c = small_case(r == 0 ? DcpMergeMode::kAllToAll : DcpMergeMode::kAllGatherReduceScatter);
    c.interleave = r == 0 ? 2 : 1;
    Manual m(comm, c);
    const Status s = m.dcp->decode(m.p, m.ctx);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
    EXPECT_NE(s.message().find("merge_mode (rank 0: a2a, rank 1: ag-rs)"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("interleave (rank 0: 2, rank 1: 1)"), std::string::npos) << s.message();
    EXPECT_EQ(s.message().find("num_seqs"), std::string::npos) << s.message();
    EXPECT_TRUE(m.untouched());
  });
}

TEST(DcpStepValidation, CreateChecksTheGroupAndTheBackend) {
  auto comms = make_thread_communicators(2);
  std::unique_ptr<DcpDecoder> dcp;
  DcpConfig cfg;
  // The attention's shard must be the communicator's place in the group.
  std::unique_ptr<MlaAttention> att;
  ASSERT_TRUE(MlaAttention::create(make_backend(default_backend()), DcpShard{3, 0, 1}, &att).ok());
  Status s = DcpDecoder::create(std::move(att), comms[0].get(), cfg, &dcp);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("shard.world=3"), std::string::npos) << s.message();
  // The interleave comes from the attention's shard; an explicit different one is an error.
  ASSERT_TRUE(MlaAttention::create(make_backend(default_backend()), DcpShard{2, 0, 4}, &att).ok());
  s = DcpDecoder::create(std::move(att), comms[0].get(), cfg, &dcp);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(dcp->config().interleave, 4);
  cfg.interleave = 2;
  ASSERT_TRUE(MlaAttention::create(make_backend(default_backend()), DcpShard{2, 0, 4}, &att).ok());
  s = DcpDecoder::create(std::move(att), comms[0].get(), cfg, &dcp);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("config.interleave=2"), std::string::npos) << s.message();
  cfg.interleave = 0;
  cfg.deadline = std::chrono::milliseconds(0);
  s = DcpDecoder::create(make_backend(default_backend()), comms[1].get(), cfg, &dcp);
  EXPECT_NE(s.message().find("deadline"), std::string::npos) << s.message();
  EXPECT_EQ(DcpDecoder::create(make_backend(default_backend()), nullptr, DcpConfig{}, &dcp).code(),
            StatusCode::kInvalidArgument);

  // A backend without LSE cannot run DCP (the MlaAttention gate), nor can a device backend over
  // a host communicator.
  class Wrapped : public Backend {
   public:
    Wrapped(bool lse, Device dev) : inner_(make_backend(default_backend())), caps_(inner_->capabilities()) {
      caps_.name = "wrapped";
      caps_.can_return_lse_for_decode = lse;
      caps_.device = dev;
    }
    const BackendCapabilities& capabilities() const override { return caps_; }
    Status decode(const MlaDecodeParams& p, const ExecContext& c) override { return inner_->decode(p, c); }
    Status merge(const MergeParams& p, const ExecContext& c) override { return inner_->merge(p, c); }
    Status rescale(const RescaleParams& p, const ExecContext& c) override { return inner_->rescale(p, c); }

   private:
    std::unique_ptr<Backend> inner_;
    BackendCapabilities caps_;
  };
  s = DcpDecoder::create(std::make_unique<Wrapped>(false, Device::kHost), comms[0].get(), DcpConfig{}, &dcp);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("can_return_lse_for_decode"), std::string::npos) << s.message();
  s = DcpDecoder::create(std::make_unique<Wrapped>(true, Device::kCuda), comms[0].get(), DcpConfig{}, &dcp);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("host"), std::string::npos) << s.message();
}

// ---- Faults ------------------------------------------------------------------------------------

TEST(DcpStepFaults, StalledPeerTimesOutWithinTheDeadline) {
  const auto deadline = std::chrono::milliseconds(300);
  run_ranks(3, [&](int r, Communicator& comm) {
    DcpCase c = small_case(DcpMergeMode::kAllToAll);
    c.deadline = deadline;
    if (r == 2) std::this_thread::sleep_for(deadline * 3);  // stalls past everyone's deadline
    const Clock::time_point t0 = Clock::now();
    const DcpRun run = run_dcp(comm, c);
    const auto waited = Clock::now() - t0;
    if (r == 2) {
      // Arrives after the group broke: told at once that a peer is gone.
      EXPECT_EQ(run.status.code(), StatusCode::kRemoteError) << run.status.to_string();
    } else {
      // The first survivor to reach its deadline times out and breaks the group; the others learn it.
      EXPECT_TRUE(run.status.code() == StatusCode::kTimeout || run.status.code() == StatusCode::kRemoteError)
          << run.status.to_string();
      EXPECT_LT(waited, deadline + std::chrono::milliseconds(2000));
    }
    EXPECT_TRUE(run.untouched);
    // Unusable afterwards, and says so.
    const Status h = comm.health();
    EXPECT_EQ(h.code(), StatusCode::kUnavailable);
    EXPECT_NE(h.message().find("unusable"), std::string::npos) << h.message();
    EXPECT_EQ(run_dcp(comm, c).status.code(), StatusCode::kUnavailable);
  });
}

// A rank that leaves mid-step (after the query all-gather, before the output exchange).
class LeavingCommunicator final : public Communicator {
 public:
  LeavingCommunicator(Communicator& inner, int ops_before_leaving) : inner_(inner), left_(ops_before_leaving) {}
  int rank() const override { return inner_.rank(); }
  int world_size() const override { return inner_.world_size(); }
  Device memory() const override { return inner_.memory(); }
  std::string name() const override { return "leaving"; }
  Status all_gather(const void* s, void* r, size_t b) override { return leave_or(inner_.all_gather(s, r, b)); }
  Status reduce_scatter_sum_f32(const float* s, float* r, size_t c) override {
    return leave_or(inner_.reduce_scatter_sum_f32(s, r, c));
  }
  Status all_to_all(const void* s, void* r, size_t b) override { return leave_or(inner_.all_to_all(s, r, b)); }
  Status group_start() override { return inner_.group_start(); }
  Status group_end() override { return inner_.group_end(); }
  Status wait(std::chrono::milliseconds d) override { return inner_.wait(d); }
  void abort(const std::string& why) override { inner_.abort(why); }
  Status health() const override { return inner_.health(); }

 private:
  Status leave_or(Status s) {
    if (--left_ < 0) {
      inner_.abort("process exited");  // what a dying process does to its group: it stops answering
      return Status(StatusCode::kUnavailable, "left the group");
    }
    return s;
  }
  Communicator& inner_;
  int left_;
};

TEST(DcpStepFaults, PeerLeavingMidStepFailsTheOthersQuickly) {
  for (DcpMergeMode mode : {DcpMergeMode::kAllToAll, DcpMergeMode::kAllGatherReduceScatter}) {
    run_ranks(3, [&](int r, Communicator& comm) {
      DcpCase c = small_case(mode);
      c.deadline = std::chrono::milliseconds(5000);
      LeavingCommunicator leaving(comm, 2);  // agreement round and query gather, then gone
      const Clock::time_point t0 = Clock::now();
      const DcpRun run = run_dcp(r == 0 ? static_cast<Communicator&>(leaving) : comm, c);
      const auto waited = Clock::now() - t0;
      EXPECT_FALSE(run.status.ok());
      if (r != 0) {
        EXPECT_EQ(run.status.code(), StatusCode::kRemoteError) << run.status.to_string();
        EXPECT_LT(waited, std::chrono::milliseconds(4000));
      }
      EXPECT_TRUE(run.untouched);
      EXPECT_EQ(comm.health().code(), StatusCode::kUnavailable);
    });
  }
}

}  // namespace
}  // namespace mladcp::test
