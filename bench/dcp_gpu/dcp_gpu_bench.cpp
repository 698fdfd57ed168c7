// mladcp_dcp_gpu_bench: DCP decode on W GPUs over NCCL. Checks the step against single-GPU decode and
// measures its device time per phase (query all-gather, attention, exchange, merge), eager and as a
// CUDA graph, next to W = 1 (the whole cache and all heads on one GPU) and to tensor-parallel
// attention (the whole cache, H/W heads: what each GPU computes without DCP).
//
// Launch: under mpirun (one process per GPU, device = local rank; needs a build with MPI), or as one
// process driving --gpus N devices with one thread each. Examples:
//   mpirun -np 2 --allow-run-as-root mladcp_dcp_gpu_bench --check
//   mladcp_dcp_gpu_bench --gpus 2 --grid --markdown dcp.md --json dcp.json
//   mladcp_dcp_gpu_bench --gpus 2 --tokens 8 --context 131072 --merge ag-rs
#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "mladcp/nccl.h"
#include "testkit/nccl_dcp_runner.h"

namespace mladcp::dcp_gpu {
namespace {

using namespace std::chrono_literals;

struct Args {
  int gpus = 0;  // thread mode: devices used (0: all visible)
  bool check = false, grid = false;
  std::vector<int> tokens{8};
  std::vector<int> contexts{32768};
  std::vector<DcpMergeMode> merges{DcpMergeMode::kAllToAll, DcpMergeMode::kAllGatherReduceScatter};
  // Split-KV plan of the local decode (timing: DCP rows and their W=1 / TP baselines; --check runs
  // both policies whatever this says).
  std::vector<SplitPolicy> policies{SplitPolicy::kFillDevice};
  int heads = 128;
  int block_size = 64;
  int interleave = 1;
  int samples = 50, warmup = 10;
  bool baselines = true;
  bool blocking = false;  // blocking NCCL communicators (default: non-blocking)
  std::string backend = "cuda";
  std::string markdown, json;
};

[[noreturn]] void usage(const char* error) {
  if (error) std::fprintf(stderr, "mladcp_dcp_gpu_bench: %s\n", error);
  std::fprintf(
      stderr,
      "usage: mladcp_dcp_gpu_bench [--gpus N] [--check] [--grid] [--tokens T,..] [--context L,..]\n"
      "       [--merge a2a|ag-rs|both] [--heads H] [--block-size N] [--interleave I] [--samples N]\n"
      "       [--warmup N] [--no-baselines] [--blocking-comm] [--backend NAME] [--markdown FILE] [--json FILE]\n"
      "       [--split-policy invariant|fill|both]\n"
      "  --check  DCP vs single-GPU decode: both merge modes, eager and CUDA graph, empty shards, q_len 2, fp8\n"
      "  --grid   timing grid T in {1, 8, 64} x context in {32768, 131072}, both merge modes\n"
      "  Without --check or --grid: one timing run per --tokens x --context x --merge x --split-policy.\n"
      "  --split-policy  split-KV plan of the local decode in the timing runs (default fill: the grid fills\n"
      "                  the GPU; invariant: results independent of the batch); --check runs both\n");
  std::exit(2);
}

std::vector<int> parse_ints(const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long x = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || x < 0) usage(("not a list of integers: " + s).c_str());
    v.push_back(int(x));
  }
  return v;
}

int parse_int(const std::string& s) {
  const std::vector<int> v = parse_ints(s);
  if (v.size() != 1) usage(("expected one integer, got '" + s + "'").c_str());
  return v[0];
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage((k + " needs a value").c_str());
      return argv[++i];
    };
    if (k == "--gpus")
      a.gpus = parse_int(value());
    else if (k == "--check")
      a.check = true;
    else if (k == "--grid")
      a.grid = true;
    else if (k == "--tokens")
      a.tokens = parse_ints(value());
    else if (k == "--context")
      a.contexts = parse_ints(value());
    else if (k == "--heads")
      a.heads = parse_int(value());
    else if (k == "--block-size")
      a.block_size = parse_int(value());
    else if (k == "--interleave")
      a.interleave = parse_int(value());
    else if (k == "--samples")
      a.samples = parse_int(value());
    else if (k == "--warmup")
      a.warmup = parse_int(value());
    else if (k == "--no-baselines")
      a.baselines = false;
    else if (k == "--blocking-comm")
      a.blocking = true;
    else if (k == "--backend")
      a.backend = value();
    else if (k == "--markdown")
      a.markdown = value();
    else if (k == "--json")
      a.json = value();
    else if (k == "--split-policy") {
      const std::string m = value();
      if (m == "invariant")
        a.policies = {SplitPolicy::kBatchInvariant};
      else if (m == "fill")
        a.policies = {SplitPolicy::kFillDevice};
      else if (m == "both")
        a.policies = {SplitPolicy::kFillDevice, SplitPolicy::kBatchInvariant};
      else
        usage(("--split-policy: accepted invariant, fill, both; got " + m).c_str());
    } else if (k == "--merge") {
      const std::string m = value();
      if (m == "both") {
        a.merges = {DcpMergeMode::kAllToAll, DcpMergeMode::kAllGatherReduceScatter};
      } else if (auto mode = parse_dcp_merge_mode(m)) {
        a.merges = {*mode};
      } else {
        usage(("--merge: accepted a2a, ag-rs, both; got " + m).c_str());
      }
    } else if (k == "--help" || k == "-h") {
      usage(nullptr);
    } else {
      usage(("unknown argument " + k).c_str());
    }
  }
  if (a.grid) {
    a.tokens = {1, 8, 64};
    a.contexts = {32768, 131072};
  }
  return a;
}

// ---- --check -------------------------------------------------------------------------------------

struct NamedCase {
  std::string name;
  CheckCase c;
};

std::vector<NamedCase> check_cases(const Args& a) {
  std::vector<NamedCase> cases;
  auto add = [&](const std::string& name, std::vector<int32_t> lens, int q_len, int interleave, DType kv,
                 uint64_t seed) {
    for (DcpMergeMode m : a.merges)
      for (SplitPolicy policy : {SplitPolicy::kBatchInvariant, SplitPolicy::kFillDevice})
        for (bool graph : {false, true}) {
          CheckCase c;
          c.problem.num_seqs = int(lens.size());
          c.problem.seq_lens = lens;
          c.problem.q_len = q_len;
          c.problem.num_heads = a.heads;
          c.problem.block_size = a.block_size;
          c.problem.kv_dtype = kv;
          c.problem.kv_scale = kv == DType::kFP8E4M3 ? 0.5f : 1.0f;
          c.problem.seed = seed;
          c.interleave = interleave;
          c.merge_mode = m;
          c.graph = graph;
          c.split_policy = policy;
          c.backend = a.backend;
          cases.push_back({name, c});
        }
  };
  add("mixed lengths", {4096, 1000, 77, 3000}, 1, 1, DType::kBF16, 1);
  add("empty shards (I=1)", {1, 2, 3, 65}, 1, 1, DType::kBF16, 2);
  add("empty shards (I=16)", {1, 16, 17, 40}, 1, 16, DType::kBF16, 3);
  add("q_len 2", {2, 3, 130, 2000}, 2, 1, DType::kBF16, 4);
  add("q_len 2 (I=16)", {2, 17, 18, 900}, 2, 16, DType::kBF16, 5);
  add("fp8 cache", {2048, 513, 5}, 1, 1, DType::kFP8E4M3, 6);
  return cases;
}

Status run_checks(RankGroup& g, const Args& a, bool* all_ok) {
  *all_ok = true;
  if (g.leader())
    std::printf(
        "## DCP check: W=%d vs single-GPU decode of the unsharded cache (backend %s, H=%d)\n\n"
        "| case | merge | split policy | mode | max rel err out | max abs err lse | result |\n"
        "|---|---|---|---|---:|---:|---|\n",
        g.world(), a.backend.c_str(), a.heads);
  for (const NamedCase& nc : check_cases(a)) {
    std::mutex mu;
    double worst[3] = {0, 0, 0};
    const Status s = g.each([&](NcclCommunicator& comm) -> Status {
      CheckResult r;
      MLADCP_RETURN_IF_ERROR(run_check(comm, nc.c, &r));
      if (!r.ok) std::fprintf(stderr, "rank %d: %s\n", comm.rank(), r.report.c_str());
      std::vector<double> v{r.ok ? 0.0 : 1.0, r.out.max_rel_err, r.lse.max_abs_err};
      MLADCP_RETURN_IF_ERROR(max_over_ranks(comm, &v, nc.c.deadline));
      std::lock_guard<std::mutex> lock(mu);
      for (int i = 0; i < 3; ++i) worst[i] = v[i];
      return Status::Ok();
    });
    if (!s.ok()) {
      if (g.leader())
        std::printf("| %s | %s | %s | %s | | | ERROR: %s |\n", nc.name.c_str(), dcp_merge_mode_name(nc.c.merge_mode),
                    split_policy_name(nc.c.split_policy), nc.c.graph ? "graph" : "eager", s.to_string().c_str());
      *all_ok = false;
      return s;
    }
    const bool ok = worst[0] == 0.0;
    *all_ok = *all_ok && ok;
    if (g.leader())
      std::printf("| %s | %s | %s | %s | %.3g | %.3g | %s |\n", nc.name.c_str(), dcp_merge_mode_name(nc.c.merge_mode),
                  split_policy_name(nc.c.split_policy), nc.c.graph ? "graph" : "eager", worst[1], worst[2],
                  ok ? "ok" : "MISMATCH");
    std::fflush(stdout);
  }
  if (g.leader()) std::printf("\ncheck: %s\n\n", *all_ok ? "PASSED" : "FAILED");
  return Status::Ok();
}

// ---- timing --------------------------------------------------------------------------------------

struct Row {
  int tokens = 0, context = 0;
  DcpMergeMode merge = DcpMergeMode::kAllToAll;
  SplitPolicy policy = SplitPolicy::kBatchInvariant;
  TimingResult dcp;         // max over ranks
  TimingResult single, tp;  // W = 1 with H heads, and with H/W heads (tensor-parallel attention)
  bool have_baselines = false;
};

TimingCase timing_case(const Args& a, int tokens, int context, DcpMergeMode merge, SplitPolicy policy) {
  TimingCase t;
  t.num_seqs = tokens;
  t.q_len = 1;
  t.num_heads = a.heads;
  t.context = context;
  t.block_size = a.block_size;
  t.interleave = a.interleave;
  t.merge_mode = merge;
  t.split_policy = policy;
  t.samples = a.samples;
  t.warmup = a.warmup;
  t.backend = a.backend;
  t.deadline = 120s;
  return t;
}

// W = 1 runs on the leader's GPU over a one-rank communicator of its own.
Status run_baselines(NcclCommunicator& world_comm, const Args& a, int tokens, int context, SplitPolicy policy,
                     Row* row) {
  if (world_comm.rank() == 0) {
    NcclOptions o;
    o.device = world_comm.device();
    std::unique_ptr<NcclCommunicator> solo;
    MLADCP_RETURN_IF_ERROR(create_nccl_communicator(
        0, 1, [](int, NcclUniqueId*) { return Status::Ok(); }, o, &solo));
    TimingCase t = timing_case(a, tokens, context, DcpMergeMode::kAllToAll, policy);
    t.eager_sync = false;  // nothing to wait for with one rank
    MLADCP_RETURN_IF_ERROR(run_timing(*solo, t, &row->single));
    t.num_heads = a.heads / world_comm.world_size();
    MLADCP_RETURN_IF_ERROR(run_timing(*solo, t, &row->tp));
    row->have_baselines = true;
  }
  return barrier(world_comm, 600s);  // the other ranks wait here while rank 0 measures
}

std::string fmt(double v, int precision = 1) {
  if (std::isnan(v)) return "n/a";
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", precision, v);
  return b;
}

std::string markdown(const std::vector<Row>& rows, int world, const Args& a) {
  std::ostringstream os;
  os << "## DCP step on " << world << " GPUs vs W=1 (backend " << a.backend << ", H=" << a.heads << ", block "
     << a.block_size << ", I=" << a.interleave << ", bf16 KV, q_len 1, " << (a.blocking ? "blocking" : "non-blocking")
     << " NCCL communicators; device time, median of " << a.samples << " after " << a.warmup
     << " warm-up, max over ranks)\n\n"
     << "Phases per layer in µs. eager-sync: the host waits (deadline-checked) after each exchange; eager: no host "
        "wait inside the step; graph: the whole step as one CUDA graph. W=1: all H heads over the whole cache on "
        "one GPU; TP attn: H/W heads over the whole cache (what each GPU computes under tensor parallelism); both "
        "with the row's split policy.\n\n"
     << "| T | ctx | merge | split policy | mode | step | q AG | attn | exch | merge | (exch+merge)/attn | W=1 step | "
        "TP attn | "
        "step W2/W1 | step/TP | KV/GPU W="
     << world << " GB | KV/GPU W=1 GB |\n"
     << "|---:|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const Row& r : rows) {
    const PhaseTimes* modes[] = {&r.dcp.eager_sync, &r.dcp.eager, &r.dcp.graph};
    const char* names[] = {"eager-sync", "eager", "graph"};
    for (int m = 0; m < 3; ++m) {
      const PhaseTimes& p = *modes[m];
      if (!p.measured) continue;
      const PhaseTimes& single = m == 2 ? r.single.graph : r.single.eager;
      const PhaseTimes& tp = m == 2 ? r.tp.graph : r.tp.eager;
      const double nan = std::nan("");
      const double w1 = r.have_baselines && single.measured ? single.step_us : nan;
      const double tpa = r.have_baselines && tp.measured ? tp.step_us : nan;
      os << "| " << r.tokens << " | " << r.context << " | " << dcp_merge_mode_name(r.merge) << " | "
         << split_policy_name(r.policy) << " | " << names[m] << " | " << fmt(p.step_us) << " | " << fmt(p.q_gather_us)
         << " | " << fmt(p.attention_us) << " | " << fmt(p.exchange_us) << " | " << fmt(p.merge_us) << " | "
         << fmt(100.0 * (p.exchange_us + p.merge_us) / p.attention_us, 0) << "% | " << fmt(w1) << " | " << fmt(tpa)
         << " | " << fmt(p.step_us / w1, 2) << " | " << fmt(p.step_us / tpa, 2) << " | "
         << fmt(double(r.dcp.kv_bytes_rank) / 1e9, 2) << " | "
         << fmt(r.have_baselines ? double(r.single.kv_bytes_rank) / 1e9 : nan, 2) << " |\n";
    }
  }
  std::string notes;
  for (const Row& r : rows)
    if (!r.dcp.note.empty())
      notes += "- T=" + std::to_string(r.tokens) + " ctx=" + std::to_string(r.context) + ": " + r.dcp.note + "\n";
  if (!notes.empty()) os << "\nNotes:\n" << notes;
  return os.str();
}

std::string json(const std::vector<Row>& rows, int world, const Args& a) {
  std::ostringstream os;
  auto num = [](double v) { return std::isnan(v) ? std::string("null") : fmt(v, 3); };
  auto phases = [&](const PhaseTimes& p) {
    if (!p.measured) return std::string("null");
    return "{\"step_us\": " + num(p.step_us) + ", \"q_gather_us\": " + num(p.q_gather_us) +
           ", \"attention_us\": " + num(p.attention_us) + ", \"exchange_us\": " + num(p.exchange_us) +
           ", \"merge_us\": " + num(p.merge_us) + ", \"samples\": " + std::to_string(p.samples) + "}";
  };
  os << "{\"world\": " << world << ", \"backend\": \"" << a.backend << "\", \"heads\": " << a.heads
     << ", \"block_size\": " << a.block_size << ", \"interleave\": " << a.interleave << ", \"nccl\": \""
     << nccl_version_string() << "\", \"rows\": [\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    os << "  {\"tokens\": " << r.tokens << ", \"context\": " << r.context << ", \"merge\": \""
       << dcp_merge_mode_name(r.merge) << "\", \"split_policy\": \"" << split_policy_name(r.policy)
       << "\", \"kv_bytes_per_gpu\": " << r.dcp.kv_bytes_rank << ", \"eager_sync\": " << phases(r.dcp.eager_sync)
       << ", \"eager\": " << phases(r.dcp.eager) << ", \"graph\": " << phases(r.dcp.graph);
    if (r.have_baselines)
      os << ", \"w1\": {\"eager\": " << phases(r.single.eager) << ", \"graph\": " << phases(r.single.graph)
         << ", \"kv_bytes\": " << r.single.kv_bytes_rank << "}, \"tp_attention\": {\"eager\": " << phases(r.tp.eager)
         << ", \"graph\": " << phases(r.tp.graph) << "}";
    os << "}" << (i + 1 < rows.size() ? "," : "") << "\n";
  }
  os << "]}\n";
  return os.str();
}

// `on_row` runs on the leader after each row (the outputs are rewritten, so a run cut short keeps its rows).
Status run_grid(RankGroup& g, const Args& a, std::vector<Row>* rows, const std::function<void()>& on_row) {
  for (int tokens : a.tokens)
    for (int context : a.contexts)
      for (SplitPolicy policy : a.policies) {
        Row base;
        base.tokens = tokens;
        base.context = context;
        base.policy = policy;
        for (size_t mi = 0; mi < a.merges.size(); ++mi) {
          Row row = base;
          row.merge = a.merges[mi];
          std::mutex mu;
          MLADCP_RETURN_IF_ERROR(g.each([&](NcclCommunicator& comm) -> Status {
            TimingResult r;
            MLADCP_RETURN_IF_ERROR(run_timing(comm, timing_case(a, tokens, context, row.merge, policy), &r));
            std::vector<double> v = to_vector(r);
            MLADCP_RETURN_IF_ERROR(max_over_ranks(comm, &v, 120s));
            from_vector(v, &r);
            if (comm.rank() == 0) {
              std::lock_guard<std::mutex> lock(mu);
              row.dcp = r;
            }
            // Baselines once per (T, ctx), after the first merge mode.
            if (mi == 0 && a.baselines) {
              Row b;
              MLADCP_RETURN_IF_ERROR(run_baselines(comm, a, tokens, context, policy, &b));
              if (comm.rank() == 0) {
                std::lock_guard<std::mutex> lock(mu);
                base.single = b.single;
                base.tp = b.tp;
                base.have_baselines = b.have_baselines;
              }
            }
            return Status::Ok();
          }));
          row.single = base.single;
          row.tp = base.tp;
          row.have_baselines = base.have_baselines;
          rows->push_back(row);
          if (g.leader()) {
            const PhaseTimes& p = row.dcp.graph.measured ? row.dcp.graph : row.dcp.eager;
            std::printf("T=%d ctx=%d %s %s: step %s us (attn %s, exch %s, merge %s)%s\n", tokens, context,
                        dcp_merge_mode_name(row.merge), split_policy_name(policy), fmt(p.step_us).c_str(),
                        fmt(p.attention_us).c_str(), fmt(p.exchange_us).c_str(), fmt(p.merge_us).c_str(),
                        row.dcp.graph.measured ? " [graph]" : " [eager]");
            std::fflush(stdout);
            on_row();
          }
        }
      }
  return Status::Ok();
}

int main_impl(int argc, char** argv) {
  setenv("NCCL_NVLS_ENABLE", "0", 0);  // NVLink SHARP stays off unless the caller decided otherwise
  const Args a = parse(argc, argv);
  RankGroup g;
  const Status init = g.init(a.gpus, std::chrono::milliseconds(120000), a.blocking);
  if (!init.ok()) {
    std::fprintf(stderr, "mladcp_dcp_gpu_bench: %s\n", init.to_string().c_str());
    return 1;
  }
  if (g.leader()) {
    cudaDeviceProp prop{};
    int device = 0;
    cudaGetDevice(&device);
    cudaGetDeviceProperties(&prop, device);
    std::printf("# mladcp DCP on GPUs: W=%d (%s), %s, NCCL %s (%s communicators), NCCL_NVLS_ENABLE=%s\n\n", g.world(),
                g.under_mpi() ? "mpirun, one process per GPU" : "one process, one thread per GPU", prop.name,
                nccl_version_string().c_str(), a.blocking ? "blocking" : "non-blocking",
                std::getenv("NCCL_NVLS_ENABLE"));
  }
  int rc = 0;
  if (a.check) {
    bool ok = false;
    const Status s = run_checks(g, a, &ok);
    if (!s.ok()) std::fprintf(stderr, "mladcp_dcp_gpu_bench: check: %s\n", s.to_string().c_str());
    if (!s.ok() || !ok) rc = 1;
  }
  if (a.grid || !a.check) {
    std::vector<Row> rows;
    auto write = [&] {
      if (!a.markdown.empty())
        if (FILE* f = std::fopen(a.markdown.c_str(), "w")) {
          std::fputs(markdown(rows, g.world(), a).c_str(), f);
          std::fclose(f);
        }
      if (!a.json.empty())
        if (FILE* f = std::fopen(a.json.c_str(), "w")) {
          std::fputs(json(rows, g.world(), a).c_str(), f);
          std::fclose(f);
        }
    };
    const Status s = run_grid(g, a, &rows, write);
    if (!s.ok()) {
      std::fprintf(stderr, "mladcp_dcp_gpu_bench: timing: %s\n", s.to_string().c_str());
      rc = 1;
    }
    if (g.leader() && !rows.empty()) std::printf("\n%s", markdown(rows, g.world(), a).c_str());
  }
  return rc;
}

}  // namespace
}  // namespace mladcp::dcp_gpu

int main(int argc, char** argv) { return mladcp::dcp_gpu::main_impl(argc, argv); }
