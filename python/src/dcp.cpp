// The DCP decode step from Python: a DcpDecoder over an MPI communicator (mpi4py) or an NCCL communicator
// (adopted from an engine, or created with a unique id that the caller distributes).
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <chrono>
#include <cstring>
#include <type_traits>
#include <vector>

#include "common.h"
#include "mladcp/mpi.h"
#if MLADCP_PY_NCCL
#include "mladcp/nccl.h"
#endif

namespace mladcp::py {

namespace {

DcpConfig make_config(const std::string& merge, int interleave, double deadline_s) {
  DcpConfig c;
  auto mode = parse_dcp_merge_mode(merge);
  if (!mode) throw_invalid("merge='" + merge + "': accepted 'a2a' or 'ag-rs'");
  c.merge_mode = *mode;
  if (interleave < 1) throw_invalid("interleave=" + std::to_string(interleave) + ": must be >= 1");
  c.interleave = interleave;
  if (!(deadline_s > 0)) throw_invalid("deadline_s: must be > 0");
  c.deadline = std::chrono::milliseconds(int64_t(deadline_s * 1000.0));
  return c;
}

class PyDcpDecoder {
 public:
  PyDcpDecoder(std::unique_ptr<Communicator> comm, Mem mem, int device, const std::string& backend,
               const DcpConfig& config)
      : comm_(std::move(comm)), mem_(mem), device_(device) {
    DeviceGuard guard(mem == Mem::kCuda ? device : -1);
    std::unique_ptr<Backend> be;
    throw_if_error(create_backend(backend.empty() ? default_backend(mem) : backend, &be));
    if ((be->capabilities().device == Device::kCuda) != (mem == Mem::kCuda))
      throw_invalid("backend='" + be->capabilities().name + "' does not run on the communicator's memory (" +
                    (mem == Mem::kCuda ? "CUDA device" : "host") + ")");
    throw_if_error(DcpDecoder::create(std::move(be), comm_.get(), config, &decoder_));
  }

  ~PyDcpDecoder() {
    decoder_.reset();
    comm_.reset();
  }

  void decode(const Tensor& q, const Tensor& kv, const Tensor& bt, const Tensor& sl, const MutTensor& out,
              const std::optional<MutTensor>& lse, float softmax_scale, int q_len, float kv_scale,
              const std::string& lse_base, int64_t max_seq_len, uintptr_t stream, bool check_block_ids) {
    const DcpShard& shard = decoder_->attention().shard();
    DecodeCall call = parse_decode(q, kv, bt, sl, out, lse, softmax_scale, q_len, kv_scale, lse_base, shard, "",
                                   max_seq_len, check_block_ids);
    if (call.mem != mem_ || (mem_ == Mem::kCuda && call.device != device_))
      throw_invalid(std::string("q: the tensors are on ") +
                    (call.mem == Mem::kHost ? std::string("host memory") : "cuda:" + std::to_string(call.device)) +
                    " but this decoder's communicator works on " +
                    (mem_ == Mem::kHost ? std::string("host memory") : "cuda:" + std::to_string(device_)));
    DeviceGuard guard(mem_ == Mem::kCuda ? device_ : -1);
    ExecContext ctx;
    ctx.stream = reinterpret_cast<void*>(stream);
#if MLADCP_PY_NCCL
    if (nccl_ && stream && nccl_->stream() != ctx.stream) throw_if_error(nccl_->set_stream(ctx.stream));
    if (nccl_ && !stream) ctx.stream = nccl_->stream();
#endif
    ctx.workspace_size = decoder_->workspace_bytes(call.params);
    ctx.workspace = own_workspace(ctx.workspace_size, ctx.stream);
    Status s;
    {
      nb::gil_scoped_release release;  // a DCP step waits on peers
      s = decoder_->decode(call.params, ctx);
    }
    throw_if_error(s);
  }

  int world() const { return decoder_->world(); }
  int rank() const { return decoder_->rank(); }
  DcpShard shard() const { return decoder_->attention().shard(); }
  std::string communicator() const { return comm_->name(); }
  std::string backend() const { return decoder_->attention().backend().capabilities().name; }
  int device() const { return device_; }
  void abort(const std::string& reason) { comm_->abort(reason); }
  void set_nccl(void* c) { nccl_ = static_cast<NcclLike*>(c); }

 private:
#if MLADCP_PY_NCCL
  using NcclLike = NcclCommunicator;
#else
  using NcclLike = void;
#endif

  void* own_workspace(size_t bytes, void* stream) {
    if (bytes <= held_) return mem_ == Mem::kHost ? static_cast<void*>(host_ws_.data()) : device_ws_.data();
    if (mem_ == Mem::kHost) {
      host_ws_.resize(bytes);
      held_ = bytes;
      return host_ws_.data();
    }
    if (stream_is_capturing(stream))
      throw std::runtime_error("unavailable: the DCP step needs " + std::to_string(bytes) +
                               " bytes of workspace and workspace is never allocated during CUDA-graph capture: run "
                               "the same step once before capturing (warm-up)");
    DeviceBuffer bigger;
    throw_if_error(bigger.allocate(bytes));
    if (device_ws_.size()) retired_.push_back(std::move(device_ws_));
    device_ws_ = std::move(bigger);
    held_ = bytes;
    return device_ws_.data();
  }

  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<DcpDecoder> decoder_;
  Mem mem_;
  int device_;
  NcclLike* nccl_ = nullptr;
  size_t held_ = 0;
  std::vector<unsigned char> host_ws_;
  DeviceBuffer device_ws_;
  std::vector<DeviceBuffer> retired_;  // a captured graph may still point into them
};

#if MLADCP_HAVE_MPI
// mpi4py's handle: a pointer (Open MPI) or an integer (MPICH) as a Python int.
template <typename C>
C mpi_comm_from_handle(uintptr_t handle) {
  if constexpr (std::is_pointer_v<C>) {
    return reinterpret_cast<C>(handle);
  } else {
    return static_cast<C>(handle);
  }
}
#endif

PyDcpDecoder* from_mpi(uintptr_t handle, const std::string& backend, const std::string& merge, int interleave,
                       double deadline_s, bool agree) {
#if MLADCP_HAVE_MPI
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) throw_invalid("mpi_comm: MPI is not initialized (import mpi4py.MPI first)");
  DcpConfig config = make_config(merge, interleave, deadline_s);
  config.agree_on_validation = agree;
  std::unique_ptr<Communicator> comm;
  throw_if_error(create_mpi_communicator(mpi_comm_from_handle<MPI_Comm>(handle), MpiCommunicatorOptions{}, &comm));
  return new PyDcpDecoder(std::move(comm), Mem::kHost, -1, backend, config);
#else
  (void)handle, (void)backend, (void)merge, (void)interleave, (void)deadline_s, (void)agree;
  throw UnsupportedError("unsupported: this build of mladcp has no MPI communicator");
#endif
}

#if MLADCP_PY_NCCL
PyDcpDecoder* wrap_nccl(std::unique_ptr<NcclCommunicator> nccl, const std::string& backend, const DcpConfig& config) {
  NcclCommunicator* raw = nccl.get();
  const int device = raw->device();
  auto* d = new PyDcpDecoder(std::move(nccl), Mem::kCuda, device, backend, config);
  d->set_nccl(raw);
  return d;
}
#endif

// Adopts an ncclComm_t that `owner` (the loaded library that created it, e.g. torch's libtorch_cuda.so)
// made. Refused unless `owner` reaches NCCL through the very library instance this module calls: a
// communicator of another NCCL must never be handed to ours.
PyDcpDecoder* from_nccl_comm(uintptr_t comm_ptr, const std::string& owner, int device, uintptr_t stream,
                             const std::string& backend, const std::string& merge, int interleave, double deadline_s) {
#if MLADCP_PY_NCCL
  if (!comm_ptr) throw_invalid("nccl_comm: null communicator pointer");
  if (!nccl_library_shared_with(owner))
    throw_invalid("nccl_comm: made by '" + owner + "', which does not call the NCCL this module uses (" +
                  nccl_library_info().path + "); a communicator of another NCCL library cannot be adopted");
  NcclOptions options;
  options.device = device;
  options.stream = reinterpret_cast<void*>(stream);
  options.adopted_fault_policy = NcclAdoptedFaultPolicy::kNone;  // the engine owns and handles its communicator
  std::unique_ptr<NcclCommunicator> nccl;
  {
    DeviceGuard guard(device);
    throw_if_error(adopt_nccl_communicator(reinterpret_cast<ncclComm*>(comm_ptr), options, &nccl));
  }
  return wrap_nccl(std::move(nccl), backend, make_config(merge, interleave, deadline_s));
#else
  (void)comm_ptr, (void)owner, (void)device, (void)stream, (void)backend, (void)merge, (void)interleave,
      (void)deadline_s;
  throw UnsupportedError("unsupported: this build of mladcp has no NCCL communicator");
#endif
}

// `broadcast(id: bytes | None) -> bytes`: called on every rank, with rank 0's fresh unique id on rank 0
// (None elsewhere); returns rank 0's id on every rank.
PyDcpDecoder* from_nccl_bootstrap(int rank, int world, const std::function<nb::bytes(nb::object)>& broadcast,
                                  int device, uintptr_t stream, const std::string& backend, const std::string& merge,
                                  int interleave, double deadline_s) {
#if MLADCP_PY_NCCL
  NcclOptions options;
  options.device = device;
  options.stream = reinterpret_cast<void*>(stream);
  NcclIdBroadcast bcast = [&](int r, NcclUniqueId* id) -> Status {
    nb::object arg = r == 0 ? nb::object(nb::bytes(id->bytes, sizeof(id->bytes))) : nb::none();
    nb::bytes got = broadcast(arg);
    if (got.size() != sizeof(id->bytes))
      return Status::InvalidArgument("broadcast: returned " + std::to_string(got.size()) + " bytes, expected 128");
    std::memcpy(id->bytes, got.c_str(), sizeof(id->bytes));
    return Status::Ok();
  };
  std::unique_ptr<NcclCommunicator> nccl;
  {
    DeviceGuard guard(device);
    throw_if_error(create_nccl_communicator(rank, world, bcast, options, &nccl));
  }
  return wrap_nccl(std::move(nccl), backend, make_config(merge, interleave, deadline_s));
#else
  (void)rank, (void)world, (void)broadcast, (void)device, (void)stream, (void)backend, (void)merge, (void)interleave,
      (void)deadline_s;
  throw UnsupportedError("unsupported: this build of mladcp has no NCCL communicator");
#endif
}

}  // namespace

void register_dcp(nb::module_& m) {
  using namespace nb::literals;
  nb::class_<PyDcpDecoder>(m, "_DcpDecoder")
      .def_static("from_mpi", &from_mpi, "handle"_a, "backend"_a, "merge"_a, "interleave"_a, "deadline_s"_a, "agree"_a,
                  nb::rv_policy::take_ownership)
      .def_static("from_nccl_comm", &from_nccl_comm, "comm_ptr"_a, "owner"_a, "device"_a, "stream"_a, "backend"_a,
                  "merge"_a, "interleave"_a, "deadline_s"_a, nb::rv_policy::take_ownership)
      .def_static("from_nccl_bootstrap", &from_nccl_bootstrap, "rank"_a, "world"_a, "broadcast"_a, "device"_a,
                  "stream"_a, "backend"_a, "merge"_a, "interleave"_a, "deadline_s"_a, nb::rv_policy::take_ownership)
      .def("decode", &PyDcpDecoder::decode, "q"_a, "kv_cache"_a, "block_table"_a, "seq_lens"_a, "out"_a, "lse"_a.none(),
           "softmax_scale"_a, "q_len"_a, "kv_scale"_a, "lse_base"_a, "max_seq_len"_a, "stream"_a, "check_block_ids"_a)
      .def_prop_ro("world", &PyDcpDecoder::world)
      .def_prop_ro("rank", &PyDcpDecoder::rank)
      .def_prop_ro("shard", &PyDcpDecoder::shard)
      .def_prop_ro("communicator", &PyDcpDecoder::communicator)
      .def_prop_ro("backend", &PyDcpDecoder::backend)
      .def_prop_ro("device", &PyDcpDecoder::device)
      .def("abort", &PyDcpDecoder::abort, "reason"_a);
  m.def("_mpi_available", [] { return mpi_communicator_available(); });
  m.def("_nccl_available", [] { return bool(MLADCP_PY_NCCL); });
  // The NCCL this module calls (loaded on first use; loading it is what this call does first).
  m.def("_nccl_library", [] {
    nb::dict d;
#if MLADCP_PY_NCCL
    const NcclLibraryInfo info = nccl_library_info();
    d["loaded"] = info.loaded;
    d["error"] = info.error;
    d["path"] = info.path;
    d["version"] = info.version;
    d["private_copy"] = info.private_copy;
#else
    d["loaded"] = false;
    d["error"] = "this build of mladcp has no NCCL communicator";
    d["path"] = "";
    d["version"] = 0;
    d["private_copy"] = false;
#endif
    return d;
  });
  m.def(
      "_nccl_library_shared_with",
      [](const std::string& library) {
#if MLADCP_PY_NCCL
        return nccl_library_shared_with(library);
#else
        (void)library;
        return false;
#endif
      },
      "library"_a);
}

}  // namespace mladcp::py
