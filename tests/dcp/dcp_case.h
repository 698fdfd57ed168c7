// One DCP end-to-end case as run by one rank, over any host Communicator (threads or MPI): build this
// rank's shard of a synthetic problem, run the DCP step for this rank's heads, and compare with a
// single-rank decode of the unsharded problem by the same backend (own heads only).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mladcp/comm.h"
#include "mladcp/dcp.h"
#include "testkit/compare.h"
#include "testkit/synthetic.h"

namespace mladcp::test {

// The backend the DCP tests run on: $MLADCP_DCP_TEST_BACKEND when set, else "cpu". A device backend
// ("cuda") runs on device buffers of the current device (pair it with a device communicator).
std::string default_backend();

struct DcpCase {
  int local_heads = 2;  // H / W
  int q_len = 1;
  int interleave = 1;
  int block_size = 16;
  std::vector<int32_t> seq_lens;  // global
  DType kv_dtype = DType::kBF16;
  float kv_scale = 1.0f;
  DType out_dtype = DType::kBF16;
  bool want_lse = true;
  LseBase lse_base = LseBase::kE;
  DcpMergeMode mode = DcpMergeMode::kAllToAll;
  bool strided_io = false;  // q read in place from the all-heads tensor, out written into an all-heads buffer
  int pad = 0;              // extra elements at the end of every token row of q, out and lse (padded strides)
  uint64_t seed = 1;
  std::string backend = default_backend();  // "cpu", or $MLADCP_DCP_TEST_BACKEND
  // When set, the DCP step's backend comes from here (`backend` still computes the reference).
  std::function<std::unique_ptr<Backend>()> step_backend;
  std::chrono::milliseconds deadline{60000};
};

std::string describe(const DcpCase& c, int world);

struct DcpRun {
  Status status;
  std::vector<uint8_t> out;  // this rank's [T, H/W, 512] in out_dtype (gathered from strided buffers)
  std::vector<float> lse;    // this rank's [T, H/W]
  bool untouched = false;    // nothing was written (out and lse still hold the sentinel)
  DcpStepTimes times;
};

// Runs the DCP step on this rank (every rank of `comm` must call it with the same case).
DcpRun run_dcp(Communicator& comm, const DcpCase& c);

// run_dcp, then the single-rank decode of the full problem; compares this rank's heads.
::testing::AssertionResult dcp_matches_single_rank(Communicator& comm, const DcpCase& c, DcpRun* run = nullptr);

// The cases the end-to-end suites sweep for a world size: I ∈ {1, 2, 64}, q_len ∈ {1, 2, 4}, lengths
// 0..W·I+1 (every empty-shard pattern) and 4096, both merge modes, bf16 and fp8 KV, bf16 / fp32
// outputs, LSE bases e and 2, contiguous and strided q/out. `quick` keeps a representative subset.
std::vector<DcpCase> sweep_cases(int world, bool quick);

}  // namespace mladcp::test
