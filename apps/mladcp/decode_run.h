// One MLA decode step on a synthetic problem: timing, traffic and FLOP accounting, and the comparison
// with the cpu-reference oracle. Shared by `mladcp decode` and `mladcp demo`.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "mladcp/backend.h"
#include "mladcp/status.h"
#include "testkit/synthetic.h"

namespace mladcp::cli {

struct DecodeOptions {
  std::string backend;  // empty: best_available_backend()
  int heads = 128;      // H, all query heads (DeepSeek-V3)
  int batch = 4;        // sequences
  int context = 4096;   // global length of every sequence (including the q_len new tokens)
  int q_len = 1;
  int block_size = 64;
  std::string kv_dtype = "bf16";                    // bf16 | fp8
  std::string out_dtype = "bf16";                   // bf16 | fp32
  std::string lse_base = "e";                       // e | 2
  bool no_lse = false;                              // ask the kernel for no LSE
  std::string split_policy = "fill";                // invariant | fill (device backends' split-KV plan)
  int dcp_world = 1, dcp_rank = 0, interleave = 1;  // decode the shard of rank dcp_rank
  int iters = 0;    // timed runs after one warm-up; 0: as many as fit in about 2 s (1..100)
  int threads = 0;  // host backends: 0 = all hardware threads
  uint64_t seed = 1;
  bool check = false;  // compare with cpu-reference
};

struct CheckResult {
  bool pass = false;
  double out_max_abs_err = 0.0;
  double out_rel_err = 0.0;        // ||out - ref||_2 / ||ref||_2
  double out_rel_tolerance = 0.0;  // bound on out_rel_err, from the output dtype
  size_t out_bad = 0;              // elements outside the element-wise tolerance
  size_t out_unwritten = 0;        // elements the backend never wrote
  bool has_lse = false;
  double lse_max_abs_err = 0.0;  // over rows with finite LSE (empty rows must match -inf exactly)
  size_t lse_bad = 0;
  std::string detail;  // the element-wise comparison reports (for a failure)
  double oracle_seconds = 0.0;
};

struct DecodeReport {
  std::string backend;
  Device device = Device::kHost;
  std::string device_label;  // the GPU's name for device backends
  int threads = 0;           // host backends
  synthetic::Config config;
  DType out_dtype = DType::kBF16;
  bool lse = true;  // the kernel was asked for the LSE
  LseBase lse_base = LseBase::kE;
  SplitPolicy split_policy = SplitPolicy::kFillDevice;
  int iters = 0;
  std::vector<double> seconds;  // per timed run
  double median_seconds = 0.0, min_seconds = 0.0;
  double bytes = 0.0;  // KV bytes of this shard + q + out (+ LSE)
  double flops = 0.0;  // 2 · (576 + 512) per head, query token and visible key
  bool checked = false;
  CheckResult check;
};

// Runs the decode described by `opt`. Bad options give kInvalidArgument naming the flag; a failed
// check is reported in report->check (the Status stays ok).
Status run_decode(const DecodeOptions& opt, DecodeReport* report);

// Human-readable lines and JSON of a report.
std::string describe_backend(const DecodeReport& r);  // "cpu (host, 16 threads)", "cuda (NVIDIA H200)"
std::string describe_shape(const DecodeReport& r);
nlohmann::ordered_json report_json(const DecodeReport& r);

}  // namespace mladcp::cli
