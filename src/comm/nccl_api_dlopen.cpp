// The NCCL entry points of a library this build loads itself, on first use, and keeps to itself: the
// communicator of the Python module, which must not meet another NCCL of the same process (torch's bundled
// one exports the same libnccl.so.2 symbols). The binary has no libnccl.so.2 dependency; the library is
// opened with RTLD_LOCAL (its symbols serve no one else) and RTLD_DEEPBIND (its own calls between its
// exported functions stay inside it, even when another NCCL was loaded with RTLD_GLOBAL).
//
// Which file: $MLADCP_NCCL_LIBRARY when set (a path, or a name for the dynamic loader to search), else
// the library the build was configured with (MLADCP_NCCL_BUILD_LIBRARY, a full path) when that file
// exists, else "libnccl.so.2" through the dynamic loader's search (which returns an NCCL already in the
// process, if any, by its soname). A full path never resolves to a loaded library of another file.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "comm/nccl_api.h"

#ifndef MLADCP_NCCL_BUILD_LIBRARY
#define MLADCP_NCCL_BUILD_LIBRARY ""
#endif

namespace mladcp::nccl_detail {
namespace {

std::string library_to_load() {
  const char* env = std::getenv("MLADCP_NCCL_LIBRARY");
  if (env && *env) return env;
  const std::string built = MLADCP_NCCL_BUILD_LIBRARY;
  if (!built.empty() && access(built.c_str(), R_OK) == 0) return built;
  return "libnccl.so.2";
}

template <typename F>
bool resolve(void* handle, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(handle, name));
  return *out != nullptr;
}

NcclApi load() {
  NcclApi a;
  a.source = "loaded";
  const std::string file = library_to_load();
  void* h = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (!h) {
    const char* why = dlerror();
    NcclApi failed;
    failed.source = "loaded";
    failed.error = "NCCL could not be loaded from '" + file + "': " + (why ? why : "dlopen failed") +
                   " (MLADCP_NCCL_LIBRARY names the NCCL library file to load)";
    return failed;
  }
  // The handle is never closed: NCCL keeps threads and device state for the life of the process.
  std::string missing;
  auto need = [&](const char* name, auto* out) {
    if (!resolve(h, name, out)) missing += (missing.empty() ? "" : ", ") + std::string(name);
  };
  need("ncclGetVersion", &a.get_version);
  need("ncclGetUniqueId", &a.get_unique_id);
  need("ncclCommInitRankConfig", &a.comm_init_rank_config);
  need("ncclCommGetAsyncError", &a.comm_get_async_error);
  need("ncclCommFinalize", &a.comm_finalize);
  need("ncclCommDestroy", &a.comm_destroy);
  need("ncclCommAbort", &a.comm_abort);
  need("ncclCommCount", &a.comm_count);
  need("ncclCommUserRank", &a.comm_user_rank);
  need("ncclCommCuDevice", &a.comm_cu_device);
  need("ncclGetLastError", &a.get_last_error);
  need("ncclGetErrorString", &a.get_error_string);
  need("ncclAllGather", &a.all_gather);
  need("ncclReduceScatter", &a.reduce_scatter);
  need("ncclSend", &a.send);
  need("ncclRecv", &a.recv);
  need("ncclGroupStart", &a.group_start);
  need("ncclGroupEnd", &a.group_end);
  if (!missing.empty()) {
    NcclApi failed;
    failed.source = "loaded";
    failed.error = "NCCL loaded from '" + file + "' lacks " + missing + " (an NCCL of 2.14 or later is needed)";
    return failed;
  }
#if MLADCP_NCCL_HEADER_HAS_ALLTOALL
  (void)resolve(h, "ncclAlltoAll", &a.all_to_all);  // optional: NCCL >= 2.28
#endif
#if MLADCP_NCCL_HEADER_HAS_REVOKE
  (void)resolve(h, "ncclCommRevoke", &a.comm_revoke);  // optional: within NCCL 2.28
#endif
  return a;
}

}  // namespace

const NcclApi& nccl_api() {
  static const NcclApi api = load();
  return api;
}

}  // namespace mladcp::nccl_detail
