// The DCP decode step (see include/mladcp/dcp.h). Only Communicator operations and Backend
// decode / merge / rescale touch data; everything here is host-side bookkeeping: validation, the
// workspace layout and the strides that make the exchanges copy-free.
#include <algorithm>
#include <cstring>
#include <string>

#include "core/validate.h"
#include "mladcp/dcp.h"
#include "mladcp/kv_cache.h"

namespace mladcp {

using detail::cat;
using detail::invalid;
using Clock = std::chrono::steady_clock;

const char* dcp_merge_mode_name(DcpMergeMode m) {
  switch (m) {
    case DcpMergeMode::kAllToAll:
      return "a2a";
    case DcpMergeMode::kAllGatherReduceScatter:
      return "ag-rs";
  }
  return "?";
}

std::optional<DcpMergeMode> parse_dcp_merge_mode(std::string_view s) {
  if (s == "a2a" || s == "all-to-all" || s == "alltoall") return DcpMergeMode::kAllToAll;
  if (s == "ag-rs" || s == "agrs" || s == "ag_rs") return DcpMergeMode::kAllGatherReduceScatter;
  return std::nullopt;
}

namespace {

constexpr size_t kAlign = 256;
size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }
constexpr int64_t kGroupAlignFloats = int64_t(kAlign / sizeof(float));
int64_t align_floats(int64_t n) { return (n + kGroupAlignFloats - 1) / kGroupAlignFloats * kGroupAlignFloats; }

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

std::chrono::milliseconds remaining(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return std::max(left, std::chrono::milliseconds(0));
}

// FNV-1a over the bytes of a few values: the fingerprint of the arguments every rank must share.
struct Fingerprint {
  uint64_t h = 1469598103934665603ull;
  template <typename T>
  void add(const T& v) {
    unsigned char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    for (unsigned char c : b) h = (h ^ c) * 1099511628211ull;
  }
};

// The arguments every rank of a step must share, in the order of the agreement round.
constexpr int kSharedArgs = 11;
constexpr const char* kSharedArgNames[kSharedArgs] = {
    "num_seqs",  "q_len",      "num_heads",     "q_dtype",  "q bytes per rank (q_len, heads, strides)",
    "kv_dtype",  "block_size", "softmax_scale", "seq_lens", "merge_mode",
    "interleave"};

std::string describe_shared_arg(int i, int64_t v) {
  switch (i) {
    case 3:
    case 5:
      return dtype_name(DType(v));
    case 7: {
      const int32_t bits = int32_t(v);
      float f;
      std::memcpy(&f, &bits, sizeof f);
      return cat(f);
    }
    case 8:
      return cat("hash ", uint64_t(v));
    case 9:
      return dcp_merge_mode_name(DcpMergeMode(v));
    default:
      return cat(v);
  }
}

}  // namespace

// Where every buffer of one step lives, in elements and bytes, derived from the local params only.
struct DcpDecoder::Layout {
  int world = 1, rank = 0;
  int64_t T = 0;   // tokens (num_seqs · q_len)
  int64_t Hl = 0;  // local heads
  int64_t q_stride_token = 0, q_stride_head = 0;
  int64_t q_send_elems = 0;  // one rank's query as sent: (T-1)·st + (Hl-1)·sh + 576 elements
  size_t q_send_bytes = 0;
  // a2a: one packed state [T, Hl, 512] + [T, Hl] fp32, padded to kGroupAlignFloats so that every
  // group starts on a 256-byte boundary (device kernels need 16-byte aligned rows and group strides
  // that are multiples of 8 elements, whatever T · Hl is).
  int64_t group_floats = 0;
  // Byte offsets into the workspace.
  size_t q_all = 0;       // [W, q_send_elems] gathered query
  size_t a2a_send = 0;    // [W, group_floats]
  size_t a2a_recv = 0;    // [W, group_floats]
  size_t partial = 0;     // ag-rs: [W, T, Hl, 512] fp32 partial outputs (all heads)
  size_t part_lse = 0;    // ag-rs: [W, T, Hl] fp32
  size_t all_lse = 0;     // ag-rs: [W ranks, W·T·Hl] fp32
  size_t merged_lse = 0;  // ag-rs: [W·T·Hl] fp32
  size_t reduced = 0;     // ag-rs: [T, Hl, 512] fp32, this rank's heads after the reduce-scatter
  size_t backend_ws = 0;
  size_t backend_ws_bytes = 0;
  size_t total = 0;
  MlaDecodeParams decode;  // the local decode over all H heads, pointers relative to workspace base 0
};

DcpDecoder::DcpDecoder(std::unique_ptr<MlaAttention> a, Communicator* c, const DcpConfig& cfg)
    : attention_(std::move(a)),
      comm_(c),
      config_(cfg),
      agree_send_(new int64_t[kAgreeSlots]),
      agree_recv_(new int64_t[kAgreeSlots * size_t(c->world_size())]) {}

Status DcpDecoder::create(std::unique_ptr<MlaAttention> attention, Communicator* comm, const DcpConfig& config,
                          std::unique_ptr<DcpDecoder>* out) {
  if (!out) return invalid("out: null");
  if (!attention) return invalid("attention: null");
  if (!comm) return invalid("comm: null (pass the group's Communicator)");
  const DcpShard& s = attention->shard();
  const BackendCapabilities& caps = attention->backend().capabilities();
  if (s.world != comm->world_size())
    return invalid("attention shard.world=", s.world, ": must equal the communicator's world size ",
                   comm->world_size());
  if (s.rank != comm->rank())
    return invalid("attention shard.rank=", s.rank, ": must equal the communicator's rank ", comm->rank());
  if (config.interleave != 0 && s.interleave != config.interleave)
    return invalid("config.interleave=", config.interleave, ": must be 0 (the attention's) or equal the attention's ",
                   "shard.interleave=", s.interleave);
  if (config.deadline.count() <= 0) return invalid("config.deadline=", config.deadline.count(), " ms: must be > 0");
  if (config.merge_mode != DcpMergeMode::kAllToAll && config.merge_mode != DcpMergeMode::kAllGatherReduceScatter)
    return invalid("config.merge_mode: accepted a2a, ag-rs");
  if (comm->memory() != caps.device)
    return Status::Unsupported(cat("communicator '", comm->name(), "' moves ",
                                   comm->memory() == Device::kHost ? "host" : "device", " memory but backend '",
                                   caps.name, "' runs on ", caps.device == Device::kHost ? "the host" : "a device",
                                   "; pair host backends with host communicators (MPI) and device backends with "
                                   "device communicators (NCCL)"));
  if (s.world > 1 && !attention->need_to_return_lse_for_decode())
    return Status::Unsupported(
        cat("backend '", caps.name, "' cannot return the LSE for decode; DCP with world ", s.world, " needs it"));
  if (s.world > 1 && !detail::contains(caps.out_dtypes, DType::kFP32))
    return Status::Unsupported(cat("backend '", caps.name, "' cannot write fp32 outputs (accepts ",
                                   detail::join_dtypes(caps.out_dtypes), "); DCP exchanges fp32 partial states"));
  MLADCP_RETURN_IF_ERROR(comm->health());
  DcpConfig derived = config;
  derived.interleave = s.interleave;
  out->reset(new DcpDecoder(std::move(attention), comm, derived));
  return Status::Ok();
}

Status DcpDecoder::create(std::unique_ptr<Backend> backend, Communicator* comm, const DcpConfig& config,
                          std::unique_ptr<DcpDecoder>* out) {
  if (!comm) return invalid("comm: null (pass the group's Communicator)");
  DcpShard shard;
  shard.world = comm->world_size();
  shard.rank = comm->rank();
  shard.interleave = config.interleave ? config.interleave : 1;
  std::unique_ptr<MlaAttention> attention;
  MLADCP_RETURN_IF_ERROR(MlaAttention::create(std::move(backend), shard, &attention));
  return create(std::move(attention), comm, config, out);
}

DcpDecoder::Layout DcpDecoder::layout(const MlaDecodeParams& local) const {
  Layout l;
  l.world = world();
  l.rank = rank();
  l.T = std::max<int64_t>(0, int64_t(local.num_seqs) * local.q_len);
  l.Hl = std::max(0, local.num_heads);
  l.q_stride_head = local.q_stride_head ? local.q_stride_head : kQkDim;
  l.q_stride_token = local.q_stride_token ? local.q_stride_token : l.Hl * l.q_stride_head;
  l.q_send_elems = (l.T > 0 && l.Hl > 0) ? (l.T - 1) * l.q_stride_token + (l.Hl - 1) * l.q_stride_head + kQkDim : 0;
  l.q_send_bytes = size_t(l.q_send_elems) * dtype_size(local.q_dtype);
  l.group_floats = align_floats(l.T * l.Hl * (kLatentDim + 1));

  const int64_t W = l.world, T = l.T, Hl = l.Hl;
  MlaDecodeParams& d = l.decode;
  d = local;
  d.shard = attention_->shard();
  if (W == 1) {  // no exchange: decode straight into the caller's buffers
    size_t off = 0;
    l.backend_ws = off;
    l.backend_ws_bytes = attention_->backend().workspace_bytes(d);
    l.total = align_up(l.backend_ws_bytes);
    return l;
  }
  d.num_heads = int(W * Hl);
  d.head_group_size = int(Hl);
  d.q_stride_token = l.q_stride_token;
  d.q_stride_head = l.q_stride_head;
  d.q_stride_group = l.q_send_elems;
  d.out_dtype = DType::kFP32;
  d.out_stride_head = kLatentDim;
  d.out_stride_token = Hl * kLatentDim;
  d.lse_stride_token = Hl;
  d.lse_base = attention_->lse_base();

  size_t off = 0;
  auto take = [&off](size_t bytes) {
    const size_t at = off;
    off += align_up(bytes);
    return at;
  };
  l.q_all = take(size_t(W) * l.q_send_bytes);
  if (config_.merge_mode == DcpMergeMode::kAllToAll) {
    l.a2a_send = take(size_t(W * l.group_floats) * 4);
    l.a2a_recv = take(size_t(W * l.group_floats) * 4);
    d.out_stride_group = l.group_floats;
    d.lse_stride_group = l.group_floats;
  } else {
    l.partial = take(size_t(W * T * Hl * kLatentDim) * 4);
    l.part_lse = take(size_t(W * T * Hl) * 4);
    l.all_lse = take(size_t(W * W * T * Hl) * 4);
    l.merged_lse = take(size_t(W * T * Hl) * 4);
    l.reduced = take(size_t(T * Hl * kLatentDim) * 4);
    d.out_stride_group = T * Hl * kLatentDim;
    d.lse_stride_group = T * Hl;
  }
  // The backend's scratch depends on shapes only, so ask with the pointers still unset.
  d.q = nullptr;
  d.out = nullptr;
  d.lse = nullptr;
  l.backend_ws_bytes = attention_->backend().workspace_bytes(d);
  l.backend_ws = take(l.backend_ws_bytes);
  l.total = off;
  return l;
}

size_t DcpDecoder::workspace_bytes(const MlaDecodeParams& local) const { return layout(local).total; }

// Every check that can fail, done before any data moves. Shared arguments fail identically on every
// rank; rank-local ones (pointers, this rank's block table, workspace) are then agreed on.
Status DcpDecoder::check_arguments(const MlaDecodeParams& local, const ExecContext& ctx, const Layout& l) const {
  const BackendCapabilities& caps = attention_->backend().capabilities();
  const int W = l.world;
  if (local.num_seqs < 0) return invalid("num_seqs=", local.num_seqs, ": must be >= 0");
  MLADCP_RETURN_IF_ERROR(detail::check_shard_matches(local.shard, attention_->shard()));
  if (local.num_heads < 1)
    return invalid("num_heads=", local.num_heads, ": must be >= 1 (this rank's H/W local query heads)");
  if (int64_t(local.num_heads) * W > caps.max_heads)
    return invalid("num_heads=", local.num_heads, ": ", local.num_heads, " local heads x world ", W, " = ",
                   int64_t(local.num_heads) * W, " heads per decode, backend '", caps.name, "' accepts up to ",
                   caps.max_heads);
  if (local.head_group_size != 0 && local.head_group_size != local.num_heads)
    return invalid("head_group_size=", local.head_group_size,
                   ": the local query is one group of num_heads heads (use 0); DCP forms the groups itself");
  if (local.out_dtype != DType::kBF16 && local.out_dtype != DType::kFP16 && local.out_dtype != DType::kFP32)
    return invalid("out_dtype=", dtype_name(local.out_dtype), ": DCP writes bf16, fp16 or fp32");
  if (!detail::valid_lse_base(local.lse_base))
    return invalid("lse_base=", int(local.lse_base), ": ", detail::kAcceptedLseBases);
  if (W > 1) {
    if (local.out_stride_head && local.out_stride_head < kLatentDim)
      return invalid("out_stride_head=", local.out_stride_head, ": must be >= 512");
    const int64_t osh = local.out_stride_head ? local.out_stride_head : kLatentDim;
    if (local.out_stride_token && local.out_stride_token < osh * local.num_heads)
      return invalid("out_stride_token=", local.out_stride_token, ": must be >= num_heads * out_stride_head");
    if (local.lse_stride_token && local.lse_stride_token < local.num_heads)
      return invalid("lse_stride_token=", local.lse_stride_token, ": must be >= num_heads");
  }
  if (local.num_seqs == 0) return Status::Ok();
  // The local decode over all heads: shapes, dtypes, block size vs interleave, null pointers. Its
  // query and outputs are workspace buffers; a placeholder stands in for them here.
  MlaDecodeParams d = l.decode;
  if (W > 1) {
    static float placeholder;
    if (!local.q) return invalid("q: null pointer (expected [T, H/W, 576])");
    if (!local.out) return invalid("out: null pointer (expected [T, H/W, 512])");
    d.q = &placeholder;
    d.out = &placeholder;
    d.lse = &placeholder;
  }
  MLADCP_RETURN_IF_ERROR(validate_decode(d, caps));
  if (ctx.workspace_size < l.total || (l.total > 0 && !ctx.workspace))
    return invalid("ctx.workspace: ", ctx.workspace ? "" : "null, ", ctx.workspace_size, " bytes given, ", l.total,
                   " needed (DcpDecoder::workspace_bytes)");
  if (caps.device == Device::kHost) MLADCP_RETURN_IF_ERROR(check_host_indices(d));
  return Status::Ok();
}

Status DcpDecoder::agree(const Status& own, const int64_t* shared, Clock::time_point deadline) {
  static_assert(kAgreeSlots == 1 + kSharedArgs);
  const int W = world();
  agree_send_[0] = int64_t(own.code());
  for (int i = 0; i < kSharedArgs; ++i) agree_send_[1 + i] = shared[i];
  MLADCP_RETURN_IF_ERROR(comm_->all_gather(agree_send_.get(), agree_recv_.get(), kAgreeSlots * sizeof(int64_t)));
  const Status waited = comm_->wait(remaining(deadline));
  if (!waited.ok()) {
    if (!own.ok())
      return Status(own.code(), own.message() + " (and the agreement round failed: " + waited.to_string() + ")");
    return waited;
  }
  if (!own.ok()) return own;
  for (int r = 0; r < W; ++r) {
    const auto code = StatusCode(agree_recv_[kAgreeSlots * r]);
    if (code != StatusCode::kOk)
      return Status(StatusCode::kRemoteError,
                    cat("DCP rank ", r, " of ", W, " rejected its decode arguments (", status_code_name(code),
                        "; its own error names the argument); no rank computed anything"));
  }
  // Name every shared argument that differs, with each rank's value.
  std::string differ;
  for (int i = 0; i < kSharedArgs; ++i) {
    bool same = true;
    for (int r = 1; r < W; ++r) same = same && agree_recv_[kAgreeSlots * r + 1 + i] == agree_recv_[1 + i];
    if (same) continue;
    std::string values;
    for (int r = 0; r < W; ++r) {
      if (r) values += ", ";
      values += cat("rank ", r, ": ", describe_shared_arg(i, agree_recv_[kAgreeSlots * r + 1 + i]));
    }
    if (!differ.empty()) differ += "; ";
    differ += cat(kSharedArgNames[i], " (", values, ")");
  }
  if (!differ.empty())
    return invalid("DCP ranks disagree on arguments every rank must share: ", differ, "; no rank computed anything");
  return Status::Ok();
}

Status DcpDecoder::decode(const MlaDecodeParams& local, const ExecContext& ctx, DcpStepTimes* times) {
  const Clock::time_point t0 = Clock::now();
  const Clock::time_point deadline = t0 + config_.deadline;
  if (times) *times = DcpStepTimes{};
  MLADCP_RETURN_IF_ERROR(comm_->health());
  const Layout l = layout(local);
  const int W = l.world;
  Backend& backend = attention_->backend();
  const bool host = backend.capabilities().device == Device::kHost;

  Status own = check_arguments(local, ctx, l);
  if (W > 1 && config_.agree_on_validation && comm_->memory() == Device::kHost) {
    Fingerprint lens;  // the seq_lens contents (readable on the host only)
    if (own.ok() && host && local.seq_lens)
      for (int b = 0; b < local.num_seqs; ++b) lens.add(local.seq_lens[b]);
    int32_t scale_bits = 0;
    std::memcpy(&scale_bits, &local.softmax_scale, sizeof scale_bits);
    const int64_t shared[kSharedArgs] = {
        local.num_seqs,          local.q_len,      local.num_heads, int64_t(local.q_dtype), int64_t(l.q_send_bytes),
        int64_t(local.kv_dtype), local.block_size, scale_bits,      int64_t(lens.h),        int64_t(config_.merge_mode),
        config_.interleave};
    MLADCP_RETURN_IF_ERROR(agree(own, shared, deadline));
  } else {
    MLADCP_RETURN_IF_ERROR(own);
  }
  const Clock::time_point t_valid = Clock::now();
  if (times) times->validate_ms = ms_between(t0, t_valid);
  if (local.num_seqs == 0) {
    if (times) times->total_ms = ms_between(t0, Clock::now());
    return Status::Ok();
  }

  uint8_t* ws = static_cast<uint8_t*>(ctx.workspace);
  ExecContext dctx = ctx;
  dctx.workspace = l.backend_ws_bytes ? ws + l.backend_ws : nullptr;
  dctx.workspace_size = l.backend_ws_bytes;

  if (W == 1) {  // a single rank: a plain decode with the caller's buffers
    const Status s = attention_->decode(l.decode, dctx);
    if (times) {
      times->attention_ms = ms_between(t_valid, Clock::now());
      times->total_ms = ms_between(t0, Clock::now());
    }
    return s;
  }

  // Past this point every rank runs the same sequence of collectives. A failure leaves the group
  // out of step, so it aborts the communicator (peers then fail within their deadline).
  auto fail = [this](Status s, const char* phase) {
    s = Status(s.code(), cat("DCP ", phase, " on rank ", rank(), ": ", s.message()));
    comm_->abort(s.message());
    return s;
  };

  // 1. Query all-gather: rank r's heads land as head group r.
  MlaDecodeParams d = l.decode;
  d.q = ws + l.q_all;
  if (Status s = comm_->all_gather(local.q, ws + l.q_all, l.q_send_bytes); !s.ok()) return fail(s, "query all-gather");
  if (Status s = comm_->wait(remaining(deadline)); !s.ok()) return fail(s, "query all-gather");
  const Clock::time_point t_gather = Clock::now();

  const int64_t T = l.T, Hl = l.Hl;
  const LseBase base = attention_->lse_base();
  const size_t out_elems = size_t(T * Hl * kLatentDim);

  // The final merge: its output is the caller's, its inputs are set per mode below.
  MergeParams m;
  m.num_tokens = int(T);
  m.num_heads = int(Hl);
  m.head_dim = kLatentDim;
  m.in_dtype = DType::kFP32;
  m.in_stride_token = Hl * kLatentDim;
  m.in_stride_head = kLatentDim;
  m.lse_stride_token = Hl;
  m.in_base = base;
  m.out = local.out;
  m.out_dtype = local.out_dtype;
  m.out_stride_token = local.out_stride_token;
  m.out_stride_head = local.out_stride_head;
  m.out_lse = local.lse;
  m.out_lse_stride_token = local.lse_stride_token;
  m.out_base = local.lse_base;

  // Phase clock: lap() returns the milliseconds since the previous lap.
  Clock::time_point last = t_gather;
  auto lap = [&last] {
    const Clock::time_point now = Clock::now();
    const double ms = ms_between(last, now);
    last = now;
    return ms;
  };
  double attention_ms = 0, exchange_ms = 0, merge_ms = 0;
  if (config_.merge_mode == DcpMergeMode::kAllToAll) {
    // 2. Decode into the send buffer: group g (rank g's heads) = [out T·Hl·512 | lse T·Hl].
    float* send = reinterpret_cast<float*>(ws + l.a2a_send);
    float* recv = reinterpret_cast<float*>(ws + l.a2a_recv);
    d.out = send;
    d.lse = send + out_elems;
    if (Status s = attention_->decode(d, dctx); !s.ok()) return fail(s, "local decode");
    attention_ms = lap();
    // 3. One exchange: chunk g goes to rank g; recv holds the W states of this rank's heads.
    if (Status s = comm_->all_to_all(send, recv, size_t(l.group_floats) * 4); !s.ok()) return fail(s, "all-to-all");
    if (Status s = comm_->wait(remaining(deadline)); !s.ok()) return fail(s, "all-to-all");
    exchange_ms = lap();
    // 4. Combine the W states in rank order (deterministic).
    m.num_states = W;
    m.in_out = recv;
    m.in_stride_state = l.group_floats;
    m.in_lse = recv + out_elems;
    m.lse_stride_state = l.group_floats;
    if (Status s = backend.merge(m, ctx); !s.ok()) return fail(s, "merge");
    merge_ms = lap();
  } else {
    float* partial = reinterpret_cast<float*>(ws + l.partial);
    float* part_lse = reinterpret_cast<float*>(ws + l.part_lse);
    float* all_lse = reinterpret_cast<float*>(ws + l.all_lse);
    float* merged_lse = reinterpret_cast<float*>(ws + l.merged_lse);
    float* reduced = reinterpret_cast<float*>(ws + l.reduced);
    // 2. Decode all heads: partial [W, T, Hl, 512], part_lse [W, T, Hl].
    d.out = partial;
    d.lse = part_lse;
    if (Status s = attention_->decode(d, dctx); !s.ok()) return fail(s, "local decode");
    attention_ms = lap();
    const size_t rows = size_t(W * T * Hl);
    // 3a. Every rank's LSE of every head: all_lse [W ranks, W·T·Hl].
    if (Status s = comm_->all_gather(part_lse, all_lse, rows * 4); !s.ok()) return fail(s, "LSE all-gather");
    if (Status s = comm_->wait(remaining(deadline)); !s.ok()) return fail(s, "LSE all-gather");
    exchange_ms += lap();
    // 3b. Scale this rank's partial outputs by b^(lse_rank - lse_global): W·T·Hl independent rows.
    RescaleParams r;
    r.world = W;
    r.rank = rank();
    r.rows = int64_t(rows);
    r.head_dim = kLatentDim;
    r.all_lse = all_lse;
    r.base = base;
    r.out = partial;
    r.out_dtype = DType::kFP32;
    r.merged_lse = merged_lse;
    if (Status s = backend.rescale(r, ctx); !s.ok()) return fail(s, "rescale");
    merge_ms += lap();
    // 3c. Sum over ranks; rank r keeps head group r.
    if (Status s = comm_->reduce_scatter_sum_f32(partial, reduced, out_elems); !s.ok())
      return fail(s, "reduce-scatter");
    if (Status s = comm_->wait(remaining(deadline)); !s.ok()) return fail(s, "reduce-scatter");
    exchange_ms += lap();
    // 4. One state of weight exactly 1 (0 where every shard was empty): converts to the caller's
    // dtype and strides, and picks this rank's merged LSE.
    m.num_states = 1;
    m.in_out = reduced;
    m.in_lse = merged_lse + size_t(rank()) * T * Hl;
    if (Status s = backend.merge(m, ctx); !s.ok()) return fail(s, "merge");
    merge_ms += lap();
  }
  if (times) {
    times->q_gather_ms = ms_between(t_valid, t_gather);
    times->attention_ms = attention_ms;
    times->exchange_ms = exchange_ms;
    times->merge_ms = merge_ms;
    times->total_ms = ms_between(t0, Clock::now());
  }
  return Status::Ok();
}

}  // namespace mladcp
