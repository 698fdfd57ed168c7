// The real driver: thin forwarding to NCCL (through the entry-point table of this build, nccl_api.h) and
// the CUDA runtime; and where the NCCL in use comes from.
#include "comm/nccl_driver.h"

#include <dlfcn.h>

#include <climits>
#include <cstdlib>

#include "comm/nccl_api.h"
#include "mladcp/nccl.h"

namespace mladcp::nccl_detail {
namespace {

class RealDriver final : public Driver {
 public:
  std::string load_error() override { return api_.error; }
  int version() override {
    int v = 0;
    return api_.loaded() && api_.get_version(&v) == ncclSuccess ? v : 0;
  }
  ncclResult_t get_unique_id(ncclUniqueId* id) override { return api_.get_unique_id(id); }
  ncclResult_t comm_init_rank_config(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                     ncclConfig_t* config) override {
    return api_.comm_init_rank_config(comm, nranks, id, rank, config);
  }
  ncclResult_t comm_get_async_error(ncclComm_t comm, ncclResult_t* state) override {
    return api_.comm_get_async_error(comm, state);
  }
  ncclResult_t comm_finalize(ncclComm_t comm) override { return api_.comm_finalize(comm); }
  ncclResult_t comm_destroy(ncclComm_t comm) override { return api_.comm_destroy(comm); }
  ncclResult_t comm_abort(ncclComm_t comm) override { return api_.comm_abort(comm); }
  ncclResult_t comm_revoke(ncclComm_t comm) override {
#if MLADCP_NCCL_HEADER_HAS_REVOKE  // ncclCommRevoke arrived within 2.28.x: the header and the library must have it
    if (api_.comm_revoke && version() >= NCCL_VERSION(2, 28, 0)) return api_.comm_revoke(comm, NCCL_REVOKE_DEFAULT);
#else
    (void)comm;
#endif
    return ncclInvalidUsage;
  }
  ncclResult_t comm_count(ncclComm_t comm, int* count) override { return api_.comm_count(comm, count); }
  ncclResult_t comm_user_rank(ncclComm_t comm, int* rank) override { return api_.comm_user_rank(comm, rank); }
  ncclResult_t comm_cu_device(ncclComm_t comm, int* device) override { return api_.comm_cu_device(comm, device); }
  const char* last_error(ncclComm_t comm) override { return api_.get_last_error(comm); }
  const char* error_string(ncclResult_t result) override { return api_.get_error_string(result); }

  ncclResult_t all_gather(const void* send, void* recv, size_t count, ncclDataType_t type, ncclComm_t comm,
                          cudaStream_t stream) override {
    return api_.all_gather(send, recv, count, type, comm, stream);
  }
  ncclResult_t reduce_scatter(const void* send, void* recv, size_t recv_count, ncclDataType_t type, ncclRedOp_t op,
                              ncclComm_t comm, cudaStream_t stream) override {
    return api_.reduce_scatter(send, recv, recv_count, type, op, comm, stream);
  }
  ncclResult_t all_to_all(const void* send, void* recv, size_t count, ncclDataType_t type, ncclComm_t comm,
                          cudaStream_t stream) override {
#if MLADCP_NCCL_HEADER_HAS_ALLTOALL
    if (api_.all_to_all) return api_.all_to_all(send, recv, count, type, comm, stream);
#else
    (void)send, (void)recv, (void)count, (void)type, (void)comm, (void)stream;
#endif
    return ncclInvalidUsage;
  }
  bool has_all_to_all() override {
#if MLADCP_NCCL_HEADER_HAS_ALLTOALL
    return api_.all_to_all && version() >= NCCL_VERSION(2, 28, 0);
#else
    return false;
#endif
  }
  ncclResult_t send(const void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                    cudaStream_t stream) override {
    return api_.send(buf, count, type, peer, comm, stream);
  }
  ncclResult_t recv(void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                    cudaStream_t stream) override {
    return api_.recv(buf, count, type, peer, comm, stream);
  }
  ncclResult_t group_start() override { return api_.group_start(); }
  ncclResult_t group_end() override { return api_.group_end(); }

  cudaError_t device_count(int* count) override {
    const cudaError_t e = cudaGetDeviceCount(count);
    if (e != cudaSuccess) {
      *count = 0;
      (void)cudaGetLastError();  // a missing driver must not poison later calls
    }
    return e;
  }
  cudaError_t get_device(int* device) override { return cudaGetDevice(device); }
  cudaError_t set_device(int device) override { return cudaSetDevice(device); }
  cudaError_t stream_create(cudaStream_t* stream) override {
    return cudaStreamCreateWithFlags(stream, cudaStreamNonBlocking);
  }
  cudaError_t stream_destroy(cudaStream_t stream) override { return cudaStreamDestroy(stream); }
  cudaError_t stream_is_capturing(cudaStream_t stream, bool* capturing) override {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    const cudaError_t e = cudaStreamIsCapturing(stream, &status);
    *capturing = status != cudaStreamCaptureStatusNone;
    return e;
  }
  cudaError_t event_create(cudaEvent_t* event) override {
    return cudaEventCreateWithFlags(event, cudaEventDisableTiming);
  }
  cudaError_t event_destroy(cudaEvent_t event) override { return cudaEventDestroy(event); }
  cudaError_t event_record(cudaEvent_t event, cudaStream_t stream) override { return cudaEventRecord(event, stream); }
  cudaError_t event_query(cudaEvent_t event) override { return cudaEventQuery(event); }
  cudaError_t pointer_location(const void* ptr, bool* device_memory, int* device) override {
    cudaPointerAttributes attr{};
    const cudaError_t e = cudaPointerGetAttributes(&attr, ptr);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      *device_memory = false;
      *device = -1;
      return e;
    }
    *device_memory = attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
    *device = attr.device;
    return cudaSuccess;
  }
  const char* cuda_error_string(cudaError_t error) override { return cudaGetErrorString(error); }

 private:
  const NcclApi& api_ = nccl_api();
};

}  // namespace

std::shared_ptr<Driver> real_driver() {
  static const std::shared_ptr<Driver> driver = std::make_shared<RealDriver>();
  return driver;
}

}  // namespace mladcp::nccl_detail

namespace mladcp {
namespace {

// The loaded object that holds `fn`: its load address and file ("" / nullptr when unknown).
void* object_of(const void* fn, std::string* file) {
  Dl_info info{};
  if (!fn || dladdr(fn, &info) == 0) return nullptr;
  if (file && info.dli_fname) {
    char resolved[PATH_MAX];
    *file = realpath(info.dli_fname, resolved) ? resolved : info.dli_fname;
  }
  return info.dli_fbase;
}

}  // namespace

NcclLibraryInfo nccl_library_info() {
  const nccl_detail::NcclApi& api = nccl_detail::nccl_api();
  NcclLibraryInfo info;
  info.private_copy = api.source == "loaded";
  info.loaded = api.loaded();
  info.error = api.error;
  if (!info.loaded) return info;
  (void)object_of(reinterpret_cast<const void*>(api.comm_count), &info.path);
  info.version = nccl_detail::real_driver()->version();
  return info;
}

bool nccl_library_shared_with(const std::string& library) {
  const nccl_detail::NcclApi& api = nccl_detail::nccl_api();
  if (!api.loaded() || library.empty()) return false;
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_NOLOAD);  // only a library already in the process
  if (!handle) return false;
  const void* theirs = dlsym(handle, "ncclCommCount");  // searched in `library`, then its dependencies
  const void* their_object = object_of(theirs, nullptr);
  dlclose(handle);
  return their_object && their_object == object_of(reinterpret_cast<const void*>(api.comm_count), nullptr);
}

}  // namespace mladcp
