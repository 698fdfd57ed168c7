// The NCCL communicator's implementation (internal: the public API is include/mladcp/nccl.h).
//
// State machine. A communicator is usable until the first failure: an NCCL call that returns an
// error, an enqueue that stays in progress past options.setup_timeout, a wait() whose deadline
// passes, or a caller's abort(). Then it is aborted once (ncclCommAbort for an owned communicator,
// options.adopted_fault_policy for an adopted one), and every later call returns kUnavailable with
// the first failure's reason. abort() may be called from another thread (a watchdog): every NCCL
// call on the communicator holds one mutex, so the handle is never used after it was freed.
//
// Non-blocking NCCL: a call may return ncclInProgress while NCCL enqueues in the background. The
// communicator resolves that (polling ncclCommGetAsyncError) before the call returns, outside a
// group, or at group_end() inside one, so once an operation returned Ok its kernels are on the
// stream and later work on the stream is ordered after them.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/nccl_driver.h"
#include "comm/nccl_single_process.h"
#include "mladcp/nccl.h"

namespace mladcp::nccl_detail {

// A ready NCCL communicator and where it issues.
struct CommSetup {
  ncclComm_t comm = nullptr;
  int rank = 0;
  int world = 1;
  int device = 0;
  cudaStream_t stream = nullptr;  // nullptr: the communicator creates its own
  bool owns_comm = true;
};

class NcclCommunicatorImpl final : public NcclCommunicator {
 public:
  // Wraps `setup.comm` (already initialized). Creates the completion event (and the stream when
  // setup.stream is null) on setup.device. On error an owned comm is aborted.
  static Status make(std::shared_ptr<Driver> driver, const CommSetup& setup, const NcclOptions& options,
                     std::unique_ptr<NcclCommunicator>* out);
  ~NcclCommunicatorImpl() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  Device memory() const override { return Device::kCuda; }
  std::string name() const override { return "nccl"; }

  Status all_gather(const void* send, void* recv, size_t bytes) override;
  Status reduce_scatter_sum_f32(const float* send, float* recv, size_t count) override;
  Status all_to_all(const void* send, void* recv, size_t bytes_per_rank) override;
  Status group_start() override;
  Status group_end() override;
  Status wait(std::chrono::milliseconds deadline) override;
  void abort(const std::string& reason) override;
  Status health() const override;

  int device() const override { return device_; }
  void* stream() const override { return stream_; }
  Status set_stream(void* stream) override;
  void set_wait_for_completion(bool wait) override;
  ncclComm* nccl_comm() const override;
  bool owns_comm() const override { return owns_comm_; }

  // Operations issued since the last wait() (tests use it).
  int pending_operations() const { return pending_ops_; }
  bool uses_native_all_to_all() const { return native_all_to_all_; }

 private:
  NcclCommunicatorImpl(std::shared_ptr<Driver> driver, const CommSetup& setup, const NcclOptions& options);

  // "nccl rank r/W (device d)": the prefix of every message.
  std::string who() const;
  Status unavailable_locked() const;
  // Marks the communicator failed with `status` (the first failure wins) and tears NCCL down;
  // returns the status to hand to the caller. Requires mu_.
  Status fail_locked(Status status);
  // Checks a buffer argument: non-null, and (options.check_pointers) device memory of device_.
  Status check_buffer(const void* ptr, const char* what) const;
  // After an NCCL call: an error fails the communicator; ncclInProgress is resolved (outside a
  // group) or remembered until group_end(). Requires mu_.
  Status after_call_locked(ncclResult_t result, const char* call);
  // Polls ncclCommGetAsyncError until the state leaves ncclInProgress or `limit` passes. Requires mu_.
  Status resolve_in_progress_locked(std::chrono::steady_clock::time_point limit, const char* what);
  Status check_async_error_locked(const char* what);

  std::shared_ptr<Driver> driver_;
  NcclOptions options_;
  ncclComm_t comm_ = nullptr;
  const int rank_;
  const int world_;
  const int device_;
  cudaStream_t stream_ = nullptr;
  cudaStream_t owned_stream_ = nullptr;
  cudaEvent_t done_event_ = nullptr;
  const bool owns_comm_;
  bool native_all_to_all_ = false;

  mutable std::mutex mu_;
  std::atomic<bool> failed_{false};
  Status failure_;                // the first failure (kUnavailable is returned with its message)
  int group_depth_ = 0;           // this communicator's open group_start() calls
  bool enqueue_pending_ = false;  // an NCCL call returned ncclInProgress, not yet resolved
  int pending_ops_ = 0;
};

// Creation with an explicit driver; the public factories pass real_driver().
Status create_communicator(const std::shared_ptr<Driver>& driver, int rank, int world, const NcclIdBroadcast& broadcast,
                           const NcclOptions& options, std::unique_ptr<NcclCommunicator>* out);
Status create_single_process(const std::shared_ptr<Driver>& driver, const std::vector<int>& devices,
                             const NcclOptions& options, std::vector<std::unique_ptr<NcclCommunicator>>* out);
Status adopt_communicator(const std::shared_ptr<Driver>& driver, ncclComm_t comm, const NcclOptions& options,
                          std::unique_ptr<NcclCommunicator>* out);

// Maps an NCCL error to a status code: ncclRemoteError -> kRemoteError, others -> kCommError.
StatusCode status_code_of(ncclResult_t result);

}  // namespace mladcp::nccl_detail
