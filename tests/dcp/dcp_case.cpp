#include "dcp/dcp_case.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <list>
#include <sstream>

#include "common/decode_check.h"
#include "core/lse_math.h"
#include "mladcp/device_memory.h"

namespace mladcp::test {

std::string default_backend() {
  const char* env = std::getenv("MLADCP_DCP_TEST_BACKEND");
  return env && *env ? env : "cpu";
}

std::string describe(const DcpCase& c, int world) {
  std::ostringstream os;
  os << "DCP W=" << world << " I=" << c.interleave << " mode=" << dcp_merge_mode_name(c.mode) << " seed=" << c.seed
     << " H/W=" << c.local_heads << " q_len=" << c.q_len << " block=" << c.block_size
     << " kv=" << dtype_name(c.kv_dtype);
  if (c.kv_dtype == DType::kFP8E4M3) os << "(scale " << c.kv_scale << ")";
  os << " out=" << dtype_name(c.out_dtype)
     << (c.want_lse ? std::string(" lse base ") + lse_base_name(c.lse_base) : " no lse")
     << (c.strided_io ? " strided" : " contiguous") << (c.pad ? " pad=" + std::to_string(c.pad) : "")
     << " backend=" << c.backend << " lens=[";
  for (size_t i = 0; i < c.seq_lens.size(); ++i) os << (i ? ", " : "") << c.seq_lens[i];
  os << "]";
  return os.str();
}

namespace {

// The global problem of a case (H = local_heads · world heads); `shard` picks what this rank holds.
synthetic::Config problem_config(const DcpCase& c, int world, DcpShard shard) {
  synthetic::Config cfg;
  cfg.num_seqs = int(c.seq_lens.size());
  cfg.q_len = c.q_len;
  cfg.num_heads = c.local_heads * world;
  cfg.block_size = c.block_size;
  cfg.seq_lens = c.seq_lens;
  cfg.kv_dtype = c.kv_dtype;
  cfg.kv_scale = c.kv_scale;
  cfg.shard = shard;
  cfg.seed = c.seed;
  return cfg;
}

// Host vectors mirrored in device memory when the backend runs on a device; on the host, the vectors
// themselves. ptr() is what the backend reads or writes; download() brings device results back.
class Mirror {
 public:
  explicit Mirror(bool device) : device_(device) {}
  template <typename T>
  T* put(std::vector<T>& v) {
    if (!device_ || v.empty()) return v.data();
    bufs_.emplace_back();
    if (!bufs_.back().allocate(v.size() * sizeof(T)).ok() ||
        !copy_host_to_device(bufs_.back().data(), v.data(), v.size() * sizeof(T)).ok())
      status_ = Status::Internal("device allocation or upload failed");
    pairs_.push_back({v.data(), bufs_.back().data(), v.size() * sizeof(T)});
    return static_cast<T*>(bufs_.back().data());
  }
  // Copies every device buffer back into its host vector.
  Status download() {
    if (!device_) return Status::Ok();
    MLADCP_RETURN_IF_ERROR(device_synchronize());
    for (const Pair& p : pairs_) MLADCP_RETURN_IF_ERROR(copy_device_to_host(p.host, p.dev, p.bytes));
    return Status::Ok();
  }
  const Status& status() const { return status_; }

 private:
  struct Pair {
    void* host;
    const void* dev;
    size_t bytes;
  };
  bool device_;
  std::list<DeviceBuffer> bufs_;
  std::vector<Pair> pairs_;
  Status status_;
};

}  // namespace

DcpRun run_dcp(Communicator& comm, const DcpCase& c) {
  DcpRun run;
  const int W = comm.world_size(), r = comm.rank(), Hl = c.local_heads, H = Hl * W;
  const synthetic::Problem shard = make_problem(problem_config(c, W, DcpShard{W, r, c.interleave}));
  const int T = shard.num_tokens();

  std::unique_ptr<DcpDecoder> dcp;
  DcpConfig cfg;
  cfg.merge_mode = c.mode;
  cfg.interleave = c.interleave;
  cfg.deadline = c.deadline;
  run.status = DcpDecoder::create(c.step_backend ? c.step_backend() : make_backend(c.backend), &comm, cfg, &dcp);
  if (!run.status.ok()) return run;

  // Output buffers: this rank's heads alone, or its slice of an all-heads buffer (strided); every
  // token row padded by c.pad elements.
  const int out_heads = c.strided_io ? H : Hl;
  const int head0 = c.strided_io ? r * Hl : 0;
  const int64_t out_row = int64_t(out_heads) * kLatentDim + c.pad, lse_row = out_heads + c.pad;
  const size_t esize = dtype_size(c.out_dtype);
  std::vector<uint8_t> out(size_t(T) * size_t(out_row) * esize);
  std::vector<float> lse(size_t(T) * size_t(lse_row));
  fill_sentinel(out.data(), c.out_dtype, out.size() / esize);
  fill_sentinel(lse);

  // q: read in place from the [T, H, 576] tensor (strided), or this rank's heads copied out.
  const int q_heads = c.strided_io ? H : Hl;
  const int64_t q_row = int64_t(q_heads) * kQkDim + c.pad;
  std::vector<uint16_t> q(size_t(T) * size_t(q_row));
  for (int t = 0; t < T; ++t)
    std::memcpy(q.data() + size_t(t) * size_t(q_row),
                shard.q.data() + (size_t(t) * H + (c.strided_io ? 0 : size_t(r) * Hl)) * kQkDim,
                size_t(q_heads) * kQkDim * 2);
  std::vector<uint8_t> kv = shard.kv_cache;
  std::vector<int32_t> block_table = shard.block_table, seq_lens = shard.seq_lens;

  const bool device = dcp->attention().backend().capabilities().device != Device::kHost;
  Mirror mirror(device);
  uint8_t* d_out = mirror.put(out);
  float* d_lse = mirror.put(lse);
  MlaDecodeParams p = shard.params(d_out + size_t(head0) * kLatentDim * esize, c.out_dtype,
                                   c.want_lse ? d_lse + head0 : nullptr, c.lse_base);
  p.num_heads = Hl;
  p.q = mirror.put(q) + (c.strided_io ? size_t(r) * Hl * kQkDim : 0);
  p.kv_cache = mirror.put(kv);
  p.block_table = mirror.put(block_table);
  p.seq_lens = mirror.put(seq_lens);
  p.max_seq_len = std::max(1, p.max_seq_len);  // a bound device backends size their grids from
  if (c.strided_io || c.pad) {
    p.q_stride_token = q_row;
    p.out_stride_token = out_row;
    p.lse_stride_token = lse_row;
  }
  // Workspace full of NaN bytes: the step must not read anything it did not write.
  std::vector<uint8_t> workspace(dcp->workspace_bytes(p), 0xff);
  ExecContext ctx;
  ctx.workspace = mirror.put(workspace);
  ctx.workspace_size = workspace.size();
  if (!mirror.status().ok()) {
    run.status = mirror.status();
    return run;
  }
  run.status = dcp->decode(p, ctx, &run.times);
  if (Status s = mirror.download(); !s.ok() && run.status.ok()) run.status = s;

  // This rank's results, contiguous; and proof that no other head's slot (nor the padding) was touched.
  run.out.resize(size_t(T) * Hl * kLatentDim * esize);
  run.lse.resize(size_t(T) * Hl);
  size_t foreign_writes = 0;
  for (int t = 0; t < T; ++t) {
    for (int h = 0; h < out_heads; ++h) {
      const size_t src = (size_t(t) * size_t(out_row) + size_t(h) * kLatentDim) * esize;
      const size_t lsrc = size_t(t) * size_t(lse_row) + size_t(h);
      const bool own = h >= head0 && h < head0 + Hl;
      if (own) {
        std::memcpy(run.out.data() + (size_t(t) * Hl + size_t(h - head0)) * kLatentDim * esize, out.data() + src,
                    kLatentDim * esize);
        run.lse[size_t(t) * Hl + size_t(h - head0)] = lse[lsrc];
      } else {
        foreign_writes += kLatentDim - count_sentinels(out.data() + src, c.out_dtype, kLatentDim);
        foreign_writes += 1 - count_sentinels(&lse[lsrc], DType::kFP32, 1);
      }
    }
    const size_t pad_at = (size_t(t) * size_t(out_row) + size_t(out_heads) * kLatentDim) * esize;
    foreign_writes += size_t(c.pad) - count_sentinels(out.data() + pad_at, c.out_dtype, size_t(c.pad));
    foreign_writes += size_t(c.pad) - count_sentinels(&lse[size_t(t) * size_t(lse_row) + size_t(out_heads)],
                                                      DType::kFP32, size_t(c.pad));
  }
  run.untouched = count_sentinels(out.data(), c.out_dtype, out.size() / esize) == out.size() / esize &&
                  count_sentinels(lse) == lse.size();
  if (foreign_writes && run.status.ok())
    run.status = Status::Internal(std::to_string(foreign_writes) + " elements written outside this rank's heads");
  return run;
}

::testing::AssertionResult dcp_matches_single_rank(Communicator& comm, const DcpCase& c, DcpRun* run_out) {
  const int W = comm.world_size(), r = comm.rank(), Hl = c.local_heads, H = Hl * W;
  const std::string what = describe(c, W) + " rank " + std::to_string(r);
  DcpRun run = run_dcp(comm, c);
  if (!run.status.ok()) return ::testing::AssertionFailure() << what << ": " << run.status.to_string();

  // Single-rank decode of the unsharded problem, this rank's heads only (q read in place).
  const synthetic::Problem full = make_problem(problem_config(c, W, DcpShard{1, 0, c.interleave}));
  auto backend = make_backend(c.backend);
  const LseBase native = backend->capabilities().native_lse_base;
  const LseBase ref_base = backend->capabilities().lse_base_selectable ? c.lse_base : native;
  const int T = full.num_tokens();
  DecodeBuffers want(T, Hl, DType::kFP32, ref_base);
  const bool device = backend->capabilities().device != Device::kHost;
  Mirror mirror(device);
  std::vector<uint16_t> q = full.q;
  std::vector<uint8_t> kv = full.kv_cache;
  std::vector<int32_t> block_table = full.block_table, seq_lens = full.seq_lens;
  MlaDecodeParams p =
      full.params(mirror.put(want.out), DType::kFP32, want.lse ? mirror.put(*want.lse) : nullptr, ref_base);
  p.num_heads = Hl;
  p.q = mirror.put(q) + size_t(r) * Hl * kQkDim;
  p.q_stride_token = int64_t(H) * kQkDim;
  p.kv_cache = mirror.put(kv);
  p.block_table = mirror.put(block_table);
  p.seq_lens = mirror.put(seq_lens);
  p.max_seq_len = std::max(1, p.max_seq_len);
  std::vector<uint8_t> ws(backend->workspace_bytes(p));
  ExecContext ctx;
  ctx.workspace = mirror.put(ws);
  ctx.workspace_size = ws.size();
  Status s = mirror.status();
  if (s.ok()) s = backend->decode(p, ctx);
  if (s.ok()) s = mirror.download();
  if (!s.ok()) return ::testing::AssertionFailure() << what << ": single-rank decode failed: " << s.to_string();
  for (float& l : *want.lse) l = lse::convert(l, ref_base, c.lse_base);

  DecodeBuffers got(T, Hl, c.out_dtype, c.want_lse ? std::optional<LseBase>(c.lse_base) : std::nullopt);
  got.out = run.out;
  if (c.want_lse)
    *got.lse = run.lse;
  else
    want.lse.reset();
  if (!c.want_lse && count_sentinels(run.lse) != run.lse.size())
    return ::testing::AssertionFailure() << what << ": LSE written although none was asked for";
  if (run_out) *run_out = std::move(run);
  // A device backend is compared with itself on the unsharded cache: both round their own results.
  return compare_decode(got, want, what,
                        device ? std::optional<Tolerance>(device_pair_tolerance(c.out_dtype)) : std::nullopt);
}

std::vector<DcpCase> sweep_cases(int world, bool quick) {
  std::vector<DcpCase> cases;
  int k = 0;
  for (int I : {1, 2, 64}) {
    if (quick && I == 2) continue;
    // Every length 0..W·I+1 for small I (each empty-shard pattern); around each run boundary for I = 64.
    std::vector<int32_t> lens;
    if (I <= 2) {
      for (int L = 0; L <= world * I + 1; ++L) lens.push_back(L);
    } else {
      for (int j = 0; j <= world; ++j)
        for (int d : {-1, 0, 1})
          if (j * I + d >= 0) lens.push_back(j * I + d);
      lens.push_back(2);
    }
    for (int q_len : {1, 2, 4}) {
      if (quick && q_len == 2) continue;
      std::vector<int32_t> valid;
      for (int32_t L : lens)
        if (L == 0 || L >= q_len) valid.push_back(L);
      for (DcpMergeMode mode : {DcpMergeMode::kAllToAll, DcpMergeMode::kAllGatherReduceScatter}) {
        DcpCase c;
        c.interleave = I;
        c.block_size = I == 64 ? 64 : 16;
        c.q_len = q_len;
        c.seq_lens = valid;
        c.mode = mode;
        c.local_heads = 1 + k % 3;
        c.kv_dtype = k % 3 == 2 ? DType::kFP8E4M3 : DType::kBF16;
        c.kv_scale = c.kv_dtype == DType::kFP8E4M3 ? 0.25f + 0.01f * float(k) : 1.0f;
        c.out_dtype = k % 2 ? DType::kFP32 : DType::kBF16;
        c.want_lse = k % 5 != 4;
        c.lse_base = k % 4 == 3 ? LseBase::k2 : LseBase::kE;
        c.strided_io = k % 2 == 0;
        c.seed = 1000 + uint64_t(world) * 100 + uint64_t(k);
        cases.push_back(c);
        ++k;
      }
    }
  }
  // Long context: one 4096-token sequence next to a short one.
  for (int I : {1, 64}) {
    for (DcpMergeMode mode : {DcpMergeMode::kAllToAll, DcpMergeMode::kAllGatherReduceScatter}) {
      if (quick && mode == DcpMergeMode::kAllGatherReduceScatter && I == 1) continue;
      DcpCase c;
      c.interleave = I;
      c.block_size = 64;
      c.q_len = I == 1 ? 2 : 1;
      c.seq_lens = {4096, 3 * world * I + 5};
      c.mode = mode;
      c.local_heads = 2;
      c.kv_dtype = mode == DcpMergeMode::kAllToAll && I == 64 ? DType::kFP8E4M3 : DType::kBF16;
      c.kv_scale = c.kv_dtype == DType::kFP8E4M3 ? 0.5f : 1.0f;
      c.out_dtype = DType::kBF16;
      c.strided_io = I == 64;
      c.seed = 5000 + uint64_t(world) * 10 + uint64_t(k++);
      cases.push_back(c);
    }
  }
  return cases;
}

}  // namespace mladcp::test
