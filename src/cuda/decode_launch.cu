// Launch of the decode: the split kernel of the right shape, then the combine kernel over splits.
#include <cuda_runtime.h>

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

namespace {

constexpr int kCombineWarps = 8;

__device__ __forceinline__ void store4(void* out, bool fp32, int64_t i, float4 v) {
  if (fp32) {
    *reinterpret_cast<float4*>(static_cast<float*>(out) + i) = v;
  } else {
    uint2 b;
    b.x = pack_bf16(v.x, v.y);
    b.y = pack_bf16(v.z, v.w);
    *reinterpret_cast<uint2*>(static_cast<uint16_t*>(out) + i) = b;
  }
}

// One CTA (8 warps) per (sequence, query row) of a sequence with two or more splits (or parts). The weights
// come from lse::Combiner: each lane observes and accumulates a strided subset of the splits, the
// warp combines max then sum (the same two passes, just spread over lanes). Warp w sums splits
// w, w + 8, ... over 512 columns (16 per lane, float4 loads), and the 8 partial sums are added in
// warp order through shared memory: a fixed order, so the result is deterministic.
__global__ void __launch_bounds__(kCombineWarps * 32) mla_decode_combine_kernel(const DecodeKernelParams p) {
  __shared__ float4 part[kCombineWarps][kLatentDim / 4];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Launched as a programmatic dependent of the Hopper split kernel: wait for its partial states.
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t w = blockIdx.x;
  const int seq = int(w / p.rows_per_seq);
  const int grow = int(w - int64_t(seq) * p.rows_per_seq);
  // Partial state s of this row: split s of the sequence, or (balanced schedule) its s-th part's slot.
  int nsplits = 0;
  int64_t state0 = 0, step = 0;  // state s = state0 + s · step (+ the first part's slot)
  int64_t slot0 = 0;
  if (p.parts > 0) {
    const cuda_plan::BalancedRecord r = p.ws_record[seq];
    nsplits = r.parts;
    state0 = int64_t(r.first_part) * 2 * p.rows_per_seq + grow;
    step = 2 * int64_t(p.rows_per_seq);
    slot0 = int64_t(r.slot) * p.rows_per_seq;
  } else {
    const int len = clamped_len(p, seq);
    const int64_t n_max = sharding::local_len(len, p.shard.world, p.shard.rank, p.shard.interleave);
    nsplits = cuda_plan::num_splits(n_max, p.split_len);
    state0 = int64_t(seq) * p.max_splits * p.rows_per_seq + grow;
    step = p.rows_per_seq;
  }
  if (nsplits <= 1) return;  // written by the split kernel
  auto state = [&](int s) { return state0 + s * step + (s == 0 ? slot0 : 0); };

  lse::Combiner c(LseBase::k2);
  for (int s = lane; s < nsplits; s += 32) c.observe_max(p.ws_lse[state(s)]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) c.max_l = fmaxf(c.max_l, __shfl_xor_sync(0xffffffffu, c.max_l, o));
  for (int s = lane; s < nsplits; s += 32) c.accumulate(p.ws_lse[state(s)]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) c.sum += __shfl_xor_sync(0xffffffffu, c.sum, o);

  float4 acc[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s = warp; s < nsplits; s += kCombineWarps) {
    const float wt = c.weight(p.ws_lse[state(s)]);
    if (wt == 0.0f) continue;
    const float4* src = reinterpret_cast<const float4*>(p.ws_o + state(s) * kLatentDim);
    float4 v[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = src[lane + 32 * i];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      acc[i].x += lse::weighted(wt, v[i].x);
      acc[i].y += lse::weighted(wt, v[i].y);
      acc[i].z += lse::weighted(wt, v[i].z);
      acc[i].w += lse::weighted(wt, v[i].w);
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) part[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  const int i_tok = grow / p.num_heads, h = grow - i_tok * p.num_heads;
  const int64_t t = int64_t(seq) * p.q_len + i_tok;
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
    store4(p.out, p.out_fp32, out_elem(p, t, h) + 4 * threadIdx.x, sum);
  }
  if (p.lse && threadIdx.x == 0)
    p.lse[lse_elem(p, t, h)] = lse::convert(c.merged_lse(), LseBase::k2, p.lse_base2 ? LseBase::k2 : LseBase::kE);
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

Status launch_decode(const DecodeKernelParams& p, bool fp8, int64_t grid, void* stream) {
  if (grid <= 0) return Status::Ok();
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaError_t e = cudaSuccess;
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
  if (p.max_splits > 1 || p.parts > 0) {
    const int64_t blocks = int64_t(p.num_seqs) * p.rows_per_seq;
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
    MLADCP_RETURN_IF_ERROR(
        cuda_status(cudaLaunchKernelEx(&cfg, mla_decode_combine_kernel, p), "mla_decode_combine_kernel launch"));
  }
  return Status::Ok();
}

}  // namespace mladcp::cuda_impl
