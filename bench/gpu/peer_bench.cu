// Side-by-side benchmark: the "cuda" decode on the configurations of a peer's configs.txt, measured
// with the peer harness's method so that the two RESULT lines of a configuration can be divided.
//
// Cases (same as the peer harness): bf16 q [b, s_q, h, 576] and latent cache [num_blocks, 64, 576]
// with random values (never zeros), sequence lengths and a permuted block table from the 64-bit LCG
// (Knuth MMIX constants) seeded by the configuration (fixed: every length = ctx; varlen: uniform in
// [ctx/2, 3ctx/2]; halfempty: odd sequences empty), softmax scale 1/sqrt(192), causal for s_q > 1, bf16
// out and the fp32 LSE. Method: 5 warm-ups, then 30 calls, each queued behind a ~2M-cycle spin kernel
// with events right around the call (device time only); the median. One key cache, no rotation.
//
// Usage: mladcp_peer_bench --configs FILE [--reps N] [--warmup N] [--spin CYCLES] [--only INDEX]
//                          [--policies default,invariant,fill,nolse,splits,balanced,hopper-all,loaded-queries,
//                                      balanced-loaded,fused,fp8,fp8-fused,fp8-portable,fp8-all] [--hot-pages N]
//                                      [--timeline]
// loaded-queries: the default with the Hopper kernel's consumers loading the query rows (no copy by the producer);
// balanced-loaded: the same with the balanced schedule forced.
// fused, fp8-fused: the default with the Hopper 64-row kernel's fused merge (CudaBackendOptions::fused_merge).
// fp8 policies: the same case on an fp8-e4m3 copy of the cache (kv_scale 1/8; no peer runs it): fp8 the default
// backend, fp8-portable the portable kernel, fp8-all every row count on the Hopper fp8 kernel.
// --timeline (a build with -DMLADCP_SM90_TIMELINE=ON): after each case, one more call with the Hopper kernel's per-CTA
// timeline (src/cuda/sm90_timeline.cuh), printed as
//   TIMELINE mladcp[-policy] h b s_q ctx variant ctas=N pieces=P start=FIRST..LAST end=E <point>=MEDIAN/MAX ...
//   [combine=START..END]
// (µs; start, end and combine after the spin kernel's end, the points after each CTA's own start); with
// MLADCP_TIMELINE_CTAS=1 also one "TLCTA ..." line per CTA (its pieces, start, setup, the copier's first piece, ids
// and copies, both warpgroups' first scores, the piece switch on both sides: the first piece written, the second
// piece's start, first scores, copies and queries; the loop's end, row sums and output written by each warpgroup).
// --chunk0-only (timeline builds): an experiment; the Hopper kernel's CTAs of row chunks past the first exit at once
// (half the key traffic out of L2 at 128 heads, the same from memory; those rows' results are garbage).
// --chunk-major (timeline builds): an experiment; a balanced plan's CTAs take their part and row chunk chunk-major
// (part + parts · row chunk), so that the row chunks of a part, which read the same keys, do not run on the two SMs
// of one TPC (the CTA scheduler places consecutive CTAs on neighbouring SMs); results stay exact.
// --skip-empty-writes (timeline builds): an experiment; a segment without keys writes no rows (timing only: the rows
// of empty sequences are left as they were).
// --hot-pages N: every block-table entry names one of N pages (the keys stay in L2; an experiment that
// separates the kernel's own schedule from its key loads, not a peer configuration).
// Output per configuration and policy:
//   LENS mladcp h b s_q ctx variant sum_len max_len table_hash
//   RESULT mladcp[-policy] h b s_q ctx variant median_us GB/s TFLOP/s
// ("mladcp" is the default policy, "mladcp-nolse" the default without LSE; GB/s = (Σ len·1152 + q + out bytes) / t,
// Σ len·576 for the fp8 cache;
// TFLOP/s = 2·1088·h·Σ visible / t.)
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.cuh"
#include "cuda/cuda_backend.h"
#include "cuda/sm90_decode.h"
#include "cuda/sm90_timeline.cuh"
#include "mladcp/backend.h"
#include "mladcp/config.h"

namespace {

struct PeerConfig {
  std::string set, variant;
  int h = 0, b = 0, s_q = 1, ctx = 0;
};

struct Lcg {
  uint64_t s;
  explicit Lcg(uint64_t seed) : s(seed) {}
  uint64_t next() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return s >> 33;
  }
};

struct Case {
  std::vector<int32_t> lens, table;
  int nbps = 0, nb = 0, max_len = 0;
  uint32_t table_hash = 0;
};

Case make_case(const PeerConfig& c) {
  const int vid = c.variant == "varlen" ? 1 : (c.variant == "halfempty" ? 2 : 0);
  Lcg rng(uint64_t(c.h) * 1000003 + uint64_t(c.b) * 10007 + uint64_t(c.s_q) * 101 + uint64_t(c.ctx) + vid * 7919);
  Case k;
  k.lens.assign(size_t(c.b), c.ctx);
  for (int i = 0; i < c.b; ++i) {
    if (vid == 1)
      k.lens[size_t(i)] =
          int(std::max<uint64_t>(uint64_t(c.ctx / 2) + rng.next() % uint64_t(c.ctx + 1), uint64_t(c.s_q)));
    if (vid == 2) k.lens[size_t(i)] = i % 2 == 1 ? 0 : c.ctx;
  }
  k.max_len = *std::max_element(k.lens.begin(), k.lens.end());
  k.nbps = std::max(1, (k.max_len + 63) / 64);
  k.nb = c.b * k.nbps;
  k.table.resize(size_t(k.nb));
  for (int i = 0; i < k.nb; ++i) k.table[size_t(i)] = i;
  for (int i = k.nb - 1; i > 0; --i) std::swap(k.table[size_t(i)], k.table[size_t(rng.next() % uint64_t(i + 1))]);
  for (int32_t x : k.table) k.table_hash = uint32_t((uint64_t(k.table_hash) * 1000003 + uint64_t(x)) & 0xFFFFFFFFu);
  return k;
}

std::vector<PeerConfig> read_configs(const std::string& path) {
  std::ifstream f(path);
  if (!f) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    std::exit(2);
  }
  std::vector<PeerConfig> v;
  std::string line;
  while (std::getline(f, line)) {
    line = line.substr(0, line.find('#'));
    std::istringstream in(line);
    PeerConfig c;
    if (in >> c.set >> c.h >> c.b >> c.s_q >> c.ctx >> c.variant) v.push_back(c);
  }
  return v;
}

struct Policy {
  const char* tag;
  bool set;
  mladcp::SplitPolicy policy;
  bool lse = true;                     // false: no LSE asked for (the default policy)
  mladcp::Backend* backend = nullptr;  // a backend with other options (a forced schedule), else the default
  bool fp8 = false;                    // the fp8-e4m3 copy of the cache
};

#if MLADCP_SM90_TIMELINE
// The pair trace of the traced CTAs (SM clocks; the window of pairs in src/cuda/sm90_timeline.cuh): per CTA, the
// median period of a pair (the start of warpgroup 0's pair to the next one's), then each event's median offset from
// its pair's start, as
//   PAIRS mladcp[-policy] h b s_q ctx variant cta=N period=CLK <event>=OFFSET ...
void print_pair_trace(const char* tag, const PeerConfig& c) {
  namespace tl = mladcp::cuda_impl::sm90_timeline;
  std::vector<uint32_t> ev(size_t(tl::kTraceCtas) * tl::kTraceWindow * tl::kPairEvents);
  CHECK_CUDA(mladcp::cuda_impl::sm90_trace_read(ev.data()));
  for (int b = 0; b < tl::kTraceCtas; ++b) {
    auto at = [&](int pair, int e) {
      return ev[(size_t(b) * tl::kTraceWindow + size_t(pair)) * tl::kPairEvents + size_t(e)];
    };
    int pairs = 0;
    while (pairs < tl::kTraceWindow && at(pairs, tl::kA0Start) != 0) ++pairs;
    if (pairs < tl::kTraceWindow) continue;  // a CTA with fewer pairs
    std::vector<double> period;
    for (int i = 0; i + 1 < pairs; ++i)
      period.push_back(double(int32_t(at(i + 1, tl::kA0Start) - at(i, tl::kA0Start))));
    std::printf("PAIRS %s %d %d %d %d %s cta=%d period=%.0f", tag, c.h, c.b, c.s_q, c.ctx, c.variant.c_str(), b,
                median(period));
    for (int e = 0; e < tl::kPairEvents; ++e) {
      std::vector<double> off;
      for (int i = 0; i < pairs; ++i)
        if (at(i, e) != 0) off.push_back(double(int32_t(at(i, e) - at(i, tl::kA0Start))));
      std::printf(" %s=%.0f", tl::kEventNames[e], off.empty() ? -1.0 : median(off));
    }
    std::printf("\n");
  }
}

// One more call of the case behind the spin kernel, and its timeline.
void print_timeline(mladcp::Backend& be, const mladcp::MlaDecodeParams& p, const mladcp::ExecContext& ctx,
                    cudaStream_t stream, long long spin_cycles, const char* tag, const PeerConfig& c) {
  namespace tl = mladcp::cuda_impl::sm90_timeline;
  CHECK_CUDA(mladcp::cuda_impl::sm90_timeline_reset());
  CHECK_CUDA(mladcp::cuda_impl::combine_timeline_reset());
  CHECK_CUDA(mladcp::cuda_impl::sm90_trace_reset());
  CHECK_CUDA(cudaDeviceSynchronize());
  spin<<<1, 1, 0, stream>>>(spin_cycles);
  CHECK_OK(be.decode(p, ctx));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<uint64_t> pts(size_t(tl::kCtas) * tl::kPoints);
  uint64_t comb[2] = {0, 0};
  unsigned long long spin_end = 0;
  CHECK_CUDA(mladcp::cuda_impl::sm90_timeline_read(pts.data()));
  CHECK_CUDA(mladcp::cuda_impl::combine_timeline_read(comb));
  CHECK_CUDA(cudaMemcpyFromSymbol(&spin_end, g_spin_end, sizeof(spin_end)));
  auto us = [&](uint64_t t, uint64_t from) { return double(int64_t(t - from)) * 1e-3; };
  std::vector<std::vector<double>> rel(tl::kSm);
  std::vector<double> pieces;
  double first = 1e30, last = -1e30, end = -1e30;
  int ctas = 0;
  for (int b = 0; b < tl::kCtas; ++b) {
    const uint64_t* e = &pts[size_t(b) * tl::kPoints];
    if (e[tl::kStart] == 0 || e[tl::kSetup] == 0) continue;  // not launched, or exited before any work
    ++ctas;
    first = std::min(first, us(e[tl::kStart], spin_end));
    last = std::max(last, us(e[tl::kStart], spin_end));
    for (int i = tl::kSetup; i < tl::kSm; ++i)
      if (e[i]) rel[size_t(i)].push_back(us(e[i], e[tl::kStart]));
    for (const int i : {tl::kWrittenWg0, tl::kWrittenWg1})
      if (e[i]) end = std::max(end, us(e[i], spin_end));
    pieces.push_back(double(e[tl::kPieces]));
  }
  std::printf("TIMELINE %s %d %d %d %d %s ctas=%d pieces=%.0f start=%.2f..%.2f end=%.2f", tag, c.h, c.b, c.s_q, c.ctx,
              c.variant.c_str(), ctas, median(pieces), first, last, end);
  for (int i = tl::kSetup; i < tl::kSm; ++i) {
    const std::vector<double>& v = rel[size_t(i)];
    std::printf(" %s=%.2f/%.2f", tl::kNames[i], median(v), v.empty() ? 0.0 : *std::max_element(v.begin(), v.end()));
  }
  if (comb[1] != 0) std::printf(" combine=%.2f..%.2f", us(comb[0], spin_end), us(comb[1], spin_end));
  std::printf("\n");
  // MLADCP_TIMELINE_CTAS=1: every CTA's own line (start after the spin kernel, the points after the CTA's start).
  if (const char* e = std::getenv("MLADCP_TIMELINE_CTAS"); e != nullptr && e[0] == '1')
    for (int b = 0; b < tl::kCtas; ++b) {
      const uint64_t* t = &pts[size_t(b) * tl::kPoints];
      if (t[tl::kStart] == 0 || t[tl::kSetup] == 0) continue;
      auto at = [&](int i) { return t[i] ? us(t[i], t[tl::kStart]) : -1.0; };
      std::printf(
          "TLCTA %s %d %d %d %d %s cta=%d sm=%d pieces=%d start=%.2f first_copy=%.2f scores=%.2f "
          "written_first=%.2f piece2=%.2f scores2=%.2f loop=%.2f written=%.2f setup=%.2f copy_piece=%.2f "
          "copy_pages=%.2f scores_wg1=%.2f copy_piece2=%.2f first_copy2=%.2f queries2=%.2f last_copy=%.2f "
          "loop_wg1=%.2f row_sums=%.2f written_wg1=%.2f\n",
          tag, c.h, c.b, c.s_q, c.ctx, c.variant.c_str(), b, int(t[tl::kSm]), int(t[tl::kPieces]),
          us(t[tl::kStart], spin_end), at(tl::kFirstCopy), at(tl::kScoresWg0), at(tl::kWrittenFirst), at(tl::kPiece2),
          at(tl::kScores2), at(tl::kLoopWg0), at(tl::kWrittenWg0), at(tl::kSetup), at(tl::kCopyPiece),
          at(tl::kCopyPages), at(tl::kScoresWg1), at(tl::kCopyPiece2), at(tl::kFirstCopy2), at(tl::kQueries2),
          at(tl::kLastCopy), at(tl::kLoopWg1), at(tl::kRowSums), at(tl::kWrittenWg1));
    }
  print_pair_trace(tag, c);
  std::fflush(stdout);
}
#endif

void run(mladcp::Backend& default_backend, const PeerConfig& c, const std::vector<Policy>& policies, int reps,
         int warmup, long long spin_cycles, int hot_pages, bool timeline) {
  using namespace mladcp;
  Case k = make_case(c);
  if (hot_pages > 0)
    for (int32_t& b : k.table) b %= hot_pages;
  long long sum_len = 0;
  for (int32_t l : k.lens) sum_len += l;
  std::printf("LENS mladcp %d %d %d %d %s %lld %d %u\n", c.h, c.b, c.s_q, c.ctx, c.variant.c_str(), sum_len, k.max_len,
              k.table_hash);
  const int T = c.b * c.s_q;
  const size_t kv_elems = size_t(k.nb) * 64 * kQkDim;
  void *kv, *kv8 = nullptr, *q, *out, *lse, *table, *lens;
  CHECK_CUDA(cudaMalloc(&kv, kv_elems * 2));
  fill_random_bf16(kv, kv_elems, 21);
  bool any_fp8 = false;
  for (const Policy& pol : policies) any_fp8 |= pol.fp8;
  if (any_fp8) {
    CHECK_CUDA(cudaMalloc(&kv8, kv_elems));
    fill_fp8<<<1024, 256>>>(static_cast<uint8_t*>(kv8), kv_elems, 23);
    CHECK_CUDA(cudaGetLastError());
  }
  CHECK_CUDA(cudaMalloc(&q, size_t(T) * c.h * kQkDim * 2));
  fill_random_bf16(q, size_t(T) * c.h * kQkDim, 22);
  CHECK_CUDA(cudaMalloc(&out, size_t(T) * c.h * kLatentDim * 2));
  CHECK_CUDA(cudaMalloc(&lse, size_t(T) * c.h * 4));
  CHECK_CUDA(cudaMalloc(&table, k.table.size() * 4));
  CHECK_CUDA(cudaMemcpy(table, k.table.data(), k.table.size() * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMalloc(&lens, k.lens.size() * 4));
  CHECK_CUDA(cudaMemcpy(lens, k.lens.data(), k.lens.size() * 4, cudaMemcpyHostToDevice));
  double visible = 0;
  for (int32_t L : k.lens)
    for (int t = 0; t < c.s_q; ++t) visible += std::max(0, L - c.s_q + t + 1);
  const double io_bytes = double(T) * c.h * (kQkDim * 2 + kLatentDim * 2);
  const double flops = 2.0 * (kQkDim + kLatentDim) * c.h * visible;

  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  for (const Policy& pol : policies) {
    Backend& be = pol.backend ? *pol.backend : default_backend;
    MlaDecodeParams p;
    p.num_seqs = c.b;
    p.q_len = c.s_q;
    p.num_heads = c.h;
    p.q = q;
    p.kv_cache = pol.fp8 ? kv8 : kv;
    p.kv_dtype = pol.fp8 ? DType::kFP8E4M3 : DType::kBF16;
    p.kv_scale = pol.fp8 ? 0.125f : 1.0f;
    const double bytes = double(sum_len) * kQkDim * (pol.fp8 ? 1 : 2) + io_bytes;
    p.num_blocks = k.nb;
    p.block_size = 64;
    p.block_table = static_cast<const int32_t*>(table);
    p.max_blocks_per_seq = k.nbps;
    p.seq_lens = static_cast<const int32_t*>(lens);
    p.max_seq_len = std::max(1, k.max_len);
    p.softmax_scale = 0.07216878364870322f;  // 1/sqrt(192)
    p.out = out;
    p.out_dtype = DType::kBF16;
    p.lse = pol.lse ? static_cast<float*>(lse) : nullptr;
    if (pol.set) p.split_policy = pol.policy;
    void* ws = nullptr;
    const size_t ws_bytes = be.workspace_bytes(p);
    if (ws_bytes) CHECK_CUDA(cudaMalloc(&ws, ws_bytes));
    ExecContext ctx;
    ctx.stream = stream;
    ctx.workspace = ws;
    ctx.workspace_size = ws_bytes;
    for (int i = 0; i < warmup; ++i) CHECK_OK(be.decode(p, ctx));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    std::vector<double> t;
    for (int i = 0; i < reps; ++i) {
      spin<<<1, 1, 0, stream>>>(spin_cycles);
      CHECK_CUDA(cudaEventRecord(e0, stream));
      CHECK_OK(be.decode(p, ctx));
      CHECK_CUDA(cudaEventRecord(e1, stream));
      CHECK_CUDA(cudaEventSynchronize(e1));
      float ms = 0;
      CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
      t.push_back(ms * 1e3);
    }
    const double us = median(t);
    std::printf("RESULT %s %d %d %d %d %s %.2f %.1f %.2f\n", pol.tag, c.h, c.b, c.s_q, c.ctx, c.variant.c_str(), us,
                bytes / (us * 1e-6) / 1e9, flops / (us * 1e-6) / 1e12);
    std::fflush(stdout);
#if MLADCP_SM90_TIMELINE
    if (timeline) print_timeline(be, p, ctx, stream, spin_cycles, pol.tag, c);
#else
    (void)timeline;
#endif
    if (ws) CHECK_CUDA(cudaFree(ws));
  }
  CHECK_CUDA(cudaStreamDestroy(stream));
  for (void* ptr : {kv, kv8, q, out, lse, table, lens})
    if (ptr) CHECK_CUDA(cudaFree(ptr));
}

}  // namespace

int main(int argc, char** argv) {
  std::string configs, policies_arg = "default";
  int reps = 30, warmup = 5, only = -1, hot_pages = 0;
  bool timeline = false, chunk0_only = false, chunk_major = false, skip_empty = false;
  long long spin_cycles = 2000000;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has = i + 1 < argc;
    if (a == "--configs" && has)
      configs = argv[++i];
    else if (a == "--reps" && has)
      reps = std::atoi(argv[++i]);
    else if (a == "--warmup" && has)
      warmup = std::atoi(argv[++i]);
    else if (a == "--spin" && has)
      spin_cycles = std::atoll(argv[++i]);
    else if (a == "--only" && has)
      only = std::atoi(argv[++i]);
    else if (a == "--policies" && has)
      policies_arg = argv[++i];
    else if (a == "--hot-pages" && has)
      hot_pages = std::atoi(argv[++i]);
    else if (a == "--timeline")
      timeline = true;
    else if (a == "--chunk0-only")
      chunk0_only = true;
    else if (a == "--chunk-major")
      chunk_major = true;
    else if (a == "--skip-empty-writes")
      skip_empty = true;
    else {
      std::fprintf(stderr,
                   "usage: %s --configs FILE [--reps N] [--warmup N] [--spin CYCLES] [--only INDEX] "
                   "[--policies "
                   "default,invariant,fill,nolse,splits,balanced,hopper-all,loaded-queries,balanced-loaded,fused,fp8,"
                   "fp8-fused,fp8-portable,fp8-all] "
                   "[--hot-pages N] [--timeline] [--chunk0-only] [--chunk-major] [--skip-empty-writes]\n",
                   argv[0]);
      return 2;
    }
  }
#if !MLADCP_SM90_TIMELINE
  if (timeline || chunk0_only || chunk_major || skip_empty) {
    std::fprintf(
        stderr,
        "--timeline, --chunk0-only, --chunk-major, --skip-empty-writes: this build has no timeline (configure with "
        "-DMLADCP_SM90_TIMELINE=ON)\n");
    return 2;
  }
#else
  if (chunk0_only) CHECK_CUDA(mladcp::cuda_impl::sm90_chunk0_only(true));
  if (chunk_major) CHECK_CUDA(mladcp::cuda_impl::sm90_chunk_major(true));
  if (skip_empty) CHECK_CUDA(mladcp::cuda_impl::sm90_skip_empty_writes(true));
#endif
  if (configs.empty() || reps < 1 || warmup < 0) {
    std::fprintf(stderr, "--configs FILE is required; --reps >= 1, --warmup >= 0\n");
    return 2;
  }
  std::unique_ptr<mladcp::Backend> be;
  CHECK_OK(mladcp::create_backend("cuda", &be));
  // kFillDevice with each schedule of the Hopper kernel forced (the default backend chooses).
  mladcp::CudaBackendOptions opt;
  opt.fill_schedule = mladcp::cuda_plan::Schedule::kSplits;
  const std::unique_ptr<mladcp::Backend> splits = mladcp::make_cuda_backend(opt);
  opt.fill_schedule = mladcp::cuda_plan::Schedule::kBalanced;
  const std::unique_ptr<mladcp::Backend> balanced = mladcp::make_cuda_backend(opt);
  // Every bf16 call on the Hopper kernel, 16 query rows included (the default keeps them on the portable one).
  mladcp::CudaBackendOptions all;
  all.portable_max_rows_on_hopper = 0;
  const std::unique_ptr<mladcp::Backend> hopper_all = mladcp::make_cuda_backend(all);
  mladcp::CudaBackendOptions portable_opt;
  portable_opt.hopper_kernel = false;
  const std::unique_ptr<mladcp::Backend> portable = mladcp::make_cuda_backend(portable_opt);
  mladcp::CudaBackendOptions loaded_opt;
  loaded_opt.copy_queries = false;
  const std::unique_ptr<mladcp::Backend> loaded = mladcp::make_cuda_backend(loaded_opt);
  mladcp::CudaBackendOptions balanced_loaded_opt;
  balanced_loaded_opt.fill_schedule = mladcp::cuda_plan::Schedule::kBalanced;
  balanced_loaded_opt.copy_queries = false;
  const std::unique_ptr<mladcp::Backend> balanced_loaded = mladcp::make_cuda_backend(balanced_loaded_opt);
  mladcp::CudaBackendOptions fp8_all_opt;
  fp8_all_opt.hopper_fp8_max_rows = 1 << 30;
  const std::unique_ptr<mladcp::Backend> fp8_all = mladcp::make_cuda_backend(fp8_all_opt);
  mladcp::CudaBackendOptions fused_opt;
  fused_opt.fused_merge = true;
  const std::unique_ptr<mladcp::Backend> fused = mladcp::make_cuda_backend(fused_opt);
  std::vector<Policy> policies;
  std::stringstream ps(policies_arg);
  for (std::string name; std::getline(ps, name, ',');) {
    if (name == "default")
      policies.push_back({"mladcp", false, mladcp::SplitPolicy::kBatchInvariant});
    else if (name == "invariant")
      policies.push_back({"mladcp-invariant", true, mladcp::SplitPolicy::kBatchInvariant});
    else if (name == "fill")
      policies.push_back({"mladcp-fill", true, mladcp::SplitPolicy::kFillDevice});
    else if (name == "nolse")
      policies.push_back({"mladcp-nolse", false, mladcp::SplitPolicy::kFillDevice, false});
    else if (name == "splits")
      policies.push_back({"mladcp-splits", true, mladcp::SplitPolicy::kFillDevice, true, splits.get()});
    else if (name == "balanced")
      policies.push_back({"mladcp-balanced", true, mladcp::SplitPolicy::kFillDevice, true, balanced.get()});
    else if (name == "hopper-all")
      policies.push_back({"mladcp-hopper-all", true, mladcp::SplitPolicy::kFillDevice, true, hopper_all.get()});
    else if (name == "loaded-queries")
      policies.push_back({"mladcp-loaded-queries", false, mladcp::SplitPolicy::kBatchInvariant, true, loaded.get()});
    else if (name == "balanced-loaded")
      policies.push_back(
          {"mladcp-balanced-loaded", true, mladcp::SplitPolicy::kFillDevice, true, balanced_loaded.get()});
    else if (name == "fused")
      policies.push_back({"mladcp-fused", false, mladcp::SplitPolicy::kBatchInvariant, true, fused.get()});
    else if (name == "fp8-fused")
      policies.push_back({"mladcp-fp8-fused", false, mladcp::SplitPolicy::kBatchInvariant, true, fused.get(), true});
    else if (name == "fp8")
      policies.push_back({"mladcp-fp8", false, mladcp::SplitPolicy::kBatchInvariant, true, nullptr, true});
    else if (name == "fp8-portable")
      policies.push_back(
          {"mladcp-fp8-portable", false, mladcp::SplitPolicy::kBatchInvariant, true, portable.get(), true});
    else if (name == "fp8-all")
      policies.push_back({"mladcp-fp8-all", false, mladcp::SplitPolicy::kBatchInvariant, true, fp8_all.get(), true});
    else {
      std::fprintf(stderr,
                   "--policies: '%s' is not default, invariant, fill, nolse, splits, balanced, hopper-all, "
                   "loaded-queries, balanced-loaded, fused, fp8, fp8-fused, fp8-portable or fp8-all\n",
                   name.c_str());
      return 2;
    }
  }
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("DEVICE mladcp %s %d SMs\n", prop.name, prop.multiProcessorCount);
  const std::vector<PeerConfig> cfgs = read_configs(configs);
  for (size_t i = 0; i < cfgs.size(); ++i)
    if (only < 0 || size_t(only) == i) run(*be, cfgs[i], policies, reps, warmup, spin_cycles, hot_pages, timeline);
  return 0;
}
