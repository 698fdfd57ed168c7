// include/mladcp/device_memory.h on the CUDA runtime.
#include "mladcp/device_memory.h"

#include <cuda_runtime.h>

#include "core/validate.h"
#include "cuda/cuda_status.h"

namespace mladcp {

namespace {
cudaStream_t as_stream(DeviceStream s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t as_event(DeviceEvent e) { return static_cast<cudaEvent_t>(e); }

Status copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, DeviceStream stream, const char* what) {
  if (bytes == 0) return Status::Ok();
  if (!dst || !src) return detail::invalid(what, ": null pointer (dst=", dst, ", src=", src, ") for ", bytes, " bytes");
  if (stream) return cuda_status(cudaMemcpyAsync(dst, src, bytes, kind, as_stream(stream)), what);
  return cuda_status(cudaMemcpy(dst, src, bytes, kind), what);
}
}  // namespace

Status device_count(int* count) {
  if (!count) return detail::invalid("count: null");
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver or no device: report none
    n = 0;
  }
  *count = n;
  return Status::Ok();
}

Status device_set(int device) { return cuda_status(cudaSetDevice(device), "cudaSetDevice"); }
Status device_get(int* device) {
  if (!device) return detail::invalid("device: null");
  return cuda_status(cudaGetDevice(device), "cudaGetDevice");
}
Status device_synchronize() { return cuda_status(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

Status device_info(int device, DeviceInfo* info) {
  if (!info) return detail::invalid("info: null");
  cudaDeviceProp prop{};
  MLADCP_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device));
  int clock = 0;
  MLADCP_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&clock, cudaDevAttrClockRate, device));
  info->name = prop.name;
  info->compute_major = prop.major;
  info->compute_minor = prop.minor;
  info->multiprocessors = prop.multiProcessorCount;
  info->total_memory = prop.totalGlobalMem;
  info->l2_bytes = size_t(prop.l2CacheSize);
  info->shared_memory_optin = prop.sharedMemPerBlockOptin;
  info->clock_khz = clock;
  return Status::Ok();
}

Status device_alloc(void** ptr, size_t bytes) {
  if (!ptr) return detail::invalid("ptr: null");
  *ptr = nullptr;
  if (bytes == 0) return Status::Ok();
  const cudaError_t e = cudaMalloc(ptr, bytes);
  if (e != cudaSuccess) {
    *ptr = nullptr;
    return cuda_status(e, ("cudaMalloc(" + std::to_string(bytes) + " bytes)").c_str());
  }
  return Status::Ok();
}

Status device_free(void* ptr) {
  if (!ptr) return Status::Ok();
  return cuda_status(cudaFree(ptr), "cudaFree");
}

Status copy_host_to_device(void* dst, const void* src, size_t bytes, DeviceStream stream) {
  return copy(dst, src, bytes, cudaMemcpyHostToDevice, stream, "copy_host_to_device");
}
Status copy_device_to_host(void* dst, const void* src, size_t bytes, DeviceStream stream) {
  return copy(dst, src, bytes, cudaMemcpyDeviceToHost, stream, "copy_device_to_host");
}
Status copy_device_to_device(void* dst, const void* src, size_t bytes, DeviceStream stream) {
  return copy(dst, src, bytes, cudaMemcpyDeviceToDevice, stream, "copy_device_to_device");
}

Status device_memset(void* dst, int value, size_t bytes, DeviceStream stream) {
  if (bytes == 0) return Status::Ok();
  if (!dst) return detail::invalid("dst: null pointer for ", bytes, " bytes");
  if (value < 0 || value > 255) return detail::invalid("value=", value, ": must be a byte (0..255)");
  if (stream) return cuda_status(cudaMemsetAsync(dst, value, bytes, as_stream(stream)), "cudaMemsetAsync");
  return cuda_status(cudaMemset(dst, value, bytes), "cudaMemset");
}

Status stream_create(DeviceStream* stream) {
  if (!stream) return detail::invalid("stream: null");
  cudaStream_t s = nullptr;
  MLADCP_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  *stream = s;
  return Status::Ok();
}
Status stream_destroy(DeviceStream stream) {
  if (!stream) return Status::Ok();
  return cuda_status(cudaStreamDestroy(as_stream(stream)), "cudaStreamDestroy");
}
Status stream_synchronize(DeviceStream stream) {
  return cuda_status(cudaStreamSynchronize(as_stream(stream)), "cudaStreamSynchronize");
}

Status event_create(DeviceEvent* event) {
  if (!event) return detail::invalid("event: null");
  cudaEvent_t e = nullptr;
  MLADCP_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
  *event = e;
  return Status::Ok();
}
Status event_destroy(DeviceEvent event) {
  if (!event) return Status::Ok();
  return cuda_status(cudaEventDestroy(as_event(event)), "cudaEventDestroy");
}
Status event_record(DeviceEvent event, DeviceStream stream) {
  if (!event) return detail::invalid("event: null");
  return cuda_status(cudaEventRecord(as_event(event), as_stream(stream)), "cudaEventRecord");
}
Status event_synchronize(DeviceEvent event) {
  if (!event) return detail::invalid("event: null");
  return cuda_status(cudaEventSynchronize(as_event(event)), "cudaEventSynchronize");
}
Status event_elapsed_ms(DeviceEvent start, DeviceEvent stop, float* ms) {
  if (!start || !stop || !ms) return detail::invalid("event_elapsed_ms: null argument");
  return cuda_status(cudaEventElapsedTime(ms, as_event(start), as_event(stop)), "cudaEventElapsedTime");
}

}  // namespace mladcp
