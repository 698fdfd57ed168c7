// DCP decode on GPUs over NCCL, as the tool, the tests and the benchmark run it: every rank of a
// NcclCommunicator (one GPU each; one process or one thread per GPU) builds its shard of a problem in
// device memory and runs the same DcpDecoder step as the CPU ranks do, with a device backend ("cuda").
//
//   run_check():  the step (eager or captured in a CUDA graph) against a single-GPU decode of the
//                 unsharded cache on the same device; compares this rank's heads.
//   run_timing(): device time of the step and of its phases (query all-gather, attention, exchange,
//                 merge) from CUDA events recorded at the phase boundaries, median over many steps
//                 after warm-up, in three modes: eager with the deadline-checked host wait after each
//                 exchange, eager without it, and the whole step captured in one CUDA graph.
//
// Every function is collective over the communicator: all ranks call it with the same arguments.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/nccl_single_process.h"
#include "mladcp/dcp.h"
#include "mladcp/nccl.h"
#include "testkit/compare.h"
#include "testkit/dcp_command.h"
#include "testkit/synthetic.h"

namespace mladcp::dcp_gpu {

struct CheckCase {
  synthetic::Config problem;  // the global problem: num_heads = H (all heads); problem.shard is ignored
  DcpMergeMode merge_mode = DcpMergeMode::kAllToAll;
  int interleave = 1;
  DType out_dtype = DType::kBF16;
  bool with_lse = true;  // also return and check the merged LSE
  bool graph = false;    // capture the step in a CUDA graph and replay it (instead of running it eagerly)
  SplitPolicy split_policy = SplitPolicy::kBatchInvariant;  // of the DCP step's local decode
  std::string backend = "cuda";
  std::chrono::milliseconds deadline{30000};
};

struct CheckResult {
  bool ok = false;
  std::string report;  // the output (and LSE) comparison for this rank's heads, with seed and shape
  test::Comparison out, lse;
  size_t kv_bytes_rank = 0;       // bytes of this rank's cache that hold its tokens
  std::vector<float> out_values;  // this rank's DCP output [T, H/W, 512] widened to fp32 (bit-exact)
  std::vector<float> lse_values;  // [T, H/W] when with_lse
};

// One DCP step on every rank, compared with a single-GPU decode of the unsharded cache.
Status run_check(NcclCommunicator& comm, const CheckCase& c, CheckResult* result);

struct TimingCase {
  int num_seqs = 1;  // B; T = B · q_len query tokens
  int q_len = 1;
  int num_heads = 128;  // H (all heads); each rank owns H / W
  int context = 32768;  // global length of every sequence
  int block_size = 64;
  int interleave = 1;
  DType kv_dtype = DType::kBF16;
  DcpMergeMode merge_mode = DcpMergeMode::kAllToAll;
  SplitPolicy split_policy = SplitPolicy::kBatchInvariant;  // split-KV plan of the local decode
  bool eager_sync = true;                                   // eager, host waits (with the deadline) after each exchange
  bool eager = true;                                        // eager, no host wait inside the step
  bool graph = true;                                        // the step captured in a CUDA graph
  int warmup = 10;
  int samples = 50;
  int graph_batch = 5;  // graph replays back to back per sample
  // The KV cache is replicated and the copies rotated so that consecutive steps read at least this
  // many distinct bytes (more than the L2), as a real model's layers do.
  size_t rotation_bytes = size_t(256) << 20;
  std::string backend = "cuda";
  uint64_t seed = 1;
  std::chrono::milliseconds deadline{30000};
};

// Medians over the samples, in microseconds of device time (NaN when not measured).
struct PhaseTimes {
  double step_us = 0, q_gather_us = 0, attention_us = 0, exchange_us = 0, merge_us = 0;
  int samples = 0;
  bool measured = false;
};

struct TimingResult {
  PhaseTimes eager_sync, eager, graph;
  size_t kv_bytes_rank = 0;       // bytes of this rank's cache that hold its tokens (one copy)
  size_t kv_bytes_allocated = 0;  // including rotation copies
  int rotation_copies = 1;
  std::string note;  // why a mode was skipped, if one was
};

Status run_timing(NcclCommunicator& comm, const TimingCase& c, TimingResult* result);

// Element-wise maximum of `values` over the ranks (NaN wins); the same vector length on every rank.
Status max_over_ranks(NcclCommunicator& comm, std::vector<double>* values, std::chrono::milliseconds deadline);
// Every rank's `mine` (the same length on every rank), rank after rank, within the deadline.
Status all_gather_over_ranks(NcclCommunicator& comm, const std::vector<double>& mine, std::vector<double>* all,
                             std::chrono::milliseconds deadline);

// Returns once every rank called it (a small all-gather, waited for with the deadline).
Status barrier(NcclCommunicator& comm, std::chrono::milliseconds deadline);

// Flattening of a TimingResult's numbers for max_over_ranks (and back).
std::vector<double> to_vector(const TimingResult& r);
void from_vector(const std::vector<double>& v, TimingResult* r);

// The ranks this process drives: under mpirun (a build with MPI, started by mpirun) the one rank of
// this process on device = local rank % devices, the NCCL id broadcast over MPI_COMM_WORLD (MPI is
// initialized here if the caller has not, and finalized on destruction); otherwise `gpus` ranks in
// this process (0: every visible device), one communicator each, driven by one thread each.
class RankGroup {
 public:
  RankGroup() = default;
  RankGroup(const RankGroup&) = delete;
  RankGroup& operator=(const RankGroup&) = delete;
  ~RankGroup();
  // blocking: create blocking NCCL communicators (NCCL config blocking = 1) instead of non-blocking ones.
  Status init(int gpus, std::chrono::milliseconds setup_timeout = std::chrono::milliseconds(120000),
              bool blocking = false);
  int world() const { return comms_.empty() ? 0 : comms_[0]->world_size(); }
  // This process holds rank 0 (it prints).
  bool leader() const { return !comms_.empty() && comms_[0]->rank() == 0; }
  bool under_mpi() const { return mpi_; }
  // body(comm) for every rank of this process, in parallel (one thread each); the first error wins.
  Status each(const std::function<Status(NcclCommunicator&)>& body);

 private:
  std::vector<std::unique_ptr<NcclCommunicator>> comms_;
  bool mpi_ = false;
  bool mpi_owned_ = false;
};

// `mladcp dcp` with a device backend (the same options as on host ranks, plus o.gpus for the
// single-process mode). Prints rank 0's report (text or JSON); with o.check, fails on a mismatch.
Status run_command(const testkit::DcpCommandOptions& o);

}  // namespace mladcp::dcp_gpu
