// Shared pieces of the Python binding: DLPack tensor views, Status -> exception, the device guard, the
// per-device backend and workspace cache.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "mladcp/device_memory.h"
#include "mladcp/mladcp.h"

namespace mladcp::py {

namespace nb = nanobind;

// Any DLPack tensor (numpy, torch, cupy, ...), read-only or writable; never converted or copied.
using Tensor = nb::ndarray<nb::ro>;
using MutTensor = nb::ndarray<>;

// Raised for kUnsupported; the module translates it to NotImplementedError (a RuntimeError).
struct UnsupportedError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Raises ValueError (invalid argument), NotImplementedError (unsupported) or RuntimeError (everything
// else) carrying status.to_string(), when !status.ok().
void throw_if_error(const Status& status);
[[noreturn]] void throw_invalid(const std::string& message);

enum class Mem { kHost, kCuda };

// A tensor as the binding sees it: pointer, element type, memory, shape and strides in elements.
struct View {
  const char* name = "";
  void* data = nullptr;
  DType dtype = DType::kFP32;  // for float tensors
  bool is_int32 = false, is_int64 = false;
  Mem mem = Mem::kHost;
  int device = -1;  // CUDA device, -1 for host memory
  int ndim = 0;
  int64_t shape[4] = {0, 0, 0, 0};
  int64_t stride[4] = {0, 0, 0, 0};
};

// Reads a DLPack tensor. Float tensors: bfloat16, float16, float32, float8_e4m3fn; uint16 is taken as
// bf16 bits and uint8 as fp8-e4m3 bits (numpy has neither type). Integer tensors: int32 / int64.
View view_of(const char* name, const nb::ndarray<nb::ro>& t);
View view_of(const char* name, const nb::ndarray<>& t);

// ---- torch tensors without capsules: the DLPack C exchange API -----------------------------------------
// torch (2.10 and later) publishes on torch.Tensor a table of C functions (`__dlpack_c_exchange_api__`,
// DLPack 1.2+) that describe a tensor in place (pointer, dtype, device, shape and strides: no allocation,
// no capsule, no Python call) and return the current stream of a device. Reading a tensor this way costs
// tens of nanoseconds where torch._C._to_dlpack and the capsule's import cost about half a microsecond.

// The DLPack C ABI of a tensor description (dlpack.h's DLTensor; codes as in nb::dlpack::dtype_code).
struct DLTensorC {
  void* data;
  struct {
    int32_t device_type, device_id;
  } device;
  int32_t ndim;
  struct {
    uint8_t code, bits;
    uint16_t lanes;
  } dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null: compact row-major
  uint64_t byte_offset;
};

// Registers the exchange API of `tensor_type` (a PyCapsule "dlpack_exchange_api" or an int address, as
// torch publishes it); returns false, keeping nothing, when it is absent or of an unknown DLPack major
// version. None unregisters.
bool set_torch_exchange(nb::handle tensor_type, nb::handle api);
bool torch_exchange_ready();
// Describes objs[0..n) (null entries are skipped) through the registered API, into out[0..n). False, with
// nothing raised, unless every non-null object is exactly the registered type and torch described it.
bool torch_describe(PyObject* const* objs, DLTensorC* out, int n);
// torch's current stream on CUDA device `device` (at::cuda::getCurrentCUDAStream), as a cudaStream_t.
void* torch_current_stream(int device);
View view_of(const char* name, const DLTensorC& t);

std::string describe_shape(const View& v);
void require_ndim(const View& v, int lo, int hi, const char* expected);
void require_last_contiguous(const View& v, const char* expected);
void require_float(const View& v, std::initializer_list<DType> accepted);
void require_int32(const View& v);
void require_int64(const View& v);
// All `views` live in the same memory (same CUDA device); returns it.
Mem common_memory(std::initializer_list<const View*> views, int* device);

// Makes `device` current for the lifetime of the guard (CUDA builds; no-op for host memory).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// True when `stream` (a cudaStream_t) is capturing a CUDA graph. Always false in builds without CUDA.
bool stream_is_capturing(void* stream);

// A cached backend per (name, device); created on first use, kept for the process. An empty name is the
// default backend of `mem` ("cuda" for device memory, "cpu" for host memory).
Backend& backend_for(std::string_view name, Mem mem, int device);
// The default backend name for tensors in `mem`: "cuda" for device memory, "cpu" for host memory.
std::string default_backend(Mem mem);

// Workspace of `bytes` on `device` (host memory for device -1), allocated once and grown when a call
// needs more; growing during CUDA-graph capture is refused with a message. The pointer stays valid
// until the next call that grows it.
void* workspace(Mem mem, int device, size_t bytes, void* stream, const char* what);

// (bytes held, buffers outgrown) of the device workspace of `device`.
std::pair<size_t, size_t> workspace_info(int device);

std::optional<LseBase> parse_lse_base(std::string_view s);
std::optional<SplitPolicy> parse_split_policy(std::string_view s);

// The decode arguments of the Python call, checked and turned into params (shapes, dtypes, strides,
// devices). On a device, max_seq_len 0 becomes the bound the block table can address.
struct DecodeCall {
  MlaDecodeParams params;
  Mem mem = Mem::kHost;
  int device = -1;
};
DecodeCall parse_decode(const Tensor& q, const Tensor& kv_cache, const Tensor& block_table, const Tensor& seq_lens,
                        const MutTensor& out, const std::optional<MutTensor>& lse, float softmax_scale, int q_len,
                        float kv_scale, const std::string& lse_base, const DcpShard& shard,
                        const std::string& split_policy, int64_t max_seq_len, bool check_block_ids);
// The same checks on views already read (q, kv, bt, sl, out, then lse when not null, in that order).
DecodeCall parse_decode(const View& q, const View& kv, const View& bt, const View& sl, const View& out, const View* lse,
                        float softmax_scale, int q_len, float kv_scale, std::string_view lse_base,
                        const DcpShard& shard, std::string_view split_policy, int64_t max_seq_len,
                        bool check_block_ids);

// Registration of the parts of the module.
void register_ops(nb::module_& m);
void register_dcp(nb::module_& m);

}  // namespace mladcp::py
