// Merging partial attention states (N-way merge and the DCP rescale) and writing new tokens into the
// paged cache, on the device. The arithmetic is the host's: lse::Combiner for the weights, fp32
// accumulation in state order, numeric:: conversions for storage.
#include <cuda_runtime.h>

#include "core/lse_math.h"
#include "core/numeric.h"
#include "cuda/cuda_status.h"
#include "cuda/state_kernels.h"
#include "mladcp/config.h"

namespace mladcp::cuda_impl {
namespace {

constexpr int kWarpsPerBlock = 8;

// Merge and rescale: one row (token, head) per kRowThreads threads, kRowsPerBlock rows per block.
// Thread i of a row owns columns i, i + 128, i + 256, ... (coalesced), kCols of them per pass, so a
// 512-wide row is one pass whose loads are all in flight together: at small T the kernel costs about
// two memory latencies (LSEs, then values) instead of one latency per 32 columns.
constexpr int kRowThreads = 128;
constexpr int kRowsPerBlock = 2;
constexpr int kCols = 4;  // columns per thread per pass
constexpr int kRowsBlockThreads = kRowThreads * kRowsPerBlock;

// Every thread of a row folds the row's LSEs (the same few floats, served by L1); the sum over
// states runs in state order for every column, as on the host. The value loads do not depend on the
// weight (a state of weight 0 contributes exactly 0 through lse::weighted even when it holds NaN), so
// the loads of several states are issued back to back.
__global__ void __launch_bounds__(kRowsBlockThreads) merge_kernel(const MergeParams p) {
  const int tid = threadIdx.x % kRowThreads;
  const int64_t w = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kRowThreads;
  if (w >= int64_t(p.num_tokens) * p.num_heads) return;
  const int64_t t = w / p.num_heads, h = w - t * p.num_heads;
  const float* lse_row = p.in_lse + t * p.lse_stride_token + h;
  lse::Combiner c(p.in_base);
  for (int n = 0; n < p.num_states; ++n) c.observe_max(lse_row[n * p.lse_stride_state]);
  for (int n = 0; n < p.num_states; ++n) c.accumulate(lse_row[n * p.lse_stride_state]);

  const int64_t in_row = t * p.in_stride_token + h * p.in_stride_head;
  const int64_t out_row = t * p.out_stride_token + h * p.out_stride_head;
  for (int d0 = tid; d0 < p.head_dim; d0 += kRowThreads * kCols) {
    float acc[kCols];
#pragma unroll
    for (int k = 0; k < kCols; ++k) acc[k] = 0.0f;
#pragma unroll 4
    for (int n = 0; n < p.num_states; ++n) {
      const float wn = c.weight(lse_row[n * p.lse_stride_state]);
      const int64_t src = n * p.in_stride_state + in_row;
      float v[kCols];
#pragma unroll
      for (int k = 0; k < kCols; ++k) {
        const int d = d0 + k * kRowThreads;
        v[k] = d < p.head_dim ? numeric::load_as_float(p.in_out, p.in_dtype, src + d) : 0.0f;
      }
#pragma unroll
      for (int k = 0; k < kCols; ++k) acc[k] += lse::weighted(wn, v[k]);
    }
#pragma unroll
    for (int k = 0; k < kCols; ++k) {
      const int d = d0 + k * kRowThreads;
      if (d < p.head_dim) numeric::store_from_float(p.out, p.out_dtype, out_row + d, acc[k]);
    }
  }
  if (p.out_lse && tid == 0)
    p.out_lse[t * p.out_lse_stride_token + h] = lse::convert(c.merged_lse(), p.in_base, p.out_base);
}

// out *= b^(lse[rank] - merged), exactly 0 for an empty state; same row layout as the merge (every
// load of a pass before any store).
__global__ void __launch_bounds__(kRowsBlockThreads) rescale_kernel(const RescaleParams p) {
  const int tid = threadIdx.x % kRowThreads;
  const int64_t w = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kRowThreads;
  const int64_t R = p.rows, D = p.head_dim;
  if (w >= R) return;
  lse::Combiner c(p.base);
  for (int n = 0; n < p.world; ++n) c.observe_max(p.all_lse[n * R + w]);
  for (int n = 0; n < p.world; ++n) c.accumulate(p.all_lse[n * R + w]);
  const float wt = c.weight(p.all_lse[p.rank * R + w]);
  for (int64_t d0 = tid; d0 < D; d0 += kRowThreads * kCols) {
    float v[kCols];
#pragma unroll
    for (int k = 0; k < kCols; ++k) {
      const int64_t d = d0 + k * kRowThreads;
      v[k] = d < D ? numeric::load_as_float(p.out, p.out_dtype, w * D + d) : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < kCols; ++k) {
      const int64_t d = d0 + k * kRowThreads;
      if (d < D) numeric::store_from_float(p.out, p.out_dtype, w * D + d, lse::weighted(wt, v[k]));
    }
  }
  if (p.merged_lse && tid == 0) p.merged_lse[w] = c.merged_lse();
}

// One warp per new token: [kv_c | k_pe] → cache slot, converted to the cache dtype. Slots -1 and
// slots outside [0, num_blocks · block_size) are skipped (the host cannot check device slots
// without a synchronization).
__global__ void __launch_bounds__(kWarpsPerBlock * 32) cache_write_kernel(const CacheWriteParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t i = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (i >= p.num_tokens) return;
  const int64_t slot = p.slot_mapping[i];
  if (slot < 0 || slot >= int64_t(p.num_blocks) * p.block_size) return;
  const int64_t dst = (slot / p.block_size) * p.kv_stride_block + (slot % p.block_size) * p.kv_stride_token;
  const bool fp8 = p.cache_dtype == DType::kFP8E4M3;
  for (int d = lane; d < kQkDim; d += 32) {
    const float v = d < kLatentDim ? numeric::load_as_float(p.kv_c, p.src_dtype, i * p.kv_c_stride + d)
                                   : numeric::load_as_float(p.k_pe, p.src_dtype, i * p.k_pe_stride + (d - kLatentDim));
    if (fp8)
      static_cast<uint8_t*>(p.kv_cache)[dst + d] = numeric::float_to_fp8e4m3(v / p.kv_scale);
    else
      static_cast<uint16_t*>(p.kv_cache)[dst + d] = numeric::float_to_bf16(v);
  }
}

unsigned blocks_for(int64_t warps) { return unsigned((warps + kWarpsPerBlock - 1) / kWarpsPerBlock); }
unsigned row_blocks_for(int64_t rows) { return unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock); }

}  // namespace

Status launch_merge(const MergeParams& p, void* stream) {
  const int64_t rows = int64_t(p.num_tokens) * p.num_heads;
  if (rows == 0) return Status::Ok();
  merge_kernel<<<row_blocks_for(rows), kRowsBlockThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  return cuda_status(cudaGetLastError(), "merge_kernel launch");
}

Status launch_rescale(const RescaleParams& p, void* stream) {
  const int64_t rows = p.rows;
  if (rows == 0) return Status::Ok();
  rescale_kernel<<<row_blocks_for(rows), kRowsBlockThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  return cuda_status(cudaGetLastError(), "rescale_kernel launch");
}

Status launch_cache_write(const CacheWriteParams& p, void* stream) {
  if (p.num_tokens == 0) return Status::Ok();
  cache_write_kernel<<<blocks_for(p.num_tokens), kWarpsPerBlock * 32, 0, static_cast<cudaStream_t>(stream)>>>(p);
  return cuda_status(cudaGetLastError(), "cache_write_kernel launch");
}

}  // namespace mladcp::cuda_impl
