// "cpu": the fast host backend. Plans the call as independent chunks (sequence × up to 128 query rows
// × a range of keys), runs them on the thread pool with the best kernel for this machine, then merges
// the chunks of each row with the LSE primitive and writes the output in its dtype and layout.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <vector>

#include "core/lse_math.h"
#include "core/numeric.h"
#include "cpu/cpu_backends.h"
#include "cpu/cpu_internal.h"
#include "cpu/kernel.h"
#include "cpu/thread_pool.h"
#include "mladcp/backend.h"
#include "mladcp/cpu.h"
#include "mladcp/sharding.h"

namespace mladcp {
namespace cpu {
namespace {

// A group of query rows of one sequence, and the chunks its keys were split into.
struct RowGroup {
  int seq = 0;
  int row_begin = 0, row_end = 0;
  int64_t keys = 0;  // keys visible to the group's last row (the most any of its rows sees)
  int first_chunk = 0, num_chunks = 0;
};

struct Chunk {
  int group = 0;
  int64_t key_begin = 0, key_end = 0;
  size_t out_offset = 0;  // floats into the partial-output buffer; the group's LSEs follow its outputs
};

// Grows on demand and is reused across calls (64-byte aligned views).
class FloatArena {
 public:
  float* get(size_t floats) {
    if (buf_.size() < floats + 16) buf_.resize(floats + 16);
    auto addr = reinterpret_cast<uintptr_t>(buf_.data());
    return buf_.data() + ((64 - addr % 64) % 64) / sizeof(float);
  }

 private:
  std::vector<float> buf_;
};

inline size_t round_up16(size_t n) { return (n + 15) & ~size_t(15); }

class CpuBackend final : public Backend {
 public:
  CpuBackend(const KernelVariant& kernel, const PlanOptions& plan) : kernel_(kernel), plan_(plan) {
    caps_ = host_backend_capabilities("cpu", std::string("host: multi-threaded, ") + isa_name(kernel.isa) +
                                                 " kernel, fp32 online softmax, split-KV merged by LSE");
  }

  const BackendCapabilities& capabilities() const override { return caps_; }

  Status decode(const MlaDecodeParams& in, const ExecContext& ctx) override {
    MLADCP_RETURN_IF_ERROR(validate_decode(in, caps_));
    MLADCP_RETURN_IF_ERROR(check_host_indices(in));
    const MlaDecodeParams p = with_default_strides(in);
    if (p.num_seqs == 0) return Status::Ok();

    // Causal rule in global coordinates, per query token: keys visible on this shard.
    const int Q = p.q_len, H = p.num_heads, rows_per_seq = Q * H;
    std::vector<int64_t> visible(size_t(p.num_seqs) * Q);
    for (int s = 0; s < p.num_seqs; ++s)
      for (int i = 0; i < Q; ++i)
        visible[size_t(s) * Q + i] = sharding::visible_local_keys(p.seq_lens[s], Q, i, p.shard);

    // Row groups of up to kMaxChunkRows rows, balanced in size.
    std::vector<RowGroup> groups;
    const int groups_per_seq = (rows_per_seq + kMaxChunkRows - 1) / kMaxChunkRows;
    int64_t total_keys = 0;
    for (int s = 0; s < p.num_seqs; ++s) {
      for (int g = 0; g < groups_per_seq; ++g) {
        RowGroup rg;
        rg.seq = s;
        rg.row_begin = int(int64_t(rows_per_seq) * g / groups_per_seq);
        rg.row_end = int(int64_t(rows_per_seq) * (g + 1) / groups_per_seq);
        rg.keys = visible[size_t(s) * Q + (rg.row_end - 1) / H];
        total_keys += rg.keys;
        groups.push_back(rg);
      }
    }

    // Split keys into chunks of a whole number of tiles; the size depends only on the inputs, so the
    // result is the same whatever the thread count.
    const int target = plan_.target_items > 0 ? plan_.target_items : std::max(8, 4 * ThreadPool::instance().size());
    int64_t chunk_keys = (total_keys + target - 1) / target;
    chunk_keys = std::clamp<int64_t>(chunk_keys, plan_.min_chunk_keys, plan_.max_chunk_keys);
    chunk_keys = std::max<int64_t>(kTileKeys, (chunk_keys + kTileKeys - 1) / kTileKeys * kTileKeys);
    std::vector<Chunk> chunks;
    size_t floats = 0;
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      RowGroup& rg = groups[gi];
      const int64_t n = (rg.keys + chunk_keys - 1) / chunk_keys;
      rg.first_chunk = int(chunks.size());
      rg.num_chunks = int(n);
      const int64_t per = n > 0 ? ((rg.keys + n - 1) / n + kTileKeys - 1) / kTileKeys * kTileKeys : 0;
      for (int64_t c = 0; c < n; ++c) {
        Chunk ch;
        ch.group = int(gi);
        ch.key_begin = std::min(rg.keys, c * per);
        ch.key_end = std::min(rg.keys, (c + 1) * per);
        if (ch.key_begin >= ch.key_end) {
          --rg.num_chunks;
          continue;
        }
        ch.out_offset = floats;
        floats += round_up16(size_t(rg.row_end - rg.row_begin) * (kLatentDim + 1));
        chunks.push_back(ch);
      }
    }

    ThreadPool& pool = ThreadPool::instance();
    const int threads = ctx.num_threads > 0 ? std::min(ctx.num_threads, pool.size()) : pool.size();
    const size_t per_thread = round_up16(kernel_.scratch_floats);

    std::unique_lock<std::mutex> lock(arena_mu_, std::try_to_lock);
    FloatArena local;  // a concurrent call on this object gets its own memory
    FloatArena& arena = lock.owns_lock() ? arena_ : local;
    float* mem = arena.get(per_thread * threads + floats);
    float* scratch = mem;
    float* partial = mem + per_thread * threads;

    const float score_scale = p.softmax_scale * p.kv_scale * lse::kLog2e;
    pool.parallel_for(int(chunks.size()), threads, [&](int c, int slot) {
      const Chunk& ch = chunks[size_t(c)];
      const RowGroup& rg = groups[size_t(ch.group)];
      ChunkArgs a;
      a.p = &p;
      a.seq = rg.seq;
      a.row_begin = rg.row_begin;
      a.row_end = rg.row_end;
      a.key_begin = ch.key_begin;
      a.key_end = ch.key_end;
      a.visible = &visible[size_t(rg.seq) * Q];
      a.score_scale = score_scale;
      a.value_scale = p.kv_scale;
      a.out = partial + ch.out_offset;
      a.lse2 = a.out + size_t(rg.row_end - rg.row_begin) * kLatentDim;
      kernel_.run(a, scratch + per_thread * size_t(slot));
    });

    pool.parallel_for(int(groups.size()), threads, [&](int g, int) { combine(p, groups[size_t(g)], chunks, partial); });
    return Status::Ok();
  }

  Status merge(const MergeParams& p, const ExecContext& ctx) override {
    (void)ctx;
    return merge_states_host(p);
  }

  Status rescale(const RescaleParams& p, const ExecContext& ctx) override {
    (void)ctx;
    return rescale_states_host(p);
  }

 private:
  // Merges the chunks of each row of a group (base 2, the kernel's) and writes out and lse.
  static void combine(const MlaDecodeParams& p, const RowGroup& rg, const std::vector<Chunk>& chunks,
                      const float* partial) {
    const int H = p.num_heads, R = rg.row_end - rg.row_begin;
    float acc[kLatentDim];
    for (int r = 0; r < R; ++r) {
      const int row = rg.row_begin + r;
      const int64_t t = int64_t(rg.seq) * p.q_len + row / H;
      const int h = row % H;
      lse::Combiner comb(LseBase::k2);
      auto chunk_lse = [&](int c) {
        const float* base = partial + chunks[size_t(rg.first_chunk + c)].out_offset;
        return base[size_t(R) * kLatentDim + r];
      };
      for (int c = 0; c < rg.num_chunks; ++c) comb.observe_max(chunk_lse(c));
      for (int c = 0; c < rg.num_chunks; ++c) comb.accumulate(chunk_lse(c));
      std::fill(acc, acc + kLatentDim, 0.0f);
      for (int c = 0; c < rg.num_chunks; ++c) {
        const float w = comb.weight(chunk_lse(c));
        if (w == 0.0f) continue;
        const float* o = partial + chunks[size_t(rg.first_chunk + c)].out_offset + size_t(r) * kLatentDim;
        for (int d = 0; d < kLatentDim; ++d) acc[d] += w * o[d];
      }
      const int64_t ob = out_offset(p, t, h);
      if (p.out_dtype == DType::kFP32) {
        std::memcpy(static_cast<float*>(p.out) + ob, acc, sizeof(acc));
      } else {
        uint16_t* out = static_cast<uint16_t*>(p.out) + ob;
        for (int d = 0; d < kLatentDim; ++d) out[d] = numeric::float_to_bf16(acc[d]);
      }
      if (p.lse) p.lse[lse_offset(p, t, h)] = lse::convert(comb.merged_lse(), LseBase::k2, p.lse_base);
    }
  }

  const KernelVariant& kernel_;
  PlanOptions plan_;
  BackendCapabilities caps_;
  std::mutex arena_mu_;
  FloatArena arena_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend_with(const KernelVariant& kernel, const PlanOptions& plan) {
  return std::make_unique<CpuBackend>(kernel, plan);
}
std::unique_ptr<Backend> make_cpu_backend_with(const KernelVariant& kernel) {
  return make_cpu_backend_with(kernel, PlanOptions{});
}

}  // namespace cpu

std::unique_ptr<Backend> make_cpu_backend() { return cpu::make_cpu_backend_with(cpu::best_kernel()); }

Status create_cpu_backend(const CpuBackendOptions& options, std::unique_ptr<Backend>* out) {
  if (!out) return Status::InvalidArgument("out: null");
  for (cpu::Isa isa : {cpu::Isa::kGeneric, cpu::Isa::kAvx2, cpu::Isa::kAvx512, cpu::Isa::kAmx})
    if (options.max_isa == cpu::isa_name(isa)) {
      *out = cpu::make_cpu_backend_with(cpu::best_kernel(isa));
      return Status::Ok();
    }
  return Status::InvalidArgument("options.max_isa='" + options.max_isa + "': accepted generic, avx2, avx512, amx");
}

}  // namespace mladcp
