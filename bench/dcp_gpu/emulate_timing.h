// Device timing of single decode and merge calls on one GPU, for the DCP emulation and the planner's
// calibration (mladcp_dcp_emulate). Everything goes through the library's public API (the `cuda`
// backend's decode and merge); CUDA graphs and events come from the CUDA runtime.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "mladcp/device_memory.h"
#include "mladcp/mladcp.h"

namespace mladcp::emulate {

struct TimingOptions {
  int samples = 15;  // median of this many timed calls
  int warmup = 3;
  SplitPolicy split_policy = SplitPolicy::kFillDevice;
};

// One decode call: `heads` query heads (as `groups` head groups, the layout of a DCP all-gather and of
// the A2A send buffer when groups > 1) × q_len tokens for each of `batch` sequences of global length
// `context`, on shard rank 0 of `world` (interleave 1), cache blocks of 64 drawn at random from a pool.
struct DecodeShape {
  int heads = 16;
  int groups = 1;
  int q_len = 1;
  int64_t batch = 1;
  int64_t context = 4096;
  int world = 1;
  DType kv_dtype = DType::kBF16;
};

// Median device times in µs. The L2 cache is flushed (a memset larger than L2) before every sample, as
// a decode step finds the cache of each layer cold.
struct Timing {
  double median_us = 0;
  double min_us = 0;
  bool graph = false;  // timed as CUDA graph replays (else direct calls)
};

class Bench {
 public:
  // Allocates the KV pool (pool_gb of random bf16 or fp8 bytes), the L2 flush buffer and a stream on
  // the current device.
  static Status create(double pool_gb, const TimingOptions& options, std::unique_ptr<Bench>* out);
  ~Bench();

  const DeviceInfo& device() const { return info_; }

  // Times decode; with merge_states > 0 also the A2A merge of the decode's output (merge_states partial
  // states of heads / groups heads each: the step's merge on a rank), into *merge.
  Status time_decode(const DecodeShape& s, Timing* decode, int merge_states = 0, Timing* merge = nullptr);
  // Times the AG+RS form: rescale of `states` × heads rows in place, then the 1-way conversion.
  Status time_rescale_merge(int states, int64_t tokens, int heads, Timing* t);

 private:
  Bench() = default;
  Status buffer(size_t bytes, int slot, void** ptr);
  template <typename Enqueue>
  Status time(Enqueue enqueue, Timing* t);

  TimingOptions options_;
  DeviceInfo info_;
  std::unique_ptr<Backend> backend_;
  void* stream_ = nullptr;
  void* pool_ = nullptr;
  size_t pool_bytes_ = 0;
  void* flush_ = nullptr;
  size_t flush_bytes_ = 0;
  std::vector<std::pair<void*, size_t>> buffers_;  // grown on demand, reused across calls
};

}  // namespace mladcp::emulate
