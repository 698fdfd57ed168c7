#include "comm/mpi_communicator.h"

#include <algorithm>
#include <climits>
#include <thread>

#include "core/validate.h"

namespace mladcp {

using detail::cat;
using Clock = std::chrono::steady_clock;

Status create_mpi_communicator(MPI_Comm comm, const MpiCommunicatorOptions& options,
                               std::unique_ptr<Communicator>* out) {
  return MpiCommunicator::create(comm, options, out);
}

namespace {

std::string mpi_error_string(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(text, size_t(len));
}

}  // namespace

Status MpiCommunicator::create(MPI_Comm comm, const MpiCommunicatorOptions& options,
                               std::unique_ptr<Communicator>* out) {
  if (!out) return detail::invalid("out: null");
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized)
    return Status(StatusCode::kUnavailable,
                  finalized ? "MPI is already finalized" : "MPI is not initialized: call MPI_Init first");
  if (comm == MPI_COMM_NULL) return detail::invalid("comm: MPI_COMM_NULL");
  if (options.ownership != MpiOwnership::kDuplicate && options.ownership != MpiOwnership::kBorrow)
    return detail::invalid("options.ownership=", int(options.ownership),
                           ": accepted MpiOwnership::kDuplicate (0), MpiOwnership::kBorrow (1)");
  if (options.yield_for.count() < 0 || options.max_sleep.count() < 0)
    return detail::invalid("options.yield_for / options.max_sleep: must be >= 0");
  MPI_Errhandler previous = MPI_ERRHANDLER_NULL;
  MPI_Comm use = comm;
  const bool own = options.ownership == MpiOwnership::kDuplicate;
  if (own) {
    const int rc = MPI_Comm_dup(comm, &use);
    if (rc != MPI_SUCCESS) return Status(StatusCode::kCommError, "MPI_Comm_dup: " + mpi_error_string(rc));
  } else {
    MPI_Comm_get_errhandler(comm, &previous);
  }
  const int rc = MPI_Comm_set_errhandler(use, MPI_ERRORS_RETURN);
  if (rc != MPI_SUCCESS) {
    if (own) MPI_Comm_free(&use);
    return Status(StatusCode::kCommError, "MPI_Comm_set_errhandler: " + mpi_error_string(rc));
  }
  out->reset(new MpiCommunicator(use, own, previous, options));
  return Status::Ok();
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, bool owned, MPI_Errhandler previous,
                                 const MpiCommunicatorOptions& options)
    : comm_(comm), owned_(owned), previous_handler_(previous), options_(options) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &world_);
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;  // nothing may be called any more
  // Unfinished requests (after an abort) are left to MPI: it forbids freeing or cancelling them.
  for (auto& [unit, type] : types_) MPI_Type_free(&type);
  if (owned_) {
    MPI_Comm_free(&comm_);
  } else if (previous_handler_ != MPI_ERRHANDLER_NULL) {
    MPI_Comm_set_errhandler(comm_, previous_handler_);
    MPI_Errhandler_free(&previous_handler_);
  }
}

Status MpiCommunicator::health() const {
  if (!aborted_) return Status::Ok();
  return Status(StatusCode::kUnavailable, "MPI communicator aborted (" + abort_reason_ +
                                              "); it is unusable: create a new one (and rebuild the group)");
}

void MpiCommunicator::abort(const std::string& reason) {
  if (aborted_) return;
  aborted_ = true;
  abort_reason_ = reason;
  orphaned_.insert(orphaned_.end(), pending_.begin(), pending_.end());
  pending_.clear();
  pending_what_.clear();
}

Status MpiCommunicator::mpi_error(int rc, const std::string& what) {
  Status s(StatusCode::kCommError, cat("MPI ", what, " on rank ", rank_, ": ", mpi_error_string(rc)));
  abort(s.message());
  return s;
}

Status MpiCommunicator::byte_type(size_t bytes, int* count, MPI_Datatype* type) {
  if (bytes <= size_t(INT_MAX)) {
    *count = int(bytes);
    *type = MPI_BYTE;
    return Status::Ok();
  }
  for (size_t unit : {size_t(1) << 12, size_t(1) << 16, size_t(1) << 20, size_t(1) << 24}) {
    if (bytes % unit != 0 || bytes / unit > size_t(INT_MAX)) continue;
    auto it = std::find_if(types_.begin(), types_.end(), [unit](const auto& e) { return e.first == unit; });
    if (it == types_.end()) {
      MPI_Datatype t;
      int rc = MPI_Type_contiguous(int(unit), MPI_BYTE, &t);
      if (rc == MPI_SUCCESS) rc = MPI_Type_commit(&t);
      if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Type_contiguous");
      types_.emplace_back(unit, t);
      it = types_.end() - 1;
    }
    *count = int(bytes / unit);
    *type = it->second;
    return Status::Ok();
  }
  return Status::Unsupported(cat("MPI message of ", bytes, " bytes: above 2^31-1 and not a multiple of 4 KiB"));
}

Status MpiCommunicator::issued(int rc, MPI_Request request, std::string what) {
  if (rc != MPI_SUCCESS) return mpi_error(rc, what);
  pending_.push_back(request);
  pending_what_.push_back(std::move(what));
  return Status::Ok();
}

Status MpiCommunicator::all_gather(const void* send, void* recv, size_t bytes) {
  MLADCP_RETURN_IF_ERROR(health());
  if (bytes == 0) return Status::Ok();
  if (!send || !recv) return detail::invalid("all_gather: null ", send ? "recv" : "send", " buffer");
  int count;
  MPI_Datatype type;
  MLADCP_RETURN_IF_ERROR(byte_type(bytes, &count, &type));
  // Sending from this rank's own slot of recv is MPI's in-place form.
  const bool in_place = send == static_cast<const char*>(recv) + size_t(rank_) * bytes;
  MPI_Request r;
  const int rc = MPI_Iallgather(in_place ? MPI_IN_PLACE : send, count, type, recv, count, type, comm_, &r);
  return issued(rc, r, cat("all_gather of ", bytes, " bytes"));
}

Status MpiCommunicator::reduce_scatter_sum_f32(const float* send, float* recv, size_t count) {
  MLADCP_RETURN_IF_ERROR(health());
  if (count == 0) return Status::Ok();
  if (!send || !recv) return detail::invalid("reduce_scatter_sum_f32: null ", send ? "recv" : "send", " buffer");
  if (count > size_t(INT_MAX))
    return Status::Unsupported(cat("reduce_scatter_sum_f32: count ", count, " above 2^31-1 floats per rank"));
  MPI_Request r;
  const int rc = MPI_Ireduce_scatter_block(send, recv, int(count), MPI_FLOAT, MPI_SUM, comm_, &r);
  return issued(rc, r, cat("reduce_scatter_sum_f32 of ", count, " floats per rank"));
}

Status MpiCommunicator::all_to_all(const void* send, void* recv, size_t bytes_per_rank) {
  MLADCP_RETURN_IF_ERROR(health());
  if (bytes_per_rank == 0) return Status::Ok();
  if (!send || !recv) return detail::invalid("all_to_all: null ", send ? "recv" : "send", " buffer");
  if (send == recv) return detail::invalid("all_to_all: send and recv are the same buffer");
  int count;
  MPI_Datatype type;
  MLADCP_RETURN_IF_ERROR(byte_type(bytes_per_rank, &count, &type));
  MPI_Request r;
  const int rc = MPI_Ialltoall(send, count, type, recv, count, type, comm_, &r);
  return issued(rc, r, cat("all_to_all of ", bytes_per_rank, " bytes per rank"));
}

Status MpiCommunicator::group_start() { return health(); }
Status MpiCommunicator::group_end() { return health(); }

Status MpiCommunicator::wait(std::chrono::milliseconds deadline) {
  MLADCP_RETURN_IF_ERROR(health());
  if (pending_.empty()) return Status::Ok();
  const Clock::time_point start = Clock::now();
  const Clock::time_point end = start + deadline;
  const Clock::time_point yield_end = start + options_.yield_for;
  std::chrono::microseconds sleep{10};
  std::vector<MPI_Status> statuses(pending_.size());
  for (;;) {
    int done = 0;
    const int rc = MPI_Testall(int(pending_.size()), pending_.data(), &done, statuses.data());
    if (rc != MPI_SUCCESS) {
      int code = rc;
      if (rc == MPI_ERR_IN_STATUS)
        for (const MPI_Status& st : statuses)
          if (st.MPI_ERROR != MPI_SUCCESS && st.MPI_ERROR != MPI_ERR_PENDING) code = st.MPI_ERROR;
      return mpi_error(code, "wait (" + pending_what_.front() + (pending_.size() > 1 ? ", ..." : "") + ")");
    }
    if (done) {
      pending_.clear();
      pending_what_.clear();
      return Status::Ok();
    }
    const Clock::time_point now = Clock::now();
    if (now >= end) {
      std::string ops;
      for (size_t i = 0; i < pending_what_.size(); ++i) ops += (i ? ", " : "") + pending_what_[i];
      const double ms = std::chrono::duration<double, std::milli>(now - start).count();
      Status s(StatusCode::kTimeout,
               cat("MPI rank ", rank_, " of ", world_, ": ", ops, " did not complete within ", deadline.count(),
                   " ms (waited ", int64_t(ms), " ms): a peer stalled, died or issued different operations"));
      abort(s.message());
      return s;
    }
    if (now < yield_end) {
      std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(
        std::min<std::chrono::microseconds>(sleep, std::chrono::duration_cast<std::chrono::microseconds>(end - now)));
    sleep = std::min(sleep * 2, std::max(options_.max_sleep, std::chrono::microseconds(1)));
  }
}

}  // namespace mladcp
