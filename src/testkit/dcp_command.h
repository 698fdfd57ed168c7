// The options of `mladcp dcp`: one struct for the host run (MPI ranks, apps/mladcp/cmd_dcp.cpp) and the
// device run (NCCL, nccl_dcp_command.cpp). Each flag is checked once, by check_dcp_options().
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mladcp/dcp.h"
#include "mladcp/status.h"
#include "testkit/synthetic.h"

namespace mladcp::testkit {

struct DcpCommandOptions {
  std::string backend = "cpu";
  int heads = 128;  // all query heads H; each rank owns H / W
  int batch = 4;
  int context = 4096;
  int q_len = 1;
  int block_size = 64;
  std::string kv_dtype = "bf16";
  std::string out_dtype = "bf16";
  std::string merge = "a2a";
  int interleave = 1;
  bool lse = false;  // also return (and check) the merged LSE
  int iters = 0;     // timed steps (0: host: as many as fit in about 2 s; device: 50)
  int threads = 0;   // host threads per rank (0: hardware threads / ranks on the host)
  int deadline_ms = 60000;
  uint64_t seed = 1;
  bool check = false;
  bool json = false;
  int gpus = 0;  // device backends started without mpirun: GPUs of this process, one rank each (0: all)
};

// What checked options mean: the global problem (num_heads = H, all heads; shard unset), the output
// dtype and the merge mode.
struct DcpCommandSetup {
  synthetic::Config problem;
  DType out_dtype = DType::kBF16;
  DcpMergeMode merge_mode = DcpMergeMode::kAllToAll;
};

// Checks that depend only on the options and the number of ranks W, identical on every rank (a bad
// flag fails everywhere before any communication). Messages name the flag and the accepted values.
Status check_dcp_options(const DcpCommandOptions& o, int world, DcpCommandSetup* out);

// The flags every rank must be given alike (--iters included), as numbers for an agreement round
// (text flags hashed).
struct SharedFlag {
  const char* name;
  double value;
  std::string text;  // this rank's value of a text flag; empty for numeric flags
};
std::vector<SharedFlag> shared_flags(const DcpCommandOptions& o);
uint64_t text_hash(const std::string& s);  // FNV-1a

// `all`: every rank's shared_flags() values, rank after rank. Ok when they agree; else an error that
// names each differing flag with every rank's value (text flags: this rank's value).
Status flags_agree(const std::vector<SharedFlag>& mine, const std::vector<double>& all, int world, int rank);

}  // namespace mladcp::testkit
