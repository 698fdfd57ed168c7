// Fault drill for DCP over MPI, run under mpirun by run_mpi_fault.sh. Every rank first runs one good
// step, then the last rank misbehaves:
//   --mode stall: it sleeps for three deadlines before its next step;
//   --mode exit:  it exits (status 3) in the middle of the next step, after the query all-gather.
// Each survivor must get kTimeout / kRemoteError within the deadline (plus slack) and prints
//   DCP_FAULT_OK rank <r>: <status> after <ms> ms (deadline <d> ms)
// before anything else can happen to it; a survivor that got no error, or got it too late, prints
// DCP_FAULT_BAD and exits 1. After an exit, the survivors leave without MPI_Finalize (see the end).
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "mladcp/backend.h"
#include "mladcp/dcp.h"
#include "mladcp/mpi.h"
#include "testkit/synthetic.h"

namespace {

using namespace mladcp;
using Clock = std::chrono::steady_clock;

// Forwards to the real communicator; exits the process when asked to issue operation number `exit_at`.
class ExitingCommunicator final : public Communicator {
 public:
  ExitingCommunicator(Communicator& inner, int exit_at) : inner_(inner), exit_at_(exit_at) {}
  int rank() const override { return inner_.rank(); }
  int world_size() const override { return inner_.world_size(); }
  Device memory() const override { return inner_.memory(); }
  std::string name() const override { return inner_.name(); }
  Status all_gather(const void* s, void* r, size_t b) override { return tick(), inner_.all_gather(s, r, b); }
  Status reduce_scatter_sum_f32(const float* s, float* r, size_t c) override {
    return tick(), inner_.reduce_scatter_sum_f32(s, r, c);
  }
  Status all_to_all(const void* s, void* r, size_t b) override { return tick(), inner_.all_to_all(s, r, b); }
  Status group_start() override { return inner_.group_start(); }
  Status group_end() override { return inner_.group_end(); }
  Status wait(std::chrono::milliseconds d) override { return inner_.wait(d); }
  void abort(const std::string& why) override { inner_.abort(why); }
  Status health() const override { return inner_.health(); }

 private:
  void tick() {
    if (++issued_ == exit_at_) {
      std::fprintf(stderr, "rank %d: exiting in the middle of a DCP step (operation %d)\n", inner_.rank(), issued_);
      std::fflush(stderr);
      std::exit(3);
    }
  }
  Communicator& inner_;
  int exit_at_;
  int issued_ = 0;
};

struct Step {
  synthetic::Problem shard;
  std::vector<uint16_t> out;
  std::vector<uint8_t> workspace;
  MlaDecodeParams p;
  ExecContext ctx;
};

Step make_step(const DcpDecoder& dcp, int world, int rank) {
  Step s;
  synthetic::Config c;
  c.num_seqs = 2;
  c.num_heads = 4 * world;
  c.block_size = 64;
  c.seq_lens = {3000, 100};
  c.shard = {world, rank, 1};
  c.seed = 9;
  if (!synthetic::make_problem(c, &s.shard).ok()) std::abort();
  s.out.resize(size_t(s.shard.num_tokens()) * 4 * kLatentDim);
  s.p = s.shard.params(s.out.data(), DType::kBF16, nullptr);
  s.p.num_heads = 4;
  s.p.q = s.shard.q.data() + size_t(rank) * 4 * kQkDim;
  s.p.q_stride_token = int64_t(c.num_heads) * kQkDim;
  s.workspace.resize(dcp.workspace_bytes(s.p));
  s.ctx.workspace = s.workspace.data();
  s.ctx.workspace_size = s.workspace.size();
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  std::string mode = "stall";
  int deadline_ms = 1500;
  for (int i = 1; i + 1 < argc; ++i) {
    if (!std::strcmp(argv[i], "--mode")) mode = argv[i + 1];
    if (!std::strcmp(argv[i], "--deadline-ms")) deadline_ms = std::atoi(argv[i + 1]);
  }
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const bool faulty = rank == world - 1;
  // The survivors-to-be, to meet once they have reported (the faulty rank is not a member).
  MPI_Comm survivors;
  MPI_Comm_split(MPI_COMM_WORLD, faulty ? MPI_UNDEFINED : 0, rank, &survivors);

  std::unique_ptr<Communicator> mpi;
  if (!create_mpi_communicator(MPI_COMM_WORLD, {}, &mpi).ok()) MPI_Abort(MPI_COMM_WORLD, 2);
  // Operations per A2A step: agreement all-gather, query all-gather, all-to-all. The faulty rank
  // exits when issuing the all-to-all of its second step.
  ExitingCommunicator exiting(*mpi, mode == "exit" && faulty ? 6 : -1);
  std::unique_ptr<Backend> backend;
  if (!create_backend("cpu", &backend).ok()) MPI_Abort(MPI_COMM_WORLD, 2);
  DcpConfig cfg;
  cfg.deadline = std::chrono::milliseconds(deadline_ms);
  std::unique_ptr<DcpDecoder> dcp;
  Status s = DcpDecoder::create(std::move(backend), &exiting, cfg, &dcp);
  if (!s.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, s.to_string().c_str());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  Step step = make_step(*dcp, world, rank);
  s = dcp->decode(step.p, step.ctx);  // a good step first: the group works
  if (!s.ok()) {
    std::fprintf(stderr, "rank %d: the good step failed: %s\n", rank, s.to_string().c_str());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }

  if (faulty && mode == "stall") std::this_thread::sleep_for(std::chrono::milliseconds(3 * deadline_ms));
  const Clock::time_point t0 = Clock::now();
  s = dcp->decode(step.p, step.ctx);
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  int rc = 0;
  if (faulty) {
    std::printf("DCP_FAULT_LATE rank %d: %s after %.0f ms\n", rank, s.to_string().c_str(), ms);
  } else {
    const bool bounded = ms <= deadline_ms + 2000.0;
    const bool error = s.code() == StatusCode::kTimeout || s.code() == StatusCode::kRemoteError;
    const bool unusable = dcp->communicator().health().code() == StatusCode::kUnavailable;
    rc = bounded && error && unusable ? 0 : 1;
    std::printf("%s rank %d: %s after %.0f ms (deadline %d ms); communicator: %s\n",
                rc == 0 ? "DCP_FAULT_OK" : "DCP_FAULT_BAD", rank, s.to_string().c_str(), ms, deadline_ms,
                dcp->communicator().health().to_string().c_str());
  }
  std::fflush(stdout);
  if (mode == "exit") {
    // A rank is gone. Open MPI 4's MPI_Finalize fences with every process of the job and would wait for
    // it forever, so the survivors meet among themselves (everyone has reported) and leave without it;
    // mpirun then ends the job.
    MPI_Barrier(survivors);
    std::fflush(stdout);
    std::_Exit(rc);
  }
  // A stalled rank is still alive: meeting it lets MPI finish the operations the survivors left behind.
  MPI_Barrier(MPI_COMM_WORLD);
  if (survivors != MPI_COMM_NULL) MPI_Comm_free(&survivors);
  dcp.reset();
  mpi.reset();
  MPI_Finalize();
  return rc;
}
