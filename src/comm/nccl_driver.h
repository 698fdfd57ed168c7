// The NCCL and CUDA runtime calls the NCCL communicator makes, behind one interface. The real driver
// forwards to the libraries; tests substitute a scripted one to exercise the communicator's state
// machine (deadlines, aborts, enqueue in progress, graph capture) on machines without a GPU.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>
#include <string>

namespace mladcp::nccl_detail {

class Driver {
 public:
  virtual ~Driver() = default;

  // ---- NCCL ----
  // Why the NCCL library cannot be used ("" when it can): the creation paths refuse with it before any
  // other NCCL call.
  virtual std::string load_error() { return ""; }
  virtual int version() = 0;  // ncclGetVersion of the loaded library (0 if it fails)
  virtual ncclResult_t get_unique_id(ncclUniqueId* id) = 0;
  virtual ncclResult_t comm_init_rank_config(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                             ncclConfig_t* config) = 0;
  virtual ncclResult_t comm_get_async_error(ncclComm_t comm, ncclResult_t* state) = 0;
  virtual ncclResult_t comm_finalize(ncclComm_t comm) = 0;
  virtual ncclResult_t comm_destroy(ncclComm_t comm) = 0;
  virtual ncclResult_t comm_abort(ncclComm_t comm) = 0;
  // ncclCommRevoke where the library has it (NCCL >= 2.28), else ncclInvalidUsage.
  virtual ncclResult_t comm_revoke(ncclComm_t comm) = 0;
  virtual ncclResult_t comm_count(ncclComm_t comm, int* count) = 0;
  virtual ncclResult_t comm_user_rank(ncclComm_t comm, int* rank) = 0;
  virtual ncclResult_t comm_cu_device(ncclComm_t comm, int* device) = 0;
  virtual const char* last_error(ncclComm_t comm) = 0;
  virtual const char* error_string(ncclResult_t result) = 0;

  virtual ncclResult_t all_gather(const void* send, void* recv, size_t count, ncclDataType_t type, ncclComm_t comm,
                                  cudaStream_t stream) = 0;
  virtual ncclResult_t reduce_scatter(const void* send, void* recv, size_t recv_count, ncclDataType_t type,
                                      ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) = 0;
  // ncclAlltoAll where the library has it (NCCL >= 2.28), else ncclInvalidUsage.
  virtual ncclResult_t all_to_all(const void* send, void* recv, size_t count, ncclDataType_t type, ncclComm_t comm,
                                  cudaStream_t stream) = 0;
  virtual bool has_all_to_all() = 0;
  virtual ncclResult_t send(const void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                            cudaStream_t stream) = 0;
  virtual ncclResult_t recv(void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                            cudaStream_t stream) = 0;
  virtual ncclResult_t group_start() = 0;
  virtual ncclResult_t group_end() = 0;

  // ---- CUDA runtime ----
  virtual cudaError_t device_count(int* count) = 0;
  virtual cudaError_t get_device(int* device) = 0;
  virtual cudaError_t set_device(int device) = 0;
  virtual cudaError_t stream_create(cudaStream_t* stream) = 0;  // non-blocking stream on the current device
  virtual cudaError_t stream_destroy(cudaStream_t stream) = 0;
  virtual cudaError_t stream_is_capturing(cudaStream_t stream, bool* capturing) = 0;
  virtual cudaError_t event_create(cudaEvent_t* event) = 0;  // timing disabled
  virtual cudaError_t event_destroy(cudaEvent_t event) = 0;
  virtual cudaError_t event_record(cudaEvent_t event, cudaStream_t stream) = 0;
  virtual cudaError_t event_query(cudaEvent_t event) = 0;  // cudaSuccess, cudaErrorNotReady or an error
  // Where `ptr` lives: *device_memory is true for device or managed memory, *device its device.
  virtual cudaError_t pointer_location(const void* ptr, bool* device_memory, int* device) = 0;
  virtual const char* cuda_error_string(cudaError_t error) = 0;
};

// The driver that calls NCCL and the CUDA runtime (one shared instance).
std::shared_ptr<Driver> real_driver();

}  // namespace mladcp::nccl_detail
