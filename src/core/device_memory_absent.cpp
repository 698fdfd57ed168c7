// include/mladcp/device_memory.h in a build without CUDA: no devices, every operation unsupported.
#include "mladcp/device_memory.h"

namespace mladcp {

namespace {
Status no_cuda(const char* what) {
  return Status::Unsupported(std::string(what) + ": this build of mladcp has no CUDA support");
}
}  // namespace

Status device_count(int* count) {
  if (!count) return Status::InvalidArgument("count: null");
  *count = 0;
  return Status::Ok();
}
Status device_set(int) { return no_cuda("device_set"); }
Status device_get(int*) { return no_cuda("device_get"); }
Status device_synchronize() { return no_cuda("device_synchronize"); }
Status device_info(int, DeviceInfo*) { return no_cuda("device_info"); }
Status device_alloc(void** ptr, size_t) {
  if (ptr) *ptr = nullptr;
  return no_cuda("device_alloc");
}
Status device_free(void* ptr) { return ptr ? no_cuda("device_free") : Status::Ok(); }
Status copy_host_to_device(void*, const void*, size_t, DeviceStream) { return no_cuda("copy_host_to_device"); }
Status copy_device_to_host(void*, const void*, size_t, DeviceStream) { return no_cuda("copy_device_to_host"); }
Status copy_device_to_device(void*, const void*, size_t, DeviceStream) { return no_cuda("copy_device_to_device"); }
Status device_memset(void*, int, size_t, DeviceStream) { return no_cuda("device_memset"); }
Status stream_create(DeviceStream* s) {
  if (s) *s = nullptr;
  return no_cuda("stream_create");
}
Status stream_destroy(DeviceStream s) { return s ? no_cuda("stream_destroy") : Status::Ok(); }
Status stream_synchronize(DeviceStream) { return no_cuda("stream_synchronize"); }
Status event_create(DeviceEvent* e) {
  if (e) *e = nullptr;
  return no_cuda("event_create");
}
Status event_destroy(DeviceEvent e) { return e ? no_cuda("event_destroy") : Status::Ok(); }
Status event_record(DeviceEvent, DeviceStream) { return no_cuda("event_record"); }
Status event_synchronize(DeviceEvent) { return no_cuda("event_synchronize"); }
Status event_elapsed_ms(DeviceEvent, DeviceEvent, float*) { return no_cuda("event_elapsed_ms"); }

}  // namespace mladcp
