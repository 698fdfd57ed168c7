// DLPack views, errors, the device guard, and the per-device backend and workspace caches.
#include <array>
#include <atomic>
#include <map>
#include <mutex>
#include <sstream>
#include <utility>
#include <vector>

#include "common.h"

#if MLADCP_PY_CUDA
#include <cuda_runtime_api.h>
#endif

namespace mladcp::py {

namespace {

constexpr int kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13;

// A DLTensorC read like an nb::ndarray (the accessors make_view uses).
struct DLAccess {
  const DLTensorC& t;
  const void* data() const { return static_cast<const char*>(t.data) + t.byte_offset; }
  size_t ndim() const { return size_t(t.ndim); }
  int64_t shape(size_t i) const { return t.shape[i]; }
  int64_t stride(size_t i) const {
    if (t.strides) return t.strides[i];
    int64_t s = 1;  // compact row-major
    for (size_t j = size_t(t.ndim); j-- > i + 1;) s *= t.shape[j];
    return s;
  }
  int32_t device_type() const { return t.device.device_type; }
  int32_t device_id() const { return t.device.device_id; }
  nb::dlpack::dtype dtype() const { return nb::dlpack::dtype{t.dtype.code, t.dtype.bits, t.dtype.lanes}; }
};

template <typename Array>
View make_view(const char* name, const Array& t) {
  View v;
  v.name = name;
  v.data = const_cast<void*>(static_cast<const void*>(t.data()));
  v.ndim = int(t.ndim());
  if (v.ndim > 4)
    throw_invalid(std::string(name) + ": " + std::to_string(v.ndim) + " dimensions; at most 4 are accepted");
  for (int i = 0; i < v.ndim; ++i) {
    v.shape[i] = int64_t(t.shape(size_t(i)));
    v.stride[i] = t.stride(size_t(i));
    if (v.shape[i] > 1 && v.stride[i] <= 0)
      throw_invalid(std::string(name) + ": stride " + std::to_string(v.stride[i]) + " of dimension " +
                    std::to_string(i) + " (size " + std::to_string(v.shape[i]) +
                    "): broadcast (0) and negative strides are not accepted; pass a tensor that owns its elements");
  }
  switch (t.device_type()) {
    case kDLCPU:
    case kDLCUDAHost:
      v.mem = Mem::kHost;
      v.device = -1;
      break;
    case kDLCUDA:
    case kDLCUDAManaged:
      v.mem = Mem::kCuda;
      v.device = t.device_id();
      break;
    default:
      throw_invalid(std::string(name) + ": DLPack device type " + std::to_string(t.device_type()) +
                    " is not supported (host memory or CUDA)");
  }
  const nb::dlpack::dtype d = t.dtype();
  using C = nb::dlpack::dtype_code;
  const auto code = C(d.code);
  if (d.lanes != 1) throw_invalid(std::string(name) + ": vector dtypes (lanes > 1) are not supported");
  if (code == C::Bfloat && d.bits == 16) {
    v.dtype = DType::kBF16;
  } else if (code == C::Float && d.bits == 16) {
    v.dtype = DType::kFP16;
  } else if (code == C::Float && d.bits == 32) {
    v.dtype = DType::kFP32;
  } else if (code == C::Float8_E4M3FN && d.bits == 8) {
    v.dtype = DType::kFP8E4M3;
  } else if (code == C::UInt && d.bits == 16) {
    v.dtype = DType::kBF16;  // bf16 bits (numpy)
  } else if (code == C::UInt && d.bits == 8) {
    v.dtype = DType::kFP8E4M3;  // fp8-e4m3 bits (numpy)
  } else if (code == C::Int && d.bits == 32) {
    v.is_int32 = true;
  } else if (code == C::Int && d.bits == 64) {
    v.is_int64 = true;
  } else {
    v.is_int32 = v.is_int64 = false;
    v.dtype = DType::kFP32;
    v.ndim = -v.ndim - 1;  // marks "unsupported dtype"; reported by the require_* checks
  }
  return v;
}

std::string dtype_text(const View& v) {
  if (v.ndim < 0) return "an unsupported dtype";
  if (v.is_int32) return "int32";
  if (v.is_int64) return "int64";
  return dtype_name(v.dtype);
}

std::string where(const View& v) {
  return v.mem == Mem::kHost ? std::string("host memory") : "cuda:" + std::to_string(v.device);
}

}  // namespace

void throw_invalid(const std::string& message) { throw nb::value_error(("invalid_argument: " + message).c_str()); }

void throw_if_error(const Status& s) {
  if (s.ok()) return;
  const std::string text = s.to_string();
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
      throw nb::value_error(text.c_str());
    case StatusCode::kUnsupported:
      throw UnsupportedError(text);
    default:
      throw std::runtime_error(text);
  }
}

View view_of(const char* name, const nb::ndarray<nb::ro>& t) { return make_view(name, t); }
View view_of(const char* name, const nb::ndarray<>& t) { return make_view(name, t); }
View view_of(const char* name, const DLTensorC& t) { return make_view(name, DLAccess{t}); }

// ---- the DLPack C exchange API of torch -----------------------------------------------------------------

namespace {

// dlpack.h's DLPackExchangeAPI (DLPack 1.2+): a header (version, the previous version's table) and the
// producer's functions, of which the binding calls two.
struct ExchangeApi {
  uint32_t major, minor;
  const ExchangeApi* prev_api;
  void* managed_tensor_allocator;
  void* managed_tensor_from_py_object_no_sync;
  void* managed_tensor_to_py_object_no_sync;
  int (*dltensor_from_py_object_no_sync)(void* py_object, DLTensorC* out);
  int (*current_work_stream)(int32_t device_type, int32_t device_id, void** out_stream);
};

PyTypeObject* g_torch_type = nullptr;  // torch.Tensor (a strong reference while registered)
const ExchangeApi* g_torch_api = nullptr;

}  // namespace

bool set_torch_exchange(nb::handle tensor_type, nb::handle api) {
  if (g_torch_type) {
    Py_DECREF(reinterpret_cast<PyObject*>(g_torch_type));
    g_torch_type = nullptr;
    g_torch_api = nullptr;
  }
  if (tensor_type.is_none() || api.is_none() || !PyType_Check(tensor_type.ptr())) return false;
  const void* table = nullptr;
  if (PyCapsule_CheckExact(api.ptr())) {
    table = PyCapsule_GetPointer(api.ptr(), "dlpack_exchange_api");
  } else if (PyLong_Check(api.ptr())) {
    table = PyLong_AsVoidPtr(api.ptr());
  }
  if (!table) {
    PyErr_Clear();
    return false;
  }
  // The table of the newest version comes first; older versions follow through prev_api.
  const ExchangeApi* a = static_cast<const ExchangeApi*>(table);
  while (a && a->major != 1) a = a->prev_api;
  if (!a || a->minor < 2 || !a->dltensor_from_py_object_no_sync || !a->current_work_stream) return false;
  Py_INCREF(tensor_type.ptr());
  g_torch_type = reinterpret_cast<PyTypeObject*>(tensor_type.ptr());
  g_torch_api = a;
  return true;
}

bool torch_exchange_ready() { return g_torch_api != nullptr; }

bool torch_describe(PyObject* const* objs, DLTensorC* out, int n) {
  if (!g_torch_api) return false;
  for (int i = 0; i < n; ++i)
    if (objs[i] && Py_TYPE(objs[i]) != g_torch_type) return false;
  for (int i = 0; i < n; ++i) {
    if (!objs[i]) continue;
    if (g_torch_api->dltensor_from_py_object_no_sync(objs[i], &out[i]) != 0) {
      PyErr_Clear();  // what torch cannot describe takes the capsule path, which reports it
      return false;
    }
  }
  return true;
}

void* torch_current_stream(int device) {
  constexpr int32_t kDLCUDA_ = 2;
  void* stream = nullptr;
  if (!g_torch_api || g_torch_api->current_work_stream(kDLCUDA_, device, &stream) != 0) throw nb::python_error();
  return stream;
}

std::string describe_shape(const View& v) {
  std::ostringstream os;
  os << "shape [";
  const int n = v.ndim < 0 ? -v.ndim - 1 : v.ndim;
  for (int i = 0; i < n; ++i) os << (i ? ", " : "") << v.shape[i];
  os << "], strides [";
  for (int i = 0; i < n; ++i) os << (i ? ", " : "") << v.stride[i];
  os << "]";
  return os.str();
}

void require_ndim(const View& v, int lo, int hi, const char* expected) {
  if (v.ndim < 0) return;  // dtype error reported by the caller's dtype check
  if (v.ndim < lo || v.ndim > hi)
    throw_invalid(std::string(v.name) + ": " + std::to_string(v.ndim) + " dimensions (" + describe_shape(v) +
                  "); expected " + expected);
}

void require_last_contiguous(const View& v, const char* expected) {
  if (v.ndim > 0 && v.shape[v.ndim - 1] > 1 && v.stride[v.ndim - 1] != 1)
    throw_invalid(std::string(v.name) + ": the last dimension must be contiguous (stride 1), got " + describe_shape(v) +
                  "; expected " + expected + ". The call does not copy: pass .contiguous() yourself if intended");
}

void require_float(const View& v, std::initializer_list<DType> accepted) {
  bool ok = v.ndim >= 0 && !v.is_int32 && !v.is_int64;
  if (ok) {
    ok = false;
    for (DType d : accepted) ok = ok || d == v.dtype;
  }
  if (ok) return;
  std::string list;
  for (DType d : accepted) list += (list.empty() ? "" : ", ") + std::string(dtype_name(d));
  throw_invalid(std::string(v.name) + ": dtype " + dtype_text(v) + "; accepted " + list +
                " (numpy: uint16 holds bf16 bits, uint8 fp8-e4m3 bits)");
}

void require_int32(const View& v) {
  if (!v.is_int32 || v.ndim < 0) throw_invalid(std::string(v.name) + ": dtype " + dtype_text(v) + "; expected int32");
}

void require_int64(const View& v) {
  if (!v.is_int64 || v.ndim < 0) throw_invalid(std::string(v.name) + ": dtype " + dtype_text(v) + "; expected int64");
}

Mem common_memory(std::initializer_list<const View*> views, int* device) {
  const View* first = *views.begin();
  for (const View* v : views) {
    if (v->mem != first->mem || v->device != first->device)
      throw_invalid(std::string(v->name) + ": on " + where(*v) + " but " + first->name + " is on " + where(*first) +
                    "; every tensor of a call must be on the same device");
  }
  if (device) *device = first->device;
  return first->mem;
}

// ---- device guard and capture ---------------------------------------------------------------------------

DeviceGuard::DeviceGuard(int device) {
  if (device < 0) return;
  int current = -1;
  throw_if_error(device_get(&current));
  if (current != device) {
    throw_if_error(device_set(device));
    previous_ = current;
  }
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) (void)device_set(previous_);
}

bool stream_is_capturing(void* stream) {
#if MLADCP_PY_CUDA
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status) != cudaSuccess) {
    (void)cudaGetLastError();
    return true;  // the legacy stream while another captures: treat as capturing (refuse to allocate)
  }
  return status != cudaStreamCaptureStatusNone;
#else
  (void)stream;
  return false;
#endif
}

// ---- backends and workspaces ----------------------------------------------------------------------------

namespace {

std::mutex g_mu;
std::map<std::pair<std::string, int>, std::unique_ptr<Backend>> g_backends;

struct DeviceWorkspace {
  DeviceBuffer current;
  std::vector<DeviceBuffer> retired;  // kept alive: a captured graph may still point into them
};
std::map<int, DeviceWorkspace> g_device_ws;

}  // namespace

std::string default_backend(Mem mem) { return mem == Mem::kCuda ? "cuda" : "cpu"; }

namespace {

// The default backend of host memory and of each CUDA device, once created: read without the lock (a
// backend, once in g_backends, lives as long as the process).
constexpr int kCachedDevices = 64;
std::atomic<Backend*> g_default_host{nullptr};
std::array<std::atomic<Backend*>, kCachedDevices> g_default_cuda{};

std::atomic<Backend*>* default_slot(std::string_view name, Mem mem, int device) {
  if (!name.empty()) return nullptr;
  if (mem == Mem::kHost) return &g_default_host;
  return device >= 0 && device < kCachedDevices ? &g_default_cuda[size_t(device)] : nullptr;
}

}  // namespace

Backend& backend_for(std::string_view name_arg, Mem mem, int device) {
  std::atomic<Backend*>* slot = default_slot(name_arg, mem, device);
  if (slot) {
    if (Backend* b = slot->load(std::memory_order_acquire)) return *b;
  }
  const std::string name = name_arg.empty() ? default_backend(mem) : std::string(name_arg);
  std::lock_guard<std::mutex> lock(g_mu);
  auto key = std::make_pair(name, mem == Mem::kCuda ? device : -1);
  auto it = g_backends.find(key);
  if (it != g_backends.end()) {
    if (slot) slot->store(it->second.get(), std::memory_order_release);
    return *it->second;
  }
  std::unique_ptr<Backend> b;
  {
    DeviceGuard guard(mem == Mem::kCuda ? device : -1);
    throw_if_error(create_backend(name, &b));
  }
  const bool on_device = b->capabilities().device == Device::kCuda;
  if (on_device != (mem == Mem::kCuda))
    throw_invalid("backend='" + name + "' runs on " + (on_device ? "CUDA device memory" : "host memory") +
                  " but the tensors are in " + (mem == Mem::kCuda ? "CUDA device memory" : "host memory"));
  Backend& ref = *b;
  g_backends.emplace(key, std::move(b));
  if (slot) slot->store(&ref, std::memory_order_release);
  return ref;
}

void* workspace(Mem mem, int device, size_t bytes, void* stream, const char* what) {
  if (bytes == 0) return nullptr;
  if (mem == Mem::kHost) {
    thread_local std::vector<unsigned char> host;  // host backends run on the caller's thread
    if (host.size() < bytes) host.resize(bytes);
    return host.data();
  }
  std::lock_guard<std::mutex> lock(g_mu);
  DeviceWorkspace& ws = g_device_ws[device];
  if (ws.current.size() >= bytes) return ws.current.data();
  if (stream_is_capturing(stream))
    throw std::runtime_error(std::string("unavailable: ") + what + " needs " + std::to_string(bytes) +
                             " bytes of workspace on cuda:" + std::to_string(device) +
                             " (held: " + std::to_string(ws.current.size()) +
                             "), and workspace is never allocated during CUDA-graph capture: run the same call once "
                             "before capturing (warm-up)");
  DeviceBuffer bigger;
  throw_if_error(bigger.allocate(std::max(bytes, ws.current.size() * 2)));
  if (ws.current.size()) ws.retired.push_back(std::move(ws.current));
  ws.current = std::move(bigger);
  return ws.current.data();
}

std::pair<size_t, size_t> workspace_info(int device) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_device_ws.find(device);
  if (it == g_device_ws.end()) return {0, 0};
  return {it->second.current.size(), it->second.retired.size()};
}

std::optional<LseBase> parse_lse_base(std::string_view s) {
  if (s == "e" || s == "E" || s == "ln") return LseBase::kE;
  if (s == "2" || s == "log2") return LseBase::k2;
  return std::nullopt;
}

std::optional<SplitPolicy> parse_split_policy(std::string_view s) {
  if (s.empty() || s == "invariant" || s == "batch_invariant") return SplitPolicy::kBatchInvariant;
  if (s == "fill" || s == "fill_device") return SplitPolicy::kFillDevice;
  return std::nullopt;
}

}  // namespace mladcp::py
