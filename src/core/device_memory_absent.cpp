// include/mladcp/device_memory.h without CUDA: no devices, every operation unsupported. In a build
// with CUDA these definitions are weak: a program that links mladcp::cuda gets the real ones.
#include "mladcp/device_memory.h"

#if MLADCP_DEVICE_MEMORY_WEAK
#define MLADCP_FALLBACK __attribute__((weak))
#else
#define MLADCP_FALLBACK
#endif

namespace mladcp {

namespace {
Status no_cuda(const char* what) {
  return Status::Unsupported(std::string(what) + ": this build of mladcp has no CUDA support");
}
}  // namespace

MLADCP_FALLBACK Status device_count(int* count) {
  if (!count) return Status::InvalidArgument("count: null");
  *count = 0;
  return Status::Ok();
}
MLADCP_FALLBACK Status device_set(int) { return no_cuda("device_set"); }
MLADCP_FALLBACK Status device_get(int*) { return no_cuda("device_get"); }
MLADCP_FALLBACK Status device_synchronize() { return no_cuda("device_synchronize"); }
MLADCP_FALLBACK Status device_info(int, DeviceInfo*) { return no_cuda("device_info"); }
MLADCP_FALLBACK Status device_alloc(void** ptr, size_t) {
  if (ptr) *ptr = nullptr;
  return no_cuda("device_alloc");
}
MLADCP_FALLBACK Status device_free(void* ptr) { return ptr ? no_cuda("device_free") : Status::Ok(); }
MLADCP_FALLBACK Status copy_host_to_device(void*, const void*, size_t, DeviceStream) {
  return no_cuda("copy_host_to_device");
}
MLADCP_FALLBACK Status copy_device_to_host(void*, const void*, size_t, DeviceStream) {
  return no_cuda("copy_device_to_host");
}
MLADCP_FALLBACK Status copy_device_to_device(void*, const void*, size_t, DeviceStream) {
  return no_cuda("copy_device_to_device");
}
MLADCP_FALLBACK Status device_memset(void*, int, size_t, DeviceStream) { return no_cuda("device_memset"); }
MLADCP_FALLBACK Status stream_create(DeviceStream* s) {
  if (s) *s = nullptr;
  return no_cuda("stream_create");
}
MLADCP_FALLBACK Status stream_destroy(DeviceStream s) { return s ? no_cuda("stream_destroy") : Status::Ok(); }
MLADCP_FALLBACK Status stream_synchronize(DeviceStream) { return no_cuda("stream_synchronize"); }
MLADCP_FALLBACK Status event_create(DeviceEvent* e) {
  if (e) *e = nullptr;
  return no_cuda("event_create");
}
MLADCP_FALLBACK Status event_destroy(DeviceEvent e) { return e ? no_cuda("event_destroy") : Status::Ok(); }
MLADCP_FALLBACK Status event_record(DeviceEvent, DeviceStream) { return no_cuda("event_record"); }
MLADCP_FALLBACK Status event_synchronize(DeviceEvent) { return no_cuda("event_synchronize"); }
MLADCP_FALLBACK Status event_elapsed_ms(DeviceEvent, DeviceEvent, float*) { return no_cuda("event_elapsed_ms"); }

}  // namespace mladcp
