// NCCL communicator creation with the unique id broadcast over MPI.
#include <string>

#include "core/validate.h"
#include "mladcp/nccl.h"

#if MLADCP_HAVE_MPI
#include <mpi.h>
#endif

namespace mladcp {

Status create_nccl_communicator_mpi(const void* mpi_comm, const NcclOptions& options,
                                    std::unique_ptr<NcclCommunicator>* out) {
#if MLADCP_HAVE_MPI
  if (!out) return detail::invalid("out: null");
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized)
    return Status(StatusCode::kUnavailable,
                  "create_nccl_communicator_mpi: MPI is not initialized (call MPI_Init first)");
  const MPI_Comm comm = mpi_comm ? *static_cast<const MPI_Comm*>(mpi_comm) : MPI_COMM_WORLD;
  int rank = 0, size = 0;
  if (MPI_Comm_rank(comm, &rank) != MPI_SUCCESS || MPI_Comm_size(comm, &size) != MPI_SUCCESS)
    return detail::invalid("mpi_comm: MPI_Comm_rank/MPI_Comm_size failed (pass a valid MPI_Comm)");
  const NcclIdBroadcast broadcast = [comm](int, NcclUniqueId* id) {
    const int r = MPI_Bcast(id->bytes, int(sizeof(id->bytes)), MPI_BYTE, 0, comm);
    if (r == MPI_SUCCESS) return Status::Ok();
    char text[MPI_MAX_ERROR_STRING] = {};
    int len = 0;
    MPI_Error_string(r, text, &len);
    return Status(StatusCode::kCommError, detail::cat("MPI_Bcast: ", std::string(text, size_t(len))));
  };
  return create_nccl_communicator(rank, size, broadcast, options, out);
#else
  (void)mpi_comm, (void)options, (void)out;
  return Status::Unsupported(
      "create_nccl_communicator_mpi: this build of mladcp has no MPI (configure with -DMLADCP_WITH_MPI=ON)");
#endif
}

}  // namespace mladcp
