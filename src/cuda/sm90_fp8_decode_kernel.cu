// Hopper (sm_90a) decode kernel of the "cuda" backend for fp8-e4m3 caches: N = 16 or 32 query rows per CTA,
// pages of any size; a copying warp, and two warpgroups that convert their operand fragments in registers.
//
// Same contract, plan, workspace and combine as the other kernels (decode_kernel.cuh, decode_plan.h): one CTA = one
// chunk of N query rows over one split of a sequence's local keys (split schedule) or over the pieces of a part,
// sequence after sequence (balanced schedule, sm90_segments.cuh). A segment that covers its sequence writes out/lse
// directly, otherwise the normalized fp32 partial state for the combine kernel. Every role walks the segments with
// its own cursor; the ring's tiles and the P buffers are numbered across segments, so the copier streams the next
// segment's keys while the warpgroups finish the last, and each segment's rows are written by the products
// warpgroup from its accumulators.
//
// The products are turned around against the 64-row kernel (sm90_decode_kernel.cu): the 64 keys of a tile are
// the M dimension of every wgmma and the CTA's N query rows the N dimension, so few rows cost few tensor-core
// cycles (m64nNk16 on N rows instead of m64n64k16 on 64 rows, most of them empty):
//   Sᵀ [64 keys × N]   = K [64 × 576] · Qᵀ              36 × wgmma.m64nNk16, K from registers, Q from shared memory
//   Oᵀ [512 × N]      += Vᵀ [512 × 64] · Pᵀ [64 × N]     8 dim blocks × 4 key steps, Vᵀ from registers, P from
//                                                        shared memory
// The ring holds the cache's fp8 rows only (no f16 copy of a tile), so five tiles fit: up to 180 KiB of keys in
// flight per SM. Each warpgroup reads its operand fragments of K or Vᵀ from the ring (16-byte reads) and converts
// them to f16 in registers (exact: every e4m3 value is an f16 value, one instruction per two). Each query row is
// scaled by a power of two 2^e_n into [2^14, 2^15) at its maximum before rounding to f16 (f16_scaling.h; 2^-e_n
// goes into the row's score scale); P in [0, 1] rounds to f16. kv_scale is folded into the score and output scales.
//
// Fragment maps (thread = warp w of its warpgroup, lane = 4g + q):
//   K (M = keys, K = dims): the thread's rows g and g + 8 are keys 16w + g and + 8, and a 16-byte read at dims
//     64c + 16q of each key gives k-steps 4c .. 4c + 3: in k-step 4c + j, fragment columns 2q, 2q + 1, 2q + 8,
//     2q + 9 are dims 64c + 16q + 4j + 0, 1, 2, 3. The query rows are stored with the same permutation of each
//     k-step's 16 columns, so the products are unchanged. A quarter warp's reads hit 8 different 4-bank groups.
//   Vᵀ (M = dims, K = keys): in key step s the thread's columns 2q, 2q + 1, 2q + 8, 2q + 9 are keys 16s + q, + 4,
//     + 8, + 12 (P is stored in this key order), and its rows g, g + 8 of dim block b are dims 16(8w + g) + b and
//     + 8 + b: one 16-byte read per key (dims 16(8w + g) .. + 15) serves all 8 dim blocks; byte permutes pair two
//     keys' bytes. Keys are 576 bytes apart, as in a dense page (a page's run of keys is one copy), so a quarter
//     warp's reads meet two keys of each parity: two-way bank conflicts.
//
// Threads: three warpgroups (384), one CTA per SM; `setmaxnreg` moves the copying warpgroup's registers to the
// others.
//   warpgroup 2, the copier (warp 8; warps 9-11 exit): per tile, the block ids of its 64 keys (two per lane), then
//     one bulk copy per present run of keys of one page (per key where the cache's rows are not dense) into the
//     tile's stage, completing on the stage's `full` mbarrier; absent keys (past the split, on an invalid block id)
//     zero-filled; the present keys as 64 bits in `ok`.
//   warpgroup 0, the scores: per segment its query rows, then per tile: K fragments and Sᵀ, release of the stage, mask,
//   P
//     and O's rescale factors → buffer t % 2, handed over by a named barrier. A row's running maximum is raised only
//     when a score exceeds it by more than kMaxSlack (8 in base 2: P ≤ 256 in f16; sm90_ptx.cuh): one barrier ORs the
//     threads' verdicts, and only then are the column maxima of the 4 warps gathered and O rescaled. Past a row's first
//     keys that is rare, so most tiles take no cross-warp maxima and no rescale (12-17% faster at 16 heads).
//   warpgroup 1, the products: per tile, O rescaled (only when a row's maximum moved; then after the previous
//     tile's products), Vᵀ fragments and Oᵀ += Vᵀ·Pᵀ, the stage released; the previous tile's P buffer released once
//     this tile's first groups have retired its products. The scores of tile t + 1 run while the products of tile t
//     do, and the products of consecutive tiles overlap unless a maximum moved. At a segment's end the scores
//     warpgroup puts the row sums and LSE in `sums` and goes on with the next segment's queries; the products
//     warpgroup writes the rows (16 contiguous dims of each of its rows per thread) and releases `sums`.
//
// Shared memory:
//   kv     [5 stages][64 keys][576 B]      fp8 key rows
//   q      [9][N rows][128 B]              the CTA's query rows, scaled, f16, columns permuted (128-byte swizzle)
//   p      [2][N rows][128 B]              P (f16), 64 keys per row (128-byte swizzle)
//   red    [2][4 warps][N] fp32            per-warp column maxima, row sums (first the balanced cursor's scratch)
//   alpha  [2][N] fp32                     O's rescale factors of the tile
//   qs     [N] fp32                        2^-e_n of each query row
//   sums   [2][N] fp32                     a segment's row sums and base-2 LSE
//   ok     [5] u64                         present keys of each stage
//   full, empty [5] u64                    the ring's mbarriers
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/lse_math.h"
#include "cuda/decode_kernel.cuh"
#include "cuda/f16_scaling.h"
#include "cuda/sm90_decode.h"
#include "cuda/sm90_fp8_fragments.h"
#include "cuda/sm90_ptx.cuh"
#include "cuda/sm90_segments.cuh"

namespace mladcp::cuda_impl {
namespace {

using namespace sm90;
namespace fr = sm90_fp8_fragments;
using sm90_segments::CtaWork;

constexpr int kTile = 64;          // keys per tile
constexpr int kStages = 5;         // tiles in the ring
constexpr int kWg = 128;           // threads of a warpgroup
constexpr int kThreads = 3 * kWg;  // the scores and the products warpgroups, the copying warpgroup
// The CTA starts with 168 registers per thread (launch bounds); the copying warpgroup gives all but 56 back (its
// warps 1-3 exit at once), the two others take them: 128 · (168 − 56) = 256 · (224 − 168).
constexpr int kCopierRegs = 56, kMmaRegs = 224;
static_assert(kWg * kCopierRegs + 2 * kWg * kMmaRegs <= 168 * kThreads, "register budget");
constexpr int kKeyStride = kF8RowBytes;  // 576: bytes per key row in the ring (as in a dense cache page)
static_assert(kKeyStride == fr::kKeyBytes, "the fragment maps' key rows");
constexpr int kStageBytes = kTile * kKeyStride;  // 36864
// Named barriers (0 is __syncthreads): the scores warpgroup among itself; P of the ring's tile t (buffer t % 2)
// written (scores → products) and read (products → scores); a segment's row sums written (scores → products) and
// read (products → scores).
constexpr int kBarScores = 1, kBarPFull = 2 /* + buffer */, kBarPEmpty = 4 /* + buffer */, kBarSums = 6,
              kBarSumsFree = 7;

template <int N>
struct F8Smem {
  static constexpr int kv = 0;
  static constexpr int q = kv + kStages * kStageBytes;
  static constexpr int p = q + 9 * N * 128;          // [2 buffers][N rows][128 B]
  static constexpr int red = p + 2 * N * 128;        // [2 buffers][4 warps][N] fp32
  static constexpr int alpha = red + 2 * 4 * N * 4;  // [2 buffers][N] fp32: O's rescale factor of tile t
  static constexpr int qs = alpha + 2 * N * 4;       // [N] fp32
  static constexpr int sums = qs + N * 4;            // [N] fp32: row sums, then [N] base-2 LSE
  static constexpr int ok = sums + 2 * N * 4;
  static constexpr int full = ok + kStages * 8;
  static constexpr int empty = full + kStages * 8;
  static constexpr int total = empty + kStages * 8;
  static_assert(q % 1024 == 0 && p % 1024 == 0 && ok % 8 == 0, "alignment of the swizzled tiles and the barriers");
};
static_assert(F8Smem<32>::total <= 227 * 1024, "shared memory of one Hopper CTA");

// Register buffers of K and Vᵀ fragments in flight (each feeds a group of two wgmmas; a group's buffer is
// rewritten once the group kBufs later may start). 18 groups of K and 16 of V per tile: the buffer of each group
// is a compile-time constant. 32 rows keep two Vᵀ buffers (O takes 128 registers).
// Tunables, overridable with -D for timing variants (tools/gpu/run.sh variants; H200, 2026-12-02: 3, 6 or 9 K buffers
// and 4 or 6 Vᵀ buffers within 1%; K reads 2, 3 or 4 column blocks deep: 4 is 1.5-2% faster than 2).
#ifndef MLADCP_FP8_KBUFS
#define MLADCP_FP8_KBUFS 3
#endif
#ifndef MLADCP_FP8_VBUFS16
#define MLADCP_FP8_VBUFS16 4
#endif
#ifndef MLADCP_FP8_VBUFS32
#define MLADCP_FP8_VBUFS32 2
#endif
#ifndef MLADCP_FP8_KREADS
#define MLADCP_FP8_KREADS 4
#endif
constexpr int kKBufs = MLADCP_FP8_KBUFS;
template <int N>
constexpr int kVBufs = N == 16 ? MLADCP_FP8_VBUFS16 : MLADCP_FP8_VBUFS32;
constexpr int kKReads = MLADCP_FP8_KREADS;  // K's 16-byte reads run kKReads − 1 column blocks ahead of the conversions

// wgmma.m64nNk16 (f16 in, fp32 accumulate), A (64 × 16) from registers, B (16 × N, K-major) from shared memory.
__device__ __forceinline__ void wgmma_rs(float (&d)[8], const uint32_t (&a)[4], uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, p, 1, 1, "
      "0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}
__device__ __forceinline__ void wgmma_rs(float (&d)[16], const uint32_t (&a)[4], uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

// Where tile t sits in the ring (stage, mbarrier phase parity), advanced tile by tile by the copier and both
// warpgroups (sm90_fp8_fragments.h, host-tested).
using RingSlot = fr::RingSlot<kStages>;

// The copying warp: every tile of the CTA's split into the ring. Lane i looks up keys i and i + 32 of a tile; a
// present key that starts a run of keys of one page (the tile's first key, a page's first key; every key when the
// cache's rows are not dense) copies the run with one bulk copy. Absent keys are zero-filled, so no stale byte of
// the ring reaches a product.
template <int N>
__device__ __forceinline__ void copy_tiles(const DecodeKernelParams& p, uint8_t* smem, const CtaWork& w, RingSlot& slot,
                                           int& ring_tile) {
  using L = F8Smem<N>;
  const int lane = threadIdx.x & 31;
  const uint32_t kv = smem_addr(smem + L::kv), full = smem_addr(smem + L::full), empty = smem_addr(smem + L::empty);
  uint64_t* const ok = reinterpret_cast<uint64_t*>(smem + L::ok);
  const int32_t* const bt_row = p.block_table + int64_t(w.seq) * p.block_table_stride;
  const int k_begin = w.k_begin, k_end = w.k_end, ntiles = w.ntiles;
  const uint64_t policy = evict_first_policy();
  const bool dense = p.kv_stride_token == kF8RowBytes;
  // Block id of key 32h + lane of tile t (-1: past the split or the table), read a tile ahead of its copy.
  auto block_id = [&](int t, int h) -> int32_t {
    const int k = k_begin + t * kTile + 32 * h + lane;
    if (t >= ntiles || k >= k_end) return -1;
    const int page = p.block_shift >= 0 ? k >> p.block_shift : k / p.block_size;
    return page < p.max_blocks_per_seq ? __ldg(bt_row + page) : -1;
  };
  int32_t next[2] = {block_id(0, 0), block_id(0, 1)};
  for (int t = 0; t < ntiles; ++t, ++ring_tile, slot.next()) {
    const int st = slot.st;
    const int32_t cur[2] = {next[0], next[1]};
    next[0] = block_id(t + 1, 0);
    next[1] = block_id(t + 1, 1);
    if (ring_tile >= kStages)
      mbar_wait(bar_addr(empty, st), slot.phase ^ 1);  // both warpgroups are done with the
                                                       // ring's tile 5 before
    const uint32_t stage = kv + uint32_t(st * kStageBytes);
    bool present[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      present[h] = cur[h] >= 0 && cur[h] < p.num_blocks;
      if (!present[h]) {
        const uint32_t row = stage + uint32_t((32 * h + lane) * kKeyStride);
        for (int c = 0; c < kF8RowBytes / 16; ++c)
          asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};\n" ::"r"(row + 16 * c), "r"(0) : "memory");
      }
    }
    fence_proxy_async();  // the zeros before later bulk copies into the same bytes
    __syncwarp();         // and before lane 0's arrival below, which releases them to the warpgroups
    const uint64_t bits =
        uint64_t(__ballot_sync(0xffffffffu, present[0])) | (uint64_t(__ballot_sync(0xffffffffu, present[1])) << 32);
    const uint32_t bar = bar_addr(full, st);
    if (lane == 0) {
      ok[st] = bits;
      mbar_arrive_expect_tx(bar, uint32_t(__popcll(bits)) * kF8RowBytes);
    }
    __syncwarp();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int j = 32 * h + lane, k = k_begin + t * kTile + j;
      const int row = p.block_shift >= 0 ? k & (p.block_size - 1) : k % p.block_size;
      if (!present[h] || (dense && j > 0 && row > 0)) continue;  // absent, or inside a run
      const int len = dense ? min(min(kTile - j, p.block_size - row), k_end - k) : 1;
      const uint8_t* const src = p.kv + int64_t(cur[h]) * p.kv_stride_block + int64_t(row) * p.kv_stride_token;
      bulk_copy(stage + uint32_t(j * kKeyStride), src, uint32_t(len * kF8RowBytes), bar, policy);
    }
  }
}

template <int N>
using Segments = sm90_segments::Segments<N>;

// A segment's rows from the products warpgroup's accumulators, normalized: the final output and LSE where the
// segment covers its sequence, else its partial state (kept in L2 for the combine kernel). The thread holds dims
// 16·(8·warp + g) .. + 15 of its query rows n(i) = 8·(i / 2) + 2·qd + i % 2: 64 contiguous bytes of each (32 in
// bf16). sums: [N] row sums, then [N] base-2 LSE.
template <int N>
__device__ __forceinline__ void write_rows(const DecodeKernelParams& p, const CtaWork& w, const float (&o)[8][N / 2],
                                           const float* sums, int warp, int g, int qd) {
  constexpr int kCols = N / 4;
  const int dim0 = 16 * (8 * warp + g);
  const bool none = w.ntiles == 0;  // O was never written: the rows are 0
  const uint64_t keep = evict_last_policy();
#pragma unroll
  for (int i = 0; i < kCols; ++i) {
    const int j = i / 2, e = i & 1, n = 8 * j + 2 * qd + e;
    const int grow = w.row0 + n;
    if (grow >= p.rows_per_seq) continue;
    const float sum = sums[n], lse2 = sums[N + n];
    const float inv = sum > 0.0f ? p.out_scale / sum : 0.0f;
    float v[16];
#pragma unroll
    for (int b = 0; b < 8; ++b) {
      v[b] = none ? 0.0f : o[b][4 * j + e] * inv;
      v[8 + b] = none ? 0.0f : o[b][4 * j + 2 + e] * inv;
    }
    const int tok_i = grow / p.num_heads, h = grow - tok_i * p.num_heads;
    const int64_t tok = int64_t(w.seq) * p.q_len + tok_i;
    if (w.direct) {
      const int64_t ob = out_elem(p, tok, h) + dim0;
      if (p.out_fp32) {
        float4* const dst = reinterpret_cast<float4*>(static_cast<float*>(p.out) + ob);
#pragma unroll
        for (int c = 0; c < 4; ++c) dst[c] = make_float4(v[4 * c], v[4 * c + 1], v[4 * c + 2], v[4 * c + 3]);
      } else {
        uint4* const dst = reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.out) + ob);
#pragma unroll
        for (int c = 0; c < 2; ++c)
          dst[c] = make_uint4(pack_bf16(v[8 * c], v[8 * c + 1]), pack_bf16(v[8 * c + 2], v[8 * c + 3]),
                              pack_bf16(v[8 * c + 4], v[8 * c + 5]), pack_bf16(v[8 * c + 6], v[8 * c + 7]));
      }
      if (p.lse && warp == 0 && g == 0)
        p.lse[lse_elem(p, tok, h)] = lse::convert(lse2, LseBase::k2, p.lse_base2 ? LseBase::k2 : LseBase::kE);
    } else {
      const int64_t state = w.state_block * p.rows_per_seq + grow;
      float4* const dst = reinterpret_cast<float4*>(p.ws_o + state * kLatentDim + dim0);
#pragma unroll
      for (int c = 0; c < 4; ++c)
        store_evict_last(dst + c, make_float4(v[4 * c], v[4 * c + 1], v[4 * c + 2], v[4 * c + 3]), keep);
      if (warp == 0 && g == 0) store_evict_last(p.ws_lse + state, lse2, keep);
    }
  }
}

template <int N>
__global__ void __launch_bounds__(kThreads, 1) mla_decode_sm90_fp8_kernel(const DecodeKernelParams p) {
  using L = F8Smem<N>;
  constexpr int kAcc = N / 2;   // accumulator floats per thread of an m64nN product
  constexpr int kCols = N / 4;  // query rows of a thread: n = 8·(i / 2) + 2·(lane % 4) + i % 2
  constexpr int KB = kKBufs, VB = kVBufs<N>;
  extern __shared__ __align__(1024) uint8_t smem[];
  uint8_t* const kv_s = smem + L::kv;
  uint8_t* const q_s = smem + L::q;
  float* const sums = reinterpret_cast<float*>(smem + L::sums);
  const int tid = threadIdx.x, warp = (tid >> 5) & 3, lane = tid & 31;
  const int g = lane >> 2, qd = lane & 3;  // fragment row group and column pair of the thread

  // The CTA's segments (one split, or the pieces of its part): every role walks them with its own copy of the
  // cursor, and the ring's tiles and P buffers are numbered across segments (ring_tile).
  Segments<N> segs;
  if (!sm90_segments::cta_segments(p, segs)) return;
  const uint32_t full = smem_addr(smem + L::full), empty = smem_addr(smem + L::empty);
  if (tid == 0) {
    for (int i = 0; i < kStages; ++i) {
      mbar_init(bar_addr(full, i), 1);
      mbar_init(bar_addr(empty, i), 2 * kWg);  // every thread of both warpgroups arrives
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  if (segs.balanced)
    segs.cur = sm90_segments::balanced_start<kThreads>(p, segs.part, reinterpret_cast<int64_t*>(smem + L::red));
  __syncthreads();

  if (tid >= 2 * kWg) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kCopierRegs));
    if (tid < 2 * kWg + 32) {
      RingSlot slot;
      int ring_tile = 0;
      CtaWork w;
      while (segs.next(p, w)) copy_tiles<N>(p, smem, w, slot, ring_tile);
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kMmaRegs));
  const uint32_t kv_addr = smem_addr(kv_s);
  const uint32_t p_lo = kmajor_lo(smem_addr(smem + L::p));
  constexpr uint32_t kPBuf = (N * 128) >> 4;  // one P buffer in descriptor units

  if (tid >= kWg) {
    // ==== the products warpgroup: Oᵀ += Vᵀ·Pᵀ per tile, O in registers ====
    // Vᵀ fragments: keys qd (+ 4, 8, 12, and 16 per key step) at dims 16·(8·warp + g) .. + 15.
    const uint32_t v_off = fr::v_read_offset(warp, g, qd, 0, 0);
    float o[8][kAcc];  // dim block b: dims 16·(8·warp + g) + b (+ 8), query rows n(i)
    uint32_t vf[VB][2][4];
    RingSlot slot;
    int ring_tile = 0;  // tiles of the CTA's earlier segments + t
    CtaWork w;
    while (segs.next(p, w)) {
      for (int t = 0; t < w.ntiles; ++t, ++ring_tile, slot.next()) {
        const int pb = ring_tile & 1, st = slot.st;
        mbar_wait(bar_addr(full, st), slot.phase);  // tile t is in stage st
        const uint32_t stage = kv_addr + uint32_t(st * kStageBytes);
        // Per key step, four 16-byte reads (keys qd, + 4, + 8, + 12) give the fragments of all 8 dim blocks, two
        // blocks per group; the reads of the next key step are issued before the current one's conversions.
        uint4 vr[2][4];
        auto read_v = [&](uint4(&v)[4], int ks) {
#pragma unroll
          for (int kk = 0; kk < 4; ++kk) v[kk] = lds128(stage + v_off + fr::v_read_offset(0, 0, 0, ks, kk));
        };
        read_v(vr[0], 0);
        named_bar_sync(kBarPFull + pb, 2 * kWg);  // P and the rescale factors of tile t are written
        {
          // O is rescaled only when a row's maximum moved (then the products of tile t − 1 are waited for first);
          // otherwise they may still run while tile t's are issued. Every warp holds all N rows: the same decision.
          const float* const alpha = reinterpret_cast<const float*>(smem + L::alpha) + pb * N;
          float a[kCols];
          bool moved = false;
#pragma unroll
          for (int i = 0; i < kCols; ++i) {
            a[i] = alpha[8 * (i / 2) + 2 * qd + (i & 1)];
            moved |= a[i] != 1.0f;
          }
          if (t > 0 && __any_sync(0xffffffffu, moved)) {
            wgmma_wait<0>();
#pragma unroll
            for (int b = 0; b < 8; ++b) fence_regs(o[b]);
#pragma unroll
            for (int i = 0; i < kCols; ++i)
#pragma unroll
              for (int b = 0; b < 8; ++b) {
                o[b][4 * (i / 2) + (i & 1)] *= a[i];
                o[b][4 * (i / 2) + 2 + (i & 1)] *= a[i];
              }
          }
        }
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
          if (ks + 1 < 4) read_v(vr[(ks + 1) & 1], ks + 1);
#pragma unroll
          for (int bp = 0; bp < 4; ++bp) {
            const int grp = 4 * ks + bp, b = grp % VB;
            // Group grp − VB of this tile is done with buffer b. (The first VB groups do not wait: the previous
            // tile's last groups may still read fragments of the same buffer index, which are other values, so other
            // registers: each group's fragments are defined anew in this iteration.)
            if (grp >= VB) wgmma_wait<VB - 1>();
            // Bytes 2·(bp % 2), + 1 of word bp / 2 (h = 0: dims + 0..7) or 2 + bp / 2 (h = 1: dims + 8..15) of
            // two keys, paired: [x_j, y_j, x_j+1, y_j+1] → dim blocks 2·bp and 2·bp + 1.
            const uint32_t sel = bp & 1 ? 0x7362u : 0x5140u;
#pragma unroll
            for (int r = 0; r < 4; ++r) {  // fragment register r: row half r % 2, key pair r / 2
              const int wi = (r & 1) * 2 + (bp >> 1), x = 2 * (r >> 1);
              const uint2 f = e4m3x4_to_f16x4(__byte_perm(word(vr[ks & 1][x], wi), word(vr[ks & 1][x + 1], wi), sel));
              vf[b][0][r] = f.x;
              vf[b][1][r] = f.y;
            }
            wgmma_fence();
            const uint64_t pd = desc(p_lo + pb * kPBuf + uint32_t((ks * 32) >> 4));
            wgmma_rs(o[2 * bp], vf[b][0], pd, t > 0 || ks > 0);
            wgmma_rs(o[2 * bp + 1], vf[b][1], pd, t > 0 || ks > 0);
            wgmma_commit();
          }
        }
        // The groups above waited for every product of the ring's previous tile (or the segment's epilogue did): its
        // P buffer is free for the next tile. (The last arrival is matched by the scores warpgroup after its loop.)
        if (ring_tile > 0) named_bar_arrive(kBarPEmpty + (pb ^ 1), 2 * kWg);
        mbar_arrive(bar_addr(empty, st));  // this thread's reads of the stage are done
      }
      wgmma_wait<0>();
#pragma unroll
      for (int b = 0; b < 8; ++b) fence_regs(o[b]);
      named_bar_sync(kBarSums, 2 * kWg);  // the segment's row sums and LSE are in shared memory
      write_rows<N>(p, w, o, sums, warp, g, qd);
      named_bar_arrive(kBarSumsFree, 2 * kWg);  // sums may be written again
      if (tid == kWg) {
        if (w.record) p.ws_record[int64_t(w.seq) * p.row_chunks + w.row0 / N] = w.rec;
        if (!w.direct && p.ws_merges != nullptr) {              // the combine kernel has a state to merge
          asm volatile("griddepcontrol.wait;\n" ::: "memory");  // after launch_decode's zeroing
          *p.ws_merges = 1;
        }
      }
    }  // segments
  } else {
    // ==== the scores warpgroup: query rows, then per tile Sᵀ = K·Qᵀ, softmax, P ====
    float* const red = reinterpret_cast<float*>(smem + L::red);
    uint8_t* const p_s = smem + L::p;
    const uint64_t* const ok_s = reinterpret_cast<const uint64_t*>(smem + L::ok);
    const uint32_t q_lo = kmajor_lo(smem_addr(q_s));
    const int key_a = 16 * warp + g;  // this thread's score rows: keys key_a and key_a + 8 of each tile
    // Its position in P's rows (the Vᵀ fragments' key order: fr::p_position(key_a), written out); key_a + 8: + 8.
    const int pos_a = 16 * warp + 2 * (g & 3) + (g >> 2);
    static_assert(
        [] {
          for (int k = 0; k < 64; ++k)
            if ((k & 8) == 0 && (16 * (k >> 4) + 2 * (k & 3) + ((k >> 2) & 1) != fr::p_position(k) ||
                                 fr::p_position(k + 8) != fr::p_position(k) + 8))
              return false;
          return true;
        }(),
        "P positions of keys key_a and key_a + 8");
    const uint32_t k_off =
        fr::k_read_offset(warp, g, qd, 0, 0);  // K fragments: keys key_a, + 8 at dims 16·qd (+ 64 per block)
    RingSlot slot;
    int ring_tile = 0;  // tiles of the CTA's earlier segments + t
    int segments = 0;
    CtaWork w;
    while (segs.next(p, w)) {
      // The segment's query rows go over the last one's: every warp of this warpgroup is past its last scores (the
      // barriers of the row sums below), and only this warpgroup reads q.
      // ---- query rows → q: f16, row n scaled by 2^e_n (rows past the sequence's R rows are zero), each k-step's
      // 16 columns in the K fragments' order: dims 4u .. 4u + 3 of column block c (u = 4·qq + j) at positions
      // 16j + 2qq, + 1, + 8, + 9 ----
      {
        constexpr int kPerRow = kWg / N;               // threads per row: 8 or 4, neighbouring lanes
        constexpr int kChunks = kRowChunks / kPerRow;  // 16-byte chunks (8 values) per thread: 9 or 18
        const int r = tid / kPerRow, sub = tid % kPerRow;
        const int grow = w.row0 + r;
        const bool valid = grow < p.rows_per_seq;
        const uint16_t* src = p.q;
        if (valid) {
          const int i = grow / p.num_heads, h = grow - i * p.num_heads;
          src = p.q + q_elem(p, int64_t(w.seq) * p.q_len + i, h);
        }
        uint4 qv[kChunks];
        float mx = 0.0f;
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          qv[c] = valid ? *reinterpret_cast<const uint4*>(src + 8 * (sub + kPerRow * c)) : make_uint4(0, 0, 0, 0);
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const float2 f = bf16x2_to_float2(word(qv[c], k));
            mx = fmaxf(mx, fmaxf(fabsf(f.x), fabsf(f.y)));
          }
        }
#pragma unroll
        for (int sh = 1; sh < kPerRow; sh <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, sh));
        const int e = f16_row_exponent(mx);
        const float up = ldexpf(1.0f, e);
        if (sub == 0) reinterpret_cast<float*>(smem + L::qs)[r] = ldexpf(1.0f, -e);
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          const int ch = sub + kPerRow * c;  // dims 8·ch .. + 7
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const float2 f = bf16x2_to_float2(word(qv[c], k));
            const int pos = fr::query_pair_position(2 * (ch & 7) + (k >> 1), k & 1);  // dims 8·ch + 2k, + 1
            *reinterpret_cast<uint32_t*>(q_s + (ch >> 3) * (N * 128) + r * 128 + (((pos >> 3) ^ (r & 7)) << 4) +
                                         (pos & 7) * 2) = pack_f16(f.x * up, f.y * up);
          }
        }
      }
      fence_proxy_async();
      named_bar_sync(kBarScores, kWg);  // the query rows and their scales are in shared memory

      // ---- per-thread state: query rows n(i), their visible keys and score scales, running max and sums ----
      int nvis[kCols];
      float m[kCols], l[kCols], row_scale[kCols];  // row_scale: score_scale_log2 · 2^-e_n
#pragma unroll
      for (int i = 0; i < kCols; ++i) {
        const int n = 8 * (i / 2) + 2 * qd + (i & 1);
        const int grow = w.row0 + n;
        nvis[i] =
            grow < p.rows_per_seq ? int(sharding::visible_local_keys(w.len, p.q_len, grow / p.num_heads, p.shard)) : 0;
        row_scale[i] = p.score_scale_log2 * reinterpret_cast<const float*>(smem + L::qs)[n];
        m[i] = -INFINITY;
        l[i] = 0.0f;
      }
      float s[kAcc];      // scores: keys key_a (+ 8), query rows n(i)
      float s_odd[kAcc];  // the odd column blocks' part (two independent accumulator chains)
      uint32_t kf[KB][2][4];

      for (int t = 0; t < w.ntiles; ++t, ++ring_tile, slot.next()) {
        const int pb = ring_tile & 1, st = slot.st;
        mbar_wait(bar_addr(full, st), slot.phase);  // tile t is in stage st
        const uint64_t okb = ok_s[st];
        const uint32_t stage = kv_addr + uint32_t(st * kStageBytes);
        // Sᵀ over 576 dims: column block c's two 16-byte reads (keys key_a, key_a + 8) give 4 k-steps, two per group.
        // The reads run kKReads − 1 column blocks ahead of the conversions.
        uint4 kr[kKReads][2];
#pragma unroll
        for (int c = 0; c + 1 < kKReads; ++c) {
          kr[c][0] = lds128(stage + k_off + 64 * c);
          kr[c][1] = lds128(stage + k_off + 8 * kKeyStride + 64 * c);
        }
#pragma unroll
        for (int c = 0; c < 9; ++c) {
          if (c + kKReads - 1 < 9) {
            const int cr = c + kKReads - 1;
            kr[cr % kKReads][0] = lds128(stage + k_off + 64 * cr);
            kr[cr % kKReads][1] = lds128(stage + k_off + 8 * kKeyStride + 64 * cr);
          }
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const int grp = 2 * c + hh, b = grp % KB;
            if (grp >= KB) wgmma_wait<KB - 1>();  // group grp − KB is done with buffer b
#pragma unroll
            for (int jj = 0; jj < 2; ++jj) {
              const uint2 fa = e4m3x4_to_f16x4(word(kr[c % kKReads][0], 2 * hh + jj));
              const uint2 fb = e4m3x4_to_f16x4(word(kr[c % kKReads][1], 2 * hh + jj));
              kf[b][jj][0] = fa.x;
              kf[b][jj][1] = fb.x;
              kf[b][jj][2] = fa.y;
              kf[b][jj][3] = fb.y;
            }
            wgmma_fence();
#pragma unroll
            for (int jj = 0; jj < 2; ++jj) {
              const uint64_t qd_desc = desc(q_lo + uint32_t((c * N * 128 + (2 * hh + jj) * 32) >> 4));
              if (c & 1)
                wgmma_rs(s_odd, kf[b][jj], qd_desc, c > 1 || hh > 0 || jj > 0);
              else
                wgmma_rs(s, kf[b][jj], qd_desc, c > 0 || hh > 0 || jj > 0);
            }
            wgmma_commit();
          }
        }
        wgmma_wait<0>();
        fence_regs(s);
        fence_regs(s_odd);
#pragma unroll
        for (int i = 0; i < kAcc; ++i) s[i] += s_odd[i];
        mbar_arrive(bar_addr(empty, st));  // this thread's reads of the stage are done

        // Absent keys and keys after a row's causal limit → -inf. The running maxima m (base-2 logits) are raised
        // only when some score of the tile exceeds its row's by more than kMaxSlack (every tile of a row that has
        // seen no key yet): otherwise P = 2^(S·scale − m) ≤ 2^kMaxSlack is taken against the old maxima, O is not
        // rescaled, and the tile needs no maxima across the warps, only one barrier that ORs the threads' verdicts.
        const int kt = w.k_begin + t * kTile;
        const bool pres_a = (okb >> key_a) & 1, pres_b = (okb >> (key_a + 8)) & 1;
        bool over = false;
#pragma unroll
        for (int i = 0; i < kCols; ++i) {
          const int j = i / 2, e = i & 1;
          s[4 * j + e] = pres_a && kt + key_a < nvis[i] ? s[4 * j + e] : -INFINITY;
          s[4 * j + 2 + e] = pres_b && kt + key_a + 8 < nvis[i] ? s[4 * j + 2 + e] : -INFINITY;
          const float limit = m[i] + kMaxSlack;  // −inf while the row has seen no key
          over |= s[4 * j + e] * row_scale[i] > limit || s[4 * j + 2 + e] * row_scale[i] > limit;
        }
        float alpha[kCols];
#pragma unroll
        for (int i = 0; i < kCols; ++i) alpha[i] = 1.0f;
        if (named_bar_sync_or(kBarScores, kWg, over)) {
          // Column maxima of the warp's 16 keys, then of the tile's 64 (red is double-buffered: a warp writes buffer
          // pb again only after the barrier above of tile t + 2, past every read of it).
          float* const red_t = red + pb * 4 * N;
          float mx[kCols];
#pragma unroll
          for (int i = 0; i < kCols; ++i) {
            const int j = i / 2, e = i & 1;
            mx[i] = fmaxf(s[4 * j + e], s[4 * j + 2 + e]);
#pragma unroll
            for (int sh = 4; sh < 32; sh <<= 1) mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], sh));
          }
          if (lane < 4) {
#pragma unroll
            for (int i = 0; i < kCols; ++i) red_t[warp * N + 8 * (i / 2) + 2 * lane + (i & 1)] = mx[i];
          }
          named_bar_sync(kBarScores, kWg);  // every warp's maxima
#pragma unroll
          for (int i = 0; i < kCols; ++i) {
            const int n = 8 * (i / 2) + 2 * qd + (i & 1);
            const float tile_max = fmaxf(fmaxf(red_t[n], red_t[N + n]), fmaxf(red_t[2 * N + n], red_t[3 * N + n]));
            const float m_new = fmaxf(m[i], tile_max * row_scale[i]);
            alpha[i] = rescale_factor(m[i], m_new);
            m[i] = m_new;
          }
        }
        if (ring_tile >= 2)
          named_bar_sync(kBarPEmpty + pb, 2 * kWg);  // the products of the ring's tile 2 before
                                                     // are done with P buffer pb

        // P = 2^(S·scale − m) → P buffer pb, O's rescale factors → alpha buffer pb.
        uint8_t* const p_t = p_s + pb * N * 128;
        float* const alpha_t = reinterpret_cast<float*>(smem + L::alpha) + pb * N;
#pragma unroll
        for (int i = 0; i < kCols; ++i) {
          const int j = i / 2, e = i & 1, n = 8 * j + 2 * qd + e;
          const float neg_m = m[i] == -INFINITY ? 0.0f : -m[i];
          const float pa = fast_exp2(fmaf(s[4 * j + e], row_scale[i], neg_m));
          const float pb2 = fast_exp2(fmaf(s[4 * j + 2 + e], row_scale[i], neg_m));
          l[i] = l[i] * alpha[i] + (pa + pb2);
          uint8_t* const prow = p_t + n * 128;
          *reinterpret_cast<__half*>(prow + (((pos_a >> 3) ^ (n & 7)) << 4) + (pos_a & 7) * 2) = __float2half_rn(pa);
          *reinterpret_cast<__half*>(prow + ((((pos_a + 8) >> 3) ^ (n & 7)) << 4) + (pos_a & 7) * 2) =
              __float2half_rn(pb2);
          if (warp == 0 && g == 0) alpha_t[n] = alpha[i];
        }
        fence_proxy_async();
        named_bar_arrive(kBarPFull + pb, 2 * kWg);  // P and the rescale factors of tile t are written
      }

      // ---- row sums of the 64 keys of the 4 warps; base-2 LSE ----
#pragma unroll
      for (int i = 0; i < kCols; ++i)
#pragma unroll
        for (int sh = 4; sh < 32; sh <<= 1) l[i] += __shfl_xor_sync(0xffffffffu, l[i], sh);
      named_bar_sync(kBarScores, kWg);  // every warp is past its last reads of red
      if (lane < 4) {
#pragma unroll
        for (int i = 0; i < kCols; ++i) red[warp * N + 8 * (i / 2) + 2 * lane + (i & 1)] = l[i];
      }
      named_bar_sync(kBarScores, kWg);
      if (segments > 0) named_bar_sync(kBarSumsFree, 2 * kWg);  // the products read the last segment's sums
      if (warp == 0 && lane < 4) {
#pragma unroll
        for (int i = 0; i < kCols; ++i) {
          const int n = 8 * (i / 2) + 2 * lane + (i & 1);
          const float sum = red[n] + red[N + n] + red[2 * N + n] + red[3 * N + n];
          sums[n] = sum;
          sums[N + n] = sum > 0.0f ? m[i] + log2f(sum) : -INFINITY;
        }
      }
      named_bar_arrive(kBarSums, 2 * kWg);  // the row sums and LSE are in shared memory
      ++segments;
    }  // segments
    // The products' last arrivals on the P buffers and on the sums (each arrives once more than this warpgroup
    // waited above), so that no named barrier is left half arrived.
    if (ring_tile >= 2) named_bar_sync(kBarPEmpty + (ring_tile & 1), 2 * kWg);
    if (segments > 0) named_bar_sync(kBarSumsFree, 2 * kWg);
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
