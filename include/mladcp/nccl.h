// The NCCL communicator: the Communicator interface over NCCL for device buffers on a CUDA stream.
// Available when the library is built with NCCL (MLADCP_HAVE_NCCL); this header needs neither
// nccl.h nor the CUDA headers (a stream is passed as void*, a communicator as ncclComm*).
//
// Three ways to get one:
//   - create_nccl_communicator(): one rank of a new NCCL communicator; the caller's callback
//     distributes the unique id from rank 0 to every rank (sockets, a key-value store, MPI, ...).
//   - create_nccl_communicator_mpi(): the same, with the id broadcast over an MPI communicator.
//   - adopt_nccl_communicator(): wraps an engine's existing ncclComm_t without owning it.
//
// Communicators are created non-blocking (NCCL config blocking = 0) unless asked otherwise, so no
// call blocks the host on a peer: wait(deadline) returns kTimeout once the deadline passes and the
// communicator is aborted. Under CUDA-graph capture wait() only checks that the operations were
// enqueued (no host sync), so the whole exchange can be captured and replayed.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mladcp/comm.h"
#include "mladcp/status.h"

struct ncclComm;  // NCCL's communicator (ncclComm_t is ncclComm*)

namespace mladcp {

// NCCL's unique id as raw bytes (NCCL_UNIQUE_ID_BYTES = 128).
struct NcclUniqueId {
  char bytes[128] = {};
};

// Distributes the unique id: called on every rank with `id` filled on rank 0 (by ncclGetUniqueId);
// on return every rank's `id` must hold rank 0's bytes. A non-ok Status fails the creation.
using NcclIdBroadcast = std::function<Status(int rank, NcclUniqueId* id)>;

// What to do with an adopted communicator when an operation fails or times out.
enum class NcclAdoptedFaultPolicy {
  kRevoke,  // ncclCommRevoke (NCCL >= 2.28): in-flight operations stop; the engine still destroys it
  kAbort,   // ncclCommAbort: stops everything and frees it; the engine must not use its handle again
  kNone,    // only mark this wrapper unusable; the engine handles the communicator itself
};

struct NcclOptions {
  // CUDA device of this rank; -1 uses the current device (create*) or the communicator's (adopt).
  int device = -1;
  // cudaStream_t the operations are issued on; nullptr creates (and owns) a non-blocking stream.
  // The caller can change it later with NcclCommunicator::set_stream().
  void* stream = nullptr;
  // NCCL config blocking: false (default) creates a non-blocking communicator, the only kind whose
  // calls can never block the host on a peer. Ignored when adopting.
  bool blocking = false;
  // Upper bound on communicator creation (every rank must join within it) and on waiting for an
  // operation to be enqueued (a non-blocking call returning ncclInProgress).
  std::chrono::milliseconds setup_timeout{60000};
  // wait() outside graph capture: true (default) waits for the operations to complete on the device
  // (an event on the stream, polled with the communicator's error state until the deadline);
  // false only checks that they were enqueued, like under capture (no host sync per exchange).
  bool wait_for_completion = true;
  // Check with cudaPointerGetAttributes that every buffer is device memory of this device.
  bool check_pointers = true;
  // true: sets NCCL_NVLS_ENABLE=0 in the environment before creating, unless the variable is already
  // set (NVLink SHARP / multicast off, as the mladcp tool runs). false (default): the environment is
  // the caller's.
  bool disable_nvls = false;
  // Name given to the communicator (NCCL config commName; shows in NCCL's logs).
  std::string name = "mladcp";
  NcclAdoptedFaultPolicy adopted_fault_policy = NcclAdoptedFaultPolicy::kRevoke;
};

// The Communicator for NCCL, with the stream and device it issues on.
class NcclCommunicator : public Communicator {
 public:
  virtual int device() const = 0;
  virtual void* stream() const = 0;  // cudaStream_t
  // Issue later operations on `stream` (a cudaStream_t of this communicator's device; not nullptr).
  virtual Status set_stream(void* stream) = 0;
  // Switches wait() outside capture between waiting for completion on the device (true) and only
  // checking the enqueue (false); see NcclOptions::wait_for_completion.
  virtual void set_wait_for_completion(bool wait) = 0;
  // The NCCL communicator (nullptr once aborted); owned unless adopted.
  virtual ncclComm* nccl_comm() const = 0;
  virtual bool owns_comm() const = 0;
};

// One rank of a new communicator of `world` ranks. `broadcast` distributes the unique id.
Status create_nccl_communicator(int rank, int world, const NcclIdBroadcast& broadcast, const NcclOptions& options,
                                std::unique_ptr<NcclCommunicator>* out);

// One rank of a new communicator over the ranks of an MPI communicator (rank and size from MPI):
// rank 0 makes the id and broadcasts it with MPI_Bcast. `mpi_comm` points to an MPI_Comm (nullptr:
// MPI_COMM_WORLD); MPI must be initialized. kUnsupported when the library was built without MPI.
Status create_nccl_communicator_mpi(const void* mpi_comm, const NcclOptions& options,
                                    std::unique_ptr<NcclCommunicator>* out);

// Wraps an engine's communicator. Never destroys it; on a fault applies options.adopted_fault_policy.
Status adopt_nccl_communicator(ncclComm* comm, const NcclOptions& options, std::unique_ptr<NcclCommunicator>* out);

// "2.28.9 (built with 2.28.9)": the NCCL library loaded and the header compiled against.
std::string nccl_version_string();

// The NCCL library the communicator calls. The C++ library calls the NCCL the program is linked against;
// the Python module's build loads its own on first use (a private copy, symbols kept local; see
// docs/python.md) and reports here whether that worked.
struct NcclLibraryInfo {
  bool loaded = false;  // false: no communicator can be made, `error` says why
  std::string error;
  std::string path;           // the library's file
  int version = 0;            // its ncclGetVersion code (22809 for 2.28.9)
  bool private_copy = false;  // loaded by mladcp itself (dlopen RTLD_LOCAL | RTLD_DEEPBIND)
};
NcclLibraryInfo nccl_library_info();

// Whether `library`, a shared object already loaded in this process (a file path, e.g. an engine's
// libtorch_cuda.so), reaches NCCL through the very library instance the communicator calls. An ncclComm_t
// is valid only in the library instance that created it, so only then may adopt_nccl_communicator() take
// a communicator that `library` created. false when `library` is not loaded, resolves no NCCL symbol (a
// static NCCL inside it), or resolves them to another NCCL.
bool nccl_library_shared_with(const std::string& library);

// Sets NCCL_NVLS_ENABLE=0 unless the variable is already set (NVLink SHARP / multicast off).
void nccl_disable_nvls_if_unset();

}  // namespace mladcp
