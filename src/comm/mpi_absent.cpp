// Builds without MPI: the MPI communicator is absent (mladcp/mpi.h declares no factory).
#include "mladcp/mpi.h"

namespace mladcp {

bool mpi_communicator_available() { return false; }

}  // namespace mladcp
