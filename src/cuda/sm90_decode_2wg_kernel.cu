// Hopper (sm_90a) decode kernel for bf16 caches in two warpgroups: 64 query rows per CTA, pages of 16, 32 or a
// multiple of 64 keys, no producer warpgroup.
//
// The same work, ring and pair schedule as the three-warpgroup kernel (sm90_decode_kernel.cu, which keeps fp8 caches
// and the fused merge), but the consumers issue the bulk tensor copies themselves: each stage half is refilled by the
// last warpgroup that reads it, right after its own product over that half has retired, so no release barrier and no
// producer wake-up lie between the release and the copy, and 256 threads share the register file (up to 255 each,
// against 224 beside a producer warpgroup). The registers freed pay for the query rows' rope block as register A
// fragments of the scores (8 KiB less of shared-memory operand reads per tile).
//
// Threads: two warpgroups (256). Warpgroup w scores the tiles of stage w (S = Q·Kᵀ) and owns output columns
// [256w, 256w + 256) of every tile (docs/cuda.md, "The two-warpgroup Hopper kernel"). Per pair (tile a in stage 0,
// tile b in stage 1), the halves and who refills them for the next pair, in the order they are freed:
//   stage 0, column blocks 0-3: read by warpgroup 0 only (scores, P_a·V_a,L)      → thread 0, after P_a·V_a,L
//   stage 1, column blocks 4-8: read by warpgroup 1 only (scores, P_b·V_b,R)      → thread 128, after P_b·V_b,R
//   stage 1, column blocks 0-3: scores by warpgroup 1, P_b·V_b,L by warpgroup 0  → thread 0, after P_b·V_b,L
//   stage 0, column blocks 4-8: scores by warpgroup 0, P_a (block 8) and
//                               P_a·V_a,R by warpgroup 1                         → thread 128, after P_a·V_a,R
// The other warpgroup's reads of a half are ordered before the copy by the hand-over barriers of the pair (each
// waits for the other's scores of its tile before its products). The next pair is the segment's next one, or the
// first pair of the CTA's next segment when that has keys: the ring runs on from one segment into the next.
// Each copying thread reads the next pair's page ids into shared memory at the pair's start (cp.async), so the
// copies never wait for the block table.
//
// Shared memory: sm90_ring::Smem's layout up to q_full (queries, ring, P_b, row state, key-presence rows, full
// barriers), then this kernel's page-id slots and segment lookahead.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/decode_kernel.cuh"
#include "cuda/sm90_consumer.cuh"
#include "cuda/sm90_decode_2wg.h"
#include "cuda/sm90_decode_ring.cuh"
#include "cuda/sm90_ptx.cuh"
#include "cuda/sm90_segments.cuh"

namespace mladcp::cuda_impl {
namespace {

using namespace sm90;
using namespace sm90_consumer;
using sm90_ring::kBlockBytes;
using sm90_ring::kRows;
using sm90_ring::kSubTiles;
using sm90_ring::kTile;
using sm90_ring::kTileBytes;
using sm90_ring::tma_load_2d;
using sm90_ring::tma_load_3d;
using sm90_segments::CtaWork;
using Segments = sm90_segments::Segments<kRows>;

constexpr int kThreads2 = 256;
// The page-id slot of one copying thread: for tiles a and b of the next pair, up to 4 copies per column block
// (pages of 16 keys), each {block id (cp.async; -1: none), first row in its page, keys present if the page is valid}.
struct PageSlot {
  int blk[2][4], row[2][4], keys[2][4];
};
// The segments in shared memory, one ahead of the consumers (thread 0 advances the cursor): slot k % 3 holds segment
// k, slot (k + 1) % 3 the next, whose first pair the current segment's last pair copies.
struct Lookahead {
  Segments segs;
  CtaWork w[3];
  int more[3];
};
struct Smem2 {
  static constexpr int q = sm90_ring::Smem::q;
  static constexpr int kv = sm90_ring::Smem::kv;
  static constexpr int pb = sm90_ring::Smem::pb;
  static constexpr int red = sm90_ring::Smem::red;
  static constexpr int ok = sm90_ring::Smem::ok;
  static constexpr int full = sm90_ring::Smem::full;  // [2][9] u64
  static constexpr int q_full = full + 2 * kSubTiles * 8;
  static constexpr int slots = q_full + kSubTiles * 8;  // PageSlot [2]: copying threads 0 and 128
  static constexpr int seg = slots + 2 * int(sizeof(PageSlot));
  static constexpr int total = seg + int(sizeof(Lookahead));
};
static_assert(Smem2::total <= 227 * 1024, "shared memory of one Hopper CTA");
static_assert(Smem2::q_full % 8 == 0 && Smem2::seg % 8 == 0, "alignment of the barriers and the cursor");

__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}

// Where the next pair's keys come from: tiles [kt, kt + 128) of a sequence's local keys below k_end.
struct PairSource {
  const int32_t* bt_row;
  int kt, k_end;
};

// One copying thread: the page ids of the pair at src into its slot (asynchronous; copy_half waits for them).
__device__ __forceinline__ void prefetch_pages(const DecodeKernelParams& p, const PairSource& src, PageSlot* slot,
                                               int ncopies) {
  const int rows = kTile / ncopies;
#pragma unroll
  for (int t = 0; t < 2; ++t)
#pragma unroll 1
    for (int q = 0; q < ncopies; ++q) {
      const int k = src.kt + t * kTile + q * rows;
      const int page = k / p.block_size;
      const bool valid = k < src.k_end && page < p.max_blocks_per_seq;
      slot->row[t][q] = valid ? k - page * p.block_size : 0;
      slot->keys[t][q] = valid ? min(rows, src.k_end - k) : 0;
      if (valid)
        cp_async_4(smem_addr(&slot->blk[t][q]), src.bt_row + page);
      else
        slot->blk[t][q] = -1;
    }
  cp_async_commit();
}

// One copying thread: column blocks [c0, c1) of tile t of the slot's pair into stage t, each completing on its full
// barrier (a block id outside [0, num_blocks) is out of the tensor map's range: the copy engine fills zeros and counts
// the bytes). ok: the stage's key-presence row, written first (the consumers read it after their full waits).
__device__ __forceinline__ void copy_half(const DecodeKernelParams& p, const CUtensorMap* map, PageSlot* slot, int t,
                                          int c0, int c1, int ncopies, uint8_t* smem, uint64_t* ok, uint64_t policy) {
  const int rows = kTile / ncopies;
  cp_async_wait_all();
  uint64_t bits = 0;
#pragma unroll 1
  for (int q = 0; q < ncopies; ++q) {
    int b = slot->blk[t][q];
    if (b < 0 || b >= p.num_blocks) b = -1;
    slot->blk[t][q] = b;
    const int n = slot->keys[t][q];
    if (b >= 0 && n > 0) bits |= (n >= 64 ? ~0ull : ((1ull << n) - 1)) << (q * rows);
  }
  if (ok) *ok = bits;
  const uint32_t stage = smem_addr(smem + Smem2::kv) + uint32_t(t * kTileBytes);
  const uint32_t full = smem_addr(smem + Smem2::full);
#pragma unroll 1
  for (int c = c0; c < c1; ++c) {
    const uint32_t bar = bar_addr(full, t * kSubTiles + c);
    mbar_arrive_expect_tx(bar, kBlockBytes);
#pragma unroll 1
    for (int q = 0; q < ncopies; ++q)
      tma_load_3d(stage + uint32_t(c * kBlockBytes + q * rows * 128), map, bar, c * 64, slot->row[t][q],
                  slot->blk[t][q], policy);
  }
}

// One thread: the 9 query column blocks of segment w into q_s, on the q_full barriers.
__device__ __forceinline__ void copy_queries_of(const DecodeKernelParams& p, const CUtensorMap* q_map, const CtaWork& w,
                                                uint8_t* smem) {
  const uint32_t q_full = smem_addr(smem + Smem2::q_full), q_s = smem_addr(smem + Smem2::q);
  const uint32_t box_bytes = uint32_t(min(kRows, p.rows_per_seq)) * 128;  // the map's box: min(64, R) rows
  const int row = int(int64_t(w.seq) * p.q_len * p.num_heads + w.row0);
#pragma unroll 1
  for (int c = 0; c < kSubTiles; ++c) {
    mbar_arrive_expect_tx(bar_addr(q_full, c), box_bytes);
    tma_load_2d(q_s + uint32_t(c * kBlockBytes), q_map, bar_addr(q_full, c), c * 64, row);
  }
}

__device__ __forceinline__ const int32_t* table_row(const DecodeKernelParams& p, int seq) {
  return p.block_table + int64_t(seq) * p.block_table_stride;
}

// q_copied: thread 0 copies the query rows through q_map (bf16 caches whose query rows form one matrix); else the
// consumers load them.
__global__ void __launch_bounds__(kThreads2, 1)
    mla_decode_sm90_2wg_kernel(const DecodeKernelParams p, const __grid_constant__ CUtensorMap kv_map,
                               const __grid_constant__ CUtensorMap q_map, bool q_copied) {
  extern __shared__ __align__(1024) uint8_t smem[];
  const int tid = threadIdx.x, lane = tid & 31;
  const int wg = tid >> 7;
  const int tid_in_wg = tid & 127;
  const bool copier = tid_in_wg == 0;  // thread 0 of each warpgroup issues its halves' copies

  if (tid == 0) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&kv_map)) : "memory");
    if (q_copied) asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&q_map)) : "memory");
  }

  Segments segs;
  if (!sm90_segments::cta_segments(p, segs)) return;

  const uint32_t full = smem_addr(smem + Smem2::full);
  if (tid == 0) {
    for (int i = 0; i < 2 * kSubTiles; ++i) mbar_init(bar_addr(full, i), 1);
    for (int i = 0; i < kSubTiles; ++i) mbar_init(smem_addr(smem + Smem2::q_full) + 8 * i, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  if (segs.balanced)
    segs.cur = sm90_segments::balanced_start<kThreads2>(p, segs.part, reinterpret_cast<int64_t*>(smem + Smem2::red));
  Lookahead* const la = reinterpret_cast<Lookahead*>(smem + Smem2::seg);
  if (tid == 0) {
    la->segs = segs;
    la->more[0] = la->segs.next(p, la->w[0]);
    la->more[1] = la->more[0] && la->segs.next(p, la->w[1]);
  }
  __syncthreads();

  uint8_t* const q_s = smem + Smem2::q;
  uint8_t* const kv_s = smem + Smem2::kv;
  float* const red = reinterpret_cast<float*>(smem + Smem2::red);  // [6][64]: m_a, m_b (two each), l of WG0, WG1
  uint64_t* const ok = reinterpret_cast<uint64_t*>(smem + Smem2::ok);
  PageSlot* const slot = reinterpret_cast<PageSlot*>(smem + Smem2::slots) + wg;
  const int ncopies = p.block_size >= kTile ? 1 : kTile / p.block_size;  // copies per column block: 1, 2 or 4
  const uint64_t policy = evict_first_policy();                          // keys: each byte read once per CTA

  const uint32_t kv_addr = smem_addr(kv_s);
  // Operand descriptors (low words, warp-uniform: they stay in uniform registers).
  constexpr uint32_t kStage = kTileBytes >> 4;        // one stage in descriptor address units
  constexpr uint32_t kHalf = (4 * kBlockBytes) >> 4;  // value columns 256-511 of a stage
  const uint32_t q_lo = kmajor_lo(smem_addr(q_s));
  const uint32_t k_lo0 = kmajor_lo(kv_addr);                      // keys of stage 0
  const uint32_t p_lo0 = kmajor_lo(kv_addr + 8 * kBlockBytes);    // P_a over the rope block of stage 0
  const uint32_t pb_lo = kmajor_lo(smem_addr(smem + Smem2::pb));  // P_b in its own buffer
  const uint32_t v_lo0 = nmajor_lo(kv_addr);                      // values of stage 0, columns 0-255
  const uint8_t* const rope = q_s + (kSubTiles - 1) * kBlockBytes;
  const uint32_t q_full_addr = q_copied ? smem_addr(smem + Smem2::q_full) : 0u;

  int64_t g0 = 0;             // the first pair of the segment, numbered across the CTA (the ring's phases)
  int q_loads = 0;            // segments with keys so far (the copied queries' phases)
  int prev_npairs = 0;        // pairs of the previous segment (> 0: it copied this segment's first pair)
  bool queries_sent = false;  // thread 0: this segment's queries were copied during the previous one
  for (int k = 0;; ++k) {
    named_bar_sync(kBarConsumers, kConsumerThreads);  // every thread past the last epilogue (q_s, red, the slots)
    const int s0 = k % 3, s1 = (k + 1) % 3;
    if (!la->more[s0]) break;
    const CtaWork& w = la->w[s0];
    const CtaWork& wn = la->w[s1];
    const int npairs = w.npairs, k_begin = w.k_begin;
    const bool next_has_keys = la->more[s1] && wn.npairs > 0;
    const bool staged = w.direct && !p.out_fp32 && npairs > 0;

    if (npairs > 0) {
      // ---- query rows → q_s (rows past the sequence's R rows are zero, or masked), then the first pair's keys ----
      if (q_copied) {
        if (tid == 0 && !queries_sent) copy_queries_of(p, &q_map, w, smem);
      } else {
        for (int c = tid; c < kRows * kRowChunks; c += kConsumerThreads) {
          const int r = c / kRowChunks, ch = c - r * kRowChunks;
          const int grow = w.row0 + r;
          const bool valid = grow < p.rows_per_seq;
          const uint16_t* src = p.q;
          if (valid) {
            const int i = grow / p.num_heads, h = grow - i * p.num_heads;
            src = p.q + q_elem(p, int64_t(w.seq) * p.q_len + i, h) + ch * 8;
          }
          const int cb = ch >> 3, cc = ch & 7;
          cp_async_16(smem_addr(q_s + cb * kBlockBytes + r * 128 + ((cc ^ (r & 7)) << 4)), src, valid);
        }
        cp_async_commit();
      }
      if (tid == 0 && prev_npairs == 0) {  // the first pair's keys were not copied by the previous segment
        prefetch_pages(p, PairSource{table_row(p, w.seq), k_begin, w.k_end}, slot, ncopies);
        copy_half(p, &kv_map, slot, 0, 0, kSubTiles, ncopies, smem, ok, policy);
        copy_half(p, &kv_map, slot, 1, 4, kSubTiles, ncopies, smem, nullptr, policy);
        copy_half(p, &kv_map, slot, 1, 0, 4, ncopies, smem, ok + 1, policy);
      }
      if (!q_copied) {
        cp_async_wait_all();
        fence_proxy_async();
        named_bar_sync(kBarConsumers, kConsumerThreads);
      }
    }
    queries_sent = false;
    // The lookahead: segment k + 2 (its slot was segment k - 1's, which every thread is done with).
    if (tid == 0 && la->more[s1]) la->more[(k + 2) % 3] = la->segs.next(p, la->w[(k + 2) % 3]);
    const uint32_t q_parity = uint32_t(q_loads) & 1;
    if (npairs > 0 && q_copied) ++q_loads;

    RowState st;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      st.rs[e] = 16 * ((tid >> 5) & 3) + (lane >> 2) + 8 * e;
      const int grow = w.row0 + st.rs[e];
      st.nvis[e] =
          grow < p.rows_per_seq ? int(sharding::visible_local_keys(w.len, p.q_len, grow / p.num_heads, p.shard)) : 0;
      st.m[e] = -INFINITY;
      st.l[e] = 0.0f;
      st.scale[e] = p.score_scale_log2;
    }
    // The tile whose last keys lie past the segment's end (rows [tail_valid, 64) to zero), or -1.
    const int tail_valid = (w.k_end - k_begin) % kTile;
    const int tail_tile = tail_valid ? w.ntiles - 1 : -1;
    // The pair that the copies of pair i fill: the segment's next, else the next segment's first (if it has keys).
    auto next_source = [&](int i) {
      if (i + 1 < npairs) return PairSource{table_row(p, w.seq), k_begin + 2 * (i + 1) * kTile, w.k_end};
      return PairSource{table_row(p, wn.seq), wn.k_begin, wn.k_end};
    };

    // Accumulators are first written by the tensor cores (the first products overwrite them).
    float o[128];
    float s[32];
    uint32_t pr[16];
    uint32_t qr[16];  // the query rows' rope block (A fragments), read by the segment's first scores

    if (wg == 0) {
      // ---- warpgroup 0: tiles a (stage 0), columns [0, 256) ----
      if (npairs > 0) {
        issue_scores<false, 0, Rope::kLoad>(s, qr, rope, q_lo, k_lo0, full, uint32_t(g0) & 1, q_full_addr, q_parity);
        wgmma_wait<0>();
        fence_regs(s);
      }
      for (int i = 0; i < npairs; ++i) {
        const bool more = i + 1 < npairs;
        const bool copy_next = more || next_has_keys;
        const uint32_t par = uint32_t(g0 + i) & 1;  // the pair's ring phase
        float* const red_m = red + 128 * par;       // m_a and m_b of this pair: slots of its parity
        float mx[2], m_a[2], alpha[2], m_b[2], beta[2];
        if (copier && copy_next) prefetch_pages(p, next_source(i), slot, ncopies);
        __syncwarp();
        // m_a = max(m, rowmax S_a), published at once: warpgroup 1 holds S_b already and needs only m_a.
        mask_scores(s, mx, ok, k_begin + 2 * i * kTile, st, lane);
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          m_a[e] = raised_max(st.m[e], mx[e]);
          alpha[e] = rescale_factor(st.m[e], m_a[e]);
          st.l[e] *= alpha[e];
        }
        if ((lane & 3) == 0) {
          red_m[st.rs[0]] = m_a[0];
          red_m[st.rs[1]] = m_a[1];
        }
        named_bar_arrive(kBarMa, kConsumerThreads);
        // P_a = 2^(S_a − m_a); O_L = O_L·2^(m − m_a) + P_a·V_a,L (P_a from registers).
        exponentiate<false>(s, pr, m_a, st.scale, st.l);
        if (2 * i == tail_tile) zero_tail_rows(kv_s, tail_valid, 0, wg, tid_in_wg);
        if (i > 0) rescale_rows(o, alpha);
        wgmma_fence();
        fence_regs(o);
        fence_regs(pr);
        issue_pv_regs<false>(o, pr, v_lo0, i > 0);
        wgmma_commit();
        // m_b from warpgroup 1; P_a·2^(m_a − m_b) over the rope block of stage 0 for warpgroup 1.
        named_bar_sync(kBarMb, kConsumerThreads);
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          m_b[e] = red_m[64 + st.rs[e]];
          beta[e] = rescale_factor(m_a[e], m_b[e]);
          st.l[e] *= beta[e];
          st.m[e] = m_b[e];
        }
        // Both warpgroups' last scores of the segment have retired (warpgroup 1 published m_b after its own): the
        // next segment's queries may replace these, unless q_s stages this segment's output.
        if (tid == 0 && q_copied && !more && next_has_keys && !staged) {
          copy_queries_of(p, &q_map, wn, smem);
          queries_sent = true;
        }
        store_p<false>(kv_s + 8 * kBlockBytes, s, beta, st, lane);
        fence_proxy_async();
        named_bar_arrive(kBarPa, kConsumerThreads);
        wgmma_wait<0>();
        fence_regs(o);
        if (copier && copy_next)  // stage 0, columns 0-3: P_a·V_a,L retired, nobody else reads them
          copy_half(p, &kv_map, slot, 0, 0, 4, ncopies, smem, ok, policy);
        __syncwarp();
        // O_L ·= 2^(m_a − m_b), O_L += P_b·V_b,L (P_b from its own buffer, at m_b).
        rescale_rows(o, beta);
        named_bar_sync(kBarPb, kConsumerThreads);
        if (2 * i + 1 == tail_tile) zero_tail_rows(kv_s + kTileBytes, tail_valid, 0, wg, tid_in_wg);
        wgmma_fence();
        fence_regs(o);
        issue_pv_smem<false>(o, pb_lo, v_lo0 + kStage, true);
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(o);
        if (copier && copy_next)  // stage 1, columns 0-3: P_b·V_b,L retired (warpgroup 1's scores of b long before)
          copy_half(p, &kv_map, slot, 1, 0, 4, ncopies, smem, ok + 1, policy);
        __syncwarp();
        if (more) {  // scores of the next tile a, for the next pair
          issue_scores<false, 0, Rope::kRegisters>(s, qr, rope, q_lo, k_lo0, full, par ^ 1);
          wgmma_wait<0>();
          fence_regs(s);
        }
      }
    } else {
      // ---- warpgroup 1: tiles b (stage 1), columns [256, 512) ----
      if (npairs > 0) {
        issue_scores<false, 4, Rope::kLoad>(s, qr, rope, q_lo, k_lo0 + kStage, bar_addr(full, kSubTiles),
                                            uint32_t(g0) & 1, q_full_addr, q_parity);
        wgmma_wait<0>();
        fence_regs(s);
      }
      for (int i = 0; i < npairs; ++i) {
        const bool more = i + 1 < npairs;
        const bool copy_next = more || next_has_keys;
        const uint32_t par = uint32_t(g0 + i) & 1;
        float* const red_m = red + 128 * par;
        float mx[2], m_a[2], alpha[2], m_b[2], one[2] = {1.0f, 1.0f};
        if (copier && copy_next) prefetch_pages(p, next_source(i), slot, ncopies);
        __syncwarp();
        // m_b = max(m_a, rowmax S_b), published; O_R's scale moves once per pair, from m to m_b.
        mask_scores(s, mx, ok + 1, k_begin + (2 * i + 1) * kTile, st, lane);
        named_bar_sync(kBarMa, kConsumerThreads);
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          m_a[e] = red_m[st.rs[e]];
          m_b[e] = raised_max(m_a[e], mx[e]);
          alpha[e] = rescale_factor(st.m[e], m_b[e]);
          st.l[e] *= alpha[e];
          st.m[e] = m_b[e];
        }
        if ((lane & 3) == 0) {
          red_m[64 + st.rs[0]] = m_b[0];
          red_m[64 + st.rs[1]] = m_b[1];
        }
        named_bar_arrive(kBarMb, kConsumerThreads);
        // P_b = 2^(S_b − m_b); O_R = O_R·2^(m − m_b) + P_b·V_b,R (registers); P_b for warpgroup 0.
        exponentiate<false>(s, pr, m_b, st.scale, st.l);
        if (2 * i + 1 == tail_tile) zero_tail_rows(kv_s + kTileBytes, tail_valid, 4, wg, tid_in_wg);
        if (i > 0) rescale_rows(o, alpha);
        wgmma_fence();
        fence_regs(o);
        fence_regs(pr);
        issue_pv_regs<false>(o, pr, v_lo0 + kStage + kHalf, i > 0);
        wgmma_commit();
        store_p<false>(smem + Smem2::pb, s, one, st, lane);
        fence_proxy_async();
        named_bar_arrive(kBarPb, kConsumerThreads);
        // O_R += P_a·V_a,R once warpgroup 0 has stored P_a at m_b.
        named_bar_sync(kBarPa, kConsumerThreads);
        if (2 * i == tail_tile) zero_tail_rows(kv_s, tail_valid, 4, wg, tid_in_wg);
        wgmma_fence();
        issue_pv_smem<false>(o, p_lo0, v_lo0 + kHalf, true);
        wgmma_commit();
        wgmma_wait<1>();
        if (copier && copy_next)  // stage 1, columns 4-8: P_b·V_b,R retired, nobody else reads them
          copy_half(p, &kv_map, slot, 1, 4, kSubTiles, ncopies, smem, nullptr, policy);
        __syncwarp();
        wgmma_wait<0>();
        fence_regs(o);
        if (copier && copy_next)  // stage 0, columns 4-8: P_a·V_a,R retired (warpgroup 0's scores of a before P_a)
          copy_half(p, &kv_map, slot, 0, 4, kSubTiles, ncopies, smem, nullptr, policy);
        __syncwarp();
        if (more) {  // scores of the next tile b, for the next pair
          issue_scores<false, 4, Rope::kRegisters>(s, qr, rope, q_lo, k_lo0 + kStage, bar_addr(full, kSubTiles),
                                                   par ^ 1);
          wgmma_wait<0>();
          fence_regs(s);
        }
      }
    }
    wgmma_wait<0>();
    fence_regs(o);

    // ---- row sums of both warpgroups, then the rows: final output (one split) or the partial state (several) ----
    publish_row_sums(st, red, wg, lane);
    named_bar_sync(kBarConsumers, kConsumerThreads);
    write_rows(p, w, st, o, red, q_s, staged, wg, lane);
    if (w.record && tid == 0) p.ws_record[int64_t(w.seq) * p.row_chunks + w.row0 / kRows] = w.rec;
    if (!w.direct && p.ws_merges != nullptr && tid == 0) {  // the combine kernel has a state to merge
      asm volatile("griddepcontrol.wait;\n" ::: "memory");  // after launch_decode's zeroing
      *p.ws_merges = 1;
    }
    g0 += npairs;
    prev_npairs = next_has_keys ? npairs : 0;
  }  // segments
  // The combine kernel (launched as a programmatic dependent) may start its prologue now; it waits for this grid's
  // completion before it reads any partial state.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

}  // namespace

size_t sm90_2wg_decode_smem_bytes() { return size_t(Smem2::total); }

cudaError_t set_sm90_2wg_decode_smem() {
  return cudaFuncSetAttribute(mla_decode_sm90_2wg_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              int(Smem2::total));
}

cudaError_t launch_sm90_2wg_decode(const DecodeKernelParams& p, const CUtensorMap& kv_map, const CUtensorMap& q_map,
                                   bool q_copied, cudaLaunchConfig_t cfg) {
  cfg.blockDim = dim3(kThreads2);
  cfg.dynamicSmemBytes = size_t(Smem2::total);
  return cudaLaunchKernelEx(&cfg, mla_decode_sm90_2wg_kernel, p, kv_map, q_map, q_copied);
}

}  // namespace mladcp::cuda_impl
