// The ranks of a GPU DCP run (mpirun or threads) and `mladcp dcp` on a device backend.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <thread>

#include "core/validate.h"
#include "testkit/nccl_dcp_runner.h"

#if MLADCP_HAVE_MPI
#include <mpi.h>
#endif

namespace mladcp::dcp_gpu {
namespace {

using detail::cat;
using detail::invalid;

bool started_by_mpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
}

std::string gb(double bytes) { return cat(std::round(bytes / 1e7) / 100.0, " GB"); }

std::string us(double v) {
  if (std::isnan(v)) return "n/a";
  char b[32];
  std::snprintf(b, sizeof b, "%.1f us", v);
  return b;
}

std::string json_num(double v) {
  if (std::isnan(v) || std::isinf(v)) return "null";
  char b[32];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}

std::string json_phases(const PhaseTimes& p) {
  if (!p.measured) return "null";
  return "{\"step_us\": " + json_num(p.step_us) + ", \"q_gather_us\": " + json_num(p.q_gather_us) +
         ", \"attention_us\": " + json_num(p.attention_us) + ", \"exchange_us\": " + json_num(p.exchange_us) +
         ", \"merge_us\": " + json_num(p.merge_us) + "}";
}

}  // namespace

// ---- RankGroup -----------------------------------------------------------------------------------

RankGroup::~RankGroup() {
  destroy_nccl_communicators(&comms_);
#if MLADCP_HAVE_MPI
  int finalized = 0;
  if (mpi_owned_ && MPI_Finalized(&finalized) == MPI_SUCCESS && !finalized) MPI_Finalize();
#endif
}

Status RankGroup::init(int gpus, std::chrono::milliseconds setup_timeout, bool blocking) {
  if (!comms_.empty()) return invalid("RankGroup::init: already initialized");
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) {
    (void)cudaGetLastError();
    devices = 0;
  }
  if (devices == 0) return Status(StatusCode::kUnavailable, "no CUDA device visible");
  NcclOptions o;
  o.setup_timeout = setup_timeout;
  o.blocking = blocking;
  o.disable_nvls = true;  // NVLink SHARP stays off unless the caller's environment decided otherwise
#if MLADCP_HAVE_MPI
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized || started_by_mpirun()) {
    if (!initialized) {
      int provided = 0;
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
      mpi_owned_ = true;
    }
    mpi_ = true;
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    int local_rank = 0;
    MPI_Comm_rank(node, &local_rank);
    MPI_Comm_free(&node);
    o.device = local_rank % devices;
    comms_.resize(1);
    const Status s = create_nccl_communicator_mpi(nullptr, o, &comms_[0]);
    if (!s.ok()) comms_.clear();
    return s;
  }
#endif
  const int n = gpus > 0 ? gpus : devices;
  if (n > devices)
    return Status(StatusCode::kUnavailable, cat("--gpus=", n, ": only ", devices, " CUDA device(s) visible"));
  std::vector<int> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = i;
  return create_nccl_communicators_single_process(ids, o, &comms_);
}

Status RankGroup::each(const std::function<Status(NcclCommunicator&)>& body) {
  if (comms_.empty()) return Status(StatusCode::kUnavailable, "RankGroup: not initialized");
  if (comms_.size() == 1) return body(*comms_[0]);
  std::vector<Status> st(comms_.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < comms_.size(); ++i) threads.emplace_back([&, i] { st[i] = body(*comms_[i]); });
  for (auto& t : threads) t.join();
  for (const Status& s : st)
    if (!s.ok()) return s;
  return Status::Ok();
}

// ---- mladcp dcp --backend cuda -------------------------------------------------------------------

Status run_command(const testkit::DcpCommandOptions& o) {
  RankGroup group;
  MLADCP_RETURN_IF_ERROR(group.init(o.gpus));
  const int W = group.world();
  testkit::DcpCommandSetup setup;
  const Status own = testkit::check_dcp_options(o, W, &setup);
  const std::chrono::milliseconds deadline(o.deadline_ms);
  // Every rank's flags checked, and the same on every rank (--iters included), before any work.
  MLADCP_RETURN_IF_ERROR(group.each([&](NcclCommunicator& comm) -> Status {
    const std::vector<testkit::SharedFlag> flags = testkit::shared_flags(o);
    std::vector<double> mine{double(int(own.code()))};
    for (const testkit::SharedFlag& f : flags) mine.push_back(f.value);
    std::vector<double> all;
    const Status s = all_gather_over_ranks(comm, mine, &all, deadline);
    if (!own.ok()) return own;
    MLADCP_RETURN_IF_ERROR(s);
    std::vector<double> values;
    for (int r = 0; r < comm.world_size(); ++r) {
      const size_t at = size_t(r) * mine.size();
      if (all[at] != 0)
        return Status(StatusCode::kRemoteError, cat("rank ", r, " rejected its flags (its own error names the flag)"));
      values.insert(values.end(), all.begin() + ptrdiff_t(at + 1), all.begin() + ptrdiff_t(at + mine.size()));
    }
    return testkit::flags_agree(flags, values, comm.world_size(), comm.rank());
  }));
  const DType kv = setup.problem.kv_dtype, out = setup.out_dtype;
  const DcpMergeMode mode = setup.merge_mode;

  CheckCase cc;
  cc.problem = setup.problem;
  cc.merge_mode = mode;
  cc.interleave = o.interleave;
  cc.out_dtype = out;
  cc.with_lse = o.lse;
  cc.backend = o.backend;
  cc.deadline = deadline;

  TimingCase tc;
  tc.num_seqs = o.batch;
  tc.q_len = o.q_len;
  tc.num_heads = o.heads;
  tc.context = o.context;
  tc.block_size = o.block_size;
  tc.interleave = o.interleave;
  tc.kv_dtype = kv;
  tc.merge_mode = mode;
  tc.samples = o.iters > 0 ? o.iters : 50;
  tc.backend = o.backend;
  tc.seed = o.seed;
  tc.deadline = deadline;

  std::mutex mu;
  TimingResult timing;
  std::vector<double> check{0, 0, 0, 0, 0};  // failed, out max abs, out max rel, lse max abs, kv bytes
  std::string failure;
  MLADCP_RETURN_IF_ERROR(group.each([&](NcclCommunicator& comm) -> Status {
    std::vector<double> mine(5, 0.0);
    for (const bool graph : {false, true}) {
      if (!o.check) break;
      CheckCase c = cc;
      c.graph = graph;
      CheckResult r;
      MLADCP_RETURN_IF_ERROR(run_check(comm, c, &r));
      if (!r.ok) {
        std::lock_guard<std::mutex> lock(mu);
        failure += cat("rank ", comm.rank(), (graph ? " (CUDA graph)" : " (eager)"), ": ", r.report, "\n");
      }
      mine[0] = std::max(mine[0], r.ok ? 0.0 : 1.0);
      mine[1] = std::max(mine[1], r.out.max_abs_err);
      mine[2] = std::max(mine[2], r.out.max_rel_err);
      mine[3] = std::max(mine[3], r.lse.max_abs_err);
    }
    TimingResult t;
    MLADCP_RETURN_IF_ERROR(run_timing(comm, tc, &t));
    std::vector<double> v = to_vector(t);
    MLADCP_RETURN_IF_ERROR(max_over_ranks(comm, &v, deadline));
    from_vector(v, &t);
    MLADCP_RETURN_IF_ERROR(max_over_ranks(comm, &mine, deadline));
    if (comm.rank() == 0) {
      std::lock_guard<std::mutex> lock(mu);
      timing = t;
      check = mine;
    }
    return Status::Ok();
  }));
  if (!failure.empty()) std::fprintf(stderr, "%s", failure.c_str());
  const bool pass = check[0] == 0.0;
  const double kv_rank = double(timing.kv_bytes_rank);
  const double kv_full = double(o.batch) * o.context * kQkDim * dtype_size(kv);
  if (!group.leader()) return o.check && !pass ? Status::Internal("DCP check failed (see rank 0)") : Status::Ok();

  const char* launch = group.under_mpi() ? "mpirun, one process per GPU" : "one process, one thread per GPU";
  if (o.json) {
    std::ostringstream js;
    js << "{\n  \"comm\": \"nccl\",\n  \"nccl\": \"" << nccl_version_string() << "\",\n  \"launch\": \"" << launch
       << "\",\n  \"world\": " << W << ",\n  \"merge\": \"" << dcp_merge_mode_name(mode)
       << "\",\n  \"interleave\": " << o.interleave << ",\n  \"backend\": \"" << o.backend
       << "\",\n  \"shape\": {\"heads\": " << o.heads << ", \"heads_per_rank\": " << o.heads / W
       << ", \"batch\": " << o.batch << ", \"context\": " << o.context << ", \"q_len\": " << o.q_len
       << ", \"block_size\": " << o.block_size << ", \"kv_dtype\": \"" << dtype_name(kv) << "\", \"out_dtype\": \""
       << dtype_name(out) << "\", \"lse\": " << (o.lse ? "true" : "false") << "},\n  \"seed\": " << o.seed
       << ",\n  \"kv_bytes_full\": " << json_num(kv_full) << ",\n  \"kv_bytes_max_rank\": " << json_num(kv_rank)
       << ",\n  \"kv_saving\": " << json_num(kv_rank > 0 ? kv_full / kv_rank : 0.0)
       << ",\n  \"device_time_us\": {\"eager_sync\": " << json_phases(timing.eager_sync)
       << ", \"eager\": " << json_phases(timing.eager) << ", \"graph\": " << json_phases(timing.graph)
       << ", \"samples\": " << tc.samples << ", \"max_over_ranks\": true}";
    if (o.check)
      js << ",\n  \"check\": {\"reference\": \"single-GPU decode of the unsharded cache (" << o.backend
         << ")\", \"modes\": [\"eager\", \"graph\"], \"pass\": " << (pass ? "true" : "false")
         << ", \"out_max_abs_err\": " << json_num(check[1]) << ", \"out_max_rel_err\": " << json_num(check[2])
         << ", \"out_rel_tolerance\": " << json_num(test::device_pair_tolerance(out).rel)
         << ", \"lse_max_abs_err\": " << json_num(check[3]) << "}";
    js << "\n}\n";
    std::printf("%s", js.str().c_str());
  } else {
    std::printf("DCP decode over NCCL: %d GPUs (%s), merge %s, interleave %d, NCCL %s\n", W, launch,
                dcp_merge_mode_name(mode), o.interleave, nccl_version_string().c_str());
    std::printf("  problem   %d sequences x %d tokens, %d query heads (%d per GPU), q_len %d, kv %s, block %d\n",
                o.batch, o.context, o.heads, o.heads / W, o.q_len, dtype_name(kv), o.block_size);
    std::printf("  KV cache  %s per GPU at most, %s unsharded: %.2fx less per GPU\n", gb(kv_rank).c_str(),
                gb(kv_full).c_str(), kv_rank > 0 ? kv_full / kv_rank : 0.0);
    std::printf("  device time per step (median of %d, max over GPUs)\n", tc.samples);
    std::printf("  %-11s %-11s %-12s %-11s %-11s %-11s\n", "mode", "step", "q all-gather", "attention", "exchange",
                "merge");
    const std::pair<const char*, const PhaseTimes*> modes[] = {
        {"eager-sync", &timing.eager_sync}, {"eager", &timing.eager}, {"cuda-graph", &timing.graph}};
    for (const auto& [name, p] : modes)
      if (p->measured)
        std::printf("  %-11s %-11s %-12s %-11s %-11s %-11s\n", name, us(p->step_us).c_str(), us(p->q_gather_us).c_str(),
                    us(p->attention_us).c_str(), us(p->exchange_us).c_str(), us(p->merge_us).c_str());
    if (!timing.note.empty()) std::printf("  note      %s\n", timing.note.c_str());
    if (o.check)
      std::printf(
          "  check     every GPU's heads vs single-GPU decode of the unsharded cache (eager and CUDA graph): "
          "out max abs err %.3g, max rel err %.3g (tolerance %.3g)%s: %s\n",
          check[1], check[2], test::device_pair_tolerance(out).rel,
          o.lse ? cat(", LSE max abs err ", check[3]).c_str() : "", pass ? "PASS" : "FAIL");
  }
  if (o.check && !pass) return Status::Internal("DCP check failed: some GPU differs from the single-GPU decode");
  return Status::Ok();
}

}  // namespace mladcp::dcp_gpu
