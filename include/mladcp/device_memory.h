// Device memory, streams and timing for callers that hold no CUDA headers: the tool, the NCCL tests,
// the benchmarks and engines that want the "cuda" backend without including cuda_runtime.h.
//
// Every function returns a Status. In a build without CUDA every function returns kUnsupported,
// except device_count(), which reports 0 devices. A stream is a cudaStream_t passed as void*;
// nullptr is the legacy default stream. Copies and memsets with stream == nullptr are synchronous
// (they return when the data is in place); with a stream they are queued on it and the caller
// synchronizes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "mladcp/status.h"

namespace mladcp {

using DeviceStream = void*;  // cudaStream_t
using DeviceEvent = void*;   // cudaEvent_t

// Number of visible CUDA devices; 0 (and Ok) when the driver or the device is missing.
Status device_count(int* count);
Status device_set(int device);
Status device_get(int* device);
Status device_synchronize();

struct DeviceInfo {
  std::string name;
  int compute_major = 0, compute_minor = 0;
  int multiprocessors = 0;
  size_t total_memory = 0;  // bytes
  size_t l2_bytes = 0;
  size_t shared_memory_optin = 0;  // largest dynamic shared memory a block can opt into, bytes
  int clock_khz = 0;               // SM clock
};
Status device_info(int device, DeviceInfo* info);

// Plain device allocations (cudaMalloc/cudaFree). device_free(nullptr) is Ok.
Status device_alloc(void** ptr, size_t bytes);
Status device_free(void* ptr);

Status copy_host_to_device(void* dst, const void* src, size_t bytes, DeviceStream stream = nullptr);
Status copy_device_to_host(void* dst, const void* src, size_t bytes, DeviceStream stream = nullptr);
Status copy_device_to_device(void* dst, const void* src, size_t bytes, DeviceStream stream = nullptr);
// Sets `bytes` bytes to `value` (0..255).
Status device_memset(void* dst, int value, size_t bytes, DeviceStream stream = nullptr);

Status stream_create(DeviceStream* stream);  // non-blocking with respect to the legacy stream
Status stream_destroy(DeviceStream stream);
Status stream_synchronize(DeviceStream stream);

// Events for device-side timing: record on a stream, then elapsed milliseconds between two.
Status event_create(DeviceEvent* event);
Status event_destroy(DeviceEvent event);
Status event_record(DeviceEvent event, DeviceStream stream);
Status event_synchronize(DeviceEvent event);
Status event_elapsed_ms(DeviceEvent start, DeviceEvent stop, float* ms);

// Owns one device allocation; frees it on destruction. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      ptr_ = o.ptr_;
      bytes_ = o.bytes_;
      o.ptr_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }

  // Frees what it held, then allocates `bytes` (0 holds nothing).
  Status allocate(size_t bytes) {
    reset();
    if (bytes == 0) return Status::Ok();
    MLADCP_RETURN_IF_ERROR(device_alloc(&ptr_, bytes));
    bytes_ = bytes;
    return Status::Ok();
  }
  void reset() {
    if (ptr_) (void)device_free(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void* data() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t size() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace mladcp
