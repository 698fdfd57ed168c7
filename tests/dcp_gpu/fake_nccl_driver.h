// A scripted NCCL/CUDA driver: lets the communicator's logic (validation, deadlines, aborts,
// enqueue in progress, graph capture, fault policies) be tested on machines without a GPU.
#pragma once

#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "comm/nccl_driver.h"

namespace mladcp::test {

class FakeNcclDriver final : public nccl_detail::Driver {
 public:
  // ---- script (set before use; guarded by mu) ----
  std::mutex mu;
  int devices = 2;
  int current_device = 0;
  bool all_to_all_available = true;
  int init_polls_in_progress = 2;  // polls a new communicator stays ncclInProgress (-1: forever)
  ncclResult_t init_result = ncclInProgress;
  ncclResult_t next_op_result = ncclSuccess;  // what the next collective/p2p call returns (then reset)
  int op_polls_in_progress = 0;               // after an op returned ncclInProgress: polls until ncclSuccess
  ncclResult_t async_error = ncclSuccess;     // injected communicator error (reported by polls)
  int event_polls_not_ready = 0;              // cudaEventQuery answers NotReady this many times (-1: forever)
  bool capturing = false;
  std::string library_error;                  // non-empty: the NCCL library "could not be loaded"
  std::map<const void*, int> device_buffers;  // pointer -> device; anything else is host memory

  // ---- record ----
  struct Call {
    std::string name;
    const void* send = nullptr;
    void* recv = nullptr;
    size_t count = 0;
    int peer = -1;
    ncclComm_t comm = nullptr;
  };
  std::vector<Call> calls;
  std::vector<ncclComm_t> aborted, revoked, destroyed, finalized;
  std::vector<std::vector<char>> init_ids;  // the unique id each init saw
  int event_queries = 0, event_records = 0, streams_created = 0, streams_destroyed = 0, events_destroyed = 0;
  int group_depth = 0;
  static constexpr char kIdByte = 0x5a;

  int count(const std::string& name) {
    std::lock_guard<std::mutex> l(mu);
    int n = 0;
    for (const Call& c : calls) n += c.name == name;
    return n;
  }
  void add_buffer(const void* p, int device) {
    std::lock_guard<std::mutex> l(mu);
    device_buffers[p] = device;
  }

  // ---- NCCL ----
  std::string load_error() override {
    std::lock_guard<std::mutex> l(mu);
    return library_error;
  }
  int version() override { return 22809; }
  ncclResult_t get_unique_id(ncclUniqueId* id) override {
    std::memset(id->internal, kIdByte, sizeof(id->internal));
    return ncclSuccess;
  }
  ncclResult_t comm_init_rank_config(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                     ncclConfig_t* config) override {
    std::lock_guard<std::mutex> l(mu);
    (void)nranks, (void)config;
    init_ids.emplace_back(id.internal, id.internal + sizeof(id.internal));
    if (init_result != ncclSuccess && init_result != ncclInProgress) return init_result;
    *comm = reinterpret_cast<ncclComm_t>(uintptr_t(0x1000 + 0x10 * next_comm_));
    State& s = states_[*comm];
    s.rank = rank;
    s.world = nranks;
    s.device = current_device;
    s.polls_in_progress = init_result == ncclInProgress ? init_polls_in_progress : 0;
    ++next_comm_;
    return init_result;
  }
  // A communicator as an engine would hand it over (already initialized).
  ncclComm_t make_ready_comm(int rank, int world, int device) {
    std::lock_guard<std::mutex> l(mu);
    ncclComm_t c = reinterpret_cast<ncclComm_t>(uintptr_t(0x9000 + 0x10 * next_comm_++));
    State& s = states_[c];
    s.rank = rank;
    s.world = world;
    s.device = device;
    return c;
  }
  ncclResult_t comm_get_async_error(ncclComm_t comm, ncclResult_t* state) override {
    std::lock_guard<std::mutex> l(mu);
    auto it = states_.find(comm);
    if (it == states_.end()) return ncclInvalidArgument;
    State& s = it->second;
    if (s.polls_in_progress != 0) {
      if (s.polls_in_progress > 0) --s.polls_in_progress;
      *state = ncclInProgress;
      return ncclSuccess;
    }
    *state = async_error;
    return ncclSuccess;
  }
  ncclResult_t comm_finalize(ncclComm_t comm) override { return record_teardown(comm, finalized, false); }
  ncclResult_t comm_destroy(ncclComm_t comm) override { return record_teardown(comm, destroyed, true); }
  ncclResult_t comm_abort(ncclComm_t comm) override { return record_teardown(comm, aborted, true); }
  ncclResult_t comm_revoke(ncclComm_t comm) override { return record_teardown(comm, revoked, false); }
  ncclResult_t comm_count(ncclComm_t comm, int* n) override { return describe(comm, n, &State::world); }
  ncclResult_t comm_user_rank(ncclComm_t comm, int* r) override { return describe(comm, r, &State::rank); }
  ncclResult_t comm_cu_device(ncclComm_t comm, int* d) override { return describe(comm, d, &State::device); }
  const char* last_error(ncclComm_t) override { return "fake last error"; }
  const char* error_string(ncclResult_t r) override {
    switch (r) {
      case ncclSuccess:
        return "success";
      case ncclRemoteError:
        return "remote process exited or there was a network error";
      case ncclInProgress:
        return "in progress";
      default:
        return "fake nccl error";
    }
  }

  ncclResult_t all_gather(const void* send, void* recv, size_t count, ncclDataType_t, ncclComm_t comm,
                          cudaStream_t) override {
    return op({"all_gather", send, recv, count, -1, comm});
  }
  ncclResult_t reduce_scatter(const void* send, void* recv, size_t count, ncclDataType_t, ncclRedOp_t, ncclComm_t comm,
                              cudaStream_t) override {
    return op({"reduce_scatter", send, recv, count, -1, comm});
  }
  ncclResult_t all_to_all(const void* send, void* recv, size_t count, ncclDataType_t, ncclComm_t comm,
                          cudaStream_t) override {
    return op({"all_to_all", send, recv, count, -1, comm});
  }
  bool has_all_to_all() override { return all_to_all_available; }
  ncclResult_t send(const void* buf, size_t count, ncclDataType_t, int peer, ncclComm_t comm, cudaStream_t) override {
    return op({"send", buf, nullptr, count, peer, comm});
  }
  ncclResult_t recv(void* buf, size_t count, ncclDataType_t, int peer, ncclComm_t comm, cudaStream_t) override {
    return op({"recv", nullptr, buf, count, peer, comm});
  }
  ncclResult_t group_start() override {
    std::lock_guard<std::mutex> l(mu);
    calls.push_back({"group_start"});
    ++group_depth;
    return ncclSuccess;
  }
  ncclResult_t group_end() override {
    std::lock_guard<std::mutex> l(mu);
    calls.push_back({"group_end"});
    --group_depth;
    return ncclSuccess;
  }

  // ---- CUDA ----
  cudaError_t device_count(int* n) override {
    std::lock_guard<std::mutex> l(mu);
    *n = devices;
    return devices > 0 ? cudaSuccess : cudaErrorNoDevice;
  }
  cudaError_t get_device(int* d) override {
    std::lock_guard<std::mutex> l(mu);
    *d = current_device;
    return cudaSuccess;
  }
  cudaError_t set_device(int d) override {
    std::lock_guard<std::mutex> l(mu);
    if (d < 0 || d >= devices) return cudaErrorInvalidDevice;
    current_device = d;
    return cudaSuccess;
  }
  cudaError_t stream_create(cudaStream_t* s) override {
    std::lock_guard<std::mutex> l(mu);
    *s = reinterpret_cast<cudaStream_t>(uintptr_t(0x5000 + 0x10 * ++streams_created));
    return cudaSuccess;
  }
  cudaError_t stream_destroy(cudaStream_t) override {
    std::lock_guard<std::mutex> l(mu);
    ++streams_destroyed;
    return cudaSuccess;
  }
  cudaError_t stream_is_capturing(cudaStream_t, bool* c) override {
    std::lock_guard<std::mutex> l(mu);
    *c = capturing;
    return cudaSuccess;
  }
  cudaError_t event_create(cudaEvent_t* e) override {
    *e = reinterpret_cast<cudaEvent_t>(uintptr_t(0x7000));
    return cudaSuccess;
  }
  cudaError_t event_destroy(cudaEvent_t) override {
    std::lock_guard<std::mutex> l(mu);
    ++events_destroyed;
    return cudaSuccess;
  }
  cudaError_t event_record(cudaEvent_t, cudaStream_t) override {
    std::lock_guard<std::mutex> l(mu);
    ++event_records;
    return cudaSuccess;
  }
  cudaError_t event_query(cudaEvent_t) override {
    std::lock_guard<std::mutex> l(mu);
    ++event_queries;
    if (event_polls_not_ready != 0) {
      if (event_polls_not_ready > 0) --event_polls_not_ready;
      return cudaErrorNotReady;
    }
    return cudaSuccess;
  }
  cudaError_t pointer_location(const void* p, bool* device_memory, int* device) override {
    std::lock_guard<std::mutex> l(mu);
    auto it = device_buffers.find(p);
    *device_memory = it != device_buffers.end();
    *device = *device_memory ? it->second : -1;
    return cudaSuccess;
  }
  const char* cuda_error_string(cudaError_t) override { return "fake cuda error"; }

 private:
  struct State {
    int rank = 0, world = 1, device = 0;
    int polls_in_progress = 0;
    bool freed = false;
  };
  ncclResult_t op(Call c) {
    std::lock_guard<std::mutex> l(mu);
    auto it = states_.find(c.comm);
    if (it == states_.end() || it->second.freed) return ncclInvalidArgument;
    calls.push_back(c);
    const ncclResult_t r = next_op_result;
    next_op_result = ncclSuccess;
    if (r == ncclInProgress) it->second.polls_in_progress = op_polls_in_progress;
    return r;
  }
  ncclResult_t record_teardown(ncclComm_t comm, std::vector<ncclComm_t>& list, bool frees) {
    std::lock_guard<std::mutex> l(mu);
    list.push_back(comm);
    auto it = states_.find(comm);
    if (it == states_.end()) return ncclInvalidArgument;
    if (frees) it->second.freed = true;
    it->second.polls_in_progress = 0;
    return ncclSuccess;
  }
  ncclResult_t describe(ncclComm_t comm, int* out, int State::*field) {
    std::lock_guard<std::mutex> l(mu);
    auto it = states_.find(comm);
    if (it == states_.end() || it->second.freed) return ncclInvalidArgument;
    *out = it->second.*field;
    return ncclSuccess;
  }

  std::map<ncclComm_t, State> states_;
  int next_comm_ = 0;
};

}  // namespace mladcp::test
