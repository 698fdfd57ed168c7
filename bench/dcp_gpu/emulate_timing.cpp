#include "emulate_timing.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "mladcp/device_memory.h"

namespace mladcp::emulate {
namespace {

constexpr int kBlock = 64;
constexpr int kLatent = 576, kOut = 512;

enum Slot { kQ, kTable, kLens, kOutBuf, kWorkspace, kMergeOut, kLse, kSlots };

Status cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  return Status(StatusCode::kCudaError, std::string(what) + ": " + cudaGetErrorString(e));
}

uint16_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// Random bytes for a device range: bf16 values of N(0, 1) (fp8 pools take the same bytes: every byte
// pattern but 0x7f/0xff of e4m3 is finite, and those are rare enough for timing).
const std::vector<uint16_t>& random_chunk() {
  static const std::vector<uint16_t> chunk = [] {
    std::vector<uint16_t> v(size_t(8) << 20);  // 16 MB
    std::mt19937 rng(1234);
    std::normal_distribution<float> n(0.f, 1.f);
    for (uint16_t& x : v) x = bf16_bits(n(rng));
    return v;
  }();
  return chunk;
}

Status fill_random(void* dst, size_t bytes, void* stream) {
  const auto& c = random_chunk();
  const size_t chunk = c.size() * 2;
  for (size_t off = 0; off < bytes; off += chunk) {
    MLADCP_RETURN_IF_ERROR(
        copy_host_to_device(static_cast<char*>(dst) + off, c.data(), std::min(chunk, bytes - off), stream));
  }
  return stream_synchronize(stream);
}

}  // namespace

Bench::~Bench() {
  for (auto& [p, n] : buffers_) (void)device_free(p);
  (void)device_free(pool_);
  (void)device_free(flush_);
  if (stream_) (void)stream_destroy(stream_);
}

Status Bench::create(double pool_gb, const TimingOptions& options, std::unique_ptr<Bench>* out) {
  std::unique_ptr<Bench> b(new Bench());
  b->options_ = options;
  int dev = 0;
  MLADCP_RETURN_IF_ERROR(device_get(&dev));
  MLADCP_RETURN_IF_ERROR(device_info(dev, &b->info_));
  MLADCP_RETURN_IF_ERROR(create_backend("cuda", &b->backend_));
  MLADCP_RETURN_IF_ERROR(stream_create(&b->stream_));
  b->pool_bytes_ = size_t(pool_gb * 1e9) / (kBlock * kLatent * 2) * (kBlock * kLatent * 2);
  MLADCP_RETURN_IF_ERROR(device_alloc(&b->pool_, b->pool_bytes_));
  MLADCP_RETURN_IF_ERROR(fill_random(b->pool_, b->pool_bytes_, b->stream_));
  b->flush_bytes_ = std::max<size_t>(size_t(2) * b->info_.l2_bytes, size_t(128) << 20);
  MLADCP_RETURN_IF_ERROR(device_alloc(&b->flush_, b->flush_bytes_));
  b->buffers_.assign(kSlots, {nullptr, 0});
  *out = std::move(b);
  return Status::Ok();
}

Status Bench::buffer(size_t bytes, int slot, void** ptr) {
  auto& [p, n] = buffers_[slot];
  if (n < bytes) {
    MLADCP_RETURN_IF_ERROR(device_free(p));
    p = nullptr, n = 0;
    MLADCP_RETURN_IF_ERROR(device_alloc(&p, bytes));
    n = bytes;
  }
  *ptr = p;
  return Status::Ok();
}

template <typename Enqueue>
Status Bench::time(Enqueue enqueue, Timing* t) {
  const auto s = static_cast<cudaStream_t>(stream_);
  // Once directly: arguments are checked here, and lazy set-up is out of the timed calls.
  MLADCP_RETURN_IF_ERROR(enqueue());
  MLADCP_RETURN_IF_ERROR(stream_synchronize(stream_));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  if (cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess) {
    const Status st = enqueue();
    const cudaError_t e = cudaStreamEndCapture(s, &graph);
    if (!st.ok() || e != cudaSuccess || cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) exec = nullptr;
  }
  (void)cudaGetLastError();
  const auto launch = [&]() -> Status {
    return exec != nullptr ? cuda(cudaGraphLaunch(exec, s), "cudaGraphLaunch") : enqueue();
  };
  const int n = std::max(1, options_.samples);
  std::vector<cudaEvent_t> ev(2 * n);
  Status st;
  for (auto& e : ev) {
    if (st.ok()) st = cuda(cudaEventCreate(&e), "cudaEventCreate");
  }
  for (int i = 0; st.ok() && i < options_.warmup; ++i) st = launch();
  // A head start for the host: with the GPU busy on these, every event and launch below is queued before the
  // GPU reaches it, so the events time the device work only.
  for (int i = 0; st.ok() && i < 16; ++i) st = device_memset(flush_, 0, flush_bytes_, stream_);
  std::vector<double> us;
  for (int i = 0; st.ok() && i < n; ++i) {
    st = device_memset(flush_, i & 0xff, flush_bytes_, stream_);
    if (st.ok()) st = cuda(cudaEventRecord(ev[2 * i], s), "cudaEventRecord");
    if (st.ok()) st = launch();
    if (st.ok()) st = cuda(cudaEventRecord(ev[2 * i + 1], s), "cudaEventRecord");
  }
  if (st.ok()) st = cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  for (int i = 0; st.ok() && i < n; ++i) {
    float ms = 0;
    st = cuda(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]), "cudaEventElapsedTime");
    us.push_back(1000.0 * ms);
  }
  for (auto& e : ev) {
    if (e) cudaEventDestroy(e);
  }
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  MLADCP_RETURN_IF_ERROR(st);
  std::sort(us.begin(), us.end());
  t->median_us = us[us.size() / 2];
  t->min_us = us.front();
  t->graph = exec != nullptr;
  return Status::Ok();
}

Status Bench::time_decode(const DecodeShape& s, Timing* decode, int merge_states, Timing* merge) {
  if (s.groups < 1 || s.heads % s.groups != 0) return Status::InvalidArgument("groups must divide heads");
  const int hg = s.heads / s.groups;
  const int64_t t = s.batch * s.q_len;
  const int64_t local = sharding::local_len(s.context, s.world, 0, 1);
  const int max_blocks = int(std::max<int64_t>(1, (local + kBlock - 1) / kBlock));
  const size_t elem = dtype_size(s.kv_dtype);
  const int num_blocks = int(pool_bytes_ / (size_t(kBlock) * kLatent * elem));

  MlaDecodeParams p;
  p.num_seqs = int(s.batch);
  p.q_len = s.q_len;
  p.num_heads = s.heads;
  p.head_group_size = s.groups > 1 ? hg : 0;
  void *q = nullptr, *table = nullptr, *lens = nullptr, *out = nullptr, *lse = nullptr, *ws = nullptr;
  MLADCP_RETURN_IF_ERROR(buffer(size_t(t) * s.heads * kLatent * 2, kQ, &q));
  MLADCP_RETURN_IF_ERROR(fill_random(q, size_t(t) * s.heads * kLatent * 2, stream_));
  p.q = q;
  p.kv_cache = pool_;
  p.kv_dtype = s.kv_dtype;
  p.kv_scale = s.kv_dtype == DType::kFP8E4M3 ? 0.125f : 1.0f;
  p.num_blocks = num_blocks;
  p.block_size = kBlock;
  {
    std::vector<int32_t> ids(size_t(s.batch) * max_blocks);
    std::mt19937 rng(uint32_t(s.batch * 131 + s.context + s.heads));
    std::uniform_int_distribution<int32_t> pick(0, num_blocks - 1);
    for (int32_t& id : ids) id = pick(rng);
    MLADCP_RETURN_IF_ERROR(buffer(ids.size() * 4, kTable, &table));
    MLADCP_RETURN_IF_ERROR(copy_host_to_device(table, ids.data(), ids.size() * 4));
    const std::vector<int32_t> l(size_t(s.batch), int32_t(s.context));
    MLADCP_RETURN_IF_ERROR(buffer(l.size() * 4, kLens, &lens));
    MLADCP_RETURN_IF_ERROR(copy_host_to_device(lens, l.data(), l.size() * 4));
  }
  p.block_table = static_cast<const int32_t*>(table);
  p.max_blocks_per_seq = max_blocks;
  p.seq_lens = static_cast<const int32_t*>(lens);
  p.max_seq_len = int(s.context);
  p.softmax_scale = 1.0f / std::sqrt(192.0f);
  // A DCP rank writes fp32 partial states in the A2A layout: per head group [T, Hg, 512] then its LSE.
  const int64_t group_floats = t * hg * kOut + t * hg;
  if (s.groups > 1) {
    MLADCP_RETURN_IF_ERROR(buffer(size_t(s.groups) * group_floats * 4, kOutBuf, &out));
    p.out = out;
    p.out_dtype = DType::kFP32;
    p.out_stride_group = group_floats;
    p.lse = static_cast<float*>(out) + t * hg * kOut;
    p.lse_stride_group = group_floats;
  } else {
    MLADCP_RETURN_IF_ERROR(buffer(size_t(t) * s.heads * kOut * 2, kOutBuf, &out));
    MLADCP_RETURN_IF_ERROR(buffer(size_t(t) * s.heads * 4, kLse, &lse));
    p.out = out;
    p.out_dtype = DType::kBF16;
    p.lse = static_cast<float*>(lse);
  }
  p.shard = {s.world, 0, 1};
  p.check_block_ids = false;
  p.split_policy = options_.split_policy;
  const size_t ws_bytes = backend_->workspace_bytes(p);
  MLADCP_RETURN_IF_ERROR(buffer(std::max<size_t>(ws_bytes, 256), kWorkspace, &ws));
  const ExecContext ctx{stream_, ws, ws_bytes, 0};
  MLADCP_RETURN_IF_ERROR(time([&] { return backend_->decode(p, ctx); }, decode));

  if (merge_states > 0 && merge != nullptr) {
    if (s.groups != merge_states) return Status::InvalidArgument("merge_states must equal the head groups");
    void* mout = nullptr;
    MLADCP_RETURN_IF_ERROR(buffer(size_t(t) * hg * kOut * 2, kMergeOut, &mout));
    MergeParams m;
    m.num_states = merge_states;
    m.num_tokens = int(t);
    m.num_heads = hg;
    m.head_dim = kOut;
    m.in_out = out;
    m.in_dtype = DType::kFP32;
    m.in_stride_state = group_floats;
    m.in_lse = static_cast<const float*>(p.lse);
    m.lse_stride_state = group_floats;
    m.out = mout;
    m.out_dtype = DType::kBF16;
    const ExecContext mctx{stream_, nullptr, 0, 0};
    MLADCP_RETURN_IF_ERROR(time([&] { return backend_->merge(m, mctx); }, merge));
  }
  return Status::Ok();
}

Status Bench::time_rescale_merge(int states, int64_t tokens, int heads, Timing* t) {
  // As the step does it: the W·T·Hg rows as one token of W·T·Hg heads, then one state of this rank's heads.
  const int64_t rows = int64_t(states) * tokens * heads;
  void *part = nullptr, *all_lse = nullptr, *mout = nullptr;
  MLADCP_RETURN_IF_ERROR(buffer(size_t(rows) * kOut * 4, kOutBuf, &part));
  MLADCP_RETURN_IF_ERROR(fill_random(part, size_t(rows) * kOut * 4, stream_));
  MLADCP_RETURN_IF_ERROR(buffer(size_t(states) * rows * 4 + size_t(rows) * 4, kLse, &all_lse));
  MLADCP_RETURN_IF_ERROR(device_memset(all_lse, 0, size_t(states) * rows * 4 + size_t(rows) * 4));
  MLADCP_RETURN_IF_ERROR(buffer(size_t(tokens) * heads * kOut * 2, kMergeOut, &mout));
  float* merged_lse = static_cast<float*>(all_lse) + size_t(states) * rows;
  RescaleParams r;
  r.world = states;
  r.rank = 0;
  r.rows = rows;
  r.head_dim = kOut;
  r.all_lse = static_cast<const float*>(all_lse);
  r.out = part;
  r.out_dtype = DType::kFP32;
  r.merged_lse = merged_lse;
  MergeParams m;
  m.num_states = 1;
  m.num_tokens = int(tokens);
  m.num_heads = heads;
  m.head_dim = kOut;
  m.in_out = part;
  m.in_dtype = DType::kFP32;
  m.in_lse = merged_lse;
  m.out = mout;
  m.out_dtype = DType::kBF16;
  const ExecContext ctx{stream_, nullptr, 0, 0};
  return time(
      [&]() -> Status {
        MLADCP_RETURN_IF_ERROR(backend_->rescale(r, ctx));
        return backend_->merge(m, ctx);
      },
      t);
}

}  // namespace mladcp::emulate
