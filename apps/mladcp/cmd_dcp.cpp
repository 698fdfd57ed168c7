// `mladcp dcp`: decode context parallelism over the ranks of `mpirun -np W` (MPI communicator, host
// backend). Every rank builds its shard of one synthetic problem (DeepSeek-V3 shapes by default), runs
// the DCP step for its H/W heads, and rank 0 prints the per-rank KV bytes (the W-fold saving), the time
// split (attention, exchange, merge) and, with --check, the error against a single-rank decode of the
// unsharded cache (each rank compares its own heads, computed locally with the same backend).
//
// Also the DCP section of `mladcp demo`, which starts `mpirun -np 4 <this tool> dcp --check --json`.
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cli_checks.h"
#include "cli_common.h"
#include "commands.h"
#include "core/validate.h"
#include "mladcp/dcp.h"
#include "mladcp/mpi.h"
#include "testkit/compare.h"
#include "testkit/dcp_command.h"
#include "testkit/median.h"
#include "testkit/synthetic.h"
#if MLADCP_TESTKIT_HAVE_NCCL_DCP
#include "testkit/nccl_dcp_runner.h"
#endif

namespace mladcp::cli {
namespace {

using detail::invalid;
using json = nlohmann::ordered_json;

using DcpOptions = testkit::DcpCommandOptions;

using testkit::median;

// The options, checked once (testkit::check_dcp_options), for a host backend.
Status parse(const DcpOptions& o, int world, synthetic::Config* cfg, DType* out_dtype, DcpMergeMode* mode) {
  testkit::DcpCommandSetup setup;
  MLADCP_RETURN_IF_ERROR(testkit::check_dcp_options(o, world, &setup));
  std::unique_ptr<Backend> b;
  if (!create_backend(o.backend, &b).ok()) {
    std::string names;
    for (const std::string& n : backend_names()) {
      if (!names.empty()) names += ", ";
      names += n;
    }
    return invalid("--backend=", o.backend, ": unknown; registered: ", names);
  }
  if (b->capabilities().device != Device::kHost)
    return invalid("--backend=", o.backend, ": a device backend needs the NCCL communicator, which this build lacks; ",
                   "use a host backend (cpu) over MPI");
  *cfg = setup.problem;
  *out_dtype = setup.out_dtype;
  *mode = setup.merge_mode;
  return Status::Ok();
}

#if MLADCP_HAVE_MPI

// Initializes MPI for the command when the caller has not (and finalizes it at the end).
class MpiSession {
 public:
  MpiSession() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
      owned_ = true;
    }
  }
  ~MpiSession() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owned_ && !finalized) MPI_Finalize();
  }

 private:
  bool owned_ = false;
};

// What each rank reports to rank 0.
struct RankResult {
  double kv_bytes = 0;
  double step_ms = 0, q_gather_ms = 0, attention_ms = 0, exchange_ms = 0, merge_ms = 0;
  double out_max_abs_err = 0, out_rel_err = 0, lse_max_abs_err = 0;
  double out_bad = 0, lse_bad = 0, pass = 1;
};
constexpr int kRankFields = 12;

// The tool's own collectives: all-gathers over the DCP communicator, each bounded by a deadline (a
// late or missing peer makes every rank fail with kTimeout / kRemoteError instead of hanging).
Status all_gather_doubles(Communicator& comm, const std::vector<double>& mine, std::vector<double>* all,
                          std::chrono::milliseconds deadline) {
  all->assign(mine.size() * size_t(comm.world_size()), 0.0);
  MLADCP_RETURN_IF_ERROR(comm.all_gather(mine.data(), all->data(), mine.size() * sizeof(double)));
  return comm.wait(deadline);
}

Status barrier(Communicator& comm, std::chrono::milliseconds deadline) {
  std::vector<double> all;
  return all_gather_doubles(comm, {0.0}, &all, deadline);
}

// Before any other communication: every rank shares whether its flags parsed, its host and the flags
// all ranks must share; a rank whose flags were rejected, or flags that differ between ranks, fail
// every rank (naming the flags that differ). Returns the number of ranks on this rank's host.
Status agree_on_flags(Communicator& comm, const DcpOptions& o, const Status& own, int* ranks_on_host) {
  const int W = comm.world_size();
  const std::vector<testkit::SharedFlag> flags = testkit::shared_flags(o);
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  std::vector<double> mine{double(int(own.code())), double(testkit::text_hash(host) >> 12)};
  for (const testkit::SharedFlag& f : flags) mine.push_back(f.value);
  const size_t n = mine.size();
  std::vector<double> all;
  const Status s = all_gather_doubles(comm, mine, &all, std::chrono::milliseconds(o.deadline_ms));
  if (!own.ok()) return own;
  MLADCP_RETURN_IF_ERROR(s);
  *ranks_on_host = 0;
  std::vector<double> values;
  for (int r = 0; r < W; ++r) {
    if (all[size_t(r) * n] != 0)
      return Status(StatusCode::kRemoteError, detail::cat("rank ", r, " of ", W,
                                                          " rejected its flags (its own error names the flag); "
                                                          "no rank started"));
    if (all[size_t(r) * n + 1] == mine[1]) ++*ranks_on_host;
    values.insert(values.end(), all.begin() + ptrdiff_t(size_t(r) * n + 2), all.begin() + ptrdiff_t(size_t(r + 1) * n));
  }
  return testkit::flags_agree(flags, values, W, comm.rank());
}

// Single-rank decode of the unsharded problem for this rank's heads, with the same backend; compares.
Status check_against_single_rank(const DcpOptions& o, const synthetic::Config& cfg, DType out_dtype, int world,
                                 int rank, const std::vector<uint8_t>& out, const std::vector<float>& lse, int threads,
                                 RankResult* r, std::string* detail) {
  synthetic::Config full_cfg = cfg;
  full_cfg.shard = DcpShard{1, 0, o.interleave};
  synthetic::Problem full;
  MLADCP_RETURN_IF_ERROR(synthetic::make_problem(full_cfg, &full));
  std::unique_ptr<Backend> backend;
  MLADCP_RETURN_IF_ERROR(create_backend(o.backend, &backend));
  const int Hl = cfg.num_heads / world, T = full.num_tokens();
  std::vector<float> ref(size_t(T) * Hl * kLatentDim), ref_lse(size_t(T) * Hl);
  MlaDecodeParams p = full.params(ref.data(), DType::kFP32, o.lse ? ref_lse.data() : nullptr);
  p.num_heads = Hl;
  p.q = full.q.data() + size_t(rank) * Hl * kQkDim;
  p.q_stride_token = int64_t(cfg.num_heads) * kQkDim;
  std::vector<uint8_t> ws(backend->workspace_bytes(p));
  ExecContext ctx;
  ctx.workspace = ws.data();
  ctx.workspace_size = ws.size();
  ctx.num_threads = threads;
  MLADCP_RETURN_IF_ERROR(backend->decode(p, ctx));

  const std::vector<float> got = test::to_float(out.data(), out_dtype, ref.size());
  const test::Tolerance tol = test::output_tolerance(out_dtype);
  const test::Comparison c =
      test::compare(got, ref, tol, "rank " + std::to_string(rank) + " output", {T, Hl, kLatentDim});
  double d2 = 0, r2 = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    d2 += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
    r2 += double(ref[i]) * ref[i];
  }
  r->out_max_abs_err = c.max_abs_err;
  r->out_rel_err = r2 > 0 ? std::sqrt(d2 / r2) : std::sqrt(d2);
  r->out_bad = double(c.bad);
  bool pass = c.ok && r->out_rel_err <= tol.rel;
  *detail = c.report;
  if (o.lse) {
    const test::Comparison l =
        test::compare(lse, ref_lse, test::lse_tolerance(), "rank " + std::to_string(rank) + " lse", {T, Hl});
    r->lse_max_abs_err = l.max_abs_err;
    r->lse_bad = double(l.bad);
    pass = pass && l.ok;
    *detail += "\n" + l.report;
  }
  r->pass = pass ? 1 : 0;
  return Status::Ok();
}

Status run_dcp_command(const DcpOptions& o) {
  MpiSession session;
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::unique_ptr<Communicator> comm;
  MLADCP_RETURN_IF_ERROR(create_mpi_communicator(MPI_COMM_WORLD, MpiCommunicatorOptions{}, &comm));
  const std::chrono::milliseconds deadline(o.deadline_ms);
  synthetic::Config cfg;
  DType out_dtype;
  DcpMergeMode mode;
  int ranks_on_host = 1;
  MLADCP_RETURN_IF_ERROR(agree_on_flags(*comm, o, parse(o, world, &cfg, &out_dtype, &mode), &ranks_on_host));
  cfg.shard = DcpShard{world, rank, o.interleave};

  // Threads per rank: the host's hardware threads shared by the ranks on it.
  const int threads =
      o.threads > 0 ? o.threads : std::max(1, int(std::thread::hardware_concurrency()) / std::max(1, ranks_on_host));

  std::unique_ptr<Backend> backend;
  MLADCP_RETURN_IF_ERROR(create_backend(o.backend, &backend));
  DcpConfig dc;
  dc.merge_mode = mode;
  dc.interleave = o.interleave;
  dc.deadline = std::chrono::milliseconds(o.deadline_ms);
  std::unique_ptr<DcpDecoder> dcp;
  MLADCP_RETURN_IF_ERROR(DcpDecoder::create(std::move(backend), comm.get(), dc, &dcp));

  synthetic::Problem shard;
  MLADCP_RETURN_IF_ERROR(synthetic::make_problem(cfg, &shard));
  const int Hl = cfg.num_heads / world, T = shard.num_tokens();
  std::vector<uint8_t> out(size_t(T) * Hl * kLatentDim * dtype_size(out_dtype));
  std::vector<float> lse(size_t(T) * Hl);
  MlaDecodeParams p = shard.params(out.data(), out_dtype, o.lse ? lse.data() : nullptr);
  p.num_heads = Hl;
  p.q = shard.q.data() + size_t(rank) * Hl * kQkDim;  // this rank's heads, read in place
  p.q_stride_token = int64_t(cfg.num_heads) * kQkDim;
  std::vector<uint8_t> workspace(dcp->workspace_bytes(p));
  ExecContext ctx;
  ctx.workspace = workspace.data();
  ctx.workspace_size = workspace.size();
  ctx.num_threads = threads;

  // Warm-up, then a step count every rank agrees on (--iters is one of the agreed flags; 0 derives it
  // from the slowest rank's warm-up).
  DcpStepTimes t;
  MLADCP_RETURN_IF_ERROR(barrier(*comm, deadline));
  MLADCP_RETURN_IF_ERROR(dcp->decode(p, ctx, &t));
  std::vector<double> warm;
  MLADCP_RETURN_IF_ERROR(all_gather_doubles(*comm, {t.total_ms}, &warm, deadline));
  const double slowest = *std::max_element(warm.begin(), warm.end());
  const int iters = o.iters > 0 ? o.iters : std::clamp(int(2000.0 / std::max(slowest, 1e-3)), 1, 100);
  std::vector<double> total, gather, attention, exchange, merge;
  for (int i = 0; i < iters; ++i) {
    // Every step starts together (waiting for a late peer is not exchange time), within the deadline.
    MLADCP_RETURN_IF_ERROR(barrier(*comm, deadline));
    MLADCP_RETURN_IF_ERROR(dcp->decode(p, ctx, &t));
    total.push_back(t.total_ms);
    gather.push_back(t.q_gather_ms);
    attention.push_back(t.attention_ms);
    exchange.push_back(t.exchange_ms);
    merge.push_back(t.merge_ms);
  }
  RankResult r;
  r.kv_bytes = double(shard.kv_bytes_used());
  r.step_ms = median(total);
  r.q_gather_ms = median(gather);
  r.attention_ms = median(attention);
  r.exchange_ms = median(exchange);
  r.merge_ms = median(merge);
  std::string detail;
  if (o.check) {
    if (rank == 0 && !o.json) progress("checking every rank against a single-rank decode of the unsharded cache");
    MLADCP_RETURN_IF_ERROR(check_against_single_rank(o, cfg, out_dtype, world, rank, out, lse, threads, &r, &detail));
  }
  const std::vector<double> mine = {r.kv_bytes,        r.step_ms,  r.q_gather_ms,     r.attention_ms,
                                    r.exchange_ms,     r.merge_ms, r.out_max_abs_err, r.out_rel_err,
                                    r.lse_max_abs_err, r.out_bad,  r.lse_bad,         r.pass};
  std::vector<double> all;
  // The check decodes the whole cache on every rank first: its bound is generous, but a bound.
  MLADCP_RETURN_IF_ERROR(all_gather_doubles(
      *comm, mine, &all, o.check ? std::max(deadline, std::chrono::milliseconds(600000)) : deadline));
  if (o.check && !r.pass) std::fprintf(stderr, "rank %d: %s\n", rank, detail.c_str());
  int pass = 1;
  for (int i = 0; i < world; ++i) pass = pass && all[size_t(i) * kRankFields + kRankFields - 1] != 0;
  if (rank != 0) return pass || !o.check ? Status::Ok() : Status::Internal("DCP check failed (see rank 0)");

  std::vector<RankResult> ranks(static_cast<size_t>(world));
  double kv_full = 0, max_err = 0, max_rel = 0, max_lse = 0;
  for (int i = 0; i < world; ++i) {
    const double* f = &all[size_t(i) * kRankFields];
    RankResult& x = ranks[size_t(i)];
    x = RankResult{f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], f[10], f[11]};
    kv_full += x.kv_bytes;
    max_err = std::max(max_err, x.out_max_abs_err);
    max_rel = std::max(max_rel, x.out_rel_err);
    max_lse = std::max(max_lse, x.lse_max_abs_err);
  }
  const double kv_max =
      std::max_element(ranks.begin(), ranks.end(), [](auto& a, auto& b) { return a.kv_bytes < b.kv_bytes; })->kv_bytes;
  if (o.json) {
    json j = {{"comm", "mpi"},
              {"world", world},
              {"merge", dcp_merge_mode_name(mode)},
              {"interleave", o.interleave},
              {"backend", o.backend},
              {"threads_per_rank", threads},
              {"shape",
               {{"heads", cfg.num_heads},
                {"heads_per_rank", Hl},
                {"batch", cfg.num_seqs},
                {"context", o.context},
                {"q_len", cfg.q_len},
                {"block_size", cfg.block_size},
                {"kv_dtype", dtype_name(cfg.kv_dtype)},
                {"out_dtype", dtype_name(out_dtype)},
                {"lse", o.lse}}},
              {"seed", cfg.seed},
              {"iters", iters},
              {"kv_bytes_full", kv_full},
              {"kv_bytes_max_rank", kv_max},
              {"kv_saving", kv_max > 0 ? kv_full / kv_max : 0.0}};
    json per = json::array();
    for (int i = 0; i < world; ++i) {
      const RankResult& x = ranks[size_t(i)];
      json e = {{"rank", i},
                {"kv_bytes", x.kv_bytes},
                {"time_ms",
                 {{"step", x.step_ms},
                  {"q_gather", x.q_gather_ms},
                  {"attention", x.attention_ms},
                  {"exchange", x.exchange_ms},
                  {"merge", x.merge_ms}}}};
      if (o.check)
        e["check"] = {{"pass", x.pass != 0},
                      {"out_max_abs_err", x.out_max_abs_err},
                      {"out_rel_err", x.out_rel_err},
                      {"lse_max_abs_err", x.lse_max_abs_err}};
      per.push_back(e);
    }
    j["ranks"] = per;
    if (o.check)
      j["check"] = {{"reference", "single-rank decode of the unsharded cache (" + o.backend + ")"},
                    {"pass", pass != 0},
                    {"out_max_abs_err", max_err},
                    {"out_rel_err", max_rel},
                    {"out_rel_tolerance", test::output_tolerance(out_dtype).rel},
                    {"lse_max_abs_err", max_lse}};
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("DCP decode over MPI: %d ranks, merge %s, interleave %d\n", world, dcp_merge_mode_name(mode),
                o.interleave);
    std::printf("  problem   %d sequences x %d tokens, %d query heads (%d per rank), q_len %d, kv %s, block %d\n",
                cfg.num_seqs, o.context, cfg.num_heads, Hl, cfg.q_len, dtype_name(cfg.kv_dtype), cfg.block_size);
    std::printf("  backend   %s (host, threads per rank: %d), median of %d steps\n", o.backend.c_str(), threads, iters);
    std::printf("  KV cache  %s per rank at most, %s unsharded: %.2fx less per rank\n", format_bytes(kv_max).c_str(),
                format_bytes(kv_full).c_str(), kv_max > 0 ? kv_full / kv_max : 0.0);
    std::printf("  rank  kv bytes    step        q all-gather  attention   exchange    merge%s\n",
                o.check ? "       check (max abs err, rel err)" : "");
    for (int i = 0; i < world; ++i) {
      const RankResult& x = ranks[size_t(i)];
      std::printf("  %-4d  %-10s  %-10s  %-12s  %-10s  %-10s  %-10s", i, format_bytes(x.kv_bytes).c_str(),
                  format_seconds(x.step_ms * 1e-3).c_str(), format_seconds(x.q_gather_ms * 1e-3).c_str(),
                  format_seconds(x.attention_ms * 1e-3).c_str(), format_seconds(x.exchange_ms * 1e-3).c_str(),
                  format_seconds(x.merge_ms * 1e-3).c_str());
      if (o.check)
        std::printf("  %s (%s, %s)", x.pass ? "PASS" : "FAIL", format_sci(x.out_max_abs_err).c_str(),
                    format_sci(x.out_rel_err).c_str());
      std::printf("\n");
    }
    if (o.check)
      std::printf(
          "  check     every rank's heads vs single-rank decode of the unsharded cache: out max abs err %s, "
          "rel err %s (tolerance %s)%s: %s\n",
          format_sci(max_err).c_str(), format_sci(max_rel).c_str(),
          format_sci(test::output_tolerance(out_dtype).rel).c_str(),
          o.lse ? (", LSE max abs err " + format_sci(max_lse)).c_str() : "", pass ? "PASS" : "FAIL");
  }
  if (o.check && !pass) return Status::Internal("DCP check failed: some rank differs from the single-rank decode");
  return Status::Ok();
}

// Path of this executable (to start it again under mpirun).
std::string self_path() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "mladcp";
  buf[n] = 0;
  return buf;
}

std::string run_capture(const std::string& cmd, int* rc) {
  std::string out;
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) {
    *rc = -1;
    return out;
  }
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  const int status = pclose(f);
  *rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

#endif  // MLADCP_HAVE_MPI

}  // namespace

Status dcp_demo_section(int threads) {
#if MLADCP_HAVE_MPI
  constexpr int kRanks = 4;
  int rc = 0;
  const std::string version = run_capture("mpirun --version 2>&1", &rc);
  if (rc != 0) {
    std::printf("\nDecode context parallelism: skipped (mpirun not found; install Open MPI to run DCP on CPU ranks)\n");
    return Status::Ok();
  }
  std::string flags;
  if (version.find("Open MPI") != std::string::npos || version.find("OpenRTE") != std::string::npos) {
    setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 0);  // shared memory inside containers
    flags = " --oversubscribe";
    if (geteuid() == 0) flags += " --allow-run-as-root";
  }
  const std::string cmd = "mpirun -np " + std::to_string(kRanks) + flags + " '" + self_path() +
                          "' dcp --check --json --heads 128 --batch 2 --context 4096" +
                          (threads > 0 ? " --threads " + std::to_string(threads) : std::string()) + " 2>&1";
  std::fflush(stdout);  // what the demo printed so far comes first
  progress("starting " + std::to_string(kRanks) + " CPU ranks: " + cmd.substr(0, cmd.size() - 5));
  const std::string out = run_capture(cmd, &rc);
  const size_t brace = out.find('{');
  json j;
  if (brace != std::string::npos) j = json::parse(out.substr(brace), nullptr, /*allow_exceptions=*/false);
  if (rc != 0 || j.is_discarded() || !j.contains("check")) {
    std::fprintf(stderr, "%s\n", out.c_str());
    return Status::Internal("demo failed: `mladcp dcp` under mpirun did not complete (exit " + std::to_string(rc) +
                            ")");
  }
  const json& r0 = j["ranks"][0]["time_ms"];
  const bool pass = j["check"]["pass"].get<bool>();
  std::printf(
      "\nDecode context parallelism: the same attention over %d CPU ranks (mpirun -np %d, MPI communicator)\n"
      "  shards    each rank holds 1/%d of every sequence's latent cache: %s instead of %s (%.2fx less per rank)\n"
      "  step      %s on rank 0 (median of %d): query all-gather %s, attention %s (all %d heads over the shard),\n"
      "            exchange %s, merge %s (merge mode %s: one all-to-all of outputs and LSEs)\n"
      "  check     each rank's %d heads vs single-rank decode of the unsharded cache: max abs err %s, rel err %s\n"
      "  result    %s\n",
      kRanks, kRanks, kRanks, format_bytes(j["kv_bytes_max_rank"].get<double>()).c_str(),
      format_bytes(j["kv_bytes_full"].get<double>()).c_str(), j["kv_saving"].get<double>(),
      format_seconds(r0["step"].get<double>() * 1e-3).c_str(), j["iters"].get<int>(),
      format_seconds(r0["q_gather"].get<double>() * 1e-3).c_str(),
      format_seconds(r0["attention"].get<double>() * 1e-3).c_str(), j["shape"]["heads"].get<int>(),
      format_seconds(r0["exchange"].get<double>() * 1e-3).c_str(),
      format_seconds(r0["merge"].get<double>() * 1e-3).c_str(), j["merge"].get<std::string>().c_str(),
      j["shape"]["heads_per_rank"].get<int>(), format_sci(j["check"]["out_max_abs_err"].get<double>()).c_str(),
      format_sci(j["check"]["out_rel_err"].get<double>()).c_str(),
      pass ? "PASS: DCP equals single-rank decode within the bf16 tolerance on every rank" : "FAIL");
  if (!pass) return Status::Internal("demo failed: DCP differs from single-rank decode");
  return Status::Ok();
#else
  (void)threads;
  std::printf("\nDecode context parallelism: skipped (this build has no MPI)\n");
  return Status::Ok();
#endif
}

void add_dcp_command(CLI::App& app) {
  auto o = std::make_shared<DcpOptions>();
  CLI::App* sub = app.add_subcommand(
      "dcp",
      "Decode context parallelism over MPI ranks (run under `mpirun -np W`): sharded KV cache, the DCP step, "
      "per-rank KV bytes and time split; --check compares with single-rank decode");
  sub->add_option("--backend", o->backend, "Host backend on every rank")->capture_default_str();
  sub->add_option("--heads", o->heads, "All query heads H (each rank owns H / ranks)")
      ->capture_default_str()
      ->check(int_in_range(1, kMaxHeads));
  sub->add_option("--batch", o->batch, "Sequences")->capture_default_str()->check(int_in_range(1, 1 << 20));
  sub->add_option("--context", o->context, "Global length of every sequence, new tokens included")
      ->capture_default_str()
      ->check(int_in_range(1, 1 << 30));
  sub->add_option("--q-len", o->q_len, "Query tokens per sequence (speculative decoding when > 1)")
      ->capture_default_str()
      ->check(int_in_range(1, kMaxQLen));
  sub->add_option("--block-size", o->block_size, "Tokens per paged-cache block")
      ->capture_default_str()
      ->check(int_in_range(1, 1 << 20));
  sub->add_option("--kv-dtype", o->kv_dtype, "Cache dtype: bf16 or fp8 (e4m3, scale 0.25)")->capture_default_str();
  sub->add_option("--out-dtype", o->out_dtype, "Output dtype: bf16 or fp32")->capture_default_str();
  sub->add_option("--merge", o->merge, "Merge mode: a2a (one all-to-all) or ag-rs (LSE all-gather + reduce-scatter)")
      ->capture_default_str();
  sub->add_option("--interleave", o->interleave, "DCP interleave I: runs of I positions per rank")
      ->capture_default_str()
      ->check(int_in_range(1, 1 << 20));
  sub->add_flag("--lse", o->lse, "Also return (and check) the merged LSE");
  sub->add_option("--iters", o->iters, "Timed steps after one warm-up (0: as many as fit in about 2 s)")
      ->capture_default_str()
      ->check(int_in_range(0, 1 << 20));
  sub->add_option("--threads", o->threads, "Host threads per rank (0: hardware threads / ranks on the node)")
      ->capture_default_str()
      ->check(int_in_range(0, 1 << 16));
  sub->add_option("--deadline-ms", o->deadline_ms, "Communication deadline of one step")
      ->capture_default_str()
      ->check(int_in_range(1, 1 << 30));
  sub->add_option("--seed", o->seed, "Seed of the synthetic data")->capture_default_str();
  sub->add_flag("--check", o->check, "Compare every rank's heads with a single-rank decode; exit 1 on a mismatch");
  sub->add_flag("--json", o->json, "Print JSON (rank 0)");
  sub->add_option("--gpus", o->gpus,
                  "Device backends started without mpirun: GPUs driven by this process, one rank each (0: all)")
      ->capture_default_str()
      ->check(int_in_range(0, 1 << 10));
  set_command_body(sub, [o] {
#if MLADCP_TESTKIT_HAVE_NCCL_DCP
    // A device backend: the same step over NCCL on GPUs (one rank per GPU, under mpirun or in-process).
    std::unique_ptr<Backend> b;
    if (create_backend(o->backend, &b).ok() && b->capabilities().device == Device::kCuda) {
      return dcp_gpu::run_command(*o);
    }
#endif
#if MLADCP_HAVE_MPI
    return run_dcp_command(*o);
#else
    return Status::Unsupported("`mladcp dcp` on host backends needs MPI, and this build has none (install Open MPI "
                               "and rebuild)");
#endif
  });
}

}  // namespace mladcp::cli
