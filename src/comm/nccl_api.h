// The NCCL entry points the communicator calls, as a table of function pointers. Two providers, one per
// build of the communicator (src/comm/CMakeLists.txt):
//   nccl_api_linked.cpp  the NCCL the program is linked against (the C++ library, mladcp::nccl);
//   nccl_api_dlopen.cpp  an NCCL the library loads itself on first use, with its symbols kept private
//                        (the Python module; docs/python.md, "NCCL next to torch").
// The real driver (nccl_driver.cpp) forwards through this table.
#pragma once

#include <nccl.h>

#include <string>

// Entry points that arrived within NCCL 2.28 are in the table when the header declares them.
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
#define MLADCP_NCCL_HEADER_HAS_ALLTOALL 1
#else
#define MLADCP_NCCL_HEADER_HAS_ALLTOALL 0
#endif
#if defined(NCCL_REVOKE_DEFAULT)
#define MLADCP_NCCL_HEADER_HAS_REVOKE 1
#else
#define MLADCP_NCCL_HEADER_HAS_REVOKE 0
#endif

namespace mladcp::nccl_detail {

struct NcclApi {
  // How the table was filled: "linked" or "loaded"; `error` is set (and every pointer null) when the
  // library could not be loaded.
  std::string source;
  std::string error;

  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRankConfig) comm_init_rank_config = nullptr;
  decltype(&ncclCommGetAsyncError) comm_get_async_error = nullptr;
  decltype(&ncclCommFinalize) comm_finalize = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclCommAbort) comm_abort = nullptr;
  decltype(&ncclCommCount) comm_count = nullptr;
  decltype(&ncclCommUserRank) comm_user_rank = nullptr;
  decltype(&ncclCommCuDevice) comm_cu_device = nullptr;
  decltype(&ncclGetLastError) get_last_error = nullptr;
  decltype(&ncclGetErrorString) get_error_string = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclReduceScatter) reduce_scatter = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  // Optional (null where the header or the loaded library lacks them).
#if MLADCP_NCCL_HEADER_HAS_ALLTOALL
  decltype(&ncclAlltoAll) all_to_all = nullptr;
#endif
#if MLADCP_NCCL_HEADER_HAS_REVOKE
  decltype(&ncclCommRevoke) comm_revoke = nullptr;
#endif

  bool loaded() const { return error.empty(); }
};

// The table of this build (filled once, on first use; thread-safe).
const NcclApi& nccl_api();

}  // namespace mladcp::nccl_detail
