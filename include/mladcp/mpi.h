// The MPI communicator: DCP over CPU ranks (host buffers). Including this header never requires
// mpi.h; the factory is declared only where the MPI communicator is linked (MLADCP_HAVE_MPI=1, set by the
// mladcp::mpi target of the installed package, find_package(mladcp COMPONENTS mpi)).
#pragma once

#include <chrono>
#include <memory>

#include "mladcp/comm.h"
#include "mladcp/status.h"

#ifndef MLADCP_HAVE_MPI
#define MLADCP_HAVE_MPI 0
#endif

namespace mladcp {

// True when the MPI communicator is linked into this program.
inline constexpr bool mpi_communicator_available() { return MLADCP_HAVE_MPI != 0; }

}  // namespace mladcp

#if MLADCP_HAVE_MPI
#include <mpi.h>

namespace mladcp {

enum class MpiOwnership {
  kDuplicate,  // MPI_Comm_dup the given communicator and own the duplicate (freed on destruction);
               // DCP traffic can then never match the caller's own collectives
  kBorrow,     // use the caller's communicator as is and never free it (its error handler is set to
               // MPI_ERRORS_RETURN while the wrapper lives, then restored)
};

struct MpiCommunicatorOptions {
  MpiOwnership ownership = MpiOwnership::kDuplicate;
  // wait() polls MPI_Testall (each call also progresses MPI's transfers): yielding the core between
  // polls for up to `yield_for`, then sleeping between polls with growing sleeps up to `max_sleep`, so
  // that a long wait on a slow peer does not burn a core that oversubscribed ranks need.
  std::chrono::microseconds yield_for{1000};
  std::chrono::microseconds max_sleep{100};
};

// Wraps `comm` (MPI must be initialized; the caller calls MPI_Finalize after destroying the wrapper).
// Operations: MPI_Iallgather / MPI_Ireduce_scatter_block (MPI_FLOAT, MPI_SUM) / MPI_Ialltoall on host
// buffers, bytes moved as MPI_BYTE. MPI errors come back as kCommError with MPI's message. wait()
// returns kTimeout at its deadline and aborts the communicator. MPI cannot cancel a collective, so the
// buffers of operations left unfinished by an abort may still be written if a late peer arrives: an
// engine treats an aborted group as lost and rebuilds it.
Status create_mpi_communicator(MPI_Comm comm, const MpiCommunicatorOptions& options,
                               std::unique_ptr<Communicator>* out);

}  // namespace mladcp
#endif
