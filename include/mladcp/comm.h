// The communicator interface DCP is written against. Implementations: MPI (host buffers) and NCCL
// (device buffers, a CUDA stream). An engine can implement it over its own transport.
//
// Operations are issued non-blocking and complete at wait(). Every rank issues the same sequence of
// operations with the same sizes. After any failure (local error, timeout, peer failure) the
// communicator is aborted: every later call returns kUnavailable and says why.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include "mladcp/backend.h"
#include "mladcp/status.h"

namespace mladcp {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual Device memory() const = 0;     // where send/recv buffers must live
  virtual std::string name() const = 0;  // "mpi", "nccl", ...

  // recv [W · bytes]: rank i's `bytes` bytes land at recv + i · bytes.
  virtual Status all_gather(const void* send, void* recv, size_t bytes) = 0;
  // send [W · count] fp32; recv [count] = Σ_ranks send[rank() · count ..] (sum in fp32).
  virtual Status reduce_scatter_sum_f32(const float* send, float* recv, size_t count) = 0;
  // send [W · bytes]: chunk j goes to rank j; recv [W · bytes]: chunk i came from rank i.
  virtual Status all_to_all(const void* send, void* recv, size_t bytes_per_rank) = 0;

  // Brackets several operations to be issued together (NCCL group semantics; no-op for MPI).
  virtual Status group_start() = 0;
  virtual Status group_end() = 0;

  // Completes every issued operation, or returns kTimeout / kRemoteError / kCommError once the
  // deadline passes or a peer fails; then the communicator is aborted. For NCCL "complete" means
  // enqueued on the stream without error (the stream orders the data); no host sync under capture.
  virtual Status wait(std::chrono::milliseconds deadline) = 0;

  // Tears the communicator down so that no call can hang; idempotent.
  virtual void abort(const std::string& reason) = 0;
  // Ok while usable; kUnavailable with the reason after an abort.
  virtual Status health() const = 0;
};

}  // namespace mladcp
