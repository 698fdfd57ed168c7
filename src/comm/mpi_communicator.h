// MpiCommunicator: the Communicator interface over non-blocking MPI collectives on host buffers.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include "mladcp/mpi.h"

namespace mladcp {

class MpiCommunicator final : public Communicator {
 public:
  static Status create(MPI_Comm comm, const MpiCommunicatorOptions& options, std::unique_ptr<Communicator>* out);
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  Device memory() const override { return Device::kHost; }
  std::string name() const override { return "mpi"; }

  Status all_gather(const void* send, void* recv, size_t bytes) override;
  Status reduce_scatter_sum_f32(const float* send, float* recv, size_t count) override;
  Status all_to_all(const void* send, void* recv, size_t bytes_per_rank) override;
  Status group_start() override;
  Status group_end() override;
  Status wait(std::chrono::milliseconds deadline) override;
  void abort(const std::string& reason) override;
  Status health() const override;

 private:
  MpiCommunicator(MPI_Comm comm, bool owned, MPI_Errhandler previous, const MpiCommunicatorOptions& options);
  // A byte count as (count, datatype) with count ≤ INT_MAX (large messages use a contiguous type).
  Status byte_type(size_t bytes, int* count, MPI_Datatype* type);
  Status issued(int rc, MPI_Request request, std::string what);
  Status mpi_error(int rc, const std::string& what);

  MPI_Comm comm_;
  bool owned_;
  MPI_Errhandler previous_handler_;
  MpiCommunicatorOptions options_;
  int rank_ = 0, world_ = 1;
  std::vector<MPI_Request> pending_;
  std::vector<std::string> pending_what_;
  std::vector<MPI_Request> orphaned_;                   // unfinished at an abort: MPI cannot cancel or free them
  std::vector<std::pair<size_t, MPI_Datatype>> types_;  // contiguous byte types by unit size
  bool aborted_ = false;
  std::string abort_reason_;
};

}  // namespace mladcp
