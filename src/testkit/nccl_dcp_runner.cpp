// DCP decode on GPUs over NCCL: checks against single-GPU decode and device-time measurements.
#include "testkit/nccl_dcp_runner.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <thread>
#include <utility>

#include "core/numeric.h"
#include "core/validate.h"
#include "mladcp/backend.h"
#include "mladcp/device_memory.h"
#include "mladcp/kv_cache.h"
#include "testkit/median.h"

namespace mladcp::dcp_gpu {
namespace {

using Clock = std::chrono::steady_clock;
using detail::cat;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  return Status(StatusCode::kCudaError, cat(what, ": ", cudaGetErrorString(e)));
}
#define DCP_GPU_CUDA(call) MLADCP_RETURN_IF_ERROR(cuda_status((call), #call))

// Frees what `b` held, then allocates `bytes` and copies them from the host.
Status upload(DeviceBuffer& b, const void* src, size_t bytes) {
  MLADCP_RETURN_IF_ERROR(b.allocate(bytes));
  return bytes ? copy_host_to_device(b.data(), src, bytes) : Status::Ok();
}
Status download(const DeviceBuffer& b, void* dst, size_t bytes) {
  return bytes ? copy_device_to_host(dst, b.data(), bytes) : Status::Ok();
}

class Event {
 public:
  Event() = default;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event() {
    if (ev_) (void)cudaEventDestroy(ev_);
  }
  Status create() { return cuda_status(cudaEventCreate(&ev_), "cudaEventCreate"); }
  cudaEvent_t get() const { return ev_; }

 private:
  cudaEvent_t ev_ = nullptr;
};

// Waits for `event` with a deadline; on timeout aborts the communicator (a peer stalled).
Status wait_event(cudaEvent_t event, NcclCommunicator& comm, Clock::time_point limit, const char* what) {
  for (;;) {
    const cudaError_t e = cudaEventQuery(event);
    if (e == cudaSuccess) return Status::Ok();
    if (e != cudaErrorNotReady) return cuda_status(e, what);
    if (Clock::now() >= limit) {
      const std::string msg = cat("DCP rank ", comm.rank(), ": ", what, " did not complete before the deadline");
      comm.abort(msg);
      return Status(StatusCode::kTimeout, msg);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

using testkit::median;

// Deterministic pseudo-random values in [-2, 2) (timing data: random, never zeros).
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float uniform() { return float(next() >> 40) * (4.0f / 16777216.0f) - 2.0f; }

 private:
  uint64_t s_;
};

std::vector<uint8_t> random_values(size_t count, DType dtype, uint64_t seed) {
  Rng rng(seed);
  std::vector<uint8_t> bytes(count * dtype_size(dtype));
  for (size_t i = 0; i < count; ++i) {
    const float v = rng.uniform();
    switch (dtype) {
      case DType::kBF16:
        reinterpret_cast<uint16_t*>(bytes.data())[i] = numeric::float_to_bf16(v);
        break;
      case DType::kFP16:
        reinterpret_cast<uint16_t*>(bytes.data())[i] = numeric::float_to_fp16(v);
        break;
      case DType::kFP32:
        reinterpret_cast<float*>(bytes.data())[i] = v;
        break;
      case DType::kFP8E4M3:
        bytes[i] = numeric::float_to_fp8e4m3(v);
        break;
    }
  }
  return bytes;
}

// ---- Phase timing: events recorded on the stream at the boundaries of each phase ----------------

enum Phase { kQueryGather = 0, kAttention, kExchange, kMerge, kNumPhases };

class PhaseRecorder {
 public:
  static constexpr int kMaxIntervals = 16;
  Status init() {
    for (auto& e : events_) MLADCP_RETURN_IF_ERROR(e.create());
    return Status::Ok();
  }
  // Starts a step on `stream`; under capture the events become event-record nodes of the graph.
  void begin_step(cudaStream_t stream, bool capturing) {
    stream_ = stream;
    capturing_ = capturing;
    count_ = 0;
    gathers_ = 0;
    status_ = Status::Ok();
  }
  // The first all-gather of a step is the query's; later ones belong to the exchange.
  Phase all_gather_phase() { return gathers_++ == 0 ? kQueryGather : kExchange; }
  void open(Phase p) {
    if (count_ >= kMaxIntervals) {
      if (status_.ok()) status_ = Status::Internal("phase timing: more intervals in one step than recorded");
      return;
    }
    phase_[count_] = p;
    record(events_[2 * count_].get());
  }
  void close() {
    if (count_ >= kMaxIntervals) return;
    record(events_[2 * count_ + 1].get());
    ++count_;
  }
  // Device microseconds per phase of the last completed step (or replay).
  Status collect(std::array<double, kNumPhases>* us) const {
    MLADCP_RETURN_IF_ERROR(status_);
    us->fill(0.0);
    for (int i = 0; i < count_; ++i) {
      float ms = 0;
      const cudaError_t e = cudaEventElapsedTime(&ms, events_[2 * i].get(), events_[2 * i + 1].get());
      if (e != cudaSuccess) {
        (void)cudaGetLastError();  // not sticky: keep it from surfacing in a later launch check
        return cuda_status(e, "cudaEventElapsedTime (phase timing)");
      }
      (*us)[phase_[i]] += 1000.0 * ms;
    }
    return Status::Ok();
  }

 private:
  void record(cudaEvent_t e) {
    const cudaError_t r =
        capturing_ ? cudaEventRecordWithFlags(e, stream_, cudaEventRecordExternal) : cudaEventRecord(e, stream_);
    if (r != cudaSuccess) {
      (void)cudaGetLastError();
      if (status_.ok()) status_ = cuda_status(r, "cudaEventRecord (phase timing)");
    }
  }

  std::array<Event, 2 * kMaxIntervals> events_;
  std::array<Phase, kMaxIntervals> phase_{};
  cudaStream_t stream_ = nullptr;
  bool capturing_ = false;
  int count_ = 0;
  int gathers_ = 0;
  Status status_;
};

// The backend with phase marks around its calls: decode is attention; merge and rescale are merge.
class TimedBackend final : public Backend {
 public:
  TimedBackend(std::unique_ptr<Backend> inner, PhaseRecorder* rec) : inner_(std::move(inner)), rec_(rec) {}
  const BackendCapabilities& capabilities() const override { return inner_->capabilities(); }
  size_t workspace_bytes(const MlaDecodeParams& p) const override { return inner_->workspace_bytes(p); }
  Status decode(const MlaDecodeParams& p, const ExecContext& ctx) override {
    rec_->open(kAttention);
    const Status s = inner_->decode(p, ctx);
    rec_->close();
    return s;
  }
  Status merge(const MergeParams& p, const ExecContext& ctx) override {
    rec_->open(kMerge);
    const Status s = inner_->merge(p, ctx);
    rec_->close();
    return s;
  }
  Status rescale(const RescaleParams& p, const ExecContext& ctx) override {
    rec_->open(kMerge);
    const Status s = inner_->rescale(p, ctx);
    rec_->close();
    return s;
  }

 private:
  std::unique_ptr<Backend> inner_;
  PhaseRecorder* rec_;
};

// The communicator with phase marks around its operations.
class TimedCommunicator final : public Communicator {
 public:
  TimedCommunicator(NcclCommunicator* inner, PhaseRecorder* rec) : inner_(inner), rec_(rec) {}
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  Device memory() const override { return inner_->memory(); }
  std::string name() const override { return inner_->name(); }
  Status all_gather(const void* send, void* recv, size_t bytes) override {
    rec_->open(rec_->all_gather_phase());
    const Status s = inner_->all_gather(send, recv, bytes);
    rec_->close();
    return s;
  }
  Status reduce_scatter_sum_f32(const float* send, float* recv, size_t count) override {
    rec_->open(kExchange);
    const Status s = inner_->reduce_scatter_sum_f32(send, recv, count);
    rec_->close();
    return s;
  }
  Status all_to_all(const void* send, void* recv, size_t bytes_per_rank) override {
    rec_->open(kExchange);
    const Status s = inner_->all_to_all(send, recv, bytes_per_rank);
    rec_->close();
    return s;
  }
  Status group_start() override { return inner_->group_start(); }
  Status group_end() override { return inner_->group_end(); }
  Status wait(std::chrono::milliseconds deadline) override { return inner_->wait(deadline); }
  void abort(const std::string& reason) override { inner_->abort(reason); }
  Status health() const override { return inner_->health(); }

 private:
  NcclCommunicator* inner_;
  PhaseRecorder* rec_;
};

std::string describe(const CheckCase& c, int world) {
  std::ostringstream os;
  const synthetic::Config& p = c.problem;
  os << "seed=" << p.seed << " B=" << p.num_seqs << " q_len=" << p.q_len << " H=" << p.num_heads
     << " block=" << p.block_size << " kv=" << dtype_name(p.kv_dtype) << " lens=[";
  for (size_t i = 0; i < p.seq_lens.size(); ++i) os << (i ? ", " : "") << p.seq_lens[i];
  os << "] W=" << world << " I=" << c.interleave << " merge=" << dcp_merge_mode_name(c.merge_mode)
     << " split_policy=" << split_policy_name(c.split_policy) << " out=" << dtype_name(c.out_dtype)
     << (c.graph ? " graph" : " eager") << " backend=" << c.backend;
  return os.str();
}

// Captures `body` (which issues the step on `stream`) into an executable graph.
template <typename Body>
Status capture(cudaStream_t stream, Body&& body, cudaGraphExec_t* exec) {
  DCP_GPU_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const Status s = body();
  cudaGraph_t graph = nullptr;
  const cudaError_t e = cudaStreamEndCapture(stream, &graph);
  if (!s.ok()) {
    if (graph) (void)cudaGraphDestroy(graph);
    return s;
  }
  MLADCP_RETURN_IF_ERROR(cuda_status(e, "cudaStreamEndCapture"));
  const cudaError_t ie = cudaGraphInstantiate(exec, graph, 0);
  (void)cudaGraphDestroy(graph);
  return cuda_status(ie, "cudaGraphInstantiate");
}

struct GraphExecs {
  std::vector<cudaGraphExec_t> execs;
  ~GraphExecs() {
    for (cudaGraphExec_t e : execs)
      if (e) (void)cudaGraphExecDestroy(e);
  }
};

// All ranks learn whether every rank succeeded at a local step (so none is left waiting in a collective).
Status agree_ok(NcclCommunicator& comm, const Status& own, std::chrono::milliseconds deadline, const char* what) {
  std::vector<double> flag{own.ok() ? 0.0 : 1.0};
  MLADCP_RETURN_IF_ERROR(max_over_ranks(comm, &flag, deadline));
  if (!own.ok()) return own;
  if (flag[0] != 0.0)
    return Status(StatusCode::kRemoteError, cat("DCP rank ", comm.rank(), ": another rank failed at ", what));
  return Status::Ok();
}

}  // namespace

// ---------------------------------------------------------------------------------------------

Status barrier(NcclCommunicator& comm, std::chrono::milliseconds deadline) {
  std::vector<double> none{0.0};
  return max_over_ranks(comm, &none, deadline);
}

Status all_gather_over_ranks(NcclCommunicator& comm, const std::vector<double>& mine, std::vector<double>* all,
                             std::chrono::milliseconds deadline) {
  if (!all) return detail::invalid("all: null");
  const size_t n = std::max<size_t>(1, mine.size());
  std::vector<double> send(n, 0.0);
  std::copy(mine.begin(), mine.end(), send.begin());
  DeviceBuffer d_send, d_recv;
  MLADCP_RETURN_IF_ERROR(upload(d_send, send.data(), n * sizeof(double)));
  MLADCP_RETURN_IF_ERROR(d_recv.allocate(size_t(comm.world_size()) * n * sizeof(double)));
  comm.set_wait_for_completion(true);
  MLADCP_RETURN_IF_ERROR(comm.all_gather(d_send.data(), d_recv.data(), n * sizeof(double)));
  MLADCP_RETURN_IF_ERROR(comm.wait(deadline));
  std::vector<double> gathered(size_t(comm.world_size()) * n);
  MLADCP_RETURN_IF_ERROR(download(d_recv, gathered.data(), gathered.size() * sizeof(double)));
  all->clear();
  for (int r = 0; r < comm.world_size(); ++r)
    all->insert(all->end(), gathered.begin() + ptrdiff_t(size_t(r) * n),
                gathered.begin() + ptrdiff_t(size_t(r) * n + mine.size()));
  return Status::Ok();
}

Status max_over_ranks(NcclCommunicator& comm, std::vector<double>* values, std::chrono::milliseconds deadline) {
  if (!values) return detail::invalid("values: null");
  const int W = comm.world_size();
  const size_t n = values->size();
  std::vector<double> all;
  MLADCP_RETURN_IF_ERROR(all_gather_over_ranks(comm, *values, &all, deadline));
  for (size_t i = 0; i < n; ++i) {
    double m = all[i];
    for (int r = 1; r < W; ++r) {
      const double v = all[size_t(r) * n + i];
      m = (std::isnan(m) || std::isnan(v)) ? kNaN : std::max(m, v);
    }
    (*values)[i] = m;
  }
  return Status::Ok();
}

Status run_check(NcclCommunicator& comm, const CheckCase& c, CheckResult* result) {
  if (!result) return detail::invalid("result: null");
  const int W = comm.world_size(), r = comm.rank();
  const int H = c.problem.num_heads;
  if (H < W || H % W != 0)
    return detail::invalid("problem.num_heads=", H, ": must be a multiple of the DCP world size ", W);
  const int Hl = H / W;
  *result = CheckResult{};
  DCP_GPU_CUDA(cudaSetDevice(comm.device()));
  const cudaStream_t stream = static_cast<cudaStream_t>(comm.stream());
  const std::string what = describe(c, W);

  // This rank's shard and the unsharded problem (values depend only on seed and global position).
  synthetic::Config gc = c.problem;
  gc.shard.world = W;
  gc.shard.rank = r;
  gc.shard.interleave = c.interleave;
  synthetic::Problem shard, full;
  MLADCP_RETURN_IF_ERROR(synthetic::make_problem(gc, &shard));
  gc.shard = DcpShard{};
  MLADCP_RETURN_IF_ERROR(synthetic::make_problem(gc, &full));
  const int T = shard.num_tokens();
  result->kv_bytes_rank = shard.kv_bytes_used();

  // Local query: this rank's heads [r·Hl, (r+1)·Hl) of every token.
  std::vector<uint16_t> q_local(size_t(T) * Hl * kQkDim);
  for (int t = 0; t < T; ++t)
    std::memcpy(&q_local[size_t(t) * Hl * kQkDim], &shard.q[(size_t(t) * H + size_t(r) * Hl) * kQkDim],
                size_t(Hl) * kQkDim * sizeof(uint16_t));

  const size_t out_elems = size_t(T) * Hl * kLatentDim;
  std::vector<uint8_t> out_init(out_elems * dtype_size(c.out_dtype));
  test::fill_sentinel(out_init.data(), c.out_dtype, out_elems);
  std::vector<float> lse_init(size_t(T) * Hl);
  test::fill_sentinel(lse_init);

  DeviceBuffer d_kv, d_bt, d_lens, d_q, d_out, d_lse, d_ws;
  MLADCP_RETURN_IF_ERROR(upload(d_kv, shard.kv_cache.data(), shard.kv_cache.size()));
  MLADCP_RETURN_IF_ERROR(upload(d_bt, shard.block_table.data(), shard.block_table.size() * sizeof(int32_t)));
  MLADCP_RETURN_IF_ERROR(upload(d_lens, shard.seq_lens.data(), shard.seq_lens.size() * sizeof(int32_t)));
  MLADCP_RETURN_IF_ERROR(upload(d_q, q_local.data(), q_local.size() * sizeof(uint16_t)));
  MLADCP_RETURN_IF_ERROR(upload(d_out, out_init.data(), out_init.size()));
  if (c.with_lse) MLADCP_RETURN_IF_ERROR(upload(d_lse, lse_init.data(), lse_init.size() * sizeof(float)));

  std::unique_ptr<Backend> backend;
  MLADCP_RETURN_IF_ERROR(create_backend(c.backend, &backend));
  const BackendCapabilities caps = backend->capabilities();
  const LseBase base = caps.lse_base_selectable ? LseBase::kE : caps.native_lse_base;
  DcpConfig config;
  config.merge_mode = c.merge_mode;
  config.interleave = c.interleave;
  config.deadline = c.deadline;
  std::unique_ptr<DcpDecoder> decoder;
  MLADCP_RETURN_IF_ERROR(DcpDecoder::create(std::move(backend), &comm, config, &decoder));

  MlaDecodeParams local = shard.params(d_out.data(), c.out_dtype, c.with_lse ? d_lse.as<float>() : nullptr, base);
  local.num_heads = Hl;
  local.q = d_q.data();
  local.kv_cache = d_kv.data();
  local.block_table = d_bt.as<int32_t>();
  local.seq_lens = d_lens.as<int32_t>();
  local.split_policy = c.split_policy;
  MLADCP_RETURN_IF_ERROR(d_ws.allocate(decoder->workspace_bytes(local)));
  ExecContext ctx;
  ctx.stream = stream;
  ctx.workspace = d_ws.data();
  ctx.workspace_size = d_ws.size();

  const Clock::time_point limit = Clock::now() + c.deadline;
  if (c.graph) {
    if (!caps.cuda_graph_safe)
      return Status::Unsupported(cat("backend '", caps.name, "' does not declare cuda_graph_safe"));
    GraphExecs graphs;
    graphs.execs.resize(1, nullptr);
    comm.set_wait_for_completion(false);
    const Status captured = capture(
        stream, [&] { return decoder->decode(local, ctx); }, &graphs.execs[0]);
    comm.set_wait_for_completion(true);
    MLADCP_RETURN_IF_ERROR(agree_ok(comm, captured, c.deadline, "capturing the DCP step"));
    DCP_GPU_CUDA(cudaGraphLaunch(graphs.execs[0], stream));
    Event done;
    MLADCP_RETURN_IF_ERROR(done.create());
    DCP_GPU_CUDA(cudaEventRecord(done.get(), stream));
    MLADCP_RETURN_IF_ERROR(wait_event(done.get(), comm, limit, "the replayed DCP step"));
  } else {
    comm.set_wait_for_completion(true);
    MLADCP_RETURN_IF_ERROR(decoder->decode(local, ctx));
    Event done;
    MLADCP_RETURN_IF_ERROR(done.create());
    DCP_GPU_CUDA(cudaEventRecord(done.get(), stream));
    MLADCP_RETURN_IF_ERROR(wait_event(done.get(), comm, limit, "the DCP step"));
  }
  std::vector<uint8_t> out_bytes(out_init.size());
  MLADCP_RETURN_IF_ERROR(download(d_out, out_bytes.data(), out_bytes.size()));
  result->out_values = test::to_float(out_bytes.data(), c.out_dtype, out_elems);
  if (c.with_lse) {
    result->lse_values.resize(lse_init.size());
    MLADCP_RETURN_IF_ERROR(download(d_lse, result->lse_values.data(), lse_init.size() * sizeof(float)));
  }

  // Single-GPU decode of the unsharded cache, all heads, fp32 output, on this rank's device.
  std::unique_ptr<Backend> single;
  MLADCP_RETURN_IF_ERROR(create_backend(c.backend, &single));
  DeviceBuffer f_kv, f_bt, f_q, f_out, f_lse, f_ws;
  MLADCP_RETURN_IF_ERROR(upload(f_kv, full.kv_cache.data(), full.kv_cache.size()));
  MLADCP_RETURN_IF_ERROR(upload(f_bt, full.block_table.data(), full.block_table.size() * sizeof(int32_t)));
  MLADCP_RETURN_IF_ERROR(upload(f_q, full.q.data(), full.q.size() * sizeof(uint16_t)));
  MLADCP_RETURN_IF_ERROR(f_out.allocate(size_t(T) * H * kLatentDim * sizeof(float)));
  MLADCP_RETURN_IF_ERROR(f_lse.allocate(size_t(T) * H * sizeof(float)));
  MlaDecodeParams ref = full.params(f_out.data(), DType::kFP32, f_lse.as<float>(), base);
  ref.q = f_q.data();
  ref.kv_cache = f_kv.data();
  ref.block_table = f_bt.as<int32_t>();
  ref.seq_lens = d_lens.as<int32_t>();
  MLADCP_RETURN_IF_ERROR(f_ws.allocate(single->workspace_bytes(ref)));
  ExecContext rctx;
  rctx.stream = stream;
  rctx.workspace = f_ws.data();
  rctx.workspace_size = f_ws.size();
  MLADCP_RETURN_IF_ERROR(single->decode(ref, rctx));
  DCP_GPU_CUDA(cudaStreamSynchronize(stream));
  std::vector<float> ref_out(size_t(T) * H * kLatentDim), ref_lse(size_t(T) * H);
  MLADCP_RETURN_IF_ERROR(download(f_out, ref_out.data(), ref_out.size() * sizeof(float)));
  MLADCP_RETURN_IF_ERROR(download(f_lse, ref_lse.data(), ref_lse.size() * sizeof(float)));

  // This rank's heads of the reference.
  std::vector<float> want_out(out_elems), want_lse(size_t(T) * Hl);
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < Hl; ++j) {
      const size_t h = size_t(r) * Hl + j;
      std::memcpy(&want_out[(size_t(t) * Hl + j) * kLatentDim], &ref_out[(size_t(t) * H + h) * kLatentDim],
                  kLatentDim * sizeof(float));
      want_lse[size_t(t) * Hl + j] = ref_lse[size_t(t) * H + h];
    }
  result->out =
      test::compare(result->out_values, want_out, test::device_pair_tolerance(c.out_dtype),
                    cat("out (", dtype_name(c.out_dtype), ", rank ", r, " heads ", r * Hl, "..", (r + 1) * Hl - 1, ")"),
                    {T, Hl, kLatentDim});
  result->ok = result->out.ok;
  std::string report = cat(what, "\n  ", result->out.report);
  if (c.with_lse) {
    result->lse = test::compare(result->lse_values, want_lse, test::lse_tolerance(),
                                cat("lse (base ", lse_base_name(base), ")"), {T, Hl});
    result->ok = result->ok && result->lse.ok;
    report += "\n  " + result->lse.report;
  }
  result->report = report;
  return Status::Ok();
}

Status run_timing(NcclCommunicator& comm, const TimingCase& c, TimingResult* result) {
  if (!result) return detail::invalid("result: null");
  const int W = comm.world_size(), r = comm.rank();
  if (c.num_heads < W || c.num_heads % W != 0)
    return detail::invalid("num_heads=", c.num_heads, ": must be a multiple of the DCP world size ", W);
  if (c.num_seqs < 1) return detail::invalid("num_seqs=", c.num_seqs, ": must be >= 1");
  if (c.q_len < 1 || c.q_len > kMaxQLen) return detail::invalid("q_len=", c.q_len, ": must be in [1, ", kMaxQLen, "]");
  if (c.context < c.q_len) return detail::invalid("context=", c.context, ": must be >= q_len");
  MLADCP_RETURN_IF_ERROR(validate_shard(DcpShard{W, r, c.interleave}, c.block_size));
  if (c.samples < 1 || c.warmup < 0 || c.graph_batch < 1)
    return detail::invalid("samples/warmup/graph_batch: need samples >= 1, warmup >= 0, graph_batch >= 1");
  *result = TimingResult{};
  DCP_GPU_CUDA(cudaSetDevice(comm.device()));
  const cudaStream_t stream = static_cast<cudaStream_t>(comm.stream());
  const int Hl = c.num_heads / W;
  const int B = c.num_seqs, T = B * c.q_len;
  const size_t esize = dtype_size(c.kv_dtype);
  const size_t token_bytes = size_t(kQkDim) * esize;

  // Paged cache: every rank's table has rank 0's width (the widest); blocks in a random order.
  const int64_t local = sharding::local_len(c.context, W, r, c.interleave);
  const int64_t widest = sharding::local_len(c.context, W, 0, c.interleave);
  const int bps = int(std::max<int64_t>(1, (widest + c.block_size - 1) / c.block_size));
  const size_t copy_bytes = size_t(B) * bps * c.block_size * token_bytes;
  const int copies = int(std::clamp<size_t>((c.rotation_bytes + copy_bytes - 1) / copy_bytes, 1, 16));
  const size_t num_blocks = size_t(copies) * B * bps;
  if (num_blocks > size_t(std::numeric_limits<int32_t>::max()))
    return detail::invalid("context=", c.context, ": too many cache blocks for int32 block ids");
  result->kv_bytes_rank = size_t(B) * size_t(local) * token_bytes;
  result->kv_bytes_allocated = num_blocks * c.block_size * token_bytes;
  result->rotation_copies = copies;

  DeviceBuffer d_kv, d_bt, d_lens, d_q, d_out, d_ws;
  MLADCP_RETURN_IF_ERROR(d_kv.allocate(result->kv_bytes_allocated));
  {
    // Random values: a 64 MiB tile uploaded once and replicated on the device.
    const size_t total = d_kv.size();
    const size_t tile = std::min(total, size_t(64) << 20) / esize * esize;
    const std::vector<uint8_t> host = random_values(tile / esize, c.kv_dtype, c.seed * 7919 + size_t(r));
    DCP_GPU_CUDA(cudaMemcpy(d_kv.data(), host.data(), tile, cudaMemcpyHostToDevice));
    for (size_t off = tile; off < total; off += tile)
      DCP_GPU_CUDA(
          cudaMemcpy(d_kv.as<uint8_t>() + off, d_kv.data(), std::min(tile, total - off), cudaMemcpyDeviceToDevice));
  }
  std::vector<int32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::mt19937_64 shuffle(c.seed * 31 + size_t(r));
  std::shuffle(ids.begin(), ids.end(), shuffle);
  MLADCP_RETURN_IF_ERROR(upload(d_bt, ids.data(), ids.size() * sizeof(int32_t)));
  const std::vector<int32_t> lens(B, c.context);
  MLADCP_RETURN_IF_ERROR(upload(d_lens, lens.data(), lens.size() * sizeof(int32_t)));
  const std::vector<uint8_t> q = random_values(size_t(T) * Hl * kQkDim, DType::kBF16, c.seed * 104729 + size_t(r));
  MLADCP_RETURN_IF_ERROR(upload(d_q, q.data(), q.size()));
  MLADCP_RETURN_IF_ERROR(d_out.allocate(size_t(T) * Hl * kLatentDim * sizeof(uint16_t)));

  PhaseRecorder rec;
  MLADCP_RETURN_IF_ERROR(rec.init());
  std::unique_ptr<Backend> inner;
  MLADCP_RETURN_IF_ERROR(create_backend(c.backend, &inner));
  const bool graph_safe = inner->capabilities().cuda_graph_safe;
  TimedCommunicator timed_comm(&comm, &rec);
  DcpConfig config;
  config.merge_mode = c.merge_mode;
  config.interleave = c.interleave;
  config.deadline = c.deadline;
  std::unique_ptr<DcpDecoder> decoder;
  MLADCP_RETURN_IF_ERROR(
      DcpDecoder::create(std::make_unique<TimedBackend>(std::move(inner), &rec), &timed_comm, config, &decoder));

  std::vector<MlaDecodeParams> params(copies);
  for (int k = 0; k < copies; ++k) {
    MlaDecodeParams& p = params[k];
    p.num_seqs = B;
    p.q_len = c.q_len;
    p.num_heads = Hl;
    p.q = d_q.data();
    p.q_dtype = DType::kBF16;
    p.kv_cache = d_kv.data();
    p.kv_dtype = c.kv_dtype;
    p.kv_scale = 1.0f;
    p.num_blocks = int(num_blocks);
    p.block_size = c.block_size;
    p.block_table = d_bt.as<int32_t>() + size_t(k) * B * bps;
    p.max_blocks_per_seq = bps;
    p.seq_lens = d_lens.as<int32_t>();
    p.max_seq_len = c.context;
    p.softmax_scale = 0.07216878364870322f;  // 1/sqrt(192)
    p.out = d_out.data();
    p.out_dtype = DType::kBF16;
    p.split_policy = c.split_policy;
  }
  MLADCP_RETURN_IF_ERROR(d_ws.allocate(decoder->workspace_bytes(params[0])));
  ExecContext ctx;
  ctx.stream = stream;
  ctx.workspace = d_ws.data();
  ctx.workspace_size = d_ws.size();

  Event start, stop;
  MLADCP_RETURN_IF_ERROR(start.create());
  MLADCP_RETURN_IF_ERROR(stop.create());
  auto limit = [&] { return Clock::now() + c.deadline; };

  struct Samples {
    std::vector<double> step;
    std::array<std::vector<double>, kNumPhases> phase;
  };
  auto summarize = [](const Samples& s, PhaseTimes* out) {
    out->step_us = median(s.step);
    out->q_gather_us = median(s.phase[kQueryGather]);
    out->attention_us = median(s.phase[kAttention]);
    out->exchange_us = median(s.phase[kExchange]);
    out->merge_us = median(s.phase[kMerge]);
    out->samples = int(s.step.size());
    out->measured = true;
  };
  int rotation = 0;

  // Eager: one step between two events after a barrier (both ranks start together).
  for (const bool sync : {true, false}) {
    if (!(sync ? c.eager_sync : c.eager)) continue;
    for (int i = 0; i < c.warmup; ++i) {
      comm.set_wait_for_completion(sync);
      rec.begin_step(stream, false);
      MLADCP_RETURN_IF_ERROR(decoder->decode(params[rotation++ % copies], ctx));
    }
    Samples s;
    for (int i = 0; i < c.samples; ++i) {
      MLADCP_RETURN_IF_ERROR(barrier(comm, c.deadline));
      comm.set_wait_for_completion(sync);
      rec.begin_step(stream, false);
      DCP_GPU_CUDA(cudaEventRecord(start.get(), stream));
      MLADCP_RETURN_IF_ERROR(decoder->decode(params[rotation++ % copies], ctx));
      DCP_GPU_CUDA(cudaEventRecord(stop.get(), stream));
      MLADCP_RETURN_IF_ERROR(wait_event(stop.get(), comm, limit(), "an eager DCP step"));
      float ms = 0;
      DCP_GPU_CUDA(cudaEventElapsedTime(&ms, start.get(), stop.get()));
      s.step.push_back(1000.0 * ms);
      std::array<double, kNumPhases> us{};
      MLADCP_RETURN_IF_ERROR(rec.collect(&us));
      for (int p = 0; p < kNumPhases; ++p) s.phase[p].push_back(us[p]);
    }
    summarize(s, sync ? &result->eager_sync : &result->eager);
  }
  comm.set_wait_for_completion(true);

  // CUDA graph: the whole step (query all-gather, decode, exchange, merge) captured once per cache
  // copy; a sample replays graph_batch steps back to back between two events.
  if (c.graph) {
    Status captured =
        graph_safe ? Status::Ok() : Status::Unsupported(cat("backend '", c.backend, "' is not cuda_graph_safe"));
    GraphExecs graphs;
    graphs.execs.assign(copies, nullptr);
    comm.set_wait_for_completion(false);
    for (int k = 0; k < copies && captured.ok(); ++k) {
      captured = capture(
          stream,
          [&] {
            rec.begin_step(stream, true);
            return decoder->decode(params[k], ctx);
          },
          &graphs.execs[k]);
    }
    comm.set_wait_for_completion(true);
    const Status agreed = agree_ok(comm, captured, c.deadline, "capturing the DCP step");
    if (!agreed.ok()) {
      if (!comm.health().ok()) return agreed;
      result->note += cat("graph mode skipped: ", agreed.to_string(), "; ");
    } else {
      for (int i = 0; i < std::max(c.warmup, copies); ++i)
        DCP_GPU_CUDA(cudaGraphLaunch(graphs.execs[rotation++ % copies], stream));
      Samples s;
      bool phases_ok = true;
      std::string phase_error;
      for (int i = 0; i < c.samples; ++i) {
        MLADCP_RETURN_IF_ERROR(barrier(comm, c.deadline));
        DCP_GPU_CUDA(cudaEventRecord(start.get(), stream));
        for (int k = 0; k < c.graph_batch; ++k)
          DCP_GPU_CUDA(cudaGraphLaunch(graphs.execs[rotation++ % copies], stream));
        DCP_GPU_CUDA(cudaEventRecord(stop.get(), stream));
        MLADCP_RETURN_IF_ERROR(wait_event(stop.get(), comm, limit(), "graph replays of the DCP step"));
        float ms = 0;
        DCP_GPU_CUDA(cudaEventElapsedTime(&ms, start.get(), stop.get()));
        s.step.push_back(1000.0 * ms / c.graph_batch);
        std::array<double, kNumPhases> us{};
        const Status ps = rec.collect(&us);
        if (!ps.ok()) {
          phases_ok = false;
          phase_error = ps.to_string();
          us.fill(kNaN);
        }
        for (int p = 0; p < kNumPhases; ++p) s.phase[p].push_back(us[p]);
      }
      summarize(s, &result->graph);
      if (!phases_ok) result->note += cat("graph phase events unreadable (", phase_error, "); ");
    }
  }
  DCP_GPU_CUDA(cudaStreamSynchronize(stream));
  return Status::Ok();
}

std::vector<double> to_vector(const TimingResult& r) {
  std::vector<double> v;
  for (const PhaseTimes* p : {&r.eager_sync, &r.eager, &r.graph}) {
    if (!p->measured) {
      v.insert(v.end(), 5, kNaN);
      continue;
    }
    v.insert(v.end(), {p->step_us, p->q_gather_us, p->attention_us, p->exchange_us, p->merge_us});
  }
  v.push_back(double(r.kv_bytes_rank));
  v.push_back(double(r.kv_bytes_allocated));
  return v;
}

void from_vector(const std::vector<double>& v, TimingResult* r) {
  size_t i = 0;
  for (PhaseTimes* p : {&r->eager_sync, &r->eager, &r->graph}) {
    if (i + 5 > v.size()) return;
    p->step_us = v[i];
    p->q_gather_us = v[i + 1];
    p->attention_us = v[i + 2];
    p->exchange_us = v[i + 3];
    p->merge_us = v[i + 4];
    i += 5;
  }
  if (i + 2 <= v.size()) {
    r->kv_bytes_rank = size_t(v[i]);
    r->kv_bytes_allocated = size_t(v[i + 1]);
  }
}

}  // namespace mladcp::dcp_gpu
