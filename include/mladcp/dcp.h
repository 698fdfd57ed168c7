// The decode context parallel (DCP) decode step: W ranks each hold 1/W of every sequence's KV cache
// (see sharding.h) and H/W of the query heads. One step, per layer:
//   1. all-gather q [T, H/W, 576] over the group → [W, T, H/W, 576] (head groups: read in place),
//   2. decode all H heads over the local shard with LSE, written straight into the exchange buffer,
//   3. merge the W partial states of this rank's own heads:
//      kAllToAll:               one all-to-all of packed (out | lse) fp32 states, then an N-way merge;
//      kAllGatherReduceScatter: all-gather the LSEs, rescale the partial outputs, reduce-scatter
//                               (sum) over heads, then a 1-way merge into the output dtype.
//   → out [T, H/W, 512] in the caller's dtype, and optionally the merged LSE [T, H/W].
//
// The step uses only Communicator operations and Backend::decode / merge / rescale on buffers in the
// backend's memory (a caller-provided workspace). It never loops over data on the host and never
// copies tensors, so the same code runs on host memory over MPI and on device memory over NCCL.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string_view>

#include "mladcp/attention.h"
#include "mladcp/comm.h"
#include "mladcp/decode.h"
#include "mladcp/status.h"

namespace mladcp {

enum class DcpMergeMode {
  kAllToAll,                // one exchange per layer; deterministic combine (fixed order over ranks)
  kAllGatherReduceScatter,  // LSE all-gather + rescale + reduce-scatter of the outputs
};

const char* dcp_merge_mode_name(DcpMergeMode m);                       // "a2a", "ag-rs"
std::optional<DcpMergeMode> parse_dcp_merge_mode(std::string_view s);  // "a2a", "ag-rs" (also "agrs")

struct DcpConfig {
  DcpMergeMode merge_mode = DcpMergeMode::kAllToAll;
  // I, tokens per rank run (block_size % I == 0). 0 (default): from the attention's shard when created
  // from an MlaAttention, 1 when created from a backend; any other value must equal the shard's.
  int interleave = 0;
  // Wall-clock budget of one decode step's communication. A peer that stalls or dies makes the step
  // return kTimeout (the communicator is then aborted) instead of hanging.
  std::chrono::milliseconds deadline{60000};
  // Before any data moves, every rank shares its validation result (and a fingerprint of the
  // arguments all ranks must agree on, which an error then names) with one small all-gather in host memory. A rank
  // whose own input is bad (e.g. a block id out of range) then makes every rank return an error (the others get
  // kRemoteError naming it) rather than leaving them to time out. Used only with host-memory communicators; device
  // backends check their indices in the kernel.
  bool agree_on_validation = true;
};

// Wall-clock milliseconds of the phases of one step, filled when the caller passes a DcpStepTimes to
// decode(). Host timers: exact for host backends; for device backends they measure enqueue time.
struct DcpStepTimes {
  double validate_ms = 0;   // argument checks and the agreement round
  double q_gather_ms = 0;   // all-gather of the query
  double attention_ms = 0;  // local decode of all H heads over this rank's shard
  double exchange_ms = 0;   // output exchange (a2a) or LSE all-gather + reduce-scatter (ag-rs)
  double merge_ms = 0;      // combine (a2a) or rescale + final conversion (ag-rs)
  double total_ms = 0;
};

class DcpDecoder {
 public:
  // `attention` fixes the backend and the shard (its world must equal comm->world_size(), its rank
  // comm->rank(); config().interleave is the shard's). `comm` is borrowed and must outlive the decoder;
  // its memory must be the backend's. Fails (kUnsupported) when the backend cannot return the LSE
  // for W > 1 (the MlaAttention gate) or cannot write fp32 partial outputs.
  static Status create(std::unique_ptr<MlaAttention> attention, Communicator* comm, const DcpConfig& config,
                       std::unique_ptr<DcpDecoder>* out);
  // Convenience: builds the MlaAttention for shard {comm world, comm rank, config.interleave or 1}.
  static Status create(std::unique_ptr<Backend> backend, Communicator* comm, const DcpConfig& config,
                       std::unique_ptr<DcpDecoder>* out);

  // Workspace bytes (in the backend's memory) one step needs for these local params; depends only on
  // shapes (num_seqs, q_len, num_heads, max_seq_len, dtypes, q strides).
  size_t workspace_bytes(const MlaDecodeParams& local) const;

  // One DCP decode step. `local` describes this rank's part (num_heads = H/W local heads):
  //   q   [T, H/W, 576] (q_stride_token / q_stride_head honoured; no head groups),
  //   the local paged cache and its block table (virtual blocks, see sharding.h),
  //   seq_lens [B] GLOBAL lengths, the same on every rank (max_seq_len: a global bound),
  //   out [T, H/W, 512] bf16 or fp32 (strides honoured), lse [T, H/W] optional in lse_base.
  // local.shard: default, or equal to the decoder's shard (anything else is an error). ctx.workspace must
  // hold workspace_bytes().
  // Every rank must call decode with the same shapes. On a bad argument every rank returns an error
  // and nothing is written; on a communication failure every rank returns kTimeout, kRemoteError or
  // kCommError within config.deadline and the communicator is aborted.
  Status decode(const MlaDecodeParams& local, const ExecContext& ctx, DcpStepTimes* times = nullptr);

  const DcpConfig& config() const { return config_; }
  const MlaAttention& attention() const { return *attention_; }
  MlaAttention& attention() { return *attention_; }
  Communicator& communicator() { return *comm_; }
  int world() const { return attention_->shard().world; }
  int rank() const { return attention_->shard().rank; }

 private:
  DcpDecoder(std::unique_ptr<MlaAttention> a, Communicator* c, const DcpConfig& cfg);
  struct Layout;
  Layout layout(const MlaDecodeParams& local) const;
  Status check_arguments(const MlaDecodeParams& local, const ExecContext& ctx, const Layout& l) const;
  // One round over the group: every rank's validation result and the arguments all ranks must share.
  static constexpr int kAgreeSlots = 12;  // status code + 11 shared arguments
  Status agree(const Status& own, const int64_t* shared, std::chrono::steady_clock::time_point deadline);

  std::unique_ptr<MlaAttention> attention_;
  Communicator* comm_;
  DcpConfig config_;
  std::unique_ptr<int64_t[]> agree_send_, agree_recv_;  // host buffers of the agreement round
};

}  // namespace mladcp
