// The NCCL entry points of the library the program is linked against (mladcp::nccl).
#include "comm/nccl_api.h"

namespace mladcp::nccl_detail {

const NcclApi& nccl_api() {
  static const NcclApi api = [] {
    NcclApi a;
    a.source = "linked";
    a.get_version = &ncclGetVersion;
    a.get_unique_id = &ncclGetUniqueId;
    a.comm_init_rank_config = &ncclCommInitRankConfig;
    a.comm_get_async_error = &ncclCommGetAsyncError;
    a.comm_finalize = &ncclCommFinalize;
    a.comm_destroy = &ncclCommDestroy;
    a.comm_abort = &ncclCommAbort;
    a.comm_count = &ncclCommCount;
    a.comm_user_rank = &ncclCommUserRank;
    a.comm_cu_device = &ncclCommCuDevice;
    a.get_last_error = &ncclGetLastError;
    a.get_error_string = &ncclGetErrorString;
    a.all_gather = &ncclAllGather;
    a.reduce_scatter = &ncclReduceScatter;
    a.send = &ncclSend;
    a.recv = &ncclRecv;
    a.group_start = &ncclGroupStart;
    a.group_end = &ncclGroupEnd;
#if MLADCP_NCCL_HEADER_HAS_ALLTOALL
    a.all_to_all = &ncclAlltoAll;
#endif
#if MLADCP_NCCL_HEADER_HAS_REVOKE
    a.comm_revoke = &ncclCommRevoke;
#endif
    return a;
  }();
  return api;
}

}  // namespace mladcp::nccl_detail
