// Device-time benchmark of the "cuda" MLA decode on the configuration grid of
// shared/reference/performance-anchors.md (bf16 cache, page 64, q_len 1), plus q_len 2 and fp8 rows.
//
// Method: random data (never zeros); key caches of at least 200 MB per configuration (smaller ones
// are replicated and the calls rotate over the replicas, so no call reads from L2 what the previous
// one left there); warm-up, then every timed call is queued behind a spin kernel so that host launch
// overhead is not counted ("queued"), and, separately, each call is a CUDA graph replayed behind a
// spin kernel ("graph"); the median of the samples is reported. The device-to-device copy and a bf16
// GEMM (cuBLAS, 8192³) are measured in the same run as ceilings.
//
// Usage: mladcp_gpu_bench [--reps N] [--warmup N] [--json FILE] [--md FILE] [--quick]
//                         [--only H,B,CTX,QLEN,KV] [--no-ceilings]
// --only runs one configuration (KV: bf16 or fp8), e.g. under a profiler.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_util.cuh"
#include "core/numeric.h"
#include "mladcp/backend.h"
#include "mladcp/config.h"

namespace {

struct Options {
  int reps = 30, warmup = 5;
  bool quick = false, ceilings = true;
  std::string json, md, only;
};

struct Ceilings {
  double copy_gbs = 0, gemm_tflops = 0;
};

// Device-to-device copy: bytes read + written per second.
double measure_copy(cudaStream_t s, int reps) {
  const size_t bytes = size_t(2) << 30;
  void *a = nullptr, *b = nullptr;
  CHECK_CUDA(cudaMalloc(&a, bytes));
  CHECK_CUDA(cudaMalloc(&b, bytes));
  fill_random_bf16(a, bytes / 2, 1);
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  std::vector<double> t;
  for (int i = 0; i < reps + 3; ++i) {
    CHECK_CUDA(cudaEventRecord(e0, s));
    CHECK_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s));
    CHECK_CUDA(cudaEventRecord(e1, s));
    CHECK_CUDA(cudaEventSynchronize(e1));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    if (i >= 3) t.push_back(ms);
  }
  CHECK_CUDA(cudaFree(a));
  CHECK_CUDA(cudaFree(b));
  return 2.0 * double(bytes) / (median(t) * 1e-3) / 1e9;
}

// cuBLAS bf16 GEMM, fp32 accumulation, 8192³, random inputs.
double measure_gemm(cudaStream_t s, int reps) {
  const int n = 8192;
  void *a, *b, *c;
  const size_t bytes = size_t(n) * n * 2;
  CHECK_CUDA(cudaMalloc(&a, bytes));
  CHECK_CUDA(cudaMalloc(&b, bytes));
  CHECK_CUDA(cudaMalloc(&c, bytes));
  fill_random_bf16(a, size_t(n) * n, 2);
  fill_random_bf16(b, size_t(n) * n, 3);
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cublasCreate failed\n");
    std::exit(1);
  }
  cublasSetStream(h, s);
  const float alpha = 1.0f, beta = 0.0f;
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  std::vector<double> t;
  for (int i = 0; i < reps + 3; ++i) {
    CHECK_CUDA(cudaEventRecord(e0, s));
    const cublasStatus_t st =
        cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a, CUDA_R_16BF, n, b, CUDA_R_16BF, n, &beta, c,
                     CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) {
      std::fprintf(stderr, "cublasGemmEx failed: %d\n", int(st));
      std::exit(1);
    }
    CHECK_CUDA(cudaEventRecord(e1, s));
    CHECK_CUDA(cudaEventSynchronize(e1));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    if (i >= 3) t.push_back(ms);
  }
  cublasDestroy(h);
  CHECK_CUDA(cudaFree(a));
  CHECK_CUDA(cudaFree(b));
  CHECK_CUDA(cudaFree(c));
  return 2.0 * double(n) * n * n / (median(t) * 1e-3) / 1e12;
}

struct Config {
  int heads, batch, ctx, q_len;
  mladcp::DType kv;
  double flashmla_us, fa3_us, triton_us;  // anchors (bf16, q_len 1 only); 0 = none
};

struct Result {
  Config cfg;
  double us_queued = 0, us_graph = 0, us_queued_min = 0;
  double bytes = 0, flops = 0;
  int replicas = 1;
  size_t workspace = 0;
};

// performance-anchors.md, measured on one H200 on 2026-11-29 (device time, µs).
std::vector<Config> anchor_grid() {
  return {
      {16, 128, 4096, 1, mladcp::DType::kBF16, 150.5, 161.5, 236.3},
      {16, 32, 32768, 1, mladcp::DType::kBF16, 290.4, 294.4, 694.5},
      {16, 4, 131072, 1, mladcp::DType::kBF16, 159.2, 161.5, 2644.3},
      {64, 64, 8192, 1, mladcp::DType::kBF16, 166.5, 176.4, 857.1},
      {128, 64, 4096, 1, mladcp::DType::kBF16, 123.8, 139.4, 871.1},
      {128, 32, 16384, 1, mladcp::DType::kBF16, 239.8, 254.3, 1638.8},
      {128, 16, 65536, 1, mladcp::DType::kBF16, 443.9, 471.3, 3289.6},
      {128, 128, 1024, 1, mladcp::DType::kBF16, 71.2, 102.9, 527.4},
      {128, 128, 8192, 1, mladcp::DType::kBF16, 468.5, 496.5, 3439.6},
  };
}

Result run_config(mladcp::Backend& be, const Config& c, const Options& o, cudaStream_t stream) {
  using namespace mladcp;
  Result r;
  r.cfg = c;
  const int bs = 64;
  const size_t esize = dtype_size(c.kv);
  const int blocks_per_seq = (c.ctx + bs - 1) / bs;
  const size_t kv_bytes = size_t(c.batch) * c.ctx * kQkDim * esize;
  r.replicas = int(std::max<size_t>(1, (size_t(200) * 1000 * 1000 + kv_bytes - 1) / kv_bytes));
  const int64_t blocks = int64_t(r.replicas) * c.batch * blocks_per_seq;
  const size_t pool_bytes = size_t(blocks) * bs * kQkDim * esize;
  const int T = c.batch * c.q_len;

  void *kv = nullptr, *q = nullptr, *out = nullptr, *lse = nullptr, *tables = nullptr, *lens = nullptr, *ws = nullptr;
  CHECK_CUDA(cudaMalloc(&kv, pool_bytes));
  if (c.kv == DType::kFP8E4M3) {
    fill_fp8<<<2048, 256>>>(static_cast<uint8_t*>(kv), pool_bytes, 11);
  } else {
    fill_random_bf16(kv, pool_bytes / 2, 11);
  }
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaMalloc(&q, size_t(T) * c.heads * kQkDim * 2));
  fill_random_bf16(q, size_t(T) * c.heads * kQkDim, 12);
  CHECK_CUDA(cudaMalloc(&out, size_t(T) * c.heads * kLatentDim * 2));
  CHECK_CUDA(cudaMalloc(&lse, size_t(T) * c.heads * 4));
  // A permuted block table per replica over disjoint blocks.
  std::vector<int32_t> ids(static_cast<size_t>(blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::mt19937_64 rng(1234);
  std::shuffle(ids.begin(), ids.end(), rng);
  CHECK_CUDA(cudaMalloc(&tables, ids.size() * 4));
  CHECK_CUDA(cudaMemcpy(tables, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
  std::vector<int32_t> seq_lens(size_t(c.batch), c.ctx);
  CHECK_CUDA(cudaMalloc(&lens, seq_lens.size() * 4));
  CHECK_CUDA(cudaMemcpy(lens, seq_lens.data(), seq_lens.size() * 4, cudaMemcpyHostToDevice));

  MlaDecodeParams p;
  p.num_seqs = c.batch;
  p.q_len = c.q_len;
  p.num_heads = c.heads;
  p.q = q;
  p.kv_cache = kv;
  p.kv_dtype = c.kv;
  p.kv_scale = c.kv == DType::kFP8E4M3 ? 0.125f : 1.0f;
  p.num_blocks = int(blocks);
  p.block_size = bs;
  p.max_blocks_per_seq = blocks_per_seq;
  p.seq_lens = static_cast<const int32_t*>(lens);
  p.max_seq_len = c.ctx;
  p.softmax_scale = 0.07216878364870322f;
  p.out = out;
  p.out_dtype = DType::kBF16;
  p.lse = static_cast<float*>(lse);
  p.lse_base = LseBase::kE;
  r.workspace = be.workspace_bytes(p);
  if (r.workspace) CHECK_CUDA(cudaMalloc(&ws, r.workspace));
  ExecContext ctx;
  ctx.stream = stream;
  ctx.workspace = ws;
  ctx.workspace_size = r.workspace;
  auto params_for = [&](int i) {
    MlaDecodeParams pi = p;
    pi.block_table = static_cast<const int32_t*>(tables) + size_t(i % r.replicas) * c.batch * blocks_per_seq;
    return pi;
  };

  for (int i = 0; i < o.warmup; ++i) CHECK_OK(be.decode(params_for(i), ctx));
  CHECK_CUDA(cudaStreamSynchronize(stream));

  std::vector<cudaEvent_t> ev(size_t(o.reps) + 1);
  for (auto& e : ev) CHECK_CUDA(cudaEventCreate(&e));
  const long long spin_cycles = 20LL * 1000 * 1000;  // ~10 ms: enough to queue every call behind it

  // Queued: e0 call e1 call e2 ... behind one spin kernel.
  spin<<<1, 1, 0, stream>>>(spin_cycles);
  CHECK_CUDA(cudaEventRecord(ev[0], stream));
  for (int i = 0; i < o.reps; ++i) {
    CHECK_OK(be.decode(params_for(i), ctx));
    CHECK_CUDA(cudaEventRecord(ev[size_t(i) + 1], stream));
  }
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<double> t;
  for (int i = 0; i < o.reps; ++i) {
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, ev[size_t(i)], ev[size_t(i) + 1]));
    t.push_back(ms * 1e3);
  }
  r.us_queued = median(t);
  r.us_queued_min = *std::min_element(t.begin(), t.end());

  // Graph: one graph per replica, each holding one decode call; replays queued behind a spin kernel.
  std::vector<cudaGraphExec_t> execs(size_t(r.replicas));
  for (int i = 0; i < r.replicas; ++i) {
    cudaGraph_t g;
    CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    CHECK_OK(be.decode(params_for(i), ctx));
    CHECK_CUDA(cudaStreamEndCapture(stream, &g));
    CHECK_CUDA(cudaGraphInstantiate(&execs[size_t(i)], g, 0));
    CHECK_CUDA(cudaGraphDestroy(g));
    CHECK_CUDA(cudaGraphLaunch(execs[size_t(i)], stream));  // warm
  }
  spin<<<1, 1, 0, stream>>>(spin_cycles);
  CHECK_CUDA(cudaEventRecord(ev[0], stream));
  for (int i = 0; i < o.reps; ++i) {
    CHECK_CUDA(cudaGraphLaunch(execs[size_t(i % r.replicas)], stream));
    CHECK_CUDA(cudaEventRecord(ev[size_t(i) + 1], stream));
  }
  CHECK_CUDA(cudaStreamSynchronize(stream));
  t.clear();
  for (int i = 0; i < o.reps; ++i) {
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, ev[size_t(i)], ev[size_t(i) + 1]));
    t.push_back(ms * 1e3);
  }
  r.us_graph = median(t);
  for (auto& e : execs) CHECK_CUDA(cudaGraphExecDestroy(e));
  for (auto& e : ev) CHECK_CUDA(cudaEventDestroy(e));

  // Sanity: the output is finite (random data, so a broken kernel shows as NaN or garbage).
  std::vector<uint16_t> host_out(size_t(T) * c.heads * kLatentDim);
  CHECK_CUDA(cudaMemcpy(host_out.data(), out, host_out.size() * 2, cudaMemcpyDeviceToHost));
  for (uint16_t v : host_out)
    if ((v & 0x7f80) == 0x7f80) {
      std::fprintf(stderr, "non-finite output in configuration h=%d b=%d ctx=%d\n", c.heads, c.batch, c.ctx);
      std::exit(1);
    }

  r.bytes = double(kv_bytes) + double(T) * c.heads * (kQkDim * 2 + kLatentDim * 2);
  r.flops = 2.0 * c.batch * c.heads * double(c.q_len) * c.ctx * 1088.0;
  for (void* b : {kv, q, out, lse, tables, lens, ws})
    if (b) CHECK_CUDA(cudaFree(b));
  return r;
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--reps")
      o.reps = std::atoi(next().c_str());
    else if (a == "--warmup")
      o.warmup = std::atoi(next().c_str());
    else if (a == "--json")
      o.json = next();
    else if (a == "--md")
      o.md = next();
    else if (a == "--quick")
      o.quick = true;
    else if (a == "--no-ceilings")
      o.ceilings = false;
    else if (a == "--only")
      o.only = next();
    else {
      std::fprintf(stderr,
                   "usage: %s [--reps N] [--warmup N] [--json FILE] [--md FILE] [--quick] [--only H,B,CTX,QLEN,KV] "
                   "[--no-ceilings]\n",
                   argv[0]);
      return 2;
    }
  }
  if (o.reps < 3) o.reps = 3;
  int dev = 0;
  CHECK_CUDA(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, dev));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  Ceilings ceil;
  ceil.copy_gbs = o.ceilings ? measure_copy(stream, 10) : 4200.0;
  ceil.gemm_tflops = o.ceilings ? measure_gemm(stream, 10) : 763.0;

  std::unique_ptr<mladcp::Backend> be;
  CHECK_OK(mladcp::create_backend("cuda", &be));

  std::vector<Config> grid = anchor_grid();
  const size_t anchors = grid.size();
  for (size_t i = 0; i < anchors; ++i) {
    Config c = grid[i];
    c.q_len = 2;
    c.flashmla_us = c.fa3_us = c.triton_us = 0;
    grid.push_back(c);
  }
  for (size_t i = 0; i < anchors; ++i) {
    Config c = grid[i];
    c.kv = mladcp::DType::kFP8E4M3;
    c.flashmla_us = c.fa3_us = c.triton_us = 0;
    grid.push_back(c);
  }
  if (o.quick) grid.resize(anchors);
  if (!o.only.empty()) {
    Config c{};
    char kv[16] = {0};
    if (std::sscanf(o.only.c_str(), "%d,%d,%d,%d,%15s", &c.heads, &c.batch, &c.ctx, &c.q_len, kv) != 5) {
      std::fprintf(stderr, "--only expects H,B,CTX,QLEN,KV (KV: bf16 or fp8), got '%s'\n", o.only.c_str());
      return 2;
    }
    c.kv = std::string(kv) == "fp8" ? mladcp::DType::kFP8E4M3 : mladcp::DType::kBF16;
    for (const Config& a : anchor_grid())
      if (a.heads == c.heads && a.batch == c.batch && a.ctx == c.ctx && c.q_len == 1 && c.kv == a.kv) c = a;
    grid = {c};
  }

  std::vector<Result> results;
  for (const Config& c : grid) {
    results.push_back(run_config(*be, c, o, stream));
    const Result& r = results.back();
    std::fprintf(stderr, "h=%d b=%d ctx=%d q_len=%d %s: %.1f us queued, %.1f us graph\n", c.heads, c.batch, c.ctx,
                 c.q_len, mladcp::dtype_name(c.kv), r.us_queued, r.us_graph);
  }

  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  std::string md;
  md += std::string("# mladcp cuda decode, ") + prop.name + ", " + date + "\n\n";
  md += std::string(o.ceilings ? "Ceilings measured in this run" : "Ceilings (anchors, not measured in this run)") +
        ": device-to-device copy " + fmt("%.0f", ceil.copy_gbs) + " GB/s (read + write), cuBLAS bf16 GEMM 8192^3 " +
        fmt("%.1f", ceil.gemm_tflops) + " TFLOP/s.\n";
  md += "Device time, median of " + std::to_string(o.reps) +
        " calls after warm-up; `queued` = calls queued behind a spin kernel, `graph` = one CUDA graph per call. "
        "GB/s counts KV + q + out once; TFLOP/s counts 2*b*h*q_len*ctx*1088. bf16 out with natural-log LSE, "
        "page 64, permuted block table, equal lengths. Anchors (FlashMLA, FA3, vLLM Triton MLA) from "
        "performance-anchors.md, same GPU model.\n\n";
  md +=
      "| kv | q_len | h_q | b | ctx | ours µs (queued) | ours µs (graph) | GB/s | % copy | TFLOP/s | % GEMM | "
      "FlashMLA µs | FA3 µs | vLLM Triton µs | vs Triton |\n";
  md += "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const Result& r : results) {
    const Config& c = r.cfg;
    const double us = r.us_queued;
    const double gbs = r.bytes / (us * 1e-6) / 1e9, tfs = r.flops / (us * 1e-6) / 1e12;
    md += std::string("| ") + mladcp::dtype_name(c.kv) + " | " + std::to_string(c.q_len) + " | " +
          std::to_string(c.heads) + " | " + std::to_string(c.batch) + " | " + std::to_string(c.ctx) + " | " +
          fmt("%.1f", us) + " | " + fmt("%.1f", r.us_graph) + " | " + fmt("%.0f", gbs) + " | " +
          fmt("%.0f%%", 100.0 * gbs / ceil.copy_gbs) + " | " + fmt("%.1f", tfs) + " | " +
          fmt("%.0f%%", 100.0 * tfs / ceil.gemm_tflops) + " | " + (c.flashmla_us ? fmt("%.1f", c.flashmla_us) : "") +
          " | " + (c.fa3_us ? fmt("%.1f", c.fa3_us) : "") + " | " + (c.triton_us ? fmt("%.1f", c.triton_us) : "") +
          " | " + (c.triton_us ? fmt("%.2fx", c.triton_us / us) : "") + " |\n";
  }
  std::printf("%s", md.c_str());
  if (!o.md.empty()) {
    if (FILE* f = std::fopen(o.md.c_str(), "w")) {
      std::fputs(md.c_str(), f);
      std::fclose(f);
    }
  }
  if (!o.json.empty()) {
    if (FILE* f = std::fopen(o.json.c_str(), "w")) {
      std::fprintf(f, "{\n  \"gpu\": \"%s\",\n  \"date\": \"%s\",\n  \"reps\": %d,\n", prop.name, date, o.reps);
      std::fprintf(f, "  \"copy_gbs\": %.1f,\n  \"gemm_tflops\": %.2f,\n  \"results\": [\n", ceil.copy_gbs,
                   ceil.gemm_tflops);
      for (size_t i = 0; i < results.size(); ++i) {
        const Result& r = results[i];
        const Config& c = r.cfg;
        std::fprintf(f,
                     "    {\"kv\": \"%s\", \"q_len\": %d, \"heads\": %d, \"batch\": %d, \"ctx\": %d, "
                     "\"us_queued\": %.2f, \"us_queued_min\": %.2f, \"us_graph\": %.2f, \"bytes\": %.0f, "
                     "\"flops\": %.0f, \"replicas\": %d, \"workspace_bytes\": %zu, \"flashmla_us\": %.1f, "
                     "\"fa3_us\": %.1f, \"triton_us\": %.1f}%s\n",
                     mladcp::dtype_name(c.kv), c.q_len, c.heads, c.batch, c.ctx, r.us_queued, r.us_queued_min,
                     r.us_graph, r.bytes, r.flops, r.replicas, r.workspace, c.flashmla_us, c.fa3_us, c.triton_us,
                     i + 1 < results.size() ? "," : "");
      }
      std::fprintf(f, "  ]\n}\n");
      std::fclose(f);
    }
  }
  // Short summary (the last lines of the output): worst ratio against vLLM Triton.
  double worst = 1e9;
  for (const Result& r : results)
    if (r.cfg.triton_us) worst = std::min(worst, r.cfg.triton_us / r.us_queued);
  std::printf("\nslowest speedup over vLLM Triton MLA on the anchor grid: %.2fx\n", worst);
  CHECK_CUDA(cudaStreamDestroy(stream));
  return 0;
}
