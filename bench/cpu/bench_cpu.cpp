// Host decode benchmarks on DeepSeek-V3 shapes (512 + 64, block 64, batch 4, context 4096, q_len 1)
// with 16 and 128 heads, next to the machine's own ceilings measured in the same run:
//   - copy bandwidth: a multi-threaded memcpy, counting bytes read + written, of 1 GiB (DRAM) and of
//     a buffer the size of the decode's KV cache (where it lives after the first iteration);
//   - fp32 FMA peak: every thread runs independent FMAs on register-resident vectors (16 accumulators
//     of the widest vector this CPU has, no memory traffic), FLOPs = 2 per lane per FMA.
// Decode counters: bytes/s = (KV bytes read + q + out) / time; FLOP/s = 2 · (576 + 512) per head per
// query token per visible key. A summary at the end prints each decode (best repetition) as a fraction
// of the ceilings (best repetition).
#include <benchmark/benchmark.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cpu/cpu_internal.h"
#include "cpu/thread_pool.h"
#include "mladcp/backend.h"
#include "mladcp/sharding.h"
#include "testkit/synthetic.h"

namespace mladcp::bench {
namespace {

struct Shape {
  int heads = 128;
  int batch = 4;
  int context = 4096;
  int q_len = 1;
  int block = 64;
  DType kv = DType::kBF16;
};

std::string shape_name(const Shape& s) {
  return "H" + std::to_string(s.heads) + "/B" + std::to_string(s.batch) + "/ctx" + std::to_string(s.context) + "/q" +
         std::to_string(s.q_len) + "/" + dtype_name(s.kv);
}

// Problems are built once per shape and shared by every backend.
const synthetic::Problem& problem_for(const Shape& s) {
  static std::map<std::string, std::unique_ptr<synthetic::Problem>> cache;
  auto& slot = cache[shape_name(s)];
  if (!slot) {
    synthetic::Config c;
    c.num_seqs = s.batch;
    c.q_len = s.q_len;
    c.num_heads = s.heads;
    c.block_size = s.block;
    c.kv_dtype = s.kv;
    c.kv_scale = s.kv == DType::kFP8E4M3 ? 0.5f : 1.0f;
    c.seq_lens = synthetic::uniform_lengths(s.batch, s.context);
    slot = std::make_unique<synthetic::Problem>();
    if (!synthetic::make_problem(c, slot.get()).ok()) std::abort();
  }
  return *slot;
}

double decode_flops(const synthetic::Problem& p) {
  double keys = 0;
  for (int32_t len : p.seq_lens)
    for (int i = 0; i < p.config.q_len; ++i)
      keys += double(sharding::visible_local_keys(len, p.config.q_len, i, p.config.shard));
  return 2.0 * (kQkDim + kLatentDim) * p.config.num_heads * keys;
}

double decode_bytes(const synthetic::Problem& p, DType out) {
  const double rows = double(p.num_tokens()) * p.config.num_heads;
  return double(p.kv_bytes_used()) + rows * kQkDim * 2.0 + rows * kLatentDim * double(dtype_size(out));
}

void bm_decode(benchmark::State& state, std::unique_ptr<Backend> backend, Shape shape) {
  const synthetic::Problem& p = problem_for(shape);
  std::vector<uint16_t> out(size_t(p.num_tokens()) * shape.heads * kLatentDim);
  std::vector<float> lse(size_t(p.num_tokens()) * shape.heads);
  const MlaDecodeParams params = p.params(out.data(), DType::kBF16, lse.data());
  for (auto _ : state) {
    const Status s = backend->decode(params, {});
    if (!s.ok()) {
      state.SkipWithError(s.to_string().c_str());
      break;
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["bytes/s"] =
      benchmark::Counter(decode_bytes(p, DType::kBF16), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["FLOP/s"] = benchmark::Counter(decode_flops(p), benchmark::Counter::kIsIterationInvariantRate);
}

void bm_copy(benchmark::State& state) {
  const size_t bytes = size_t(state.range(0));
  std::vector<char> src(bytes, 1), dst(bytes, 2);
  cpu::ThreadPool& pool = cpu::ThreadPool::instance();
  const int parts = pool.size();
  for (auto _ : state) {
    pool.parallel_for(parts, parts, [&](int i, int) {
      const size_t begin = bytes * size_t(i) / size_t(parts), end = bytes * size_t(i + 1) / size_t(parts);
      std::memcpy(dst.data() + begin, src.data() + begin, end - begin);
    });
    benchmark::DoNotOptimize(dst.data());
  }
  state.counters["bytes/s"] = benchmark::Counter(2.0 * double(bytes), benchmark::Counter::kIsIterationInvariantRate);
}

// Register-resident FMA chains: 16 independent accumulators, so latency is hidden and the FMA
// ports are the only limit. Returns FLOPs done.
constexpr long kFmaIters = 20'000'000;

#if defined(__x86_64__)
__attribute__((target("avx512f"))) float fma_avx512() {
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_ps(1.0f + 1e-3f * float(i));
  __m512 b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  for (long it = 0; it < kFmaIters; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_fmadd_ps(acc[i], b, c);
    __asm__ volatile("" : "+v"(b));
  }
  float s = 0;
  for (int i = 0; i < 16; ++i) s += _mm512_reduce_add_ps(acc[i]);
  return s;
}

__attribute__((target("avx2,fma"))) float fma_avx2() {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(1.0f + 1e-3f * float(i));
  __m256 b = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  for (long it = 0; it < kFmaIters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], b, c);
    __asm__ volatile("" : "+x"(b));
  }
  alignas(32) float o[8];
  __m256 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, acc[i]);
  _mm256_store_ps(o, s);
  return o[0];
}
#endif

void bm_fma_peak(benchmark::State& state) {
  cpu::ThreadPool& pool = cpu::ThreadPool::instance();
  const int threads = pool.size();
  double flops_per_thread = 0;
  float sink = 0;
  std::string isa = "none";
#if defined(__x86_64__)
  const bool avx512 = __builtin_cpu_supports("avx512f");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (avx512) {
    flops_per_thread = double(kFmaIters) * 16 * 16 * 2;
    isa = "avx512";
  } else if (avx2) {
    flops_per_thread = double(kFmaIters) * 12 * 8 * 2;
    isa = "avx2";
  }
  for (auto _ : state) {
    pool.parallel_for(threads, threads, [&](int, int) {
      const float v = avx512 ? fma_avx512() : (avx2 ? fma_avx2() : 0.0f);
      benchmark::DoNotOptimize(v);
      sink += 0.0f * v;
    });
  }
#else
  for (auto _ : state) benchmark::DoNotOptimize(sink);
#endif
  state.SetLabel(isa + " x " + std::to_string(threads) + " threads");
  state.counters["FLOP/s"] =
      benchmark::Counter(flops_per_thread * threads, benchmark::Counter::kIsIterationInvariantRate);
}

// Console output plus a closing summary: each decode as a fraction of the ceilings.
class SummaryReporter : public benchmark::ConsoleReporter {
 public:
  // Per benchmark: the median over repetitions when aggregates are reported, else the best run.
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      if (r.error_occurred) continue;
      const bool median = r.run_type == Run::RT_Aggregate && r.aggregate_name == "median";
      if (r.run_type != Run::RT_Iteration && !median) continue;
      const std::string name = r.run_name.str();
      auto get = [&](const char* k) {
        auto it = r.counters.find(k);
        return it == r.counters.end() ? 0.0 : double(it->second);
      };
      auto it = std::find_if(results_.begin(), results_.end(), [&](const Result& x) { return x.name == name; });
      if (it == results_.end()) it = results_.insert(results_.end(), Result{name, 0.0, 0.0, false});
      if (median) {
        *it = Result{name, get("bytes/s"), get("FLOP/s"), true};
      } else if (!it->median) {
        it->bytes = std::max(it->bytes, get("bytes/s"));
        it->flops = std::max(it->flops, get("FLOP/s"));
      }
    }
  }

  void Finalize() override {
    ConsoleReporter::Finalize();
    double copy_dram = 0, copy_kv = 0, fma = 0;
    for (const Result& r : results_) {
      if (r.name.rfind("copy/1GiB", 0) == 0) copy_dram = r.bytes;
      if (r.name.rfind("copy/kv-size", 0) == 0) copy_kv = r.bytes;
      if (r.name.rfind("fma_peak", 0) == 0) fma = r.flops;
    }
    std::printf(
        "\nCeilings: copy %.1f GB/s (1 GiB, read+write), copy %.1f GB/s (KV-sized buffer), fp32 FMA peak %.1f "
        "GFLOP/s\n",
        copy_dram / 1e9, copy_kv / 1e9, fma / 1e9);
    for (const Result& d : results_) {
      if (d.name.rfind("decode/", 0) != 0) continue;
      std::printf(
          "%-44s %7.2f GB/s = %5.1f%% of copy(1 GiB), %5.1f%% of copy(KV-sized); %7.1f GFLOP/s = %5.1f%% of FMA peak\n",
          d.name.c_str(), d.bytes / 1e9, copy_dram > 0 ? 100 * d.bytes / copy_dram : 0.0,
          copy_kv > 0 ? 100 * d.bytes / copy_kv : 0.0, d.flops / 1e9, fma > 0 ? 100 * d.flops / fma : 0.0);
    }
  }

 private:
  struct Result {
    std::string name;
    double bytes, flops;
    bool median;
  };
  std::vector<Result> results_;
};

void register_all() {
  const Shape v3_16{16, 4, 4096, 1, 64, DType::kBF16};
  const Shape v3_128{128, 4, 4096, 1, 64, DType::kBF16};
  Shape v3_16_fp8 = v3_16, v3_128_fp8 = v3_128;
  v3_16_fp8.kv = v3_128_fp8.kv = DType::kFP8E4M3;
  const Shape v3_128_mtp{128, 4, 4096, 2, 64, DType::kBF16};
  const Shape small{16, 1, 512, 1, 64, DType::kBF16};

  benchmark::RegisterBenchmark("copy/1GiB", bm_copy)
      ->Arg(int64_t(1) << 30)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  const int64_t kv_bytes = int64_t(problem_for(v3_16).kv_bytes_used());
  benchmark::RegisterBenchmark("copy/kv-size", bm_copy)->Arg(kv_bytes)->UseRealTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("fma_peak", bm_fma_peak)->UseRealTime()->Unit(benchmark::kMillisecond);

  // The "cpu" backend with its default kernel, then every other kernel variant this machine runs.
  std::vector<std::pair<std::string, const cpu::KernelVariant*>> kernels = {{"cpu", &cpu::best_kernel()}};
  for (cpu::Isa isa : {cpu::Isa::kAmx, cpu::Isa::kAvx512, cpu::Isa::kAvx2})
    if (const cpu::KernelVariant* k = cpu::kernel_for(isa); k && k != &cpu::best_kernel())
      kernels.push_back({std::string("cpu[") + cpu::isa_name(isa) + "]", k});
  for (const auto& [label, kernel] : kernels) {
    const bool main = label == "cpu";
    for (const Shape& s : {v3_16, v3_128, v3_16_fp8, v3_128_fp8, v3_128_mtp}) {
      if (!main && s.kv != DType::kBF16) continue;
      if (!main && s.q_len != 1) continue;
      const cpu::KernelVariant* k = kernel;
      benchmark::RegisterBenchmark(("decode/" + label + "/" + shape_name(s)).c_str(),
                                   [k, s](benchmark::State& st) { bm_decode(st, cpu::make_cpu_backend_with(*k), s); })
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  std::unique_ptr<Backend> probe;
  if (create_backend("cpu-reference", &probe).ok())
    benchmark::RegisterBenchmark(("decode/cpu-reference/" + shape_name(small)).c_str(),
                                 [small](benchmark::State& st) {
                                   std::unique_ptr<Backend> b;
                                   (void)create_backend("cpu-reference", &b);
                                   bm_decode(st, std::move(b), small);
                                 })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
}

}  // namespace
}  // namespace mladcp::bench

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  mladcp::bench::register_all();
  mladcp::bench::SummaryReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
