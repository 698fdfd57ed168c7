// Hopper (sm_90a) decode kernel of the "cuda" backend for fp8-e4m3 caches: N = 16 or 32 query rows per CTA,
// one warpgroup, two CTAs per SM, pages of any size.
//
// Same contract, split plan, workspace and combine as the portable kernel (decode_kernel.cuh): one CTA = one
// (sequence, chunk of N query rows, split of local keys); a single-split sequence writes out/lse directly,
// otherwise the CTA writes the normalized fp32 partial state for the combine kernel.
//
// The products are turned around against the 64-row kernel (sm90_decode_kernel.cu): the 64 keys of a tile are
// the M dimension of every wgmma and the CTA's N query rows the N dimension, so few rows cost few tensor-core
// cycles (m64nNk16 on N rows instead of m64n64k16 on 64 rows, most of them empty):
//   Sᵀ [64 keys × N]   = K [64 × 576] · Qᵀ              36 × wgmma.m64nNk16, K and Q K-major in shared memory
//   Oᵀ [512 × N]      += Vᵀ [512 × 64] · Pᵀ [64 × N]     8 dim blocks × 4 key steps of wgmma.m64nNk16; V read
//                                                        transposed from the key tile (keys are stored once and
//                                                        serve as K and V), P from shared memory
// Keys: every thread loads 18 × 16 bytes of fp8 of the next tile into registers (plain loads through the block
// table, so any page size) while the current tile is multiplied, and converts them to bf16 into the swizzled
// tile when that tile is done (exact: every e4m3 value is a bf16 value; kv_scale is folded into the score and
// output scales). Keys that are absent (past the split, on an invalid block id) are written as zeros and masked.
//
// Per tile: convert + store (bar A) → scores, mask, column maxima per warp (bar B) → maxima of the 4 warps,
// rescale, P → shared memory (bar C) → P·V, wait (bar D: the tile and P may be written again).
//
// Shared memory (128-byte-swizzled tiles, 1024-byte aligned):
//   kv  [9 column blocks][64 keys][128 B]  the key tile (bf16); at the end the normalized Oᵀ, transposed
//   q   [9][N rows][128 B]                 the CTA's query rows (zero past the sequence's rows)
//   p   [N rows][128 B]                    P (bf16), 64 keys per row
//   red [4 warps][N] fp32                  per-warp column maxima, then row sums
// Loads: warp w loads keys [16w, 16w + 16) of the tile, 576 bytes each, as 18 loads of 16 bytes per lane:
// loads 0-15 take 4 keys × 128 contiguous bytes (8 lanes per key), loads 16-17 the last 64 bytes of 8 keys
// (4 lanes per key). Every load is 32-byte-sector efficient, and the bf16 stores of each load hit every bank
// group equally (4 wavefronts per 512 bytes, the minimum).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/lse_math.h"
#include "cuda/decode_kernel.cuh"
#include "cuda/sm90_decode.h"
#include "cuda/sm90_ptx.cuh"

namespace mladcp::cuda_impl {
namespace {

using namespace sm90;

constexpr int kTile = 64;                    // keys per tile
constexpr int kThreads = 128;                // one warpgroup
constexpr int kBlockBytes = kSm90BlockBytes;  // [64 keys][128 B]: 64 dims of a tile
constexpr int kTileBytes = 9 * kBlockBytes;  // 73728
constexpr int kLoads = 18;                   // 16-byte fp8 loads per thread and tile
constexpr int kOutStride = kLatentDim + 4;   // floats per row of the transposed output (conflict-free stores)
// Independent score accumulators (16 and 32 rows per CTA).
#ifndef MLADCP_FP8_QK_ACCS_16
#define MLADCP_FP8_QK_ACCS_16 4
#endif
#ifndef MLADCP_FP8_QK_ACCS_32
#define MLADCP_FP8_QK_ACCS_32 1
#endif

template <int N>
struct F8Smem {
  static constexpr int kv = 0;
  static constexpr int q = kv + kTileBytes;
  static constexpr int p = q + 9 * N * 128;
  static constexpr int red = p + N * 128;
  static constexpr int total = red + 4 * N * 4;
  static_assert(q % 1024 == 0 && p % 1024 == 0, "alignment of the swizzled tiles");
  static_assert(N * kOutStride * 4 <= kTileBytes, "the transposed output fits the key tile");
};
// Two CTAs per SM (228 KiB of shared memory, 1 KiB reserved per CTA).
static_assert(2 * (F8Smem<32>::total + 1024) <= 228 * 1024, "two 32-row CTAs per SM");

// wgmma.m64nNk16 (bf16 in, fp32 accumulate), both operands from shared memory; kTransA = 1 reads A
// M-major (Vᵀ from the key tile).
template <int kTransA>
__device__ __forceinline__ void wgmma_n16(float (&d)[8], uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7}, %8, %9, p, 1, 1, %11, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(a), "l"(b), "r"(accumulate), "n"(kTransA));
}
template <int kTransA>
__device__ __forceinline__ void wgmma_n32(float (&d)[16], uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, %19, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(a), "l"(b), "r"(accumulate), "n"(kTransA));
}
template <int kTransA, int A>
__device__ __forceinline__ void wgmma_n(float (&d)[A], uint64_t a, uint64_t b, int accumulate) {
  if constexpr (A == 8)
    wgmma_n16<kTransA>(d, a, b, accumulate);
  else
    wgmma_n32<kTransA>(d, a, b, accumulate);
}

// 16 bytes of the cache, not kept in L1 (each byte is read once per CTA).
__device__ __forceinline__ uint4 load_stream(const uint8_t* ptr) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(ptr));
  return v;
}

// Load j of a thread: key (within the tile) and 16-byte part (of the key's 36).
__device__ __forceinline__ int load_key(int j, int warp, int lane) {
  return j < 16 ? 16 * warp + 4 * (j % 4) + (lane >> 3) : 16 * warp + 8 * (j - 16) + (lane >> 2);
}
__device__ __forceinline__ int load_part(int j, int lane) { return j < 16 ? 8 * (j / 4) + (lane & 7) : 32 + (lane & 3); }

template <int N>
__global__ void __launch_bounds__(kThreads, 2) mla_decode_sm90_fp8_kernel(const DecodeKernelParams p) {
  using L = F8Smem<N>;
  constexpr int kAcc = N / 2;   // accumulator floats per thread of an m64nN product
  constexpr int kCols = N / 4;  // query rows of a thread: n = 8·(i / 2) + 2·(lane % 4) + i % 2
  constexpr int kQkAccs = N == 16 ? MLADCP_FP8_QK_ACCS_16 : MLADCP_FP8_QK_ACCS_32;
  extern __shared__ __align__(1024) uint8_t smem[];
  uint8_t* const kv_s = smem + L::kv;
  uint8_t* const q_s = smem + L::q;
  uint8_t* const p_s = smem + L::p;
  float* const red = reinterpret_cast<float*>(smem + L::red);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  constexpr int kBar = 1;

  int64_t bid = blockIdx.x;
  const int rc = int(bid % p.row_chunks);
  bid /= p.row_chunks;
  const int split = int(bid % p.max_splits);
  const int seq = int(bid / p.max_splits);
  const int len = clamped_len(p, seq);
  const int n_max = int(sharding::local_len(len, p.shard.world, p.shard.rank, p.shard.interleave));
  const int nsplits = cuda_plan::num_splits(n_max, p.split_len);
  if (split >= nsplits) return;
  const int k_begin = split * p.split_len;
  const int k_end = min(k_begin + p.split_len, n_max);
  const int ntiles = k_end > k_begin ? (k_end - k_begin + kTile - 1) / kTile : 0;
  const int row0 = rc * N;

  // ---- query rows → q (rows past the sequence's R rows are zero) ----
  for (int c = tid; c < N * kRowChunks; c += kThreads) {
    const int r = c / kRowChunks, ch = c - r * kRowChunks;
    const int grow = row0 + r;
    const bool valid = grow < p.rows_per_seq;
    const uint16_t* src = p.q;
    if (valid) {
      const int i = grow / p.num_heads, h = grow - i * p.num_heads;
      src = p.q + q_elem(p, int64_t(seq) * p.q_len + i, h) + ch * 8;
    }
    cp_async_16(smem_addr(q_s + (ch >> 3) * (N * 128) + r * 128 + (((ch & 7) ^ (r & 7)) << 4)), src, valid);
  }
  cp_async_commit();

  // ---- key loads of a tile into registers (zeros for absent keys) ----
  const int32_t* const bt_row = p.block_table + int64_t(seq) * p.block_table_stride;
  uint4 f[kLoads];
  bool present[2];  // keys 16·warp + lane / 4 and + 8 of the loaded tile (this thread's score rows)
  auto load_tile = [&](int t) {
    const int kt = k_begin + t * kTile;
    const uint8_t* base[6];
    bool ok[6];
#pragma unroll
    for (int i = 0; i < 6; ++i) {
      const int key = i < 4 ? load_key(i, warp, lane) : load_key(12 + i, warp, lane);
      const int k = kt + key;
      ok[i] = false;
      base[i] = p.kv;
      if (k < k_end) {
        const int page = k / p.block_size;
        const int32_t b = page < p.max_blocks_per_seq ? __ldg(bt_row + page) : -1;
        if (b >= 0 && b < p.num_blocks) {
          ok[i] = true;
          base[i] = p.kv + int64_t(b) * p.kv_stride_block + int64_t(k - page * p.block_size) * p.kv_stride_token;
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      const int i = j < 16 ? j % 4 : j - 12;
      f[j] = ok[i] ? load_stream(base[i] + 16 * load_part(j, lane)) : make_uint4(0, 0, 0, 0);
    }
    present[0] = ok[4];
    present[1] = ok[5];
  };
  // The loaded tile → bf16 in the swizzled key tile.
  auto store_tile = [&]() {
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      const int key = load_key(j, warp, lane), part = load_part(j, lane);
      const int cc = (part & 3) * 2;  // first of the two 16-byte bf16 chunks in the column block's row
      uint8_t* const row = kv_s + (part >> 2) * kBlockBytes + key * 128;
      uint4 lo, hi;
      lo.x = fp8x2_to_bf16x2(f[j].x & 0xffffu);
      lo.y = fp8x2_to_bf16x2(f[j].x >> 16);
      lo.z = fp8x2_to_bf16x2(f[j].y & 0xffffu);
      lo.w = fp8x2_to_bf16x2(f[j].y >> 16);
      hi.x = fp8x2_to_bf16x2(f[j].z & 0xffffu);
      hi.y = fp8x2_to_bf16x2(f[j].z >> 16);
      hi.z = fp8x2_to_bf16x2(f[j].w & 0xffffu);
      hi.w = fp8x2_to_bf16x2(f[j].w >> 16);
      *reinterpret_cast<uint4*>(row + ((cc ^ (key & 7)) << 4)) = lo;
      *reinterpret_cast<uint4*>(row + (((cc + 1) ^ (key & 7)) << 4)) = hi;
    }
  };

  // ---- per-thread state: query rows n(i), their visible keys, running max and sums ----
  int nvis[kCols];
  float m[kCols], l[kCols];
#pragma unroll
  for (int i = 0; i < kCols; ++i) {
    const int n = 8 * (i / 2) + 2 * (lane & 3) + (i & 1);
    const int grow = row0 + n;
    nvis[i] =
        grow < p.rows_per_seq ? int(sharding::visible_local_keys(len, p.q_len, grow / p.num_heads, p.shard)) : 0;
    m[i] = -INFINITY;
    l[i] = 0.0f;
  }
  const int key_a = 16 * warp + (lane >> 2);  // this thread's score rows: key_a and key_a + 8 of each tile

  const uint32_t kv_addr = smem_addr(kv_s);
  const uint32_t k_lo = kmajor_lo(kv_addr), v_lo = nmajor_lo(kv_addr);
  const uint32_t q_lo = kmajor_lo(smem_addr(q_s)), p_lo = kmajor_lo(smem_addr(p_s));
  const float scale = p.score_scale_log2;

  // Accumulators are first written by the tensor cores (the first products overwrite them).
  float o[8][kAcc];         // dim block b: dims 64b + key_a (+ 8), query rows n(i)
  float sa[kQkAccs][kAcc];  // partial scores

  if (ntiles > 0) load_tile(0);
  cp_async_wait_all();
  for (int t = 0; t < ntiles; ++t) {
    const bool pres_a = present[0], pres_b = present[1];
    store_tile();
    if (t + 1 < ntiles) load_tile(t + 1);  // in flight while this tile is multiplied
    fence_proxy_async();
    named_bar_sync(kBar, kThreads);  // (A) the tile and the query rows are in shared memory

    // Sᵀ = K·Qᵀ over 576 dims, in kQkAccs independent accumulators (interleaved k-steps), so that the
    // tensor cores need not finish one product before starting the next.
    wgmma_fence();
#pragma unroll
    for (int a = 0; a < kQkAccs; ++a) fence_regs(sa[a]);
#pragma unroll
    for (int step = 0; step < 36; ++step) {
      const int c = step / 4, k4 = step % 4;
      wgmma_n<0>(sa[step % kQkAccs], desc(k_lo + uint32_t((c * kBlockBytes + k4 * 32) >> 4)),
                 desc(q_lo + uint32_t((c * N * 128 + k4 * 32) >> 4)), step >= kQkAccs);
    }
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int a = 0; a < kQkAccs; ++a) fence_regs(sa[a]);
    float s[kAcc];
#pragma unroll
    for (int x = 0; x < kAcc; ++x) {
      s[x] = sa[0][x];
#pragma unroll
      for (int a = 1; a < kQkAccs; ++a) s[x] += sa[a][x];
    }

    // Absent keys and keys after a row's causal limit → -inf; column maxima of the warp's 16 keys.
    const int kt = k_begin + t * kTile;
    float mx[kCols];
#pragma unroll
    for (int i = 0; i < kCols; ++i) {
      const int j = i / 2, e = i & 1;
      s[4 * j + e] = pres_a && kt + key_a < nvis[i] ? s[4 * j + e] : -INFINITY;
      s[4 * j + 2 + e] = pres_b && kt + key_a + 8 < nvis[i] ? s[4 * j + 2 + e] : -INFINITY;
      mx[i] = fmaxf(s[4 * j + e], s[4 * j + 2 + e]);
#pragma unroll
      for (int sh = 4; sh < 32; sh <<= 1) mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], sh));
    }
    if (lane < 4) {
#pragma unroll
      for (int i = 0; i < kCols; ++i) red[warp * N + 8 * (i / 2) + 2 * lane + (i & 1)] = mx[i];
    }
    named_bar_sync(kBar, kThreads);  // (B)

    // New maxima (base-2 logits), P = 2^(S·scale − m) → shared memory, O rescaled.
    float alpha[kCols];
    bool moved = false;
#pragma unroll
    for (int i = 0; i < kCols; ++i) {
      const int j = i / 2, e = i & 1, n = 8 * j + 2 * (lane & 3) + e;
      const float tile_max = fmaxf(fmaxf(red[n], red[N + n]), fmaxf(red[2 * N + n], red[3 * N + n]));
      const float m_new = fmaxf(m[i], tile_max * scale);
      alpha[i] = rescale_factor(m[i], m_new);
      moved |= alpha[i] != 1.0f;
      m[i] = m_new;
      const float neg_m = m_new == -INFINITY ? 0.0f : -m_new;
      const float pa = fast_exp2(fmaf(s[4 * j + e], scale, neg_m));
      const float pb = fast_exp2(fmaf(s[4 * j + 2 + e], scale, neg_m));
      l[i] = l[i] * alpha[i] + (pa + pb);
      uint8_t* const prow = p_s + n * 128;
      const __nv_bfloat16 ba = __float2bfloat16_rn(pa), bb = __float2bfloat16_rn(pb);
      *reinterpret_cast<__nv_bfloat16*>(prow + (((key_a >> 3) ^ (n & 7)) << 4) + (key_a & 7) * 2) = ba;
      *reinterpret_cast<__nv_bfloat16*>(prow + ((((key_a + 8) >> 3) ^ (n & 7)) << 4) + (key_a & 7) * 2) = bb;
    }
    if (t > 0 && __any_sync(0xffffffffu, moved)) {
#pragma unroll
      for (int b = 0; b < 8; ++b)
#pragma unroll
        for (int i = 0; i < kCols; ++i) {
          const int j = i / 2, e = i & 1;
          o[b][4 * j + e] *= alpha[i];
          o[b][4 * j + 2 + e] *= alpha[i];
        }
    }
    fence_proxy_async();
    named_bar_sync(kBar, kThreads);  // (C) P is in shared memory

    // Oᵀ += Vᵀ·Pᵀ: dim block b = column block b of the tile, read M-major; 16 keys per step, the 8 dim
    // blocks (independent accumulators) one after the other.
    wgmma_fence();
#pragma unroll
    for (int b = 0; b < 8; ++b) fence_regs(o[b]);
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
#pragma unroll
      for (int b = 0; b < 8; ++b)
        wgmma_n<1>(o[b], desc(v_lo + uint32_t((b * kBlockBytes + ks * 16 * 128) >> 4)),
                   desc(p_lo + uint32_t((ks * 32) >> 4)), t > 0 || ks > 0);
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int b = 0; b < 8; ++b) fence_regs(o[b]);
    named_bar_sync(kBar, kThreads);  // (D) the tile and P may be written again
  }

  // ---- row sums of the 64 keys of the 4 warps ----
#pragma unroll
  for (int i = 0; i < kCols; ++i)
#pragma unroll
    for (int sh = 4; sh < 32; sh <<= 1) l[i] += __shfl_xor_sync(0xffffffffu, l[i], sh);
  if (lane < 4) {
#pragma unroll
    for (int i = 0; i < kCols; ++i) red[warp * N + 8 * (i / 2) + 2 * lane + (i & 1)] = l[i];
  }
  named_bar_sync(kBar, kThreads);

  // ---- normalized Oᵀ → the key tile as [N rows][kOutStride] fp32; base-2 LSE per row → p ----
  float* const ot = reinterpret_cast<float*>(kv_s);
  float* const row_lse = reinterpret_cast<float*>(p_s);
  const bool none = ntiles == 0;  // O was never written: the rows are 0
#pragma unroll
  for (int i = 0; i < kCols; ++i) {
    const int j = i / 2, e = i & 1, n = 8 * j + 2 * (lane & 3) + e;
    const float sum = red[n] + red[N + n] + red[2 * N + n] + red[3 * N + n];
    const float inv = sum > 0.0f ? p.out_scale / sum : 0.0f;
#pragma unroll
    for (int b = 0; b < 8; ++b) {
      ot[n * kOutStride + 64 * b + key_a] = none ? 0.0f : o[b][4 * j + e] * inv;
      ot[n * kOutStride + 64 * b + key_a + 8] = none ? 0.0f : o[b][4 * j + 2 + e] * inv;
    }
    if (warp == 0 && lane < 4) row_lse[n] = sum > 0.0f ? m[i] + log2f(sum) : -INFINITY;
  }
  named_bar_sync(kBar, kThreads);

  // ---- write: final output (one split) or the partial state (several); a warp per row, 16 columns a lane ----
  const bool direct = nsplits == 1;
  for (int n = warp; n < N; n += 4) {
    const int grow = row0 + n;
    if (grow >= p.rows_per_seq) break;
    const int i = grow / p.num_heads, h = grow - i * p.num_heads;
    const int64_t tok = int64_t(seq) * p.q_len + i;
    const float lse2 = row_lse[n];
    if (direct) {
      const int64_t ob = out_elem(p, tok, h);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int col = 4 * lane + 128 * q;
        const float4 v = *reinterpret_cast<const float4*>(ot + n * kOutStride + col);
        if (p.out_fp32) {
          *reinterpret_cast<float4*>(static_cast<float*>(p.out) + ob + col) = v;
        } else {
          uint2 w;
          w.x = pack_bf16(v.x, v.y);
          w.y = pack_bf16(v.z, v.w);
          *reinterpret_cast<uint2*>(static_cast<uint16_t*>(p.out) + ob + col) = w;
        }
      }
      if (p.lse && lane == 0)
        p.lse[lse_elem(p, tok, h)] = lse::convert(lse2, LseBase::k2, p.lse_base2 ? LseBase::k2 : LseBase::kE);
    } else {
      const int64_t state = (int64_t(seq) * p.max_splits + split) * p.rows_per_seq + grow;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int col = 4 * lane + 128 * q;
        *reinterpret_cast<float4*>(p.ws_o + state * kLatentDim + col) =
            *reinterpret_cast<const float4*>(ot + n * kOutStride + col);
      }
      if (lane == 0) p.ws_lse[state] = lse2;
    }
  }
  // The combine kernel (a programmatic dependent launch) may start its prologue; it waits for this grid.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

}  // namespace

size_t sm90_fp8_decode_smem_bytes(int rows_per_cta) {
  return size_t(rows_per_cta <= 16 ? F8Smem<16>::total : F8Smem<32>::total);
}

cudaError_t set_sm90_fp8_decode_smem() {
  cudaError_t e = cudaFuncSetAttribute(mla_decode_sm90_fp8_kernel<16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       F8Smem<16>::total);
  if (e == cudaSuccess)
    e = cudaFuncSetAttribute(mla_decode_sm90_fp8_kernel<32>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             F8Smem<32>::total);
  return e;
}

cudaError_t launch_sm90_fp8_decode(const DecodeKernelParams& p, int64_t grid, cudaStream_t stream) {
  if (p.rows_per_cta == 16)
    mla_decode_sm90_fp8_kernel<16><<<dim3(unsigned(grid)), dim3(kThreads), size_t(F8Smem<16>::total), stream>>>(p);
  else
    mla_decode_sm90_fp8_kernel<32><<<dim3(unsigned(grid)), dim3(kThreads), size_t(F8Smem<32>::total), stream>>>(p);
  return cudaGetLastError();
}

}  // namespace mladcp::cuda_impl
