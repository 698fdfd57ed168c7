// mladcp_dcp_emulate: the TP-realistic DCP grid on ONE GPU, and the planner's calibration.
//
// Grid (default): at a fixed number of heads per rank h (16: DeepSeek-V3 at TP 8; also 8 and 32), for
// W in {2, 4, 8}, T sequences in {1, 8, 64, 256} and contexts {32K, 128K, 512K}, one GPU emulates one
// DCP rank: it measures the rank's local decode (W·h gathered heads, as W head groups, over its shard of
// ceil(L/W) keys, fp32 partial states in the A2A layout) and the A2A merge of W states, and takes the
// query all-gather and the exchange from the calibration's NCCL figures for the same payload (2 H200:
// the measured curves; W > 2: the NVLink latency-bandwidth model). TP attention (h heads over the whole
// cache) is measured on the same GPU. Every row is labelled "emulated"; the planner's prediction of the
// same row is printed next to it.
//
// Calibration (--calibrate FILE): decode time over (heads, q_len, batch, keys, dtype) and merge time
// (both modes) on this GPU, written as a calibration file whose collectives, fabrics and step overhead
// are copied from --base (one GPU cannot measure NCCL).
//
//   mladcp_dcp_emulate --calibration data/calibration/h200-2026-12-01.json --markdown grid.md --json grid.json
//   mladcp_dcp_emulate --calibrate new.json --base data/calibration/h200-2026-12-01.json --commit abc1234
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cuda/decode_plan.h"
#include "emulate_timing.h"
#include "mladcp/plan.h"

namespace mladcp::emulate {
namespace {

struct Args {
  std::vector<int> heads{16, 8, 32};
  std::vector<int> worlds{2, 4, 8};
  std::vector<int64_t> tokens{1, 8, 64, 256};
  std::vector<int64_t> contexts{32768, 131072, 524288};
  std::string calibration = MLADCP_SOURCE_CALIBRATION;
  std::string markdown, json;
  std::string calibrate, base, commit = "unknown";
  double pool_gb = 4;
  TimingOptions timing;
};

[[noreturn]] void usage(const std::string& error) {
  if (!error.empty()) std::fprintf(stderr, "mladcp_dcp_emulate: %s\n", error.c_str());
  std::fprintf(stderr,
               "usage: mladcp_dcp_emulate [--heads-per-rank H,..] [--world W,..] [--tokens T,..] [--context L,..]\n"
               "       [--calibration FILE] [--markdown FILE] [--json FILE] [--samples N] [--warmup N]\n"
               "       [--pool-gb G] [--split-policy fill|invariant]\n"
               "   or: mladcp_dcp_emulate --calibrate OUT.json --base CALIBRATION.json [--commit HASH]\n");
  std::exit(2);
}

template <typename Int>
std::vector<Int> parse_list(const std::string& flag, const std::string& s) {
  std::vector<Int> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long long x = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || x < 1) usage(flag + ": not a list of positive integers: " + s);
    v.push_back(Int(x));
  }
  if (v.empty()) usage(flag + ": empty list");
  return v;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(k + " needs a value");
      return argv[++i];
    };
    if (k == "--heads-per-rank")
      a.heads = parse_list<int>(k, value());
    else if (k == "--world")
      a.worlds = parse_list<int>(k, value());
    else if (k == "--tokens")
      a.tokens = parse_list<int64_t>(k, value());
    else if (k == "--context")
      a.contexts = parse_list<int64_t>(k, value());
    else if (k == "--calibration")
      a.calibration = value();
    else if (k == "--markdown")
      a.markdown = value();
    else if (k == "--json")
      a.json = value();
    else if (k == "--calibrate")
      a.calibrate = value();
    else if (k == "--base")
      a.base = value();
    else if (k == "--commit")
      a.commit = value();
    else if (k == "--samples")
      a.timing.samples = parse_list<int>(k, value())[0];
    else if (k == "--warmup")
      a.timing.warmup = parse_list<int>(k, value())[0];
    else if (k == "--pool-gb")
      a.pool_gb = std::atof(value().c_str());
    else if (k == "--split-policy") {
      const std::string m = value();
      if (m == "fill")
        a.timing.split_policy = SplitPolicy::kFillDevice;
      else if (m == "invariant")
        a.timing.split_policy = SplitPolicy::kBatchInvariant;
      else
        usage("--split-policy: accepted fill, invariant; got " + m);
    } else if (k == "--help" || k == "-h")
      usage("");
    else
      usage("unknown argument " + k);
  }
  if (!(a.pool_gb > 0.1)) usage("--pool-gb must be > 0.1");
  if (!a.calibrate.empty() && a.base.empty())
    usage("--calibrate needs --base (the calibration whose collectives it keeps)");
  return a;
}

void die(const Status& s, const std::string& what) {
  if (s.ok()) return;
  std::fprintf(stderr, "mladcp_dcp_emulate: %s: %s\n", what.c_str(), s.to_string().c_str());
  std::exit(1);
}

std::string fixed(double v, int d) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", d, v);
  return b;
}

std::string pct(double e) {
  char b[32];
  std::snprintf(b, sizeof b, "%+.1f%%", 100 * e);
  return b;
}

std::string today_utc() {
  const std::time_t now = std::time(nullptr);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%d", std::gmtime(&now));
  return b;
}

struct Row {
  int h = 0, w = 0;
  int64_t t = 0, ctx = 0, shard_keys = 0;
  double q_ag = 0, attn = 0, exch = 0, merge = 0, overhead = 0, step = 0, tp = 0;
  double kv_dcp = 0, kv_tp = 0;  // bytes per GPU and layer
  plan::StepPrediction pred;
  bool graph = false;
};

int run_grid(const Args& a) {
  plan::Calibration cal;
  die(plan::load_calibration(a.calibration, &cal), "calibration");
  plan::PerfModel model;
  die(plan::PerfModel::create(cal, &model), "calibration");
  std::unique_ptr<Bench> bench;
  die(Bench::create(a.pool_gb, a.timing, &bench), "set-up");
  std::fprintf(stderr, "mladcp_dcp_emulate: %s, %d SMs; calibration %s (%s, commit %s)\n", bench->device().name.c_str(),
               bench->device().multiprocessors, a.calibration.c_str(), cal.date.c_str(), cal.commit.c_str());
  const auto start = std::chrono::steady_clock::now();
  std::vector<Row> rows;
  for (int h : a.heads) {
    for (int64_t ctx : a.contexts) {
      for (int64_t t : a.tokens) {
        Timing tp;
        die(bench->time_decode({h, 1, 1, t, ctx, 1, DType::kBF16}, &tp), "TP attention");
        for (int w : a.worlds) {
          Row r;
          r.h = h, r.w = w, r.t = t, r.ctx = ctx, r.tp = tp.median_us;
          r.shard_keys = sharding::local_len(ctx, w, 0, 1);
          Timing attn, merge;
          die(bench->time_decode({w * h, w, 1, t, ctx, w, DType::kBF16}, &attn, w, &merge), "shard decode");
          r.attn = attn.median_us, r.merge = merge.median_us, r.graph = attn.graph && tp.graph;
          const double rows_ = double(t) * h;
          die(model.collective_us({plan::CollectiveOp::kAllGather, w, w * rows_ * 576 * 2, 0}, &r.q_ag),
              "q all-gather");
          die(model.collective_us({plan::CollectiveOp::kAllToAll, w, w * rows_ * 513 * 4, 0}, &r.exch), "exchange");
          r.overhead = model.step_overhead_us(DcpMergeMode::kAllToAll);
          r.step = r.q_ag + r.attn + r.exch + r.merge + r.overhead;
          die(plan::kv_bytes_per_gpu({t, ctx, w, 64, 1, DType::kBF16}, &r.kv_dcp), "kv bytes");
          die(plan::kv_bytes_per_gpu({t, ctx, 1, 64, 1, DType::kBF16}, &r.kv_tp), "kv bytes");
          die(plan::predict_step({w, h, 1, t, ctx, DType::kBF16, DcpMergeMode::kAllToAll, 0}, model, &r.pred),
              "prediction");
          rows.push_back(r);
          std::fprintf(stderr,
                       "  h %d W %d T %lld ctx %lld: step %.1f us (attn %.1f, merge %.1f), TP attn %.1f, %.2fx\n", h, w,
                       (long long)t, (long long)ctx, r.step, r.attn, r.merge, r.tp, r.step / r.tp);
        }
      }
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::ostringstream md;
  md << "## DCP step emulated on one GPU (" << bench->device().name << "), heads per rank fixed\n\n"
     << "Every row is **emulated**: one GPU runs one rank's local decode (W·h gathered heads as W head groups over "
        "ceil(L/W) keys, fp32 partial states in the A2A layout) and the A2A merge of W states, both measured (device "
        "time, CUDA graph replay, L2 flushed before each call, median of "
     << a.timing.samples << " after " << a.timing.warmup << " warm-ups, split policy "
     << split_policy_name(a.timing.split_policy)
     << "); the query all-gather and the exchange are the NCCL figures of the calibration for the same payload "
        "(W = 2: the curves measured on 2 H200; W > 2: the NVLink latency-bandwidth model), plus the calibrated step "
        "overhead. TP attn: h heads over the whole cache, measured on the same GPU. KV per GPU: one layer, T "
        "sequences. Predicted: `mladcp plan`'s model (calibration "
     << cal.date << ", commit " << cal.commit << "). Times in µs.\n\n"
     << "| kind | h/rank | W | T | ctx | gathered | shard keys | step | q AG | attn | exch | merge | (exch+merge)/attn "
        "| TP attn | step/TP | KV/GPU DCP MB | KV/GPU TP MB | predicted step | error | predicted attn | attn error |\n"
     << "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const Row& r : rows) {
    md << "| emulated | " << r.h << " | " << r.w << " | " << r.t << " | " << r.ctx << " | " << r.w * r.h << " | "
       << r.shard_keys << " | " << fixed(r.step, 1) << " | " << fixed(r.q_ag, 1) << " | " << fixed(r.attn, 1) << " | "
       << fixed(r.exch, 1) << " | " << fixed(r.merge, 1) << " | " << fixed(100 * (r.exch + r.merge) / r.attn, 0)
       << "% | " << fixed(r.tp, 1) << " | " << fixed(r.step / r.tp, 2) << " | " << fixed(r.kv_dcp / 1e6, 1) << " | "
       << fixed(r.kv_tp / 1e6, 1) << " | " << fixed(r.pred.step_us, 1) << " | " << pct(r.pred.step_us / r.step - 1)
       << " | " << fixed(r.pred.attention_us, 1) << " | " << pct(r.pred.attention_us / r.attn - 1) << " |\n";
  }
  md << "\n" << rows.size() << " rows in " << fixed(secs, 1) << " s.\n";
  std::fputs(md.str().c_str(), stdout);
  if (!a.markdown.empty()) std::ofstream(a.markdown) << md.str();
  if (!a.json.empty()) {
    std::ofstream j(a.json);
    j << "{\n  \"device\": \"" << bench->device().name << "\",\n  \"emulated\": true,\n  \"calibration\": \""
      << cal.date << " " << cal.commit << "\",\n  \"split_policy\": \"" << split_policy_name(a.timing.split_policy)
      << "\",\n  \"rows\": [\n";
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      j << "    {\"kind\": \"emulated\", \"heads_per_rank\": " << r.h << ", \"world\": " << r.w
        << ", \"tokens\": " << r.t << ", \"context\": " << r.ctx << ", \"shard_keys\": " << r.shard_keys
        << ", \"step_us\": " << r.step << ", \"q_all_gather_us\": " << r.q_ag << ", \"attention_us\": " << r.attn
        << ", \"exchange_us\": " << r.exch << ", \"merge_us\": " << r.merge << ", \"overhead_us\": " << r.overhead
        << ", \"tp_attention_us\": " << r.tp << ", \"kv_bytes_per_gpu_dcp\": " << r.kv_dcp
        << ", \"kv_bytes_per_gpu_tp\": " << r.kv_tp << ", \"predicted_step_us\": " << r.pred.step_us
        << ", \"predicted_attention_us\": " << r.pred.attention_us
        << ", \"predicted_tp_attention_us\": " << r.pred.tp_attention_us
        << ", \"graph\": " << (r.graph ? "true" : "false") << "}" << (i + 1 < rows.size() ? "," : "") << "\n";
    }
    j << "  ]\n}\n";
  }
  return 0;
}

int run_calibrate(const Args& a) {
  plan::Calibration cal;
  die(plan::load_calibration(a.base, &cal), "--base");
  std::unique_ptr<Bench> bench;
  die(Bench::create(a.pool_gb, a.timing, &bench), "set-up");
  const DeviceInfo& dev = bench->device();
  const std::string src = "mladcp_dcp_emulate --calibrate (" + today_utc() + ", commit " + a.commit +
                          ", split policy " + split_policy_name(a.timing.split_policy) + ", L2 flushed, median of " +
                          std::to_string(a.timing.samples) + ")";
  cal.kernel.clear();
  cal.merge.clear();
  struct Shape {
    int64_t batch, keys;
  };
  const Shape shapes[] = {{1, 16384},  {1, 65536},  {1, 262144}, {8, 16384},
                          {8, 131072}, {32, 32768}, {64, 4096},  {128, 8192}};
  struct Rows {
    int heads, q_len;
    DType dtype;
  };
  const Rows kinds[] = {{8, 1, DType::kBF16},     {16, 1, DType::kBF16},    {32, 1, DType::kBF16},
                        {64, 1, DType::kBF16},    {128, 1, DType::kBF16},   {256, 1, DType::kBF16},
                        {16, 2, DType::kBF16},    {64, 2, DType::kBF16},    {128, 2, DType::kBF16},
                        {16, 1, DType::kFP8E4M3}, {16, 2, DType::kFP8E4M3}, {64, 1, DType::kFP8E4M3},
                        {128, 1, DType::kFP8E4M3}};
  for (const Rows& k : kinds) {
    for (const Shape& s : shapes) {
      Timing t;
      die(bench->time_decode({k.heads, 1, k.q_len, s.batch, s.keys, 1, k.dtype}, &t), "kernel point");
      cal.kernel.push_back({k.heads, k.q_len, s.batch, s.keys, k.dtype, t.median_us, src});
      std::fprintf(stderr, "  kernel %d heads q_len %d %s batch %lld keys %lld: %.1f us\n", k.heads, k.q_len,
                   dtype_name(k.dtype), (long long)s.batch, (long long)s.keys, t.median_us);
    }
  }
  for (int w : {2, 4, 8}) {
    for (int64_t t : {1, 8, 64, 256}) {
      const int h = 64 / w * 2;  // the heads of one rank of a 128-head model
      Timing d, m, r;
      die(bench->time_decode({w * h, w, 1, t, 1024 * w, w, DType::kBF16}, &d, w, &m), "merge point");
      cal.merge.push_back({DcpMergeMode::kAllToAll, w, t * h, m.median_us, src});
      die(bench->time_rescale_merge(w, t, h, &r), "rescale point");
      cal.merge.push_back({DcpMergeMode::kAllGatherReduceScatter, w, t * h, r.median_us, src});
      std::fprintf(stderr, "  merge W %d rows %lld: a2a %.1f us, ag-rs %.1f us\n", w, (long long)(t * h), m.median_us,
                   r.median_us);
    }
  }
  cal.gpu = dev.name + " (" + std::to_string(dev.multiprocessors) + " SMs); collectives: " + cal.gpu;
  cal.date = today_utc();
  cal.commit = a.commit;
  cal.produced_by =
      "tools/gpu/calibrate.sh (mladcp_dcp_emulate --calibrate); collectives, fabrics and step overhead "
      "copied from " +
      a.base;
  cal.device.name = dev.name;
  cal.device.sms = dev.multiprocessors;
  cal.device.memory_gb = double(dev.total_memory) / 1e9;
  // The cuda backend runs sequences of more rows than this on the Hopper kernel (sm_90).
  cal.device.two_per_sm_max_rows =
      dev.compute_major == 9 && dev.compute_minor == 0 ? cuda_plan::kPortableMaxRowsOnHopper : 32;
  cal.device.balanced_schedule = dev.compute_major == 9 && dev.compute_minor == 0;
  // fp8 caches of at most 32 rows per sequence: the Hopper fp8 kernel, one CTA per SM (the portable one: two).
  cal.device.fp8_small_ctas_per_sm = dev.compute_major == 9 && dev.compute_minor == 0 ? 1 : 2;
  plan::PerfModel check;
  die(plan::PerfModel::create(cal, &check), "the measured calibration");
  std::ofstream(a.calibrate) << plan::calibration_to_json(cal);
  std::fprintf(stderr, "mladcp_dcp_emulate: wrote %s (%zu kernel points, %zu merge points)\n", a.calibrate.c_str(),
               cal.kernel.size(), cal.merge.size());
  return 0;
}

}  // namespace
}  // namespace mladcp::emulate

int main(int argc, char** argv) {
  using namespace mladcp::emulate;
  const Args a = parse(argc, argv);
  int count = 0;
  if (!mladcp::device_count(&count).ok() || count == 0) {
    std::fprintf(stderr, "mladcp_dcp_emulate: no CUDA device: nothing to measure (exit 77, a skip for ctest)\n");
    return 77;
  }
  return a.calibrate.empty() ? run_grid(a) : run_calibrate(a);
}
