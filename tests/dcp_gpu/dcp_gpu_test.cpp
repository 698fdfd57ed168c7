// DCP on two GPUs over NCCL, in one process with one thread per GPU: the communicator's operations
// on real data, DCP (both merge modes, empty shards, q_len 2, fp8, eager and CUDA graph) against a
// single-GPU decode of the unsharded cache, adoption of an existing ncclComm_t, and faults (a rank
// that never issues its part makes the other return kTimeout within its deadline).
// Skips (with the reason) without two CUDA devices or without the "cuda" backend.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/nccl_single_process.h"
#include "mladcp/backend.h"
#include "mladcp/nccl.h"
#include "testkit/nccl_dcp_runner.h"

namespace mladcp {
namespace {

using namespace std::chrono_literals;
using CommList = std::vector<std::unique_ptr<NcclCommunicator>>;

// Why this machine cannot run the GPU tests ("" when it can).
std::string skip_reason() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    count = 0;
  }
  if (count < 2) return "needs 2 CUDA devices, found " + std::to_string(count);
  std::unique_ptr<Backend> b;
  const Status s = create_backend("cuda", &b);
  if (!s.ok()) return "the cuda backend is not available: " + s.to_string();
  return "";
}

NcclOptions test_options() {
  NcclOptions o;
  o.setup_timeout = 60s;
  return o;
}

Status make_group(CommList* comms, NcclOptions options = test_options()) {
  return create_nccl_communicators_single_process({0, 1}, options, comms);
}

// Runs body(rank) on one thread per rank; returns each rank's Status.
std::vector<Status> on_every_rank(int world, const std::function<Status(int)>& body) {
  std::vector<Status> status(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back([&, r] { status[r] = body(r); });
  for (auto& t : threads) t.join();
  return status;
}

#define EXPECT_ALL_OK(statuses)                              \
  for (size_t rank_ = 0; rank_ < (statuses).size(); ++rank_) \
  EXPECT_TRUE((statuses)[rank_].ok()) << "rank " << rank_ << ": " << (statuses)[rank_].to_string()

class DcpGpuTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    reason_ = new std::string(skip_reason());
    if (!reason_->empty()) return;
    comms_ = new CommList();
    const Status s = make_group(comms_);
    if (!s.ok()) *reason_ = "NCCL communicators could not be created: " + s.to_string();
  }
  static void TearDownTestSuite() {
    if (comms_) destroy_nccl_communicators(comms_);
    delete comms_;
    comms_ = nullptr;
    delete reason_;
    reason_ = nullptr;
  }
  void SetUp() override {
    if (!reason_->empty()) GTEST_SKIP() << *reason_;
    for (auto& c : *comms_)
      if (!c->health().ok()) GTEST_SKIP() << "an earlier test broke the shared group: " << c->health().to_string();
  }
  NcclCommunicator& comm(int r) { return *(*comms_)[r]; }

  // Runs the check on both ranks and expects both to match the single-GPU decode.
  void check(const dcp_gpu::CheckCase& c, std::vector<dcp_gpu::CheckResult>* out = nullptr) {
    std::vector<dcp_gpu::CheckResult> results(2);
    const auto st = on_every_rank(2, [&](int r) { return dcp_gpu::run_check(comm(r), c, &results[r]); });
    EXPECT_ALL_OK(st);
    for (int r = 0; r < 2; ++r)
      if (st[r].ok()) EXPECT_TRUE(results[r].ok) << "rank " << r << ": " << results[r].report;
    if (out) *out = std::move(results);
  }

  static std::string* reason_;
  static CommList* comms_;
};
std::string* DcpGpuTest::reason_ = nullptr;
CommList* DcpGpuTest::comms_ = nullptr;

dcp_gpu::CheckCase make_case(std::vector<int32_t> lens, int q_len, int heads, int interleave, DcpMergeMode mode,
                             uint64_t seed) {
  dcp_gpu::CheckCase c;
  c.problem.num_seqs = int(lens.size());
  c.problem.seq_lens = std::move(lens);
  c.problem.q_len = q_len;
  c.problem.num_heads = heads;
  c.problem.block_size = 64;
  c.problem.seed = seed;
  c.interleave = interleave;
  c.merge_mode = mode;
  c.deadline = 60s;
  return c;
}

const DcpMergeMode kModes[] = {DcpMergeMode::kAllToAll, DcpMergeMode::kAllGatherReduceScatter};

// ---- The communicator's operations on known data -------------------------------------------

TEST_F(DcpGpuTest, CollectivesMoveTheRightBytes) {
  constexpr size_t kBytes = 1000, kCount = 777;
  const auto st = on_every_rank(2, [&](int r) -> Status {
    NcclCommunicator& c = comm(r);
    if (cudaSetDevice(c.device()) != cudaSuccess) return Status(StatusCode::kCudaError, "cudaSetDevice");
    // all_gather: rank r sends bytes (r * 31 + i) % 251.
    std::vector<uint8_t> send(kBytes), recv(2 * kBytes, 0);
    for (size_t i = 0; i < kBytes; ++i) send[i] = uint8_t((r * 31 + i) % 251);
    // reduce-scatter: rank r contributes r + 0.5 · i at index i of [2 · count].
    std::vector<float> rs_send(2 * kCount), rs_recv(kCount, -1.0f);
    for (size_t i = 0; i < rs_send.size(); ++i) rs_send[i] = float(r) + 0.5f * float(i);
    // all-to-all: chunk j of rank r holds (r, j) markers.
    std::vector<uint8_t> a2a_send(2 * kBytes), a2a_recv(2 * kBytes, 0);
    for (size_t i = 0; i < a2a_send.size(); ++i) a2a_send[i] = uint8_t(16 * r + i / kBytes + 1);
    void *d_send, *d_recv, *d_rs_send, *d_rs_recv, *d_a_send, *d_a_recv;
    cudaMalloc(&d_send, kBytes);
    cudaMalloc(&d_recv, 2 * kBytes);
    cudaMalloc(&d_rs_send, rs_send.size() * 4);
    cudaMalloc(&d_rs_recv, kCount * 4);
    cudaMalloc(&d_a_send, 2 * kBytes);
    cudaMalloc(&d_a_recv, 2 * kBytes);
    cudaMemcpy(d_send, send.data(), kBytes, cudaMemcpyHostToDevice);
    cudaMemcpy(d_rs_send, rs_send.data(), rs_send.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(d_a_send, a2a_send.data(), 2 * kBytes, cudaMemcpyHostToDevice);
    Status s = c.group_start();
    if (s.ok()) s = c.all_gather(d_send, d_recv, kBytes);
    if (s.ok()) s = c.reduce_scatter_sum_f32(static_cast<float*>(d_rs_send), static_cast<float*>(d_rs_recv), kCount);
    if (s.ok()) s = c.all_to_all(d_a_send, d_a_recv, kBytes);
    if (s.ok()) s = c.group_end();
    if (s.ok()) s = c.wait(30s);
    if (s.ok()) {
      cudaMemcpy(recv.data(), d_recv, 2 * kBytes, cudaMemcpyDeviceToHost);
      cudaMemcpy(rs_recv.data(), d_rs_recv, kCount * 4, cudaMemcpyDeviceToHost);
      cudaMemcpy(a2a_recv.data(), d_a_recv, 2 * kBytes, cudaMemcpyDeviceToHost);
      for (int src = 0; src < 2 && s.ok(); ++src)
        for (size_t i = 0; i < kBytes; ++i)
          if (recv[src * kBytes + i] != uint8_t((src * 31 + i) % 251)) {
            s = Status::Internal("all_gather: wrong byte from rank " + std::to_string(src) + " at " +
                                 std::to_string(i));
            break;
          }
      for (size_t i = 0; i < kCount && s.ok(); ++i) {
        const size_t g = size_t(r) * kCount + i;  // this rank's slice of the summed [2 · count]
        const float want = 0.0f + 0.5f * float(g) + 1.0f + 0.5f * float(g);
        if (rs_recv[i] != want) s = Status::Internal("reduce_scatter: wrong sum at " + std::to_string(i));
      }
      for (int src = 0; src < 2 && s.ok(); ++src)
        for (size_t i = 0; i < kBytes; ++i)
          if (a2a_recv[src * kBytes + i] != uint8_t(16 * src + r + 1)) {
            s = Status::Internal("all_to_all: wrong byte from rank " + std::to_string(src));
            break;
          }
    }
    for (void* p : {d_send, d_recv, d_rs_send, d_rs_recv, d_a_send, d_a_recv}) cudaFree(p);
    return s;
  });
  EXPECT_ALL_OK(st);
}

// ---- DCP against single-GPU decode -----------------------------------------------------------

TEST_F(DcpGpuTest, MatchesSingleGpuDecode) {
  for (DcpMergeMode mode : kModes) {
    SCOPED_TRACE(dcp_merge_mode_name(mode));
    check(make_case({1000, 4096, 77}, 1, 16, 1, mode, 11));
    check(make_case({300, 2000}, 1, 128, 1, mode, 12));  // DeepSeek-V3's 128 heads, 64 per rank
  }
}

TEST_F(DcpGpuTest, EmptyShards) {
  for (DcpMergeMode mode : kModes) {
    SCOPED_TRACE(dcp_merge_mode_name(mode));
    // I = 1: a length-1 sequence lives on rank 0 only; rank 1's shard is empty.
    check(make_case({1, 2, 3, 64}, 1, 16, 1, mode, 21));
    // I = 16: lengths up to 16 leave rank 1 empty; 17 gives it one token.
    check(make_case({1, 16, 17, 33}, 1, 16, 16, mode, 22));
  }
}

TEST_F(DcpGpuTest, QLen2CausalInGlobalCoordinates) {
  for (DcpMergeMode mode : kModes) {
    SCOPED_TRACE(dcp_merge_mode_name(mode));
    check(make_case({2, 3, 130, 1000}, 2, 16, 1, mode, 31));
    check(make_case({2, 17, 18, 700}, 2, 16, 16, mode, 32));  // token 0 of length 17 sees only rank 0's 16
  }
}

TEST_F(DcpGpuTest, Fp8Cache) {
  for (DcpMergeMode mode : kModes) {
    SCOPED_TRACE(dcp_merge_mode_name(mode));
    dcp_gpu::CheckCase c = make_case({513, 2048, 5}, 1, 16, 1, mode, 41);
    c.problem.kv_dtype = DType::kFP8E4M3;
    c.problem.kv_scale = 0.5f;
    check(c);
  }
}

TEST_F(DcpGpuTest, CudaGraphReplayEqualsEagerStep) {
  std::unique_ptr<Backend> b;
  ASSERT_TRUE(create_backend("cuda", &b).ok());
  if (!b->capabilities().cuda_graph_safe) GTEST_SKIP() << "the cuda backend does not declare cuda_graph_safe";
  for (DcpMergeMode mode : kModes) {
    SCOPED_TRACE(dcp_merge_mode_name(mode));
    dcp_gpu::CheckCase c = make_case({2, 600, 3000}, 2, 16, 1, mode, 51);
    std::vector<dcp_gpu::CheckResult> eager, graph;
    check(c, &eager);
    c.graph = true;
    check(c, &graph);
    for (int r = 0; r < 2 && !eager.empty() && !graph.empty(); ++r) {
      ASSERT_EQ(eager[r].out_values.size(), graph[r].out_values.size());
      EXPECT_EQ(std::memcmp(eager[r].out_values.data(), graph[r].out_values.data(),
                            eager[r].out_values.size() * sizeof(float)),
                0)
          << "rank " << r << ": the graph replay differs from the eager step";
    }
  }
}

TEST_F(DcpGpuTest, AllToAllIsBitwiseDeterministic) {
  const dcp_gpu::CheckCase c = make_case({1500, 2500}, 1, 16, 1, DcpMergeMode::kAllToAll, 61);
  std::vector<dcp_gpu::CheckResult> first, second;
  check(c, &first);
  check(c, &second);
  for (int r = 0; r < 2 && !first.empty() && !second.empty(); ++r) {
    EXPECT_EQ(first[r].out_values.size(), second[r].out_values.size());
    EXPECT_EQ(std::memcmp(first[r].out_values.data(), second[r].out_values.data(),
                          first[r].out_values.size() * sizeof(float)),
              0)
        << "rank " << r;
    EXPECT_EQ(std::memcmp(first[r].lse_values.data(), second[r].lse_values.data(),
                          first[r].lse_values.size() * sizeof(float)),
              0)
        << "rank " << r;
  }
}

// ---- Adoption and faults (each with its own communicators) ------------------------------------

TEST(DcpGpuFaultTest, AdoptedCommunicatorWorksAndIsNotDestroyed) {
  const std::string reason = skip_reason();
  if (!reason.empty()) GTEST_SKIP() << reason;
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  ncclComm_t raw[2] = {nullptr, nullptr};
  const int devices[2] = {0, 1};
  ASSERT_EQ(ncclCommInitAll(raw, 2, devices), ncclSuccess);
  {
    CommList adopted(2);
    for (int r = 0; r < 2; ++r) {
      NcclOptions o = test_options();
      ASSERT_TRUE(cudaSetDevice(r) == cudaSuccess);
      const Status s = adopt_nccl_communicator(raw[r], o, &adopted[r]);
      ASSERT_TRUE(s.ok()) << s.to_string();
      EXPECT_FALSE(adopted[r]->owns_comm());
    }
    const dcp_gpu::CheckCase c = make_case({900, 33}, 1, 16, 1, DcpMergeMode::kAllToAll, 71);
    std::vector<dcp_gpu::CheckResult> results(2);
    const auto st = on_every_rank(2, [&](int r) { return dcp_gpu::run_check(*adopted[r], c, &results[r]); });
    EXPECT_ALL_OK(st);
    for (int r = 0; r < 2; ++r) EXPECT_TRUE(results[r].ok) << results[r].report;
  }
  // The wrappers are gone; the engine's communicators still work and are destroyed by their owner.
  for (int r = 0; r < 2; ++r) {
    int count = 0;
    EXPECT_EQ(ncclCommCount(raw[r], &count), ncclSuccess);
    EXPECT_EQ(count, 2);
  }
  for (ncclComm_t c : raw) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// One rank never issues its part of an all-gather: the other returns kTimeout within its deadline
// and reports kUnavailable afterwards.
TEST(DcpGpuFaultTest, StalledPeerTimesOutWithinTheDeadline) {
  const std::string reason = skip_reason();
  if (!reason.empty()) GTEST_SKIP() << reason;
  CommList comms;
  NcclOptions o = test_options();
  o.setup_timeout = 10s;
  ASSERT_TRUE(make_group(&comms, o).ok());
  void* bufs[2][2];
  for (int r = 0; r < 2; ++r) {
    cudaSetDevice(r);
    cudaMalloc(&bufs[r][0], 4096);
    cudaMalloc(&bufs[r][1], 2 * 4096);
  }
  // One complete round first, so that NCCL's connections exist and the stalled round enqueues at once.
  auto round = [&](int r) -> Status {
    cudaSetDevice(r);
    MLADCP_RETURN_IF_ERROR(comms[r]->all_gather(bufs[r][0], bufs[r][1], 4096));
    return comms[r]->wait(30s);
  };
  EXPECT_ALL_OK(on_every_rank(2, round));

  constexpr auto kDeadline = 500ms;
  cudaSetDevice(0);
  ASSERT_TRUE(comms[0]->all_gather(bufs[0][0], bufs[0][1], 4096).ok());
  const auto t0 = std::chrono::steady_clock::now();
  const Status s = comms[0]->wait(kDeadline);  // rank 1 never issues its part
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(s.code(), StatusCode::kTimeout) << s.to_string();
  EXPECT_GE(elapsed, kDeadline);
  EXPECT_LT(elapsed, kDeadline + 2s) << "returned long after the deadline";
  const Status h = comms[0]->health();
  EXPECT_EQ(h.code(), StatusCode::kUnavailable);
  EXPECT_NE(h.message().find("did not complete"), std::string::npos) << h.message();
  EXPECT_EQ(comms[0]->all_gather(bufs[0][0], bufs[0][1], 4096).code(), StatusCode::kUnavailable);
  // The aborted NCCL kernel left the stream: it drains.
  EXPECT_EQ(cudaStreamSynchronize(static_cast<cudaStream_t>(comms[0]->stream())), cudaSuccess);
  comms[1]->abort("peer rank 0 timed out");
  EXPECT_EQ(comms[1]->health().code(), StatusCode::kUnavailable);
  for (int r = 0; r < 2; ++r) {
    cudaSetDevice(r);
    cudaFree(bufs[r][0]);
    cudaFree(bufs[r][1]);
  }
}

// The same fault through the DCP step: rank 1 skips a step; rank 0's decode returns kTimeout within
// the step's deadline.
TEST(DcpGpuFaultTest, DcpStepWithAMissingRankTimesOut) {
  const std::string reason = skip_reason();
  if (!reason.empty()) GTEST_SKIP() << reason;
  CommList comms;
  NcclOptions o = test_options();
  o.setup_timeout = 10s;
  ASSERT_TRUE(make_group(&comms, o).ok());
  dcp_gpu::CheckCase c = make_case({800, 1200}, 1, 16, 1, DcpMergeMode::kAllToAll, 81);
  std::vector<dcp_gpu::CheckResult> results(2);
  EXPECT_ALL_OK(on_every_rank(2, [&](int r) { return dcp_gpu::run_check(*comms[r], c, &results[r]); }));

  c.deadline = 700ms;
  const auto t0 = std::chrono::steady_clock::now();
  const Status s = dcp_gpu::run_check(*comms[0], c, &results[0]);  // rank 1 stays away
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(s.code(), StatusCode::kTimeout) << s.to_string();
  EXPECT_LT(elapsed, c.deadline + 5s) << "building the problem plus the deadline";
  EXPECT_EQ(comms[0]->health().code(), StatusCode::kUnavailable);
  comms[1]->abort("peer rank 0 timed out");
}

}  // namespace
}  // namespace mladcp
