// Decode backends: what each declares (capabilities) and how it runs.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mladcp/decode.h"
#include "mladcp/merge.h"
#include "mladcp/status.h"

namespace mladcp {

enum class Device { kHost, kCuda };

// Static declaration of a backend. The DCP decision is derived from can_return_lse_for_decode;
// the merge uses native_lse_base unless the caller asks for another base (and the backend converts).
struct BackendCapabilities {
  std::string name;
  std::string description;
  Device device = Device::kHost;
  bool can_return_lse_for_decode = false;
  LseBase native_lse_base = LseBase::kE;
  bool lse_base_selectable = false;  // honours MlaDecodeParams::lse_base (else only native)
  std::vector<DType> q_dtypes;       // accepted query dtypes
  std::vector<DType> kv_dtypes;      // accepted cache dtypes
  std::vector<DType> out_dtypes;     // accepted output dtypes
  std::vector<int> block_sizes;      // accepted block sizes; empty means any ≥ 1
  int min_heads = 1, max_heads = kMaxHeads;
  int min_q_len = 1, max_q_len = kMaxQLen;
  bool supports_dcp_interleave = true;  // applies the causal rule for any interleave I
  bool cuda_graph_safe = false;         // run() may be captured into a CUDA graph
  bool deterministic = true;            // same inputs, same bits, run to run
};

// Where a call runs. Host backends ignore `stream`; device backends never synchronize in decode().
struct ExecContext {
  void* stream = nullptr;     // cudaStream_t for device backends
  void* workspace = nullptr;  // caller-owned scratch of workspace_bytes(params) bytes
  size_t workspace_size = 0;
  int num_threads = 0;  // host backends: 0 = hardware concurrency
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const BackendCapabilities& capabilities() const = 0;

  // Scratch needed by decode(); depends only on shapes (num_seqs, q_len, heads, max_seq_len).
  virtual size_t workspace_bytes(const MlaDecodeParams& p) const {
    (void)p;
    return 0;
  }

  // Validates p against the generic contract and this backend's capabilities, then runs.
  // On any error nothing is written.
  virtual Status decode(const MlaDecodeParams& p, const ExecContext& ctx) = 0;

  // N-way merge on this backend's memory (host or device).
  virtual Status merge(const MergeParams& p, const ExecContext& ctx) = 0;
  // Rescale form of the merge (DCP all-gather + reduce-scatter), on this backend's memory.
  virtual Status rescale(const RescaleParams& p, const ExecContext& ctx) = 0;
};

// Checks p against the generic decode contract and against `caps` (dtypes, block size, heads,
// q_len, LSE). Does not read device memory. Host backends additionally check block ids and
// sequence lengths with check_host_indices().
Status validate_decode(const MlaDecodeParams& p, const BackendCapabilities& caps);
// Reads seq_lens and block_table on the host: lengths in [0, max_seq_len] (when max_seq_len > 0),
// lengths ≥ q_len, and (if p.check_block_ids) every block id a sequence reads in [0, num_blocks).
Status check_host_indices(const MlaDecodeParams& p);

// Registry of backends by name. The built-in ones ("cpu-reference", "cpu", and "cuda" when built
// with CUDA) are always present; tests and engines may add their own.
using BackendFactory = std::function<std::unique_ptr<Backend>()>;
Status register_backend(const std::string& name, BackendFactory factory);
std::vector<std::string> backend_names();
Status create_backend(const std::string& name, std::unique_ptr<Backend>* out);
// Capabilities of every registered backend, in registration order.
std::vector<BackendCapabilities> all_backend_capabilities();

// A built-in backend of the library, whether or not this program includes it.
struct KnownBackend {
  BackendCapabilities capabilities;  // its static declaration (what Backend::capabilities() returns)
  bool built = false;                // linked into this program: create_backend() can make it
};
// The built-in backends in a fixed order with their static declarations, independent of this build's
// options and of the machine (a build without CUDA still lists "cuda", with built = false): the source
// of docs/attention_backends.md and of the Python module's backend list. Backends registered by
// callers are not included.
std::vector<KnownBackend> all_known_backends();

// Name of the fastest backend usable here ("cuda" when a device is present, else "cpu").
std::string best_available_backend();

}  // namespace mladcp
