// The NCCL communicator: operations, deadlines, aborts and the creation paths.
#include "comm/nccl_communicator.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <set>
#include <thread>
#include <utility>

#include "core/validate.h"

namespace mladcp {
namespace nccl_detail {
namespace {

using Clock = std::chrono::steady_clock;
using detail::cat;

static_assert(sizeof(NcclUniqueId::bytes) == NCCL_UNIQUE_ID_BYTES, "NcclUniqueId must hold ncclUniqueId");
static_assert(sizeof(ncclUniqueId) == NCCL_UNIQUE_ID_BYTES, "ncclUniqueId is raw bytes");

// Polling pace: spin (yielding) for the first 200 µs, where an exchange normally completes, then
// sleep 50 µs between polls so that a long wait does not burn a core.
class Backoff {
 public:
  void pause() {
    if (Clock::now() - start_ < std::chrono::microseconds(200)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

 private:
  Clock::time_point start_ = Clock::now();
};

long long to_ms(std::chrono::milliseconds d) { return static_cast<long long>(d.count()); }

std::string nccl_error_text(Driver& driver, ncclComm_t comm, ncclResult_t result) {
  std::string text = driver.error_string(result);
  const char* last = driver.last_error(comm);
  if (last && *last) text += cat(" (", last, ")");
  return text;
}

ncclConfig_t make_config(const NcclOptions& options) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = options.blocking ? 1 : 0;
  config.commName = options.name.empty() ? nullptr : options.name.c_str();
  return config;
}

// Polls every communicator until none is in progress: Ok when all are ready, kTimeout at `limit`,
// the NCCL error otherwise.
Status wait_until_ready(Driver& driver, const std::vector<ncclComm_t>& comms, Clock::time_point limit,
                        const std::string& who) {
  Backoff backoff;
  for (;;) {
    bool in_progress = false;
    for (ncclComm_t comm : comms) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = driver.comm_get_async_error(comm, &state);
      if (r != ncclSuccess)
        return Status(StatusCode::kCommError,
                      cat(who, ": ncclCommGetAsyncError failed during creation: ", nccl_error_text(driver, comm, r)));
      if (state == ncclInProgress) {
        in_progress = true;
      } else if (state != ncclSuccess) {
        return Status(status_code_of(state),
                      cat(who, ": communicator creation failed: ", nccl_error_text(driver, comm, state)));
      }
    }
    if (!in_progress) return Status::Ok();
    if (Clock::now() >= limit)
      return Status(StatusCode::kTimeout, cat(who,
                                              ": communicator creation did not finish in time (did every rank "
                                              "join with the same unique id and world size?)"));
    backoff.pause();
  }
}

Status check_setup_options(const NcclOptions& options) {
  if (options.setup_timeout.count() <= 0)
    return detail::invalid("options.setup_timeout=", to_ms(options.setup_timeout), " ms: must be > 0");
  const NcclAdoptedFaultPolicy f = options.adopted_fault_policy;
  if (f != NcclAdoptedFaultPolicy::kRevoke && f != NcclAdoptedFaultPolicy::kAbort && f != NcclAdoptedFaultPolicy::kNone)
    return detail::invalid("options.adopted_fault_policy=", int(f),
                           ": accepted NcclAdoptedFaultPolicy::kRevoke (0), kAbort (1), kNone (2)");
  return Status::Ok();
}

Status count_devices(Driver& driver, int* count) {
  const cudaError_t e = driver.device_count(count);
  if (e != cudaSuccess || *count <= 0)
    return Status(StatusCode::kUnavailable, cat("no CUDA device visible (cudaGetDeviceCount: ",
                                                e == cudaSuccess ? "0 devices" : driver.cuda_error_string(e), ")"));
  return Status::Ok();
}

// The NCCL library must be usable before any NCCL call.
Status check_loaded(Driver& driver) {
  const std::string error = driver.load_error();
  if (!error.empty()) return Status(StatusCode::kUnavailable, error);
  return Status::Ok();
}

}  // namespace

StatusCode status_code_of(ncclResult_t result) {
  return result == ncclRemoteError ? StatusCode::kRemoteError : StatusCode::kCommError;
}

// ---------------------------------------------------------------------------------------------
// NcclCommunicatorImpl

NcclCommunicatorImpl::NcclCommunicatorImpl(std::shared_ptr<Driver> driver, const CommSetup& setup,
                                           const NcclOptions& options)
    : driver_(std::move(driver)),
      options_(options),
      comm_(setup.comm),
      rank_(setup.rank),
      world_(setup.world),
      device_(setup.device),
      stream_(setup.stream),
      owns_comm_(setup.owns_comm) {}

Status NcclCommunicatorImpl::make(std::shared_ptr<Driver> driver, const CommSetup& setup, const NcclOptions& options,
                                  std::unique_ptr<NcclCommunicator>* out) {
  std::unique_ptr<NcclCommunicatorImpl> c(new NcclCommunicatorImpl(driver, setup, options));
  const std::string who = c->who();
  auto give_up = [&](Status s) {
    c->abort("creation failed");  // tears the owned comm down; the destructor frees the rest
    return s;
  };
  cudaError_t e = driver->set_device(setup.device);
  if (e != cudaSuccess)
    return give_up(Status(StatusCode::kCudaError, cat(who, ": cudaSetDevice: ", driver->cuda_error_string(e))));
  if (!c->stream_) {
    e = driver->stream_create(&c->owned_stream_);
    if (e != cudaSuccess)
      return give_up(Status(StatusCode::kCudaError, cat(who, ": cudaStreamCreate: ", driver->cuda_error_string(e))));
    c->stream_ = c->owned_stream_;
  }
  e = driver->event_create(&c->done_event_);
  if (e != cudaSuccess)
    return give_up(Status(StatusCode::kCudaError, cat(who, ": cudaEventCreate: ", driver->cuda_error_string(e))));
  c->native_all_to_all_ = driver->has_all_to_all();
  *out = std::move(c);
  return Status::Ok();
}

NcclCommunicatorImpl::~NcclCommunicatorImpl() {
  std::unique_lock<std::mutex> lock(mu_);
  int previous = -1;
  (void)driver_->get_device(&previous);
  (void)driver_->set_device(device_);
  if (comm_ && owns_comm_) {
    // Orderly teardown: finalize (flushes issued work), wait bounded, then destroy; abort otherwise.
    const ncclResult_t finalized = driver_->comm_finalize(comm_);
    bool clean = finalized == ncclSuccess || finalized == ncclInProgress;
    const Clock::time_point limit = Clock::now() + options_.setup_timeout;
    Backoff backoff;
    while (clean) {
      ncclResult_t state = ncclSuccess;
      if (driver_->comm_get_async_error(comm_, &state) != ncclSuccess ||
          (state != ncclSuccess && state != ncclInProgress)) {
        clean = false;
        break;
      }
      if (state == ncclSuccess) break;
      if (Clock::now() >= limit) {
        clean = false;
        break;
      }
      backoff.pause();
    }
    if (clean) {
      (void)driver_->comm_destroy(comm_);
    } else {
      (void)driver_->comm_abort(comm_);
    }
    comm_ = nullptr;
  }
  if (done_event_) (void)driver_->event_destroy(done_event_);
  if (owned_stream_) (void)driver_->stream_destroy(owned_stream_);
  if (previous >= 0) (void)driver_->set_device(previous);
}

std::string NcclCommunicatorImpl::who() const {
  return cat("nccl rank ", rank_, "/", world_, " (device ", device_, ")");
}

Status NcclCommunicatorImpl::unavailable_locked() const {
  return Status(StatusCode::kUnavailable, cat(who(), ": communicator unusable after: ", failure_.to_string()));
}

Status NcclCommunicatorImpl::fail_locked(Status status) {
  if (failed_.load()) return status;
  failure_ = status;
  failed_.store(true);
  // Leave NCCL's per-thread group state as it was before this communicator's group_start() calls.
  for (; group_depth_ > 0; --group_depth_) (void)driver_->group_end();
  if (comm_) {
    if (owns_comm_) {
      (void)driver_->comm_abort(comm_);
    } else {
      switch (options_.adopted_fault_policy) {
        case NcclAdoptedFaultPolicy::kRevoke:
          (void)driver_->comm_revoke(comm_);
          break;
        case NcclAdoptedFaultPolicy::kAbort:
          (void)driver_->comm_abort(comm_);
          break;
        case NcclAdoptedFaultPolicy::kNone:
          break;
      }
    }
    comm_ = nullptr;
  }
  enqueue_pending_ = false;
  pending_ops_ = 0;
  return status;
}

Status NcclCommunicatorImpl::check_buffer(const void* ptr, const char* what) const {
  if (!ptr)
    return detail::invalid(what, ": null (the nccl communicator needs a device buffer of device ", device_, ")");
  if (!options_.check_pointers) return Status::Ok();
  bool device_memory = false;
  int device = -1;
  const cudaError_t e = driver_->pointer_location(ptr, &device_memory, &device);
  if (e != cudaSuccess || !device_memory)
    return detail::invalid(what, "=", ptr, ": not device memory (the nccl communicator moves device buffers of device ",
                           device_, ")");
  if (device != device_)
    return detail::invalid(what, "=", ptr, ": memory of device ", device, ", but this communicator runs on device ",
                           device_);
  return Status::Ok();
}

Status NcclCommunicatorImpl::check_async_error_locked(const char* what) {
  ncclResult_t state = ncclSuccess;
  const ncclResult_t r = driver_->comm_get_async_error(comm_, &state);
  if (r != ncclSuccess)
    return fail_locked(Status(StatusCode::kCommError, cat(who(), ": ", what, ": ncclCommGetAsyncError failed: ",
                                                          nccl_error_text(*driver_, comm_, r))));
  if (state != ncclSuccess && state != ncclInProgress)
    return fail_locked(Status(status_code_of(state), cat(who(), ": ", what, ": the communicator reports ",
                                                         nccl_error_text(*driver_, comm_, state))));
  return Status::Ok();
}

Status NcclCommunicatorImpl::resolve_in_progress_locked(Clock::time_point limit, const char* what) {
  // Caller holds mu_ through a std::unique_lock in the calling operation; this loop keeps it (an
  // enqueue normally resolves within microseconds, and `limit` bounds it).
  Backoff backoff;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = driver_->comm_get_async_error(comm_, &state);
    if (r != ncclSuccess)
      return fail_locked(Status(StatusCode::kCommError, cat(who(), ": ", what, ": ncclCommGetAsyncError failed: ",
                                                            nccl_error_text(*driver_, comm_, r))));
    if (state == ncclSuccess) {
      enqueue_pending_ = false;
      return Status::Ok();
    }
    if (state != ncclInProgress)
      return fail_locked(
          Status(status_code_of(state), cat(who(), ": ", what, " failed: ", nccl_error_text(*driver_, comm_, state))));
    if (Clock::now() >= limit)
      return fail_locked(Status(StatusCode::kTimeout, cat(who(), ": ", what,
                                                          " was still being enqueued when its time ran out; "
                                                          "communicator aborted")));
    backoff.pause();
  }
}

Status NcclCommunicatorImpl::after_call_locked(ncclResult_t result, const char* call) {
  if (result == ncclSuccess || result == ncclInProgress) {
    ++pending_ops_;
    if (result == ncclInProgress) enqueue_pending_ = true;
    if (enqueue_pending_ && group_depth_ == 0)
      return resolve_in_progress_locked(Clock::now() + options_.setup_timeout, call);
    return Status::Ok();
  }
  return fail_locked(
      Status(status_code_of(result),
             cat(who(), ": ", call, " failed: ", nccl_error_text(*driver_, comm_, result), "; communicator aborted")));
}

Status NcclCommunicatorImpl::all_gather(const void* send, void* recv, size_t bytes) {
  std::unique_lock<std::mutex> lock(mu_);
  if (failed_.load()) return unavailable_locked();
  if (bytes == 0) return Status::Ok();
  if (bytes > std::numeric_limits<size_t>::max() / size_t(world_))
    return detail::invalid("bytes=", bytes, ": bytes · world (", world_, ") overflows");
  MLADCP_RETURN_IF_ERROR(check_buffer(send, "send"));
  MLADCP_RETURN_IF_ERROR(check_buffer(recv, "recv"));
  return after_call_locked(driver_->all_gather(send, recv, bytes, ncclUint8, comm_, stream_), "ncclAllGather");
}

Status NcclCommunicatorImpl::reduce_scatter_sum_f32(const float* send, float* recv, size_t count) {
  std::unique_lock<std::mutex> lock(mu_);
  if (failed_.load()) return unavailable_locked();
  if (count == 0) return Status::Ok();
  if (count > std::numeric_limits<size_t>::max() / sizeof(float) / size_t(world_))
    return detail::invalid("count=", count, ": count · world (", world_, ") fp32 elements overflow");
  MLADCP_RETURN_IF_ERROR(check_buffer(send, "send"));
  MLADCP_RETURN_IF_ERROR(check_buffer(recv, "recv"));
  return after_call_locked(driver_->reduce_scatter(send, recv, count, ncclFloat32, ncclSum, comm_, stream_),
                           "ncclReduceScatter");
}

Status NcclCommunicatorImpl::all_to_all(const void* send, void* recv, size_t bytes_per_rank) {
  std::unique_lock<std::mutex> lock(mu_);
  if (failed_.load()) return unavailable_locked();
  if (bytes_per_rank == 0) return Status::Ok();
  if (bytes_per_rank > std::numeric_limits<size_t>::max() / size_t(world_))
    return detail::invalid("bytes_per_rank=", bytes_per_rank, ": bytes_per_rank · world (", world_, ") overflows");
  MLADCP_RETURN_IF_ERROR(check_buffer(send, "send"));
  MLADCP_RETURN_IF_ERROR(check_buffer(recv, "recv"));
  if (native_all_to_all_)
    return after_call_locked(driver_->all_to_all(send, recv, bytes_per_rank, ncclUint8, comm_, stream_),
                             "ncclAlltoAll");
  // One grouped send and receive per peer (self included: NCCL copies locally).
  ncclResult_t r = driver_->group_start();
  if (r != ncclSuccess) return after_call_locked(r, "ncclGroupStart (all-to-all)");
  const char* const send_bytes = static_cast<const char*>(send);
  char* const recv_bytes = static_cast<char*>(recv);
  for (int peer = 0; peer < world_; ++peer) {
    const size_t offset = size_t(peer) * bytes_per_rank;
    r = driver_->send(send_bytes + offset, bytes_per_rank, ncclUint8, peer, comm_, stream_);
    if (r == ncclSuccess || r == ncclInProgress)
      r = driver_->recv(recv_bytes + offset, bytes_per_rank, ncclUint8, peer, comm_, stream_);
    if (r != ncclSuccess && r != ncclInProgress) {
      (void)driver_->group_end();
      return after_call_locked(r, "ncclSend/ncclRecv (all-to-all)");
    }
  }
  return after_call_locked(driver_->group_end(), "ncclGroupEnd (all-to-all)");
}

Status NcclCommunicatorImpl::group_start() {
  std::unique_lock<std::mutex> lock(mu_);
  if (failed_.load()) return unavailable_locked();
  const ncclResult_t r = driver_->group_start();
  if (r != ncclSuccess)
    return fail_locked(
        Status(status_code_of(r), cat(who(), ": ncclGroupStart failed: ", nccl_error_text(*driver_, comm_, r))));
  ++group_depth_;
  return Status::Ok();
}

Status NcclCommunicatorImpl::group_end() {
  std::unique_lock<std::mutex> lock(mu_);
  if (failed_.load()) return unavailable_locked();
  if (group_depth_ == 0) return detail::invalid("group_end: no open group_start() on this communicator");
  --group_depth_;
  const ncclResult_t r = driver_->group_end();
  if (r != ncclSuccess && r != ncclInProgress)
    return fail_locked(Status(status_code_of(r), cat(who(), ": ncclGroupEnd failed: ",
                                                     nccl_error_text(*driver_, comm_, r), "; communicator aborted")));
  if (r == ncclInProgress) enqueue_pending_ = true;
  if (enqueue_pending_ && group_depth_ == 0)
    return resolve_in_progress_locked(Clock::now() + options_.setup_timeout, "ncclGroupEnd");
  return Status::Ok();
}

Status NcclCommunicatorImpl::wait(std::chrono::milliseconds deadline) {
  const Clock::time_point limit = Clock::now() + deadline;
  std::unique_lock<std::mutex> lock(mu_);
  if (failed_.load()) return unavailable_locked();
  if (group_depth_ > 0)
    return detail::invalid("wait: called with ", group_depth_, " group_start() still open; call group_end() first");
  if (enqueue_pending_) MLADCP_RETURN_IF_ERROR(resolve_in_progress_locked(limit, "enqueueing"));
  MLADCP_RETURN_IF_ERROR(check_async_error_locked("wait"));

  bool capturing = false;
  cudaError_t e = driver_->stream_is_capturing(stream_, &capturing);
  if (e != cudaSuccess)
    return fail_locked(Status(StatusCode::kCudaError, cat(who(), ": cudaStreamIsCapturing: ",
                                                          driver_->cuda_error_string(e), "; communicator aborted")));
  const int ops = pending_ops_;
  pending_ops_ = 0;
  // Under capture the stream orders the data and nothing runs yet: enqueued is complete.
  if (capturing || !options_.wait_for_completion || ops == 0) return Status::Ok();

  e = driver_->event_record(done_event_, stream_);
  if (e != cudaSuccess)
    return fail_locked(Status(StatusCode::kCudaError, cat(who(), ": cudaEventRecord: ", driver_->cuda_error_string(e),
                                                          "; communicator aborted")));
  Backoff backoff;
  for (;;) {
    e = driver_->event_query(done_event_);
    if (e == cudaSuccess) return Status::Ok();
    if (e != cudaErrorNotReady)
      return fail_locked(Status(StatusCode::kCudaError, cat(who(), ": the stream failed while waiting: ",
                                                            driver_->cuda_error_string(e), "; communicator aborted")));
    MLADCP_RETURN_IF_ERROR(check_async_error_locked("wait"));
    if (Clock::now() >= limit)
      return fail_locked(
          Status(StatusCode::kTimeout,
                 cat(who(), ": ", ops, " operation(s) did not complete within ", to_ms(deadline),
                     " ms (a peer stalled, died or issued different operations); communicator aborted")));
    // Let abort() from another thread in between polls.
    lock.unlock();
    backoff.pause();
    lock.lock();
    if (failed_.load()) return unavailable_locked();
  }
}

void NcclCommunicatorImpl::abort(const std::string& reason) {
  std::unique_lock<std::mutex> lock(mu_);
  if (failed_.load()) return;
  (void)fail_locked(Status(StatusCode::kUnavailable, cat(who(), ": aborted: ", reason)));
}

Status NcclCommunicatorImpl::health() const {
  std::unique_lock<std::mutex> lock(mu_);
  if (failed_.load()) return unavailable_locked();
  return Status::Ok();
}

Status NcclCommunicatorImpl::set_stream(void* stream) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!stream) return detail::invalid("stream: null (pass a cudaStream_t of device ", device_, ")");
  if (failed_.load()) return unavailable_locked();
  if (pending_ops_ > 0)
    return detail::invalid("set_stream: ", pending_ops_, " operation(s) issued since the last wait(); wait() first");
  stream_ = static_cast<cudaStream_t>(stream);
  return Status::Ok();
}

void NcclCommunicatorImpl::set_wait_for_completion(bool wait) {
  std::unique_lock<std::mutex> lock(mu_);
  options_.wait_for_completion = wait;
}

ncclComm* NcclCommunicatorImpl::nccl_comm() const {
  std::unique_lock<std::mutex> lock(mu_);
  return comm_;
}

// ---------------------------------------------------------------------------------------------
// Creation

Status create_communicator(const std::shared_ptr<Driver>& driver, int rank, int world, const NcclIdBroadcast& broadcast,
                           const NcclOptions& options, std::unique_ptr<NcclCommunicator>* out) {
  if (!out) return detail::invalid("out: null");
  if (world < 1) return detail::invalid("world=", world, ": must be >= 1");
  if (rank < 0 || rank >= world) return detail::invalid("rank=", rank, ": must be in [0, ", world, ")");
  if (!broadcast) return detail::invalid("broadcast: empty callback (it must give every rank rank 0's unique id)");
  MLADCP_RETURN_IF_ERROR(check_setup_options(options));
  MLADCP_RETURN_IF_ERROR(check_loaded(*driver));
  if (options.disable_nvls) nccl_disable_nvls_if_unset();
  int count = 0;
  MLADCP_RETURN_IF_ERROR(count_devices(*driver, &count));
  int device = options.device;
  if (device < 0 && driver->get_device(&device) != cudaSuccess) device = 0;
  if (device >= count) return detail::invalid("options.device=", device, ": must be in [0, ", count, ")");
  const std::string who = cat("nccl rank ", rank, "/", world, " (device ", device, ")");

  const Clock::time_point limit = Clock::now() + options.setup_timeout;
  NcclUniqueId id;
  if (rank == 0) {
    ncclUniqueId raw;
    const ncclResult_t r = driver->get_unique_id(&raw);
    if (r != ncclSuccess)
      return Status(StatusCode::kCommError, cat(who, ": ncclGetUniqueId failed: ", driver->error_string(r)));
    std::memcpy(id.bytes, raw.internal, NCCL_UNIQUE_ID_BYTES);
  }
  const Status bs = broadcast(rank, &id);
  if (!bs.ok()) return Status(bs.code(), cat(who, ": unique id broadcast failed: ", bs.message()));
  ncclUniqueId raw;
  std::memcpy(raw.internal, id.bytes, NCCL_UNIQUE_ID_BYTES);

  const cudaError_t e = driver->set_device(device);
  if (e != cudaSuccess)
    return Status(StatusCode::kCudaError, cat(who, ": cudaSetDevice: ", driver->cuda_error_string(e)));
  ncclConfig_t config = make_config(options);
  ncclComm_t comm = nullptr;
  const ncclResult_t r = driver->comm_init_rank_config(&comm, world, raw, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    if (comm) (void)driver->comm_abort(comm);
    return Status(status_code_of(r), cat(who, ": ncclCommInitRankConfig failed: ", nccl_error_text(*driver, comm, r)));
  }
  const Status ready = wait_until_ready(*driver, {comm}, limit, who);
  if (!ready.ok()) {
    (void)driver->comm_abort(comm);
    return ready;
  }
  CommSetup setup;
  setup.comm = comm;
  setup.rank = rank;
  setup.world = world;
  setup.device = device;
  setup.stream = static_cast<cudaStream_t>(options.stream);
  setup.owns_comm = true;
  return NcclCommunicatorImpl::make(driver, setup, options, out);
}

Status create_single_process(const std::shared_ptr<Driver>& driver, const std::vector<int>& devices,
                             const NcclOptions& options, std::vector<std::unique_ptr<NcclCommunicator>>* out) {
  if (!out) return detail::invalid("out: null");
  if (devices.empty()) return detail::invalid("devices: empty (give one CUDA device per rank)");
  MLADCP_RETURN_IF_ERROR(check_setup_options(options));
  MLADCP_RETURN_IF_ERROR(check_loaded(*driver));
  int count = 0;
  MLADCP_RETURN_IF_ERROR(count_devices(*driver, &count));
  std::set<int> seen;
  for (size_t i = 0; i < devices.size(); ++i) {
    if (devices[i] < 0 || devices[i] >= count)
      return detail::invalid("devices[", i, "]=", devices[i], ": must be in [0, ", count, ")");
    if (!seen.insert(devices[i]).second)
      return detail::invalid("devices[", i, "]=", devices[i], ": listed twice (NCCL needs one rank per device)");
  }
  if (options.disable_nvls) nccl_disable_nvls_if_unset();
  const int world = int(devices.size());
  const std::string who = cat("nccl single-process group of ", world);
  int previous = -1;
  (void)driver->get_device(&previous);

  ncclUniqueId id;
  ncclResult_t r = driver->get_unique_id(&id);
  if (r != ncclSuccess)
    return Status(StatusCode::kCommError, cat(who, ": ncclGetUniqueId failed: ", driver->error_string(r)));
  const Clock::time_point limit = Clock::now() + options.setup_timeout;
  ncclConfig_t config = make_config(options);
  std::vector<ncclComm_t> comms(devices.size(), nullptr);
  Status status;
  r = driver->group_start();
  if (r != ncclSuccess) return Status(StatusCode::kCommError, cat(who, ": ncclGroupStart: ", driver->error_string(r)));
  for (int i = 0; i < world && status.ok(); ++i) {
    const cudaError_t e = driver->set_device(devices[i]);
    if (e != cudaSuccess) {
      status =
          Status(StatusCode::kCudaError, cat(who, ": cudaSetDevice(", devices[i], "): ", driver->cuda_error_string(e)));
      break;
    }
    config = make_config(options);
    r = driver->comm_init_rank_config(&comms[i], world, id, i, &config);
    if (r != ncclSuccess && r != ncclInProgress)
      status = Status(status_code_of(r), cat(who, ": ncclCommInitRankConfig(rank ", i, "): ", driver->error_string(r)));
  }
  r = driver->group_end();
  if (status.ok() && r != ncclSuccess && r != ncclInProgress)
    status = Status(status_code_of(r), cat(who, ": ncclGroupEnd (creation): ", driver->error_string(r)));
  std::vector<ncclComm_t> created;
  for (ncclComm_t c : comms)
    if (c) created.push_back(c);
  if (status.ok() && created.size() != comms.size())
    status = Status(StatusCode::kCommError, cat(who, ": NCCL returned no communicator for some rank"));
  if (status.ok()) status = wait_until_ready(*driver, created, limit, who);
  if (!status.ok()) {
    for (ncclComm_t c : created) (void)driver->comm_abort(c);
    if (previous >= 0) (void)driver->set_device(previous);
    return status;
  }
  std::vector<std::unique_ptr<NcclCommunicator>> made(devices.size());
  for (int i = 0; i < world; ++i) {
    CommSetup setup;
    setup.comm = comms[i];
    setup.rank = i;
    setup.world = world;
    setup.device = devices[i];
    setup.stream = nullptr;
    setup.owns_comm = true;
    status = NcclCommunicatorImpl::make(driver, setup, options, &made[i]);
    if (!status.ok()) {
      for (int j = 0; j < i; ++j) made[j]->abort("creation of another rank failed");
      for (int j = i + 1; j < world; ++j) (void)driver->comm_abort(comms[j]);
      if (previous >= 0) (void)driver->set_device(previous);
      return status;
    }
  }
  if (previous >= 0) (void)driver->set_device(previous);
  *out = std::move(made);
  return Status::Ok();
}

Status adopt_communicator(const std::shared_ptr<Driver>& driver, ncclComm_t comm, const NcclOptions& options,
                          std::unique_ptr<NcclCommunicator>* out) {
  if (!out) return detail::invalid("out: null");
  if (!comm) return detail::invalid("comm: null (pass the engine's initialized ncclComm_t)");
  MLADCP_RETURN_IF_ERROR(check_setup_options(options));
  MLADCP_RETURN_IF_ERROR(check_loaded(*driver));
  int world = 0, rank = 0, device = 0;
  ncclResult_t r = driver->comm_count(comm, &world);
  if (r == ncclSuccess) r = driver->comm_user_rank(comm, &rank);
  if (r == ncclSuccess) r = driver->comm_cu_device(comm, &device);
  if (r != ncclSuccess)
    return detail::invalid("comm: NCCL cannot describe it (", driver->error_string(r),
                           "); pass an initialized, not destroyed ncclComm_t");
  if (options.device >= 0 && options.device != device)
    return detail::invalid("options.device=", options.device, ": the adopted communicator runs on device ", device);
  const std::string who = cat("nccl rank ", rank, "/", world, " (device ", device, ", adopted)");
  const Status ready = wait_until_ready(*driver, {comm}, Clock::now() + options.setup_timeout, who);
  if (!ready.ok()) return Status(StatusCode::kUnavailable, cat("comm: not usable: ", ready.to_string()));
  int count = 0;
  MLADCP_RETURN_IF_ERROR(count_devices(*driver, &count));
  CommSetup setup;
  setup.comm = comm;
  setup.rank = rank;
  setup.world = world;
  setup.device = device;
  setup.stream = static_cast<cudaStream_t>(options.stream);
  setup.owns_comm = false;
  return NcclCommunicatorImpl::make(driver, setup, options, out);
}

}  // namespace nccl_detail

// ---------------------------------------------------------------------------------------------
// Public API

Status create_nccl_communicator(int rank, int world, const NcclIdBroadcast& broadcast, const NcclOptions& options,
                                std::unique_ptr<NcclCommunicator>* out) {
  return nccl_detail::create_communicator(nccl_detail::real_driver(), rank, world, broadcast, options, out);
}

Status adopt_nccl_communicator(ncclComm* comm, const NcclOptions& options, std::unique_ptr<NcclCommunicator>* out) {
  return nccl_detail::adopt_communicator(nccl_detail::real_driver(), comm, options, out);
}

Status create_nccl_communicators_single_process(const std::vector<int>& devices, const NcclOptions& options,
                                                std::vector<std::unique_ptr<NcclCommunicator>>* out) {
  return nccl_detail::create_single_process(nccl_detail::real_driver(), devices, options, out);
}

void destroy_nccl_communicators(std::vector<std::unique_ptr<NcclCommunicator>>* comms) {
  if (!comms) return;
  std::vector<std::thread> threads;
  for (auto& c : *comms)
    if (c) threads.emplace_back([&c] { c.reset(); });
  for (auto& t : threads) t.join();
  comms->clear();
}

std::string nccl_version_string() {
  auto format = [](int code) {
    const int major = code >= 10000 ? code / 10000 : code / 1000;
    const int minor = code >= 10000 ? (code % 10000) / 100 : (code % 1000) / 100;
    return detail::cat(major, ".", minor, ".", code % 100);
  };
  const int loaded = nccl_detail::real_driver()->version();
  return detail::cat(loaded ? format(loaded) : std::string("unknown"), " (built with ", format(NCCL_VERSION_CODE), ")");
}

void nccl_disable_nvls_if_unset() { (void)setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0); }

}  // namespace mladcp
