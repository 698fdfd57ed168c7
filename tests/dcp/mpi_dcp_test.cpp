// DCP end to end over MPI: run under `mpirun -np W`. Every rank runs every test; each test loops over
// many cases inside one launch. Rank 0 prints the usual GoogleTest report, the other ranks print only
// their failures (prefixed with the rank); the exit code is the worst over all ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "dcp/dcp_case.h"
#include "mladcp/dcp.h"
#include "mladcp/mpi.h"
#include "testkit/compare.h"

namespace mladcp::test {
namespace {

using Clock = std::chrono::steady_clock;

std::unique_ptr<Communicator> world_comm() {
  std::unique_ptr<Communicator> c;
  const Status s = create_mpi_communicator(MPI_COMM_WORLD, MpiCommunicatorOptions{}, &c);
  if (!s.ok()) {
    std::fprintf(stderr, "create_mpi_communicator: %s\n", s.to_string().c_str());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  return c;
}

TEST(MpiCommunicator, CollectivesMoveTheRightBytes) {
  auto comm = world_comm();
  const int W = comm->world_size(), r = comm->rank();
  EXPECT_EQ(comm->name(), "mpi");
  EXPECT_EQ(comm->memory(), Device::kHost);
  // all_gather of 3 bytes per rank (odd sizes are fine), and the in-place form.
  std::vector<uint8_t> send = {uint8_t(r), uint8_t(r + 100), uint8_t(7)};
  std::vector<uint8_t> recv(size_t(3 * W), 0xee);
  ASSERT_TRUE(comm->all_gather(send.data(), recv.data(), 3).ok());
  ASSERT_TRUE(comm->wait(std::chrono::milliseconds(10000)).ok());
  for (int i = 0; i < W; ++i) {
    EXPECT_EQ(recv[size_t(3 * i)], i);
    EXPECT_EQ(recv[size_t(3 * i + 1)], i + 100);
  }
  std::vector<float> inplace(size_t(2 * W), -1.0f);
  inplace[size_t(2 * r)] = float(r);
  inplace[size_t(2 * r + 1)] = float(r) + 0.5f;
  ASSERT_TRUE(comm->all_gather(inplace.data() + 2 * r, inplace.data(), 8).ok());
  ASSERT_TRUE(comm->wait(std::chrono::milliseconds(10000)).ok());
  for (int i = 0; i < W; ++i) EXPECT_EQ(inplace[size_t(2 * i + 1)], float(i) + 0.5f);
  // reduce-scatter sum and all-to-all, issued together, completed by one wait.
  const size_t n = 5;
  std::vector<float> rs_send(n * size_t(W)), rs_recv(n, -1.0f);
  for (size_t i = 0; i < rs_send.size(); ++i) rs_send[i] = float(i) + 1000.0f * float(r);
  std::vector<int32_t> a2a_send(size_t(2 * W)), a2a_recv(size_t(2 * W), -1);
  for (int j = 0; j < W; ++j) a2a_send[size_t(2 * j)] = a2a_send[size_t(2 * j + 1)] = r * 10 + j;
  ASSERT_TRUE(comm->group_start().ok());
  ASSERT_TRUE(comm->reduce_scatter_sum_f32(rs_send.data(), rs_recv.data(), n).ok());
  ASSERT_TRUE(comm->all_to_all(a2a_send.data(), a2a_recv.data(), 8).ok());
  ASSERT_TRUE(comm->group_end().ok());
  ASSERT_TRUE(comm->wait(std::chrono::milliseconds(10000)).ok());
  const float rank_sum = 1000.0f * float(W * (W - 1) / 2);
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(rs_recv[i], float(W) * float(size_t(r) * n + i) + rank_sum);
  for (int i = 0; i < W; ++i) EXPECT_EQ(a2a_recv[size_t(2 * i)], i * 10 + r);
  // Zero-sized operations and bad buffers.
  EXPECT_TRUE(comm->all_gather(nullptr, nullptr, 0).ok());
  EXPECT_EQ(comm->all_to_all(send.data(), send.data(), 1).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(comm->wait(std::chrono::milliseconds(10)).ok());
}

TEST(MpiCommunicator, BorrowedCommunicatorKeepsItsErrorHandler) {
  MPI_Comm mine;
  MPI_Comm_dup(MPI_COMM_WORLD, &mine);
  MPI_Comm_set_errhandler(mine, MPI_ERRORS_ARE_FATAL);
  {
    std::unique_ptr<Communicator> c;
    MpiCommunicatorOptions o;
    o.ownership = MpiOwnership::kBorrow;
    ASSERT_TRUE(create_mpi_communicator(mine, o, &c).ok());
    int x = c->rank(), y[64];
    ASSERT_TRUE(c->all_gather(&x, y, 4).ok());
    ASSERT_TRUE(c->wait(std::chrono::milliseconds(10000)).ok());
  }
  MPI_Errhandler h;
  MPI_Comm_get_errhandler(mine, &h);
  EXPECT_TRUE(h == MPI_ERRORS_ARE_FATAL);
  MPI_Errhandler_free(&h);
  MPI_Comm_free(&mine);
  std::unique_ptr<Communicator> c;
  EXPECT_EQ(create_mpi_communicator(MPI_COMM_NULL, {}, &c).code(), StatusCode::kInvalidArgument);
}

// The sweep: every case against single-rank decode; A2A twice, bitwise equal.
TEST(DcpMpi, SweepMatchesSingleRankDecode) {
  auto comm = world_comm();
  const int W = comm->world_size();
  const auto cases = sweep_cases(W, /*quick=*/false);
  int a2a_checked = 0;
  for (const DcpCase& c : cases) {
    DcpRun first;
    EXPECT_TRUE(dcp_matches_single_rank(*comm, c, &first));
    if (c.mode == DcpMergeMode::kAllToAll && first.status.ok()) {
      const DcpRun again = run_dcp(*comm, c);
      ASSERT_TRUE(again.status.ok()) << again.status.to_string();
      EXPECT_TRUE(again.out == first.out) << describe(c, W) << ": A2A output differs between two runs";
      EXPECT_EQ(std::memcmp(again.lse.data(), first.lse.data(), first.lse.size() * 4), 0) << describe(c, W);
      ++a2a_checked;
    }
  }
  if (comm->rank() == 0)
    std::printf("[ DCP W=%d ] %zu cases matched single-rank decode; %d A2A cases bitwise identical across two runs\n",
                W, cases.size(), a2a_checked);
}

TEST(DcpMpi, RankLocalErrorFailsEveryRank) {
  auto comm = world_comm();
  const int W = comm->world_size(), r = comm->rank();
  if (W < 2) GTEST_SKIP() << "needs 2 ranks";
  DcpCase c;
  c.local_heads = 2;
  c.q_len = 1;
  c.seq_lens = {50, 3};
  c.block_size = 16;
  // A shared bad argument: every rank rejects it itself.
  DcpCase bad = c;
  bad.interleave = 3;  // block 16 is not a multiple of 3
  DcpRun run = run_dcp(*comm, bad);
  EXPECT_EQ(run.status.code(), StatusCode::kInvalidArgument) << run.status.to_string();
  EXPECT_NE(run.status.message().find("interleave=3"), std::string::npos) << run.status.message();
  EXPECT_TRUE(run.untouched);
  // A rank-local one (only the last rank asks for a bad output dtype): it names the argument, the
  // others name the rank; nothing is written anywhere; the group still works afterwards.
  DcpCase local = c;
  if (r == W - 1) local.out_dtype = DType::kFP8E4M3;
  run = run_dcp(*comm, local);
  if (r == W - 1) {
    EXPECT_EQ(run.status.code(), StatusCode::kInvalidArgument) << run.status.to_string();
  } else {
    EXPECT_EQ(run.status.code(), StatusCode::kRemoteError) << run.status.to_string();
    EXPECT_NE(run.status.message().find("rank " + std::to_string(W - 1)), std::string::npos) << run.status.message();
  }
  EXPECT_TRUE(run.untouched);
  EXPECT_TRUE(dcp_matches_single_rank(*comm, c));
}

// The last rank stalls past the deadline: the others return kTimeout within it (plus slack) and their
// communicator is aborted; the late rank then times out alone. Nothing hangs.
TEST(DcpMpi, StalledPeerTimesOut) {
  auto comm = world_comm();
  const int W = comm->world_size(), r = comm->rank();
  if (W < 2) GTEST_SKIP() << "needs 2 ranks";
  DcpCase c;
  c.local_heads = 1;
  c.seq_lens = {20};
  c.deadline = std::chrono::milliseconds(400);
  if (r == W - 1) std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  const Clock::time_point t0 = Clock::now();
  const DcpRun run = run_dcp(*comm, c);
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  EXPECT_EQ(run.status.code(), StatusCode::kTimeout) << "rank " << r << ": " << run.status.to_string();
  EXPECT_LT(ms, 400 + 3000) << "rank " << r;
  EXPECT_TRUE(run.untouched);
  EXPECT_EQ(comm->health().code(), StatusCode::kUnavailable);
  EXPECT_NE(comm->health().message().find("unusable"), std::string::npos);
  EXPECT_EQ(run_dcp(*comm, c).status.code(), StatusCode::kUnavailable);
  MPI_Barrier(MPI_COMM_WORLD);  // progresses the survivors' unfinished round while the late rank catches up
}

// Prints only failures, prefixed with the rank (ranks other than 0).
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?", r.line_number(),
                 r.summary());
  }

 private:
  int rank_;
};

}  // namespace
}  // namespace mladcp::test

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new mladcp::test::FailurePrinter(rank));
  }
  int rc = RUN_ALL_TESTS();
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && worst != rc) std::fprintf(stderr, "a test failed on another rank (see [rank N] lines)\n");
  MPI_Finalize();
  return worst;
}
