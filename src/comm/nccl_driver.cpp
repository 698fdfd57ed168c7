// The real driver: thin forwarding to NCCL and the CUDA runtime.
#include "comm/nccl_driver.h"

namespace mladcp::nccl_detail {
namespace {

constexpr bool kHeaderHasAllToAll = NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0);

class RealDriver final : public Driver {
 public:
  int version() override {
    int v = 0;
    return ncclGetVersion(&v) == ncclSuccess ? v : 0;
  }
  ncclResult_t get_unique_id(ncclUniqueId* id) override { return ncclGetUniqueId(id); }
  ncclResult_t comm_init_rank_config(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                     ncclConfig_t* config) override {
    return ncclCommInitRankConfig(comm, nranks, id, rank, config);
  }
  ncclResult_t comm_get_async_error(ncclComm_t comm, ncclResult_t* state) override {
    return ncclCommGetAsyncError(comm, state);
  }
  ncclResult_t comm_finalize(ncclComm_t comm) override { return ncclCommFinalize(comm); }
  ncclResult_t comm_destroy(ncclComm_t comm) override { return ncclCommDestroy(comm); }
  ncclResult_t comm_abort(ncclComm_t comm) override { return ncclCommAbort(comm); }
  ncclResult_t comm_revoke(ncclComm_t comm) override {
#if defined(NCCL_REVOKE_DEFAULT)  // ncclCommRevoke arrived within 2.28.x: test the header, not the version
    if (version() >= NCCL_VERSION(2, 28, 0)) return ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT);
#else
    (void)comm;
#endif
    return ncclInvalidUsage;
  }
  ncclResult_t comm_count(ncclComm_t comm, int* count) override { return ncclCommCount(comm, count); }
  ncclResult_t comm_user_rank(ncclComm_t comm, int* rank) override { return ncclCommUserRank(comm, rank); }
  ncclResult_t comm_cu_device(ncclComm_t comm, int* device) override { return ncclCommCuDevice(comm, device); }
  const char* last_error(ncclComm_t comm) override { return ncclGetLastError(comm); }
  const char* error_string(ncclResult_t result) override { return ncclGetErrorString(result); }

  ncclResult_t all_gather(const void* send, void* recv, size_t count, ncclDataType_t type, ncclComm_t comm,
                          cudaStream_t stream) override {
    return ncclAllGather(send, recv, count, type, comm, stream);
  }
  ncclResult_t reduce_scatter(const void* send, void* recv, size_t recv_count, ncclDataType_t type, ncclRedOp_t op,
                              ncclComm_t comm, cudaStream_t stream) override {
    return ncclReduceScatter(send, recv, recv_count, type, op, comm, stream);
  }
  ncclResult_t all_to_all(const void* send, void* recv, size_t count, ncclDataType_t type, ncclComm_t comm,
                          cudaStream_t stream) override {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
    return ncclAlltoAll(send, recv, count, type, comm, stream);
#else
    (void)send, (void)recv, (void)count, (void)type, (void)comm, (void)stream;
    return ncclInvalidUsage;
#endif
  }
  bool has_all_to_all() override { return kHeaderHasAllToAll && version() >= NCCL_VERSION(2, 28, 0); }
  ncclResult_t send(const void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                    cudaStream_t stream) override {
    return ncclSend(buf, count, type, peer, comm, stream);
  }
  ncclResult_t recv(void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                    cudaStream_t stream) override {
    return ncclRecv(buf, count, type, peer, comm, stream);
  }
  ncclResult_t group_start() override { return ncclGroupStart(); }
  ncclResult_t group_end() override { return ncclGroupEnd(); }

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
};

}  // namespace

std::shared_ptr<Driver> real_driver() {
  static const std::shared_ptr<Driver> driver = std::make_shared<RealDriver>();
  return driver;
}

}  // namespace mladcp::nccl_detail
