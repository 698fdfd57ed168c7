// Launch of the decode: the split kernel of the right shape, then the combine kernel over splits.
#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>

#include "core/lse_math.h"
#include "cuda/cuda_status.h"
#include "cuda/decode_kernel.cuh"
#include "cuda/sm90_decode.h"

namespace mladcp::cuda_impl {

MLADCP_DECLARE_SPLIT_KERNEL(1, false)
MLADCP_DECLARE_SPLIT_KERNEL(2, false)
MLADCP_DECLARE_SPLIT_KERNEL(4, false)
MLADCP_DECLARE_SPLIT_KERNEL(1, true)
MLADCP_DECLARE_SPLIT_KERNEL(2, true)
MLADCP_DECLARE_SPLIT_KERNEL(4, true)

#if MLADCP_SM90_TIMELINE
// The combine kernel's first start and last end (sm90_timeline.cuh).
__device__ uint64_t g_combine_times[2];
cudaError_t combine_timeline_reset() {
  const uint64_t v[2] = {~uint64_t(0), 0};
  return cudaMemcpyToSymbol(g_combine_times, v, sizeof(v));
}
cudaError_t combine_timeline_read(uint64_t* combine) {
  return cudaMemcpyFromSymbol(combine, g_combine_times, sizeof(g_combine_times));
}
__device__ __forceinline__ uint64_t globaltimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#endif

namespace {

// The combine kernel: 8 warps per CTA, units strided over the grid (at most kCombineCtasPerSm CTAs per SM). Two
// modes, chosen by the host from what it knows of the state counts (launch_decode):
//  - rows of few states (a split plan of at most kCombineFewStates splits, or a balanced plan of at least one
//    sequence per kCombineFewStates parts): a unit is a group of 8 consecutive rows, each merged by one warp, states in
//    order (a row of more states in such a group: by the CTA's 8 warps together, as below);
//  - otherwise a unit is one row, merged by the 8 warps together: warp w adds states w, w + 8, ..., and the 8
//    sums are added in warp order.
// Both give the same bits for a row of at most 8 states (the sums start from +0, so the warp-order sum of one
// state per warp adds the same terms in the same order), and a row of more states always takes the second: the
// result depends only on the row's own states, whatever the batch or the mode.
constexpr int kCombineWarps = 8, kCombineCtasPerSm = 8, kCombineFewStates = 8;
// States a warp loads at once in the mode for rows of few states (see StateBatch). 3 (held to 128 registers, two CTAs
// per SM as at 2) measured no faster: docs/perf/gpu-sm90-key-policy-combine-batch-2026-12-08.md.
constexpr int kCombineFewBatch = 2;

// Partial state `s` of a row: its workspace index (balanced schedule: the s-th part's slot).
struct RowStates {
  int count = 0;
  int64_t first = 0, step = 0, slot0 = 0;
  __device__ int64_t operator()(int s) const { return first + s * step + (s == 0 ? slot0 : 0); }
};
__device__ __forceinline__ RowStates row_states(const DecodeKernelParams& p, int seq, int grow) {
  RowStates r;
  if (p.parts > 0) {
    const cuda_plan::BalancedRecord rec = p.ws_record[int64_t(seq) * p.row_chunks + grow / p.rows_per_cta];
    r.count = rec.parts;
    r.first = int64_t(rec.first_part) * 2 * p.rows_per_seq + grow;
    r.step = 2 * int64_t(p.rows_per_seq);
    r.slot0 = int64_t(rec.slot) * p.rows_per_seq;
  } else {
    const int len = clamped_len(p, seq);
    const int64_t n_max = sharding::local_len(len, p.shard.world, p.shard.rank, p.shard.interleave);
    r.count = cuda_plan::num_splits(n_max, p.split_len);
    r.first = int64_t(seq) * p.max_splits * p.rows_per_seq + grow;
    r.step = p.rows_per_seq;
  }
  return r;
}

// The weights of a row's states (warp_combiner, decode_kernel.cuh).
__device__ __forceinline__ lse::Combiner row_combiner(const DecodeKernelParams& p, const RowStates& state) {
  return warp_combiner(state.count, [&](int s) { return p.ws_lse[state(s)]; });
}

// A warp's states of one row, in batches of kBatch: states first, first + stride, ... (16 columns per lane: float4 i at
// column 4 · (lane + 32 i)). A batch's loads are in flight together and are issued before its weights are known:
// every state of a row is written, and an empty one (weight 0) adds exactly nothing whatever its bytes. kBatch: 2 in
// the mode for rows of few states (as many registers as it takes: capped at 64 or 80 it spilled, and its calls ran up
// to 28% longer), 4 in the other (two CTAs per SM; a row's 8 warps then hold up to 32 states in flight at once).
template <int kBatch>
struct StateBatch {
  float4 v[kBatch][4];
};
template <int kBatch>
__device__ __forceinline__ void load_batch(const DecodeKernelParams& p, const RowStates& state, int first, int stride,
                                           StateBatch<kBatch>& b) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int k = 0; k < kBatch; ++k) {
    if (first + k * stride >= state.count) break;
    const float4* src = reinterpret_cast<const float4*>(p.ws_o + state(first + k * stride) * kLatentDim) + lane;
#pragma unroll
    for (int i = 0; i < 4; ++i) b.v[k][i] = __ldcs(src + 32 * i);
  }
}
template <int kBatch>
__device__ __forceinline__ void add_batch(const DecodeKernelParams& p, const RowStates& state, const lse::Combiner& c,
                                          int first, int stride, const StateBatch<kBatch>& b, float4 (&acc)[4]) {
#pragma unroll
  for (int k = 0; k < kBatch; ++k) {
    if (first + k * stride >= state.count) break;
    const float wt = c.weight(p.ws_lse[state(first + k * stride)]);
#pragma unroll
    for (int i = 0; i < 4; ++i) add_weighted(acc[i], wt, b.v[k][i]);
  }
}

// acc = +0, then += the weighted states first, first + stride, ... in that order (the combine's summation order,
// whatever the batching). The first batch is loaded before the weights are found (row_combiner: one memory latency
// for both), each later one while nothing else is in flight. Returns the row's combiner.
template <int kBatch>
__device__ __forceinline__ lse::Combiner merge_states(const DecodeKernelParams& p, const RowStates& state, int first,
                                                      int stride, float4 (&acc)[4]) {
  StateBatch<kBatch> b;
  load_batch(p, state, first, stride, b);
  const lse::Combiner c = row_combiner(p, state);
#pragma unroll
  for (int i = 0; i < 4; ++i) acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s = first; s < state.count; s += kBatch * stride) {
    if (s != first) load_batch(p, state, s, stride, b);
    add_batch(p, state, c, s, stride, b, acc);
  }
  return c;
}

// One row merged by the CTA's 8 warps together (every thread calls it; `part`: the warps' sums).
template <int kBatch>
__device__ void combine_row_by_cta(const DecodeKernelParams& p, int64_t row, float4 (*part)[kLatentDim / 4]) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int seq = int(row / p.rows_per_seq), grow = int(row - int64_t(seq) * p.rows_per_seq);
  const RowStates state = row_states(p, seq, grow);
  if (state.count <= 1) return;  // written by the split kernel (uniform over the CTA)
  float4 acc[4];
  const lse::Combiner c = merge_states<kBatch>(p, state, warp, kCombineWarps, acc);
#pragma unroll
  for (int i = 0; i < 4; ++i) part[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  if (threadIdx.x < kLatentDim / 4) {
    float4 sum = part[0][threadIdx.x];
#pragma unroll
    for (int k = 1; k < kCombineWarps; ++k) {
      const float4 v = part[k][threadIdx.x];
      sum.x += v.x;
      sum.y += v.y;
      sum.z += v.z;
      sum.w += v.w;
    }
    store4(p.out, p.out_fp32, row_out(p, seq, grow) + 4 * threadIdx.x, sum);
  }
  if (threadIdx.x == 0) store_row_lse(p, seq, grow, c);
  __syncthreads();  // part is reused
}

// Launched as a programmatic dependent of the Hopper split kernel: waits for its partial states (at once otherwise).
// The timeline's combine span starts here, after the wait, as it did when the wait opened the kernel.
__device__ __forceinline__ void wait_for_split_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
#if MLADCP_SM90_TIMELINE
  if (threadIdx.x == 0) atomicMin(reinterpret_cast<unsigned long long*>(&g_combine_times[0]), globaltimer());
#endif
}

// A balanced plan whose split kernel wrote no partial state (every sequence whole): nothing to merge. Read after the
// wait for the split kernel.
__device__ __forceinline__ bool nothing_to_merge(const DecodeKernelParams& p) {
  return p.ws_merges != nullptr && __ldcg(p.ws_merges) == 0;
}

// The units of 8 rows (the mode for rows of few states).
__device__ void combine_groups(const DecodeKernelParams& p, int64_t rows, float4 (*part)[kLatentDim / 4], int* many,
                               int lane, int warp) {
  bool waited = false;
  for (int64_t group = blockIdx.x; group * kCombineWarps < rows; group += gridDim.x) {
    // A row of few states: this warp alone, states in order.
    const int64_t row = group * kCombineWarps + warp;
    const int seq = int(row / p.rows_per_seq), grow = int(row - int64_t(seq) * p.rows_per_seq);
    // The split schedule's states follow from the sequence lengths (an input): found before the wait for the split
    // kernel, so that the first group's loads follow it at once. The balanced schedule's records come from that kernel.
    RowStates state = row < rows && p.parts == 0 ? row_states(p, seq, grow) : RowStates{};
    if (!waited) {
      wait_for_split_kernel();
      if (nothing_to_merge(p)) return;  // uniform over the grid
      waited = true;
    }
    if (row < rows && p.parts > 0) state = row_states(p, seq, grow);
    if (state.count > 1 && state.count <= kCombineFewStates) {
      float4 acc[4];
      const lse::Combiner c = merge_states<kCombineFewBatch>(p, state, 0, 1, acc);
      const int64_t o = row_out(p, seq, grow);
#pragma unroll
      for (int i = 0; i < 4; ++i) store4(p.out, p.out_fp32, o + 4 * (lane + 32 * i), acc[i]);
      if (lane == 0) store_row_lse(p, seq, grow, c);
    }
    if (lane == 0) many[warp] = state.count > kCombineFewStates;
    __syncthreads();
    for (int r = 0; r < kCombineWarps; ++r)
      if (many[r]) combine_row_by_cta<2>(p, group * kCombineWarps + r, part);
    __syncthreads();  // many[] is rewritten for the next group
  }
}

// kFew: units of 8 rows (rows of few states), else of one row (see above).
template <bool kFew>
__global__ void __launch_bounds__(kCombineWarps * 32, kFew ? 1 : 2)
    mla_decode_combine_kernel(const DecodeKernelParams p) {
  __shared__ float4 part[kCombineWarps][kLatentDim / 4];
  __shared__ int many[kCombineWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t rows = int64_t(p.num_seqs) * p.rows_per_seq;
  if constexpr (!kFew) {
    wait_for_split_kernel();
    if (nothing_to_merge(p)) return;
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) combine_row_by_cta<4>(p, row, part);
  } else {
    combine_groups(p, rows, part, many, lane, warp);
  }
#if MLADCP_SM90_TIMELINE
  if (threadIdx.x == 0) atomicMax(reinterpret_cast<unsigned long long*>(&g_combine_times[1]), globaltimer());
#endif
}

template <int MT>
cudaError_t launch_shape(const DecodeKernelParams& p, bool fp8, int64_t grid, cudaStream_t s) {
  return fp8 ? launch_split_kernel<MT, true>(p, grid, s) : launch_split_kernel<MT, false>(p, grid, s);
}

}  // namespace

size_t decode_smem_bytes(int rows_per_cta, bool fp8, int kv_stages) {
  return size_t(SplitSmem(rows_per_cta / 16, fp8, kv_stages).total);
}

Status prepare_decode_kernels(size_t max_smem_optin) {
  // The largest layout each kernel may use that fits the device (two stages, else one).
  auto limit = [&](int mt, bool fp8) {
    const size_t two = decode_smem_bytes(16 * mt, fp8, 2), one = decode_smem_bytes(16 * mt, fp8, 1);
    return int(two <= max_smem_optin ? two : (one <= max_smem_optin ? one : max_smem_optin));
  };
  MLADCP_CUDA_RETURN_IF_ERROR((set_split_kernel_smem<1, false>(limit(1, false))));
  MLADCP_CUDA_RETURN_IF_ERROR((set_split_kernel_smem<2, false>(limit(2, false))));
  MLADCP_CUDA_RETURN_IF_ERROR((set_split_kernel_smem<4, false>(limit(4, false))));
  MLADCP_CUDA_RETURN_IF_ERROR((set_split_kernel_smem<1, true>(limit(1, true))));
  MLADCP_CUDA_RETURN_IF_ERROR((set_split_kernel_smem<2, true>(limit(2, true))));
  MLADCP_CUDA_RETURN_IF_ERROR((set_split_kernel_smem<4, true>(limit(4, true))));
  return Status::Ok();
}

// The fused merge's arrival counters, or a balanced plan's merge flag, set to zero before the split kernel, which is
// launched as its programmatic dependent: it starts at once and waits (griddepcontrol.wait) only before its first
// arrival or flag.
__global__ void zero_counters_kernel(int* counters, int n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) counters[i] = 0;
}

Status launch_decode(const DecodeKernelParams& p, bool fp8, int64_t grid, void* stream) {
  if (grid <= 0) return Status::Ok();
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaError_t e = cudaSuccess;
  if (p.fused_merge) {
    const int n = p.num_seqs * p.row_chunks;
    zero_counters_kernel<<<(n + 1023) / 1024 < 8 ? (n + 1023) / 1024 : 8, 1024, 0, s>>>(p.ws_counter, n);
    MLADCP_RETURN_IF_ERROR(cuda_status(cudaGetLastError(), "zero_counters_kernel launch"));
  } else if (p.ws_merges != nullptr) {
    zero_counters_kernel<<<1, 32, 0, s>>>(p.ws_merges, 1);
    MLADCP_RETURN_IF_ERROR(cuda_status(cudaGetLastError(), "zero_counters_kernel launch"));
  }
  switch (p.rows_per_cta) {
    case 16:
      e = p.sm90_fp8 ? launch_sm90_fp8_decode(p, grid, s) : launch_shape<1>(p, fp8, grid, s);
      break;
    case 32:
      e = p.sm90_fp8 ? launch_sm90_fp8_decode(p, grid, s) : launch_shape<2>(p, fp8, grid, s);
      break;
    case 64:
      // Hopper: the warp-specialized TMA/wgmma kernel (same plan, workspace and combine), chosen by the
      // backend for caches whose pages its copies handle; the portable kernel otherwise.
      e = p.sm90 ? launch_sm90_decode(p, fp8, grid, s) : launch_shape<4>(p, fp8, grid, s);
      break;
    default:
      return Status::Internal("rows_per_cta=" + std::to_string(p.rows_per_cta) + ": not 16, 32 or 64");
  }
  MLADCP_RETURN_IF_ERROR(cuda_status(e, "mla_decode_split_kernel launch"));
  // (A balanced pair-merge plan launches it too: the kernel's cut, unknown here, may leave states.)
  if (!p.fused_merge && (p.parts > 0 || (p.max_splits > 1 && !p.pair_merge))) {
    // Few states per row: a split plan of at most kCombineFewStates splits, or a balanced plan of at least one
    // sequence per kCombineFewStates parts (sequences of similar lengths then span at most about that many).
    const bool few =
        p.parts > 0 ? int64_t(p.num_seqs) * kCombineFewStates >= p.parts : p.max_splits <= kCombineFewStates;
    const int group_rows = few ? kCombineWarps : 1;
    const int64_t rows = int64_t(p.num_seqs) * p.rows_per_seq;
    int64_t blocks = (rows + group_rows - 1) / group_rows;
    if (p.sm_count > 0) blocks = std::min<int64_t>(blocks, int64_t(p.sm_count) * kCombineCtasPerSm);
    // After a Hopper kernel the combine is a programmatic dependent launch: its CTAs start while the
    // split kernel's last CTAs write their states, and wait for the whole grid before reading.
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(unsigned(blocks));
    cfg.blockDim = dim3(kCombineWarps * 32);
    cfg.stream = s;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = p.sm90 || p.sm90_fp8 ? 1 : 0;
    MLADCP_RETURN_IF_ERROR(cuda_status(few ? cudaLaunchKernelEx(&cfg, mla_decode_combine_kernel<true>, p)
                                           : cudaLaunchKernelEx(&cfg, mla_decode_combine_kernel<false>, p),
                                       "mla_decode_combine_kernel launch"));
  }
  return Status::Ok();
}

}  // namespace mladcp::cuda_impl
