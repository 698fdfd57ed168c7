// The NCCL communicator's logic on a scripted driver (no GPU needed): argument validation, creation
// paths, enqueue in progress, deadlines, aborts, fault policies and graph capture.
#include "comm/nccl_communicator.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "dcp_gpu/fake_nccl_driver.h"

namespace mladcp {
namespace {

using nccl_detail::adopt_communicator;
using nccl_detail::create_communicator;
using nccl_detail::create_single_process;
using nccl_detail::NcclCommunicatorImpl;
using test::FakeNcclDriver;
using namespace std::chrono_literals;

NcclIdBroadcast copy_from(const NcclUniqueId* root) {
  return [root](int rank, NcclUniqueId* id) {
    if (rank != 0) std::memcpy(id->bytes, root->bytes, sizeof(id->bytes));
    return Status::Ok();
  };
}

NcclIdBroadcast noop_broadcast() {
  return [](int, NcclUniqueId*) { return Status::Ok(); };
}

NcclOptions fast_options() {
  NcclOptions o;
  o.setup_timeout = 500ms;
  return o;
}

class NcclCommunicatorTest : public ::testing::Test {
 protected:
  std::shared_ptr<FakeNcclDriver> driver = std::make_shared<FakeNcclDriver>();
  // Device buffers of device 0 (only their addresses matter to the fake).
  alignas(64) char send_buf[256] = {};
  alignas(64) char recv_buf[1024] = {};

  void SetUp() override {
    driver->add_buffer(send_buf, 0);
    driver->add_buffer(recv_buf, 0);
  }

  std::unique_ptr<NcclCommunicator> make(int rank = 0, int world = 2, NcclOptions options = fast_options()) {
    std::unique_ptr<NcclCommunicator> c;
    const Status s = create_communicator(driver, rank, world, noop_broadcast(), options, &c);
    EXPECT_TRUE(s.ok()) << s.to_string();
    return c;
  }
  NcclCommunicatorImpl* impl(const std::unique_ptr<NcclCommunicator>& c) {
    return static_cast<NcclCommunicatorImpl*>(c.get());
  }
};

TEST_F(NcclCommunicatorTest, CreationRejectsBadArguments) {
  std::unique_ptr<NcclCommunicator> c;
  const NcclOptions o = fast_options();
  EXPECT_EQ(create_communicator(driver, 0, 2, noop_broadcast(), o, nullptr).code(), StatusCode::kInvalidArgument);
  Status s = create_communicator(driver, 0, 0, noop_broadcast(), o, &c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("world=0"), std::string::npos) << s.message();
  s = create_communicator(driver, 2, 2, noop_broadcast(), o, &c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("rank=2"), std::string::npos) << s.message();
  EXPECT_EQ(create_communicator(driver, 0, 2, NcclIdBroadcast(), o, &c).code(), StatusCode::kInvalidArgument);
  NcclOptions zero = o;
  zero.setup_timeout = 0ms;
  EXPECT_EQ(create_communicator(driver, 0, 2, noop_broadcast(), zero, &c).code(), StatusCode::kInvalidArgument);
  NcclOptions bad_device = o;
  bad_device.device = 5;
  s = create_communicator(driver, 0, 2, noop_broadcast(), bad_device, &c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("options.device=5"), std::string::npos) << s.message();
  EXPECT_EQ(c, nullptr);
  EXPECT_TRUE(driver->init_ids.empty());
}

TEST_F(NcclCommunicatorTest, NoDeviceIsUnavailable) {
  driver->devices = 0;
  std::unique_ptr<NcclCommunicator> c;
  const Status s = create_communicator(driver, 0, 1, noop_broadcast(), fast_options(), &c);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.to_string();
  EXPECT_NE(s.message().find("no CUDA device"), std::string::npos) << s.message();
}

TEST_F(NcclCommunicatorTest, UnloadableLibraryIsUnavailableBeforeAnyNcclCall) {
  driver->library_error = "NCCL could not be loaded from '/nowhere/libnccl.so.2': no such file";
  std::unique_ptr<NcclCommunicator> c;
  Status s = create_communicator(driver, 0, 1, noop_broadcast(), fast_options(), &c);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.to_string();
  EXPECT_NE(s.message().find("/nowhere/libnccl.so.2"), std::string::npos) << s.message();
  s = adopt_communicator(driver, reinterpret_cast<ncclComm_t>(0xdead0), fast_options(), &c);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.to_string();
  std::vector<std::unique_ptr<NcclCommunicator>> comms;
  EXPECT_EQ(create_single_process(driver, {0, 1}, fast_options(), &comms).code(), StatusCode::kUnavailable);
  EXPECT_EQ(c, nullptr);
  EXPECT_TRUE(comms.empty());
  EXPECT_TRUE(driver->calls.empty());
  EXPECT_TRUE(driver->init_ids.empty());
}

TEST_F(NcclCommunicatorTest, BroadcastCarriesRankZerosId) {
  NcclUniqueId root;
  auto c0 = std::unique_ptr<NcclCommunicator>();
  ASSERT_TRUE(create_communicator(
                  driver, 0, 2,
                  [&](int rank, NcclUniqueId* id) {
                    EXPECT_EQ(rank, 0);
                    root = *id;  // rank 0 publishes
                    return Status::Ok();
                  },
                  fast_options(), &c0)
                  .ok());
  std::unique_ptr<NcclCommunicator> c1;
  ASSERT_TRUE(create_communicator(driver, 1, 2, copy_from(&root), fast_options(), &c1).ok());
  ASSERT_EQ(driver->init_ids.size(), 2u);
  for (const auto& id : driver->init_ids)
    for (char b : id) ASSERT_EQ(b, FakeNcclDriver::kIdByte);
  EXPECT_EQ(c0->rank(), 0);
  EXPECT_EQ(c1->rank(), 1);
  EXPECT_EQ(c1->world_size(), 2);
  EXPECT_EQ(c1->memory(), Device::kCuda);
  EXPECT_EQ(c1->name(), "nccl");
  EXPECT_TRUE(c1->owns_comm());
  EXPECT_NE(c1->stream(), nullptr);  // created and owned
}

TEST_F(NcclCommunicatorTest, BroadcastFailureFailsCreation) {
  std::unique_ptr<NcclCommunicator> c;
  const Status s = create_communicator(
      driver, 1, 2, [](int, NcclUniqueId*) { return Status(StatusCode::kCommError, "store unreachable"); },
      fast_options(), &c);
  EXPECT_EQ(s.code(), StatusCode::kCommError);
  EXPECT_NE(s.message().find("store unreachable"), std::string::npos) << s.message();
  EXPECT_TRUE(driver->init_ids.empty());
}

TEST_F(NcclCommunicatorTest, CreationThatNeverFinishesTimesOutAndAborts) {
  driver->init_polls_in_progress = -1;  // a peer never joins
  NcclOptions o = fast_options();
  o.setup_timeout = 100ms;
  std::unique_ptr<NcclCommunicator> c;
  const auto t0 = std::chrono::steady_clock::now();
  const Status s = create_communicator(driver, 0, 2, noop_broadcast(), o, &c);
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(s.code(), StatusCode::kTimeout) << s.to_string();
  EXPECT_GE(elapsed, 100ms);
  EXPECT_LT(elapsed, 2s);
  EXPECT_EQ(driver->aborted.size(), 1u);
  EXPECT_EQ(c, nullptr);
}

TEST_F(NcclCommunicatorTest, InitErrorIsCommError) {
  driver->init_result = ncclSystemError;
  std::unique_ptr<NcclCommunicator> c;
  const Status s = create_communicator(driver, 0, 2, noop_broadcast(), fast_options(), &c);
  EXPECT_EQ(s.code(), StatusCode::kCommError) << s.to_string();
}

TEST_F(NcclCommunicatorTest, OutOfRangeFaultPolicyIsRejected) {
  NcclOptions o = fast_options();
  o.adopted_fault_policy = static_cast<NcclAdoptedFaultPolicy>(9);
  std::unique_ptr<NcclCommunicator> c;
  const Status s = create_communicator(driver, 0, 2, noop_broadcast(), o, &c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("options.adopted_fault_policy=9"), std::string::npos) << s.message();
  EXPECT_EQ(c, nullptr);
}

TEST_F(NcclCommunicatorTest, LeavesTheEnvironmentAloneByDefault) {
  unsetenv("NCCL_NVLS_ENABLE");
  auto c = make();
  EXPECT_EQ(getenv("NCCL_NVLS_ENABLE"), nullptr);
}

TEST_F(NcclCommunicatorTest, DisableNvlsSetsItOffOnlyWhenUnset) {
  unsetenv("NCCL_NVLS_ENABLE");
  NcclOptions o = fast_options();
  o.disable_nvls = true;
  { auto c = make(0, 2, o); }
  ASSERT_NE(getenv("NCCL_NVLS_ENABLE"), nullptr);
  EXPECT_STREQ(getenv("NCCL_NVLS_ENABLE"), "0");
  setenv("NCCL_NVLS_ENABLE", "1", 1);
  { auto c = make(0, 2, o); }
  EXPECT_STREQ(getenv("NCCL_NVLS_ENABLE"), "1");
  setenv("NCCL_NVLS_ENABLE", "0", 1);
}

TEST_F(NcclCommunicatorTest, OperationArgumentsAreValidatedBeforeAnythingIsIssued) {
  auto c = make();
  alignas(64) char host[64];
  alignas(64) char other_device[64];
  driver->add_buffer(other_device, 1);
  Status s = c->all_gather(nullptr, recv_buf, 16);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("send"), std::string::npos) << s.message();
  s = c->all_gather(send_buf, host, 16);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("not device memory"), std::string::npos) << s.message();
  s = c->all_to_all(other_device, recv_buf, 16);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("device 1"), std::string::npos) << s.message();
  s = c->all_gather(send_buf, recv_buf, SIZE_MAX / 2 + 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("overflows"), std::string::npos) << s.message();
  s = c->reduce_scatter_sum_f32(reinterpret_cast<const float*>(send_buf), nullptr, 4);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  // Zero-sized operations are legal no-ops.
  EXPECT_TRUE(c->all_gather(nullptr, nullptr, 0).ok());
  EXPECT_TRUE(c->all_to_all(nullptr, nullptr, 0).ok());
  EXPECT_TRUE(c->reduce_scatter_sum_f32(nullptr, nullptr, 0).ok());
  EXPECT_TRUE(driver->calls.empty());
  EXPECT_TRUE(c->health().ok());  // bad arguments do not break the communicator
}

TEST_F(NcclCommunicatorTest, PointerChecksCanBeTurnedOff) {
  NcclOptions o = fast_options();
  o.check_pointers = false;
  auto c = make(0, 2, o);
  alignas(64) char host[64];
  EXPECT_TRUE(c->all_gather(host, host, 8).ok());
  EXPECT_EQ(driver->count("all_gather"), 1);
}

TEST_F(NcclCommunicatorTest, OperationsMapToNcclWithTheRightCounts) {
  auto c = make();
  ASSERT_TRUE(c->all_gather(send_buf, recv_buf, 100).ok());
  ASSERT_TRUE(
      c->reduce_scatter_sum_f32(reinterpret_cast<const float*>(send_buf), reinterpret_cast<float*>(recv_buf), 7).ok());
  ASSERT_TRUE(c->all_to_all(send_buf, recv_buf, 64).ok());
  ASSERT_EQ(driver->calls.size(), 3u);
  EXPECT_EQ(driver->calls[0].name, "all_gather");
  EXPECT_EQ(driver->calls[0].count, 100u);  // bytes as ncclUint8
  EXPECT_EQ(driver->calls[1].name, "reduce_scatter");
  EXPECT_EQ(driver->calls[1].count, 7u);  // fp32 elements received per rank
  EXPECT_EQ(driver->calls[2].name, "all_to_all");
  EXPECT_EQ(driver->calls[2].count, 64u);
  EXPECT_EQ(impl(c)->pending_operations(), 3);
  EXPECT_TRUE(c->wait(1s).ok());
  EXPECT_EQ(impl(c)->pending_operations(), 0);
}

TEST_F(NcclCommunicatorTest, AllToAllFallsBackToGroupedSendRecv) {
  driver->all_to_all_available = false;
  auto c = make(1, 4);
  ASSERT_FALSE(impl(c)->uses_native_all_to_all());
  ASSERT_TRUE(c->all_to_all(send_buf, recv_buf, 32).ok());
  EXPECT_EQ(driver->count("send"), 4);
  EXPECT_EQ(driver->count("recv"), 4);
  EXPECT_EQ(driver->count("group_start"), 1);
  EXPECT_EQ(driver->count("group_end"), 1);
  for (const auto& call : driver->calls) {
    if (call.name == "send") EXPECT_EQ(static_cast<const char*>(call.send), send_buf + call.peer * 32);
    if (call.name == "recv") EXPECT_EQ(static_cast<char*>(call.recv), recv_buf + call.peer * 32);
  }
  EXPECT_EQ(driver->group_depth, 0);
}

TEST_F(NcclCommunicatorTest, EnqueueInProgressIsResolvedBeforeReturning) {
  auto c = make();
  driver->next_op_result = ncclInProgress;
  driver->op_polls_in_progress = 3;
  ASSERT_TRUE(c->all_gather(send_buf, recv_buf, 8).ok());
  // Every in-progress poll was consumed: the kernels are on the stream when the call returns.
  ncclResult_t state = ncclInProgress;
  ASSERT_EQ(driver->comm_get_async_error(c->nccl_comm(), &state), ncclSuccess);
  EXPECT_EQ(state, ncclSuccess);
}

TEST_F(NcclCommunicatorTest, EnqueueStuckInProgressTimesOut) {
  NcclOptions o = fast_options();
  o.setup_timeout = 50ms;
  auto c = make(0, 2, o);
  driver->next_op_result = ncclInProgress;
  driver->op_polls_in_progress = -1;
  const Status s = c->all_gather(send_buf, recv_buf, 8);
  EXPECT_EQ(s.code(), StatusCode::kTimeout) << s.to_string();
  EXPECT_EQ(c->health().code(), StatusCode::kUnavailable);
}

TEST_F(NcclCommunicatorTest, GroupsDeferResolutionToGroupEnd) {
  auto c = make();
  ASSERT_TRUE(c->group_start().ok());
  driver->next_op_result = ncclInProgress;
  driver->op_polls_in_progress = 2;
  ASSERT_TRUE(c->all_gather(send_buf, recv_buf, 8).ok());
  ASSERT_TRUE(c->all_to_all(send_buf, recv_buf, 8).ok());
  Status s = c->wait(1s);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << "wait inside a group: " << s.to_string();
  ASSERT_TRUE(c->group_end().ok());
  EXPECT_EQ(driver->group_depth, 0);
  s = c->group_end();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_TRUE(c->wait(1s).ok());
  EXPECT_TRUE(c->health().ok());
}

TEST_F(NcclCommunicatorTest, WaitCompletesWhenTheEventDoes) {
  auto c = make();
  driver->event_polls_not_ready = 5;
  ASSERT_TRUE(c->all_gather(send_buf, recv_buf, 8).ok());
  ASSERT_TRUE(c->wait(5s).ok());
  EXPECT_EQ(driver->event_records, 1);
  EXPECT_EQ(driver->event_queries, 6);
  // Nothing issued since: no event work at all.
  ASSERT_TRUE(c->wait(5s).ok());
  EXPECT_EQ(driver->event_records, 1);
}

TEST_F(NcclCommunicatorTest, DeadlineExpiresWithTimeoutAndTheCommunicatorIsUnusable) {
  auto c = make();
  driver->event_polls_not_ready = -1;  // the peer never issues its part
  ASSERT_TRUE(c->all_to_all(send_buf, recv_buf, 8).ok());
  const auto t0 = std::chrono::steady_clock::now();
  const Status s = c->wait(80ms);
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(s.code(), StatusCode::kTimeout) << s.to_string();
  EXPECT_NE(s.message().find("80 ms"), std::string::npos) << s.message();
  EXPECT_GE(elapsed, 80ms);
  EXPECT_LT(elapsed, 1s);
  ASSERT_EQ(driver->aborted.size(), 1u);
  EXPECT_EQ(c->nccl_comm(), nullptr);
  const Status h = c->health();
  EXPECT_EQ(h.code(), StatusCode::kUnavailable);
  EXPECT_NE(h.message().find("did not complete"), std::string::npos) << h.message();
  EXPECT_EQ(c->all_gather(send_buf, recv_buf, 8).code(), StatusCode::kUnavailable);
  EXPECT_EQ(c->group_start().code(), StatusCode::kUnavailable);
  EXPECT_EQ(c->wait(1s).code(), StatusCode::kUnavailable);
  c->abort("again");  // idempotent
  EXPECT_EQ(driver->aborted.size(), 1u);
  c.reset();
  EXPECT_TRUE(driver->destroyed.empty());  // an aborted communicator is not destroyed twice
  EXPECT_EQ(driver->events_destroyed, 1);
  EXPECT_EQ(driver->streams_destroyed, 1);
}

TEST_F(NcclCommunicatorTest, RemoteErrorDuringWaitIsReported) {
  auto c = make();
  driver->event_polls_not_ready = -1;
  ASSERT_TRUE(c->all_gather(send_buf, recv_buf, 8).ok());
  driver->async_error = ncclRemoteError;
  const Status s = c->wait(10s);
  EXPECT_EQ(s.code(), StatusCode::kRemoteError) << s.to_string();
  EXPECT_EQ(c->health().code(), StatusCode::kUnavailable);
  EXPECT_EQ(driver->aborted.size(), 1u);
}

TEST_F(NcclCommunicatorTest, NcclCallErrorAbortsWithCommError) {
  auto c = make();
  driver->next_op_result = ncclInternalError;
  const Status s =
      c->reduce_scatter_sum_f32(reinterpret_cast<const float*>(send_buf), reinterpret_cast<float*>(recv_buf), 4);
  EXPECT_EQ(s.code(), StatusCode::kCommError) << s.to_string();
  EXPECT_NE(s.message().find("ncclReduceScatter"), std::string::npos) << s.message();
  EXPECT_EQ(c->health().code(), StatusCode::kUnavailable);
}

TEST_F(NcclCommunicatorTest, FailureInsideAGroupClosesNcclsGroup) {
  auto c = make();
  ASSERT_TRUE(c->group_start().ok());
  ASSERT_EQ(driver->group_depth, 1);
  driver->next_op_result = ncclInvalidUsage;
  EXPECT_EQ(c->all_gather(send_buf, recv_buf, 8).code(), StatusCode::kCommError);
  EXPECT_EQ(driver->group_depth, 0);
  EXPECT_EQ(c->group_end().code(), StatusCode::kUnavailable);
}

TEST_F(NcclCommunicatorTest, UnderCaptureWaitOnlyChecksEnqueueing) {
  auto c = make();
  driver->capturing = true;
  driver->event_polls_not_ready = -1;  // would time out if wait() polled the stream
  ASSERT_TRUE(c->all_gather(send_buf, recv_buf, 8).ok());
  ASSERT_TRUE(c->wait(1ms).ok());
  EXPECT_EQ(driver->event_records, 0);
  EXPECT_EQ(driver->event_queries, 0);
  // An error already reported by NCCL still surfaces.
  ASSERT_TRUE(c->all_gather(send_buf, recv_buf, 8).ok());
  driver->async_error = ncclSystemError;
  EXPECT_EQ(c->wait(1ms).code(), StatusCode::kCommError);
}

TEST_F(NcclCommunicatorTest, WaitForCompletionOffSkipsTheHostSync) {
  NcclOptions o = fast_options();
  o.wait_for_completion = false;
  auto c = make(0, 2, o);
  driver->event_polls_not_ready = -1;
  ASSERT_TRUE(c->all_gather(send_buf, recv_buf, 8).ok());
  ASSERT_TRUE(c->wait(1ms).ok());
  EXPECT_EQ(driver->event_queries, 0);
  // Switched back on, the same stall is a timeout.
  c->set_wait_for_completion(true);
  ASSERT_TRUE(c->all_gather(send_buf, recv_buf, 8).ok());
  EXPECT_EQ(c->wait(5ms).code(), StatusCode::kTimeout);
}

TEST_F(NcclCommunicatorTest, AbortFromAnotherThreadEndsAWait) {
  auto c = make();
  driver->event_polls_not_ready = -1;
  ASSERT_TRUE(c->all_gather(send_buf, recv_buf, 8).ok());
  std::thread watchdog([&] {
    std::this_thread::sleep_for(30ms);
    c->abort("watchdog: step took too long");
  });
  const auto t0 = std::chrono::steady_clock::now();
  const Status s = c->wait(20s);
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  watchdog.join();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.to_string();
  EXPECT_NE(s.message().find("watchdog"), std::string::npos) << s.message();
  EXPECT_LT(elapsed, 5s);
}

TEST_F(NcclCommunicatorTest, CallerAbortReportsTheReason) {
  auto c = make();
  c->abort("engine shutting down");
  const Status h = c->health();
  EXPECT_EQ(h.code(), StatusCode::kUnavailable);
  EXPECT_NE(h.message().find("engine shutting down"), std::string::npos) << h.message();
  EXPECT_EQ(driver->aborted.size(), 1u);
}

TEST_F(NcclCommunicatorTest, CleanDestructionFinalizesAndDestroys) {
  auto c = make();
  ASSERT_TRUE(c->all_gather(send_buf, recv_buf, 8).ok());
  ASSERT_TRUE(c->wait(1s).ok());
  ncclComm_t comm = c->nccl_comm();
  c.reset();
  ASSERT_EQ(driver->finalized.size(), 1u);
  ASSERT_EQ(driver->destroyed.size(), 1u);
  EXPECT_EQ(driver->destroyed[0], comm);
  EXPECT_TRUE(driver->aborted.empty());
}

TEST_F(NcclCommunicatorTest, SetStream) {
  auto c = make();
  EXPECT_EQ(c->set_stream(nullptr).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(c->all_gather(send_buf, recv_buf, 8).ok());
  EXPECT_EQ(c->set_stream(reinterpret_cast<void*>(0x1234)).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(c->wait(1s).ok());
  ASSERT_TRUE(c->set_stream(reinterpret_cast<void*>(0x1234)).ok());
  EXPECT_EQ(c->stream(), reinterpret_cast<void*>(0x1234));
}

TEST_F(NcclCommunicatorTest, AdoptedCommunicatorIsNeverDestroyedAndIsRevokedOnFault) {
  ncclComm_t engine = driver->make_ready_comm(1, 2, 0);
  std::unique_ptr<NcclCommunicator> c;
  ASSERT_TRUE(adopt_communicator(driver, engine, fast_options(), &c).ok());
  EXPECT_FALSE(c->owns_comm());
  EXPECT_EQ(c->rank(), 1);
  EXPECT_EQ(c->world_size(), 2);
  EXPECT_EQ(c->device(), 0);
  driver->event_polls_not_ready = -1;
  ASSERT_TRUE(c->all_gather(send_buf, recv_buf, 8).ok());
  EXPECT_EQ(c->wait(20ms).code(), StatusCode::kTimeout);
  c.reset();
  EXPECT_EQ(driver->revoked.size(), 1u);
  EXPECT_TRUE(driver->aborted.empty());
  EXPECT_TRUE(driver->destroyed.empty());
  EXPECT_TRUE(driver->finalized.empty());
}

TEST_F(NcclCommunicatorTest, AdoptedFaultPolicies) {
  for (NcclAdoptedFaultPolicy policy : {NcclAdoptedFaultPolicy::kAbort, NcclAdoptedFaultPolicy::kNone}) {
    auto d = std::make_shared<FakeNcclDriver>();
    ncclComm_t engine = d->make_ready_comm(0, 2, 1);
    NcclOptions o = fast_options();
    o.adopted_fault_policy = policy;
    std::unique_ptr<NcclCommunicator> c;
    ASSERT_TRUE(adopt_communicator(d, engine, o, &c).ok());
    EXPECT_EQ(c->device(), 1);
    c->abort("test");
    c.reset();
    EXPECT_EQ(d->aborted.size(), policy == NcclAdoptedFaultPolicy::kAbort ? 1u : 0u);
    EXPECT_TRUE(d->revoked.empty());
    EXPECT_TRUE(d->destroyed.empty());
  }
}

TEST_F(NcclCommunicatorTest, AdoptRejectsBadHandles) {
  std::unique_ptr<NcclCommunicator> c;
  EXPECT_EQ(adopt_communicator(driver, nullptr, fast_options(), &c).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(adopt_communicator(driver, reinterpret_cast<ncclComm_t>(0xdead0), fast_options(), &c).code(),
            StatusCode::kInvalidArgument);
  ncclComm_t engine = driver->make_ready_comm(0, 2, 0);
  NcclOptions o = fast_options();
  o.device = 1;
  EXPECT_EQ(adopt_communicator(driver, engine, o, &c).code(), StatusCode::kInvalidArgument);
  driver->async_error = ncclRemoteError;
  EXPECT_EQ(adopt_communicator(driver, engine, fast_options(), &c).code(), StatusCode::kUnavailable);
  EXPECT_EQ(c, nullptr);
}

TEST_F(NcclCommunicatorTest, SingleProcessGroup) {
  std::vector<std::unique_ptr<NcclCommunicator>> comms;
  EXPECT_EQ(create_single_process(driver, {}, fast_options(), &comms).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(create_single_process(driver, {0, 0}, fast_options(), &comms).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(create_single_process(driver, {0, 2}, fast_options(), &comms).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(driver->init_ids.empty());
  driver->current_device = 1;
  ASSERT_TRUE(create_single_process(driver, {1, 0}, fast_options(), &comms).ok());
  ASSERT_EQ(comms.size(), 2u);
  EXPECT_EQ(comms[0]->rank(), 0);
  EXPECT_EQ(comms[0]->device(), 1);
  EXPECT_EQ(comms[1]->rank(), 1);
  EXPECT_EQ(comms[1]->device(), 0);
  EXPECT_NE(comms[0]->stream(), comms[1]->stream());
  EXPECT_EQ(driver->current_device, 1);  // restored
  EXPECT_EQ(driver->count("group_start"), 1);
  EXPECT_EQ(driver->count("group_end"), 1);
  EXPECT_EQ(driver->init_ids.size(), 2u);
}

TEST_F(NcclCommunicatorTest, SingleProcessGroupIsDestroyedTogether) {
  std::vector<std::unique_ptr<NcclCommunicator>> comms;
  ASSERT_TRUE(create_single_process(driver, {0, 1}, fast_options(), &comms).ok());
  destroy_nccl_communicators(&comms);
  EXPECT_TRUE(comms.empty());
  EXPECT_EQ(driver->finalized.size(), 2u);
  EXPECT_EQ(driver->destroyed.size(), 2u);
  EXPECT_TRUE(driver->aborted.empty());
}

TEST_F(NcclCommunicatorTest, SingleProcessCreationTimeoutAbortsEveryRank) {
  driver->init_polls_in_progress = -1;
  NcclOptions o = fast_options();
  o.setup_timeout = 50ms;
  std::vector<std::unique_ptr<NcclCommunicator>> comms;
  EXPECT_EQ(create_single_process(driver, {0, 1}, o, &comms).code(), StatusCode::kTimeout);
  EXPECT_EQ(driver->aborted.size(), 2u);
  EXPECT_TRUE(comms.empty());
}

TEST(NcclVersion, NamesLoadedAndBuiltVersions) {
  const std::string v = nccl_version_string();
  EXPECT_NE(v.find("built with 2."), std::string::npos) << v;
}

}  // namespace
}  // namespace mladcp
