// The Hopper decode kernel's ring (sm90_decode_kernel.cu): the shared-memory layout, the CTA's segments of work
// (split or balanced schedule), and the producer warpgroup that fills the two-stage ring of 64-key tiles.
//   bf16 caches: one thread issues bulk tensor copies (TMA) of 64-key × 64-dim column blocks straight into the
//     ring (128-byte swizzle), completing on the blocks' `full` barriers.
//   fp8-e4m3 caches: the same thread copies each stage half's fp8 bytes (half the size) into the back of that
//     half, and warps 1-3 of the warpgroup convert them in place to f16 (exact: every e4m3 value is an f16 value,
//     one instruction per two; the cache scale is in the kernel's score and output scales), column block by
//     column block, each released to the consumers on its `full` barrier. The consumers see the same ring
//     layout in both cases (16-bit elements), and multiply f16 operands for fp8 caches.
// Included by sm90_decode_kernel.cu only (sm_90a).
#pragma once

#include <cuda.h>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "cuda/decode_kernel.cuh"
#include "cuda/sm90_fp8_ring_layout.h"
#include "cuda/sm90_ptx.cuh"
#include "cuda/sm90_segments.cuh"
#include "cuda/sm90_timeline.cuh"

namespace mladcp::cuda_impl::sm90_ring {

using namespace sm90;
using sm90_fp8_ring::convert_sync_after;
using sm90_fp8_ring::fp8_block_offset;
using sm90_segments::CtaWork;
using sm90_segments::local_keys;
using sm90_segments::local_tiles;

constexpr int kRows = 64;
constexpr int kTile = 64;                     // keys per tile
constexpr int kSubTiles = 9;                  // 64-dim column blocks of a tile
constexpr int kConsumerThreads = 256;         // two consumer warpgroups
constexpr int kThreads = 384;                 // + the producer warpgroup
constexpr int kBlockBytes = kSm90BlockBytes;  // one 64-dim column block of a 64-row tile
constexpr int kTileBytes = 9 * kBlockBytes;   // 73728: 64 rows × 576 bf16
// The CTA starts with 168 registers per thread (launch bounds); the consumers can only take what the producer
// gives back: 128 · (168 − 56) = 256 · (224 − 168). (More for the producer and setmaxnreg.inc never returns.)
constexpr int kProducerRegs = 56, kConsumerRegs = 224;
// fp8 caches: the converters take 8 more (the consumers' f16 path needs no more than 216).
constexpr int kProducerRegsFp8 = 64, kConsumerRegsFp8 = 216;
static_assert(128 * kProducerRegsFp8 + 256 * kConsumerRegsFp8 <= 168 * kThreads, "register budget");
// fp8 caches: a column block's fp8 bytes ([64 keys][64 B]; the expansion's layout: sm90_fp8_ring_layout.h), and
// the converters (warps 1-3 of the producer warpgroup) with their named barrier (the consumers use 1-7).
using sm90_fp8_ring::kF8BlockBytes;
static_assert(sm90_fp8_ring::kF16BlockBytes == kBlockBytes && sm90_fp8_ring::kBlocks == kSubTiles, "ring layout");
constexpr int kConverterThreads = 96;
constexpr int kBarConvert = 8;

// Shared-memory layout (byte offsets).
struct Smem {
  static constexpr int q = 0;
  static constexpr int kv = q + kTileBytes;
  static constexpr int pb = kv + 2 * kTileBytes;  // P_b: [64 rows][64 keys] bf16, K-major swizzled
  static constexpr int red = pb + kBlockBytes;
  static constexpr int ok = red + 6 * 64 * 4;
  static constexpr int full = ok + 2 * 8;                 // [2][9] u64
  static constexpr int empty = full + 2 * kSubTiles * 8;  // [2][2] u64
  static constexpr int staged = empty + 4 * 8;            // [2][2] u64: a stage half's fp8 bytes landed (fp8)
  static constexpr int qscale = staged + 4 * 8;           // [64] fp32: 2^-e of each query row (fp8: f16 queries)
  static constexpr int seg = qscale + 64 * 4;             // SegmentState: the consumers' segment cursor
  static constexpr int q_full = seg + 256;                // [9] u64: a query column block landed (copied queries)
  static constexpr int q_empty = q_full + kSubTiles * 8;  // u64: the consumers' last scores of a segment retired
  static constexpr int merge_go = q_empty + 8;            // u64: fused merge, the jobs published (sm90_merge.cuh)
  static constexpr int pair = merge_go + 8;               // [3] u64: pair merge (sm90_pair_merge.cuh)
#if MLADCP_SM90_TIMELINE
  static constexpr int trace = pair + 3 * 8;  // the pair trace's window (sm90_timeline.cuh)
  static constexpr int total = trace + sm90_timeline::kTraceBytes;
#else
  static constexpr int total = pair + 3 * 8;
#endif
};
static_assert(Smem::total <= 227 * 1024, "shared memory of one Hopper CTA");
using Segments = sm90_segments::Segments<kRows>;
static_assert(Smem::kv % 1024 == 0 && Smem::pb % 1024 == 0 && Smem::full % 8 == 0,
              "alignment of the swizzled tiles and the barriers");

// ---- PTX wrappers (the shared ones: sm90_ptx.cuh) ----

// One box of the paged cache (64 dims × rows keys of one page) into shared memory, completing on `bar`.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int dim, int row,
                                            int block, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(dim), "r"(row), "r"(block), "r"(bar), "l"(policy)
      : "memory");
}

// One box of the query rows (64 dims × 64 rows, rows = token · H + head) into shared memory, completing on `bar`.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int dim, int row) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
      "[%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(dim), "r"(row), "r"(bar)
      : "memory");
}

// ---- the producer: one thread ----

// Block ids of the pages of tile t (one per copy: kCopies pages of 64 / kCopies keys) as read from the block table,
// -1 where the tile has no page (past the segment or past the table), and each copy's first row in its page. The
// reads are not waited for here: resolve_pages() turns the ids outside [0, num_blocks) into -1 where the copies
// use them, a pair later, so a pair's copies go out without waiting for the next pair's block-table reads (at a
// piece's first pair they waited for two dependent reads).
template <int kCopies>
struct TilePages {
  int blk[kCopies], row[kCopies];
};
template <int kCopies>
__device__ __forceinline__ TilePages<kCopies> fetch_pages(const DecodeKernelParams& p, const int32_t* bt_row, int kt,
                                                          int k_end) {
  constexpr int rows = kTile / kCopies;
  TilePages<kCopies> tp;
#pragma unroll
  for (int c = 0; c < kCopies; ++c) {
    tp.blk[c] = -1;
    tp.row[c] = 0;
    const int k = kt + c * rows;
    if (k < k_end) {
      const int page = k / p.block_size;
      tp.row[c] = k - page * p.block_size;
      if (page < p.max_blocks_per_seq) tp.blk[c] = __ldg(bt_row + page);
    }
  }
  return tp;
}
template <int kCopies>
__device__ __forceinline__ TilePages<kCopies> resolve_pages(TilePages<kCopies> tp, int num_blocks) {
#pragma unroll
  for (int c = 0; c < kCopies; ++c)
    if (tp.blk[c] < 0 || tp.blk[c] >= num_blocks) tp.blk[c] = -1;
  return tp;
}

// Present keys of a tile as bits: a prefix of each present page's keys (up to the segment's end).
template <int kCopies>
__device__ __forceinline__ uint64_t present_bits(const TilePages<kCopies>& tp, int kt, int k_end) {
  constexpr int rows = kTile / kCopies;
  uint64_t bits = 0;
#pragma unroll
  for (int c = 0; c < kCopies; ++c) {
    if (tp.blk[c] < 0) continue;
    const int n = min(rows, k_end - (kt + c * rows));
    if (n > 0) bits |= (n >= 64 ? ~0ull : ((1ull << n) - 1)) << (c * rows);
  }
  return bits;
}

// The copying thread. kCopies copies per 64-dim column block of a tile: 1 for pages of ≥ 64 keys, 2 for 32, 4
// for 16. bf16: each block straight into the ring, completing on its `full` barrier. fp8 (kFp8): each stage
// half's blocks into the back of the half, completing on the half's `staged` barrier; the converters take
// it from there.
template <int kCopies, bool kFp8, int kStage>
__device__ __forceinline__ void produce(const DecodeKernelParams& p, const CUtensorMap* map, Segments segs,
                                        uint8_t* smem) {
  constexpr int stage = kStage;
  constexpr int rows = kTile / kCopies;  // keys per copy
  const uint32_t kv = smem_addr(smem + Smem::kv);
  const uint32_t full = smem_addr(smem + Smem::full), empty = smem_addr(smem + Smem::empty);
  const uint32_t staged = smem_addr(smem + Smem::staged);
  uint64_t* const ok = reinterpret_cast<uint64_t*>(smem + Smem::ok);
  // Keys are evicted first from L2 (evict-normal when row chunks share keys measured 1-4% slower at
  // 128 heads: the chunks of a split run side by side and meet their keys in L2 anyway).
  const uint64_t policy = evict_first_policy();
  // Copies of column blocks [c0, c1) of a tile (one stage half) into stage `st`.
  auto copy_blocks = [&](const TilePages<kCopies>& tp, int st, int c0, int c1) {
    const uint32_t stage = kv + uint32_t(st * kTileBytes);
    if constexpr (kFp8) {
      const uint32_t bar = bar_addr(staged, 2 * st + (c0 > 0));
      mbar_arrive_expect_tx(bar, uint32_t((c1 - c0) * kF8BlockBytes));
#pragma unroll 1
      for (int c = c0; c < c1; ++c)
#pragma unroll
        for (int q = 0; q < kCopies; ++q)
          tma_load_3d(stage + fp8_block_offset(c) + uint32_t(q * rows * 64), map, bar, c * 64, tp.row[q], tp.blk[q],
                      policy);
    } else {
#pragma unroll 1
      for (int c = c0; c < c1; ++c) {
        const uint32_t bar = bar_addr(full, st * kSubTiles + c);
        mbar_arrive_expect_tx(bar, kBlockBytes);
#pragma unroll
        for (int q = 0; q < kCopies; ++q)
          tma_load_3d(stage + uint32_t(c * kBlockBytes + q * rows * 128), map, bar, c * 64, tp.row[q], tp.blk[q],
                      policy);
      }
    }
  };
  // Pairs of tiles (a in stage 0, b in stage 1), numbered across the CTA's segments (g): the ring runs on
  // from one segment into the next. The consumers release a pair's stage halves in this order: a's columns 0-3
  // (after warpgroup 0's P_a·V_a,L), b's columns 4-8 (after warpgroup 1's P_b·V_b,R), a's columns 4-8 (after
  // warpgroup 1's P_a·V_a,R, which waits for m_b), b's columns 0-3 (after warpgroup 0's P_b·V_b,L, which P_b's
  // hand-over holds behind P_a·V_a,R). bf16: one copying thread per stage (`stage` 0 or 1), each refilling its
  // halves as they are released: one thread for both in a fixed order held a later half behind an earlier one,
  // and each half takes the thread a few hundred cycles to issue. fp8 (`stage` -1): one thread, in that order,
  // the order the converters take them.
  constexpr bool do_a = stage != 1, do_b = stage != 0;
  int64_t g = 0;
#if MLADCP_SM90_TIMELINE
  int pieces = 0;
#endif
  CtaWork w;
  while (segs.next(p, w)) {
    if (stage != 1 && g == 0) MLADCP_TIMELINE(kCopyPiece);
#if MLADCP_SM90_TIMELINE
    if (stage != 1 && ++pieces == 2) MLADCP_TIMELINE(kCopyPiece2);
    const int64_t g_first = g;
#endif
    const int32_t* const bt_row = p.block_table + int64_t(w.seq) * p.block_table_stride;
    TilePages<kCopies> next_a{}, next_b{};
    if (do_a) next_a = fetch_pages<kCopies>(p, bt_row, w.k_begin, w.k_end);
    if (do_b) next_b = fetch_pages<kCopies>(p, bt_row, w.k_begin + kTile, w.k_end);
    for (int i = 0; i < w.npairs; ++i, ++g) {
      const int kt = w.k_begin + 2 * i * kTile;
#if MLADCP_SM90_TIMELINE
      // The clock once the first id has arrived (the test needs the loaded value).
      if (stage != 1 && g == 0 && next_a.blk[0] != INT_MIN) MLADCP_TIMELINE(kCopyPages);
#endif
      const TilePages<kCopies> ta = resolve_pages(next_a, p.num_blocks), tb = resolve_pages(next_b, p.num_blocks);
      // In flight while this pair waits.
      if (do_a) next_a = fetch_pages<kCopies>(p, bt_row, kt + 2 * kTile, w.k_end);
      if (do_b) next_b = fetch_pages<kCopies>(p, bt_row, kt + 3 * kTile, w.k_end);
      const uint32_t prev = uint32_t(g - 1) & 1;  // phase of the previous pair's releases
      // A block id of -1 is out of the tensor map's range: the copy engine fills zeros (and counts the bytes).
      // (The pair trace files the releases of pair g - 1 under that pair.)
      if (do_a) {
        if (g > 0) mbar_wait(bar_addr(empty, 0), prev);
        MLADCP_TRACE(g - 1, sm90_timeline::kC0ReleasedA03);
        ok[0] = present_bits(ta, kt, w.k_end);
        copy_blocks(ta, 0, 0, 4);
      }
      if (do_b) {
        if (g > 0) mbar_wait(bar_addr(empty, 3), prev);
        MLADCP_TRACE(g - 1, sm90_timeline::kC1ReleasedB48);
        copy_blocks(tb, 1, 4, kSubTiles);
      }
      if (do_a) {
        if (g > 0) mbar_wait(bar_addr(empty, 1), prev);
        MLADCP_TRACE(g - 1, sm90_timeline::kC2ReleasedA48);
        copy_blocks(ta, 0, 4, kSubTiles);
      }
      if (do_b) {
        if (g > 0) mbar_wait(bar_addr(empty, 2), prev);
        MLADCP_TRACE(g - 1, sm90_timeline::kC3ReleasedB03);
        ok[1] = present_bits(tb, kt + kTile, w.k_end);
        copy_blocks(tb, 1, 0, 4);
      }
      if (stage != 1) {
        if (g == 0) MLADCP_TIMELINE(kFirstCopy);
#if MLADCP_SM90_TIMELINE
        if (pieces == 2 && g == g_first) MLADCP_TIMELINE(kFirstCopy2);
#endif
        MLADCP_TIMELINE(kLastCopy);
      }
    }
  }
}

// The copying thread of stage kStage (bf16: 0 or 1; fp8: -1, both), for the cache's page size.
template <bool kFp8, int kStage>
__device__ __forceinline__ void produce_pages(const DecodeKernelParams& p, const CUtensorMap* map, Segments segs,
                                              uint8_t* smem) {
  if (p.block_size >= kTile)
    produce<1, kFp8, kStage>(p, map, segs, smem);
  else if (p.block_size == 32)
    produce<2, kFp8, kStage>(p, map, segs, smem);
  else
    produce<4, kFp8, kStage>(p, map, segs, smem);
}

// The query copier (bf16 caches whose query rows form one [tokens · H][576] matrix, q_map; lane 0 of the producer
// warpgroup's second warp): each segment's 64 query rows, column block by column block on the q_full barriers, as
// soon as the consumers have released q_s (q_empty: the previous segment's last scores retired, or its staged
// output written): the first scores start on block 0, and a CTA's next sequence's queries load behind the current
// one's last products. A sequence of fewer than 64 rows copies its R rows only (rows [R, 64) keep whatever q_s
// held); in a chunk of 64 rows past the first, rows past R hold the next sequence's queries (or zeros past the
// matrix). Either way the scores of those rows are all masked (no visible keys) and the rows are never written.
__device__ __forceinline__ void copy_queries(const DecodeKernelParams& p, const CUtensorMap* q_map, Segments segs,
                                             uint8_t* smem) {
  const uint32_t q_full = smem_addr(smem + Smem::q_full), q_empty = smem_addr(smem + Smem::q_empty);
  const uint32_t q_s = smem_addr(smem + Smem::q);
  const uint32_t box_bytes = uint32_t(min(kRows, p.rows_per_seq)) * 128;  // the map's box: min(64, R) rows
  int loads = 0;
  CtaWork w;
  while (segs.next(p, w)) {
    if (w.npairs == 0) continue;
    if (loads > 0) mbar_wait(q_empty, uint32_t(loads - 1) & 1);
    const int row = int(int64_t(w.seq) * p.q_len * p.num_heads + w.row0);
#pragma unroll 1
    for (int c = 0; c < kSubTiles; ++c) {
      mbar_arrive_expect_tx(bar_addr(q_full, c), box_bytes);
      tma_load_2d(q_s + uint32_t(c * kBlockBytes), q_map, bar_addr(q_full, c), c * 64, row);
    }
    if (loads == 1) MLADCP_TIMELINE(kQueries2);
    ++loads;
  }
}

// The converters (ct = 0..95: warps 1-3 of the producer warpgroup): every stage half in the copying thread's
// order, once its fp8 bytes have landed, into f16 column blocks in place, ascending. Thread ct converts 16-byte
// chunks i = ct, ct + 96, ct + 192 (< 256) of a block: key i / 4, dims 16 · (i % 4) .. + 15, read conflict-free
// (a quarter warp reads 128 contiguous bytes) and written as two 16-byte chunks of the key's 128-byte-swizzled
// row (a quarter warp covers the 8 chunk positions of two rows: conflict-free). Each step reads the next block's
// fp8 bytes before writing its own block; the steps after which the converters meet (convert_sync_after) order
// every read before the writes that reach its bytes (fp8_block_offset), and release the converted blocks to the
// consumers (proxy fence, barrier, one arrival per block).
__device__ __forceinline__ void convert_fp8(const DecodeKernelParams& p, Segments segs, uint8_t* smem, int ct) {
  const uint32_t full = smem_addr(smem + Smem::full), staged = smem_addr(smem + Smem::staged);
  constexpr int kChunks = (kTile * 4 + kConverterThreads - 1) / kConverterThreads;  // 3
  const bool third = ct + 2 * kConverterThreads < kTile * 4;                        // warp-uniform
  // The thread's chunks: fp8 offset in a block, f16 offsets of its two halves in a block.
  int src_off[kChunks], dst_lo[kChunks], dst_hi[kChunks];
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int i = min(ct + k * kConverterThreads, kTile * 4 - 1);
    const int r = i >> 2, part = i & 3;
    src_off[k] = i * 16;
    dst_lo[k] = r * 128 + (((2 * part) ^ (r & 7)) << 4);
    dst_hi[k] = r * 128 + (((2 * part + 1) ^ (r & 7)) << 4);
  }
  auto read_block = [&](const uint8_t* stage, int c, uint4(&v)[kChunks]) {
    const uint8_t* const b = stage + fp8_block_offset(c);
#pragma unroll
    for (int k = 0; k < kChunks; ++k)
      if (k < 2 || third) v[k] = *reinterpret_cast<const uint4*>(b + src_off[k]);
  };
  auto write_block = [&](uint8_t* stage, int c, const uint4(&v)[kChunks]) {
    uint8_t* const b = stage + c * kBlockBytes;
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      if (k == 2 && !third) continue;
      const uint2 x = e4m3x4_to_f16x4(v[k].x), y = e4m3x4_to_f16x4(v[k].y);
      const uint2 z = e4m3x4_to_f16x4(v[k].z), w = e4m3x4_to_f16x4(v[k].w);
      *reinterpret_cast<uint4*>(b + dst_lo[k]) = make_uint4(x.x, x.y, y.x, y.y);
      *reinterpret_cast<uint4*>(b + dst_hi[k]) = make_uint4(z.x, z.y, w.x, w.y);
    }
  };
  // Column blocks [kC0, kC1) of stage st, whose fp8 bytes complete the phase `par` of their staged barrier.
  auto convert_half = [&](auto c0_const, auto c1_const, int st, uint32_t par) {
    constexpr int kC0 = decltype(c0_const)::value, kC1 = decltype(c1_const)::value;
    uint8_t* const stage = smem + Smem::kv + st * kTileBytes;
    mbar_wait(bar_addr(staged, 2 * st + (kC0 > 0)), par);
    uint4 v[2][kChunks];
    read_block(stage, kC0, v[0]);
    int released = kC0;
#pragma unroll
    for (int c = kC0; c < kC1; ++c) {
      if (c + 1 < kC1) read_block(stage, c + 1, v[(c + 1 - kC0) & 1]);
      write_block(stage, c, v[(c - kC0) & 1]);
      if (convert_sync_after(c)) {
        fence_proxy_async();  // the consumers' wgmma reads the blocks through the async proxy
        named_bar_sync(kBarConvert, kConverterThreads);
        if (ct == 0)
          for (; released <= c; ++released) mbar_arrive(bar_addr(full, st * kSubTiles + released));
      }
    }
  };
  using B0 = std::integral_constant<int, 0>;
  using B4 = std::integral_constant<int, 4>;
  using B9 = std::integral_constant<int, kSubTiles>;
  int64_t g = 0;
  CtaWork w;
  while (segs.next(p, w)) {
    for (int i = 0; i < w.npairs; ++i, ++g) {
      const uint32_t par = uint32_t(g) & 1;
      convert_half(B0{}, B4{}, 0, par);
      convert_half(B4{}, B9{}, 1, par);
      convert_half(B4{}, B9{}, 0, par);
      convert_half(B0{}, B4{}, 1, par);
    }
  }
}

}  // namespace mladcp::cuda_impl::sm90_ring
