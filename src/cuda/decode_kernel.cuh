// Split-KV MLA decode kernel: tensor cores (mma.sync m16n8k16, bf16 in, fp32 accumulate), paged cache.
//
// One CTA = one (sequence, chunk of M = 16·MT query rows, split of local keys). Two shapes:
//   MT = 1 (16 rows, memory-bound): 4 warps, 32-key tiles, two CTAs per SM, so that one CTA's loads
//          are in flight while the other computes or waits at a barrier;
//   MT = 2, 4 (32, 64 rows): 8 warps, 64-key tiles, one CTA per SM.
// Shared memory:
//   q_s   [M][576] bf16              the CTA's query rows, loaded once
//   kv_s  [stages][T][576] bf16      key tiles (double-buffered by cp.async for bf16 caches)
//   f8_s  [stages][T][576] fp8       raw fp8 tiles (fp8 caches), dequantized into kv_s
//   p_s   [M][T] bf16                probabilities of the current tile
// Rows of q_s, kv_s and p_s are stored with their 16-byte chunks XOR-swizzled, so that every
// ldmatrix of 8 rows hits 8 different bank groups.
//
// Per T-key tile:
//   scores  S = Q·Kᵀ over 576 dims. Warp w owns m-tile (w % MT) and T·MT/W keys (group w / MT).
//   softmax row max across the key groups through shared memory, base-2 exponentials, P → p_s.
//   output  O = O·α + P·V. Warp w owns 512/W output columns for all M rows (64-row CTA: 128 fp32
//           accumulator registers per thread).
// Keys past the split, past the sequence, on out-of-range block ids, or after a query token's causal
// limit get score -inf; their tile rows are zero-filled so no NaN of an unused cache slot can reach
// the P·V product.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/lse_math.h"
#include "cuda/decode_kernels.h"
#include "cuda/decode_plan.h"
#include "mladcp/config.h"
#include "mladcp/sharding.h"

namespace mladcp::cuda_impl {

inline constexpr int kRowChunks = kQkDim / 8;  // 72 chunks of 16 bytes per bf16 row
inline constexpr int kRowBytes = kQkDim * 2;   // 1152
inline constexpr int kF8RowBytes = kQkDim;     // 576

// Shape of the split kernel for MT m-tiles of 16 query rows.
__host__ __device__ constexpr int split_warps(int mt) { return mt == 1 ? 4 : 8; }
__host__ __device__ constexpr int split_tile(int mt) { return mt == 1 ? 32 : 64; }
__host__ __device__ constexpr int split_threads(int mt) { return 32 * split_warps(mt); }

// Shared-memory layout of the split kernel (byte offsets).
struct SplitSmem {
  int q, kv, f8, p, red_max, red_l, alpha, m, tok_ok, total;
  __host__ __device__ constexpr SplitSmem(int mt, bool fp8, int stages)
      : q(0),
        kv(q + 16 * mt * kRowBytes),
        f8(kv + (fp8 ? 1 : stages) * split_tile(mt) * kRowBytes),
        p(f8 + (fp8 ? stages * split_tile(mt) * kF8RowBytes : 0)),
        red_max(p + 16 * mt * split_tile(mt) * 2),
        red_l(red_max + 16 * split_warps(mt) * 4),
        alpha(red_l + 16 * split_warps(mt) * 4),
        m(alpha + 16 * mt * 4),
        tok_ok(m + 16 * mt * 4),
        total(tok_ok + 2 * split_tile(mt)) {}
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Byte offset of 16-byte chunk c of row r in a swizzled [rows][72 chunks] tile.
__device__ __forceinline__ uint32_t tile_off(int r, int c) { return uint32_t(r * kRowBytes + ((c ^ (r & 7)) << 4)); }

// Byte offset of 16-byte chunk c of row r in a swizzled [rows][T] bf16 probability tile (T = 64: 8
// chunks per row; T = 32: 4 chunks, rows paired so that 8 consecutive rows still cover 8 bank groups).
template <int T>
__device__ __forceinline__ uint32_t p_off(int r, int c) {
  if constexpr (T == 64)
    return uint32_t(r * 128 + ((c ^ (r & 7)) << 4));
  else
    return uint32_t(r * 64 + ((c ^ ((r >> 1) & 3)) << 4));
}

__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;  // 0 bytes read: the 16 bytes are zero-filled
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
// Waits until at most the most recent group is still in flight.
__device__ __forceinline__ void cp_async_wait_one() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// d += a·b for one 16×8×16 tile (a row-major 16×16, b column-major 16×8).
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Two fp8-e4m3 values (low byte first) to two bf16, exactly (every e4m3 value is a bf16 value).
__device__ __forceinline__ uint32_t fp8x2_to_bf16x2(uint32_t two) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two), __NV_E4M3);
  const float2 f = __half22float2(__half2(h));
  return pack_bf16(f.x, f.y);
}

__device__ __forceinline__ int64_t q_elem(const DecodeKernelParams& p, int64_t t, int h) {
  return int64_t(h / p.head_group_size) * p.q_stride_group + t * p.q_stride_token +
         int64_t(h % p.head_group_size) * p.q_stride_head;
}
// lse::Combiner of a row's `count` partial states over one warp: lane i observes states i, i + 32, ... (lse_of(s)),
// then the warp reduces the maximum and the sum by xor butterflies. The combine kernel and the Hopper kernel's fused
// merge both take it, so a row's weights have the same bits whichever merges it (batch invariance).
template <class LseOf>
__device__ __forceinline__ lse::Combiner warp_combiner(int count, const LseOf& lse_of) {
  lse::Combiner c(LseBase::k2);
  const int lane = threadIdx.x & 31;
  for (int s = lane; s < count; s += 32) c.observe_max(lse_of(s));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) c.max_l = fmaxf(c.max_l, __shfl_xor_sync(0xffffffffu, c.max_l, o));
  for (int s = lane; s < count; s += 32) c.accumulate(lse_of(s));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) c.sum += __shfl_xor_sync(0xffffffffu, c.sum, o);
  return c;
}

__device__ __forceinline__ int64_t out_elem(const DecodeKernelParams& p, int64_t t, int h) {
  return int64_t(h / p.head_group_size) * p.out_stride_group + t * p.out_stride_token +
         int64_t(h % p.head_group_size) * p.out_stride_head;
}
__device__ __forceinline__ int64_t lse_elem(const DecodeKernelParams& p, int64_t t, int h) {
  return int64_t(h / p.head_group_size) * p.lse_stride_group + t * p.lse_stride_token + (h % p.head_group_size);
}

// Writing a merged row (the combine kernel and the Hopper kernel's fused merge): its output element, 4 of its columns
// (float4 or 4 bf16), its LSE in the caller's base.
__device__ __forceinline__ int64_t row_out(const DecodeKernelParams& p, int seq, int grow) {
  const int i_tok = grow / p.num_heads, h = grow - i_tok * p.num_heads;
  return out_elem(p, int64_t(seq) * p.q_len + i_tok, h);
}
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
__device__ __forceinline__ void store_row_lse(const DecodeKernelParams& p, int seq, int grow, const lse::Combiner& c) {
  const int i_tok = grow / p.num_heads, h = grow - i_tok * p.num_heads;
  if (p.lse)
    p.lse[lse_elem(p, int64_t(seq) * p.q_len + i_tok, h)] =
        lse::convert(c.merged_lse(), LseBase::k2, p.lse_base2 ? LseBase::k2 : LseBase::kE);
}
// acc += wt · v, the product and the sum rounded separately (never one fused multiply-add): both merges add a row's
// states this way and must get the same bits.
__device__ __forceinline__ void add_weighted(float4& acc, float wt, float4 v) {
  acc.x = __fadd_rn(acc.x, lse::weighted(wt, v.x));
  acc.y = __fadd_rn(acc.y, lse::weighted(wt, v.y));
  acc.z = __fadd_rn(acc.z, lse::weighted(wt, v.z));
  acc.w = __fadd_rn(acc.w, lse::weighted(wt, v.w));
}

// Global length of sequence b, clamped into [0, max_seq_len] (the bound the grid was sized from).
__device__ __forceinline__ int clamped_len(const DecodeKernelParams& p, int b) {
  const int len = p.seq_lens[b];
  return len < 0 ? 0 : (len > p.max_seq_len ? p.max_seq_len : len);
}

// The work of a CTA of the split schedule: its row chunk, split and sequence (from blockIdx.x: row chunks
// fastest, then splits, then sequences), the sequence's global length and its split's local keys
// [k_begin, k_end). False when the split lies past the sequence's split count (the CTA exits).
struct SplitWork {
  int rc, split, seq, len, nsplits, k_begin, k_end;
};
__device__ __forceinline__ bool split_work(const DecodeKernelParams& p, SplitWork& w) {
  int64_t bid = blockIdx.x;
  w.rc = int(bid % p.row_chunks);
  bid /= p.row_chunks;
  w.split = int(bid % p.max_splits);
  w.seq = int(bid / p.max_splits);
  w.len = clamped_len(p, w.seq);
  const int n_max = int(sharding::local_len(w.len, p.shard.world, p.shard.rank, p.shard.interleave));
  w.nsplits = cuda_plan::num_splits(n_max, p.split_len);
  w.k_begin = w.split * p.split_len;
  w.k_end = min(w.k_begin + p.split_len, n_max);
  return w.split < w.nsplits;
}

template <int MT, bool kFp8>
__global__ void __launch_bounds__(split_threads(MT), MT == 1 ? 2 : 1)
    mla_decode_split_kernel(const DecodeKernelParams p) {
  constexpr int kWarps = split_warps(MT);
  constexpr int kThreads = 32 * kWarps;
  constexpr int kTile = split_tile(MT);  // keys per tile
  constexpr int kTileBytes = kTile * kRowBytes;
  constexpr int kF8TileBytes = kTile * kF8RowBytes;
  constexpr int M = 16 * MT;                             // query rows of the CTA
  constexpr int G = kWarps / MT;                         // key groups in the score phase
  constexpr int NT = kTile / G / 8;                      // 8-key n-tiles per warp in the score phase
  constexpr int kAcc = NT == 1 ? 4 : (NT == 2 ? 2 : 1);  // independent score accumulators per n-tile
  constexpr int kCols = kLatentDim / kWarps;             // output columns per warp
  constexpr int NO = kCols / 8;                          // output n-tiles per warp
  static_assert(NT >= 1 && NO % 2 == 0, "warp layout");
  extern __shared__ __align__(128) uint8_t smem[];
  const SplitSmem L(MT, kFp8, p.kv_stages);
  uint8_t* const q_s = smem + L.q;
  uint8_t* const kv_s = smem + L.kv;
  uint8_t* const f8_s = smem + L.f8;
  uint8_t* const p_s = smem + L.p;
  float* const red_max = reinterpret_cast<float*>(smem + L.red_max);  // [G][M]
  float* const red_l = reinterpret_cast<float*>(smem + L.red_l);      // [G][M]
  float* const alpha_s = reinterpret_cast<float*>(smem + L.alpha);    // [M]
  float* const m_s = reinterpret_cast<float*>(smem + L.m);            // [M]
  uint8_t* const tok_ok = smem + L.tok_ok;                            // [2][T], by tile parity

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  SplitWork work;
  if (!split_work(p, work)) return;
  const int seq = work.seq, split = work.split, len = work.len, nsplits = work.nsplits;
  const int k_begin = work.k_begin, k_end = work.k_end;
  const int ntiles = k_end > k_begin ? (k_end - k_begin + kTile - 1) / kTile : 0;
  const int row0 = work.rc * M;

  // ---- query rows → q_s (zero rows past the sequence's R rows) ----
  for (int c = tid; c < M * kRowChunks; c += kThreads) {
    const int r = c / kRowChunks, ch = c - r * kRowChunks;
    const int grow = row0 + r;
    const bool valid = grow < p.rows_per_seq;
    const uint16_t* src = p.q;
    if (valid) {
      const int i = grow / p.num_heads, h = grow - i * p.num_heads;
      src = p.q + q_elem(p, int64_t(seq) * p.q_len + i, h) + ch * 8;
    }
    cp_async_16(smem_addr(q_s + tile_off(r, ch)), src, valid);
  }
  cp_async_commit();

  // ---- key tile loader: kTpr threads per key row (bf16: 8, each row read as 128-byte runs and
  // written to conflict-free swizzled chunks; fp8: 4, into the unswizzled staging tile), 9 chunks of
  // 16 bytes per thread and row; bf16 tiles take two row passes.
  constexpr int kTpr = kFp8 ? 4 : 8;
  constexpr int kPasses = kTile * kTpr / kThreads;                                // rows per thread: bf16 2, fp8 1
  constexpr int kChunksPerThread = (kFp8 ? kF8RowBytes : kRowBytes) / 16 / kTpr;  // 9
  const int lr = tid / kTpr, ls = tid % kTpr;
  const int32_t* const bt_row = p.block_table + int64_t(seq) * p.block_table_stride;
  auto block_of = [&](int tile, int pass) -> int32_t {
    const int k = k_begin + tile * kTile + lr + pass * (kThreads / kTpr);
    if (tile >= ntiles || k >= k_end) return -1;
    const int page = k / p.block_size;
    if (page >= p.max_blocks_per_seq) return -1;
    return __ldg(bt_row + page);
  };
  auto issue = [&](int tile, const int32_t(&blk)[kPasses]) {
    const int stage = p.kv_stages == 2 ? (tile & 1) : 0;
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int row = lr + pass * (kThreads / kTpr);
      const int k = k_begin + tile * kTile + row;
      // Out-of-range block ids (possible only with a corrupt table: device backends cannot check the
      // table on the host without a synchronization) are skipped like keys past the sequence.
      const bool valid = k < k_end && blk[pass] >= 0 && blk[pass] < p.num_blocks;
      const uint8_t* src = p.kv;
      if (valid)
        src +=
            (int64_t(blk[pass]) * p.kv_stride_block + int64_t(k % p.block_size) * p.kv_stride_token) * (kFp8 ? 1 : 2);
      if constexpr (kFp8) {
        uint8_t* dst = f8_s + stage * kF8TileBytes + row * kF8RowBytes;
#pragma unroll
        for (int j = 0; j < kChunksPerThread; ++j) {
          const int ch = ls + kTpr * j;
          cp_async_16(smem_addr(dst + ch * 16), src + ch * 16, valid);
        }
      } else {
        uint8_t* dst = kv_s + stage * kTileBytes;
#pragma unroll
        for (int j = 0; j < kChunksPerThread; ++j) {
          const int ch = ls + kTpr * j;
          cp_async_16(smem_addr(dst + tile_off(row, ch)), src + ch * 16, valid);
        }
      }
      if (ls == 0) tok_ok[(tile & 1) * kTile + row] = valid ? 1 : 0;
    }
    cp_async_commit();
  };
  int32_t blk_next[kPasses];
  auto fetch_blocks = [&](int tile) {
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) blk_next[pass] = block_of(tile, pass);
  };

  fetch_blocks(0);
  if (ntiles > 0) issue(0, blk_next);
  fetch_blocks(1);

  // ---- per-thread state of the score phase ----
  const int ms = warp % MT;  // m-tile
  const int g = warp / MT;   // key group
  const int tok0 = g * 8 * NT;
  const int rs[2] = {ms * 16 + (lane >> 2), ms * 16 + (lane >> 2) + 8};
  int nrow[2];  // visible local keys of each of this thread's two score rows (causal rule, global coords)
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int grow = row0 + rs[e];
    nrow[e] = grow < p.rows_per_seq ? int(sharding::visible_local_keys(len, p.q_len, grow / p.num_heads, p.shard)) : 0;
  }
  float m_run[2] = {-INFINITY, -INFINITY};
  float l_run[2] = {0.0f, 0.0f};

  // Per-lane swizzled chunk offsets: ldmatrix rows always start at a multiple of 8, so row & 7 is
  // lane & 7 for every operand. off2[i]: chunk 2i + (lane >> 4); off4[i]: chunk 4i + (lane >> 3).
  uint32_t off2[4], off4[2];
#pragma unroll
  for (int i = 0; i < 4; ++i) off2[i] = uint32_t(((2 * i + (lane >> 4)) ^ (lane & 7)) << 4);
#pragma unroll
  for (int i = 0; i < 2; ++i) off4[i] = uint32_t(((4 * i + (lane >> 3)) ^ (lane & 7)) << 4);

  float o[MT][NO][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < NO; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][n][e] = 0.0f;

  const uint32_t q_row_addr = smem_addr(q_s) + uint32_t((ms * 16 + (lane & 15)) * kRowBytes);
  const uint32_t p_row_base = smem_addr(p_s);

  const bool two_stages = p.kv_stages == 2;
  for (int it = 0; it < ntiles; ++it) {
    const int par = it & 1;
    // Two stages: tile it+1 is requested before waiting for tile it, so two tiles are in flight while
    // the warps wait. Its bf16 buffer held tile it-1: every warp must be done with that first (X).
    // (fp8: tile it+1 goes to an fp8 staging buffer last read by the dequantization of tile it-1,
    // which finished before the barrier that followed it.)
    const bool prefetch = two_stages && it + 1 < ntiles;
    if (prefetch) {
      if (!kFp8 && it > 0) __syncthreads();  // (X)
      issue(it + 1, blk_next);
      fetch_blocks(it + 2);
      cp_async_wait_one();
    } else {
      cp_async_wait_all();
    }
    __syncthreads();  // (A) tile `it` (and q) landed for every thread
    const uint8_t* kt_s;
    if constexpr (kFp8) {
      const uint8_t* src8 = f8_s + (two_stages ? par : 0) * kF8TileBytes;
#pragma unroll 6
      for (int j = 0; j < kTile * kRowChunks / kThreads; ++j) {
        const int ci = tid + j * kThreads;
        const int r = ci / kRowChunks, c = ci - r * kRowChunks;
        const uint2 raw = *reinterpret_cast<const uint2*>(src8 + r * kF8RowBytes + c * 8);
        uint4 v;
        v.x = fp8x2_to_bf16x2(raw.x & 0xffffu);
        v.y = fp8x2_to_bf16x2(raw.x >> 16);
        v.z = fp8x2_to_bf16x2(raw.y & 0xffffu);
        v.w = fp8x2_to_bf16x2(raw.y >> 16);
        *reinterpret_cast<uint4*>(kv_s + tile_off(r, c)) = v;
      }
      __syncthreads();  // dequantized tile visible; the fp8 stage is free again
      if (!two_stages && it + 1 < ntiles) {
        issue(it + 1, blk_next);
        fetch_blocks(it + 2);
      }
      kt_s = kv_s;
    } else {
      kt_s = kv_s + (two_stages ? par : 0) * kTileBytes;
    }
    const uint32_t kt_addr = smem_addr(kt_s);

    // ---- S = Q·Kᵀ: 16 rows × 8·NT keys per warp. The 36 k-steps accumulate into kAcc independent
    // sets (summed at the end) so that few n-tiles per warp still give several mma chains in flight.
    float s[NT][4];
    float sa[kAcc][NT][4];
#pragma unroll
    for (int a = 0; a < kAcc; ++a)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) sa[a][j][e] = 0.0f;
    const uint32_t k_row_addr = kt_addr + uint32_t((tok0 + (lane & 7)) * kRowBytes);
#pragma unroll
    for (int kk = 0; kk < kQkDim / 32; ++kk) {  // two 16-dim k-steps per iteration
      uint32_t a0[4], a1[4];
      ldsm_x4(a0, q_row_addr + (kk >> 1) * 128 + off2[(kk & 1) * 2]);
      ldsm_x4(a1, q_row_addr + (kk >> 1) * 128 + off2[(kk & 1) * 2 + 1]);
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        uint32_t b[4];
        ldsm_x4(b, k_row_addr + j * 8 * kRowBytes + (kk >> 1) * 128 + off4[kk & 1]);
        mma_bf16(sa[(2 * kk) % kAcc][j], a0, b[0], b[1]);
        mma_bf16(sa[(2 * kk + 1) % kAcc][j], a1, b[2], b[3]);
      }
    }
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = sa[0][j][e];
#pragma unroll
        for (int a = 1; a < kAcc; ++a) v += sa[a][j][e];
        s[j][e] = v;
      }

    // ---- mask, scale to base-2 logits, row max over the tile ----
    const int kt = k_begin + it * kTile;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int tt = tok0 + 8 * j + 2 * (lane & 3) + (e & 1);
        const bool ok = tok_ok[par * kTile + tt] && kt + tt < nrow[e >> 1];
        s[j][e] = ok ? s[j][e] * p.score_scale_log2 : -INFINITY;
        mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
      }
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      mx[e] = fmaxf(mx[e], __shfl_xor_sync(0xffffffffu, mx[e], 1));
      mx[e] = fmaxf(mx[e], __shfl_xor_sync(0xffffffffu, mx[e], 2));
    }
    if ((lane & 3) == 0) {
      red_max[g * M + rs[0]] = mx[0];
      red_max[g * M + rs[1]] = mx[1];
    }
    __syncthreads();  // (B)

    // ---- online softmax: new running max, P = 2^(S - m), row sums ----
    float m_use[2], alpha[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float tmax = red_max[rs[e]];
#pragma unroll
      for (int gg = 1; gg < G; ++gg) tmax = fmaxf(tmax, red_max[gg * M + rs[e]]);
      const float m_new = fmaxf(m_run[e], tmax);
      alpha[e] = m_run[e] == -INFINITY ? 0.0f : exp2f(m_run[e] - m_new);
      m_use[e] = m_new == -INFINITY ? 0.0f : m_new;
      l_run[e] *= alpha[e];
      m_run[e] = m_new;
    }
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const int tt = tok0 + 8 * j + 2 * (lane & 3);
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float p0 = exp2f(s[j][2 * e] - m_use[e]);
        const float p1 = exp2f(s[j][2 * e + 1] - m_use[e]);
        l_run[e] += p0 + p1;
        const int r = rs[e];
        *reinterpret_cast<uint32_t*>(p_s + p_off<kTile>(r, tt >> 3) + (tt & 7) * 2) = pack_bf16(p0, p1);
      }
    }
    if (g == 0 && (lane & 3) == 0) {
      alpha_s[rs[0]] = alpha[0];
      alpha_s[rs[1]] = alpha[1];
    }
    __syncthreads();  // (C) P and α visible

    // ---- O = O·α + P·V: all rows × kCols columns per warp. α = 1 for every row of the CTA (no row
    // max moved) is the common case after the first tiles: the rescale is skipped then. ----
    {
      bool moved = false;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        moved |= alpha_s[mt * 16 + (lane >> 2)] != 1.0f || alpha_s[mt * 16 + (lane >> 2) + 8] != 1.0f;
      if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const float a_lo = alpha_s[mt * 16 + (lane >> 2)];
          const float a_hi = alpha_s[mt * 16 + (lane >> 2) + 8];
#pragma unroll
          for (int n = 0; n < NO; ++n) {
            o[mt][n][0] *= a_lo;
            o[mt][n][1] *= a_lo;
            o[mt][n][2] *= a_hi;
            o[mt][n][3] *= a_hi;
          }
        }
      }
    }
    const uint32_t v_row_addr =
        kt_addr + uint32_t(((lane & 7) + ((lane >> 3) & 1) * 8) * kRowBytes) + warp * (kCols * 2);
#pragma unroll
    for (int ks = 0; ks < kTile / 16; ++ks) {
      uint32_t pa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int r = mt * 16 + (lane & 15);
        ldsm_x4(pa[mt], p_row_base + p_off<kTile>(r, 2 * ks + (lane >> 4)));
      }
#pragma unroll
      for (int np = 0; np < NO / 2; ++np) {
        uint32_t b[4];
        ldsm_x4_trans(b, v_row_addr + ks * 16 * kRowBytes + (np >> 2) * 128 + off2[np & 3]);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_bf16(o[mt][2 * np], pa[mt], b[0], b[1]);
          mma_bf16(o[mt][2 * np + 1], pa[mt], b[2], b[3]);
        }
      }
    }
    if (!kFp8 && !two_stages && it + 1 < ntiles) {
      __syncthreads();  // (D) single buffer: every warp is done with the tile before it is refilled
      issue(it + 1, blk_next);
      fetch_blocks(it + 2);
    }
  }
  cp_async_wait_all();  // nothing in flight at exit (also when there was no tile)

  // ---- row sums and max → shared memory ----
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    l_run[e] += __shfl_xor_sync(0xffffffffu, l_run[e], 1);
    l_run[e] += __shfl_xor_sync(0xffffffffu, l_run[e], 2);
  }
  if ((lane & 3) == 0) {
    red_l[g * M + rs[0]] = l_run[0];
    red_l[g * M + rs[1]] = l_run[1];
    if (g == 0) {
      m_s[rs[0]] = m_run[0];
      m_s[rs[1]] = m_run[1];
    }
  }
  __syncthreads();

  // ---- write: final output (one split) or the partial state (several) ----
  const bool direct = nsplits == 1;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int r = mt * 16 + (lane >> 2) + 8 * hh;
      const int grow = row0 + r;
      if (grow >= p.rows_per_seq) continue;
      float l = 0.0f;
#pragma unroll
      for (int gg = 0; gg < G; ++gg) l += red_l[gg * M + r];
      const float m = m_s[r];
      const float lse2 = l > 0.0f ? m + log2f(l) : -INFINITY;
      const float inv = l > 0.0f ? p.out_scale / l : 0.0f;
      const int i = grow / p.num_heads, h = grow - i * p.num_heads;
      const int64_t t = int64_t(seq) * p.q_len + i;
      const int col0 = warp * kCols + 2 * (lane & 3);
      if (direct) {
        const int64_t ob = out_elem(p, t, h) + col0;
        if (p.out_fp32) {
          float* dst = static_cast<float*>(p.out) + ob;
#pragma unroll
          for (int n = 0; n < NO; ++n)
            *reinterpret_cast<float2*>(dst + n * 8) = make_float2(o[mt][n][2 * hh] * inv, o[mt][n][2 * hh + 1] * inv);
        } else {
          uint16_t* dst = static_cast<uint16_t*>(p.out) + ob;
#pragma unroll
          for (int n = 0; n < NO; ++n)
            *reinterpret_cast<uint32_t*>(dst + n * 8) = pack_bf16(o[mt][n][2 * hh] * inv, o[mt][n][2 * hh + 1] * inv);
        }
        if (p.lse && warp == 0 && (lane & 3) == 0)
          p.lse[lse_elem(p, t, h)] = lse::convert(lse2, LseBase::k2, p.lse_base2 ? LseBase::k2 : LseBase::kE);
      } else {
        const int64_t state = (int64_t(seq) * p.max_splits + split) * p.rows_per_seq + grow;
        float* dst = p.ws_o + state * kLatentDim + col0;
#pragma unroll
        for (int n = 0; n < NO; ++n)
          *reinterpret_cast<float2*>(dst + n * 8) = make_float2(o[mt][n][2 * hh] * inv, o[mt][n][2 * hh + 1] * inv);
        if (warp == 0 && (lane & 3) == 0) p.ws_lse[state] = lse2;
      }
    }
  }
}

template <int MT, bool kFp8>
cudaError_t launch_split_kernel(const DecodeKernelParams& p, int64_t grid, cudaStream_t stream) {
  const size_t smem = size_t(SplitSmem(MT, kFp8, p.kv_stages).total);
  mla_decode_split_kernel<MT, kFp8><<<dim3(unsigned(grid)), dim3(split_threads(MT)), smem, stream>>>(p);
  return cudaGetLastError();
}

template <int MT, bool kFp8>
cudaError_t set_split_kernel_smem(int bytes) {
  cudaError_t e =
      cudaFuncSetAttribute(mla_decode_split_kernel<MT, kFp8>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e != cudaSuccess) return e;
  // Two 16-row CTAs share an SM only with the largest shared-memory carveout.
  return cudaFuncSetAttribute(mla_decode_split_kernel<MT, kFp8>, cudaFuncAttributePreferredSharedMemoryCarveout,
                              int(cudaSharedmemCarveoutMaxShared));
}

// Declared here, instantiated once each in decode_split_*.cu (so they compile in parallel).
#define MLADCP_DECLARE_SPLIT_KERNEL(MT, FP8)                                                                  \
  extern template cudaError_t launch_split_kernel<MT, FP8>(const DecodeKernelParams&, int64_t, cudaStream_t); \
  extern template cudaError_t set_split_kernel_smem<MT, FP8>(int);
#define MLADCP_INSTANTIATE_SPLIT_KERNEL(MT, FP8)                                                       \
  template cudaError_t launch_split_kernel<MT, FP8>(const DecodeKernelParams&, int64_t, cudaStream_t); \
  template cudaError_t set_split_kernel_smem<MT, FP8>(int);

}  // namespace mladcp::cuda_impl
