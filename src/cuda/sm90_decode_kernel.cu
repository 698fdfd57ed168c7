// Hopper (sm_90a) decode kernel of the "cuda" backend: 64 query rows per CTA (H·q_len rows packed, the rest
// zero), bf16 cache in pages of 16, 32 or a multiple of 64 keys, warp-specialized.
//
// Same contract and combine as the portable kernel (decode_kernel.cuh). Split plan: one CTA = one (sequence,
// chunk of 64 query rows, split of local keys); a single-split sequence writes out/lse directly, otherwise the
// CTA writes the normalized fp32 partial state for the combine kernel (a plan of two splits per sequence: the two
// CTAs, a cluster, merge their states in shared memory instead; sm90_pair_merge.cuh). Balanced schedule
// (decode_plan.h): one CTA = one (part, chunk of 64 query rows), running the pieces of its part one sequence after the
// other, each written directly or as the part's partial state of that sequence (slot 0 or 1) with a merge record (a
// plan of two or four parts per sequence runs in clusters: under the uniform cut they merge a sequence's pieces in
// shared memory, sm90_pair_merge.cuh).
//
// Threads: three warpgroups (384).
//   warpgroup 2, the producer: two threads (one per stage; fp8: one) read the block table and issue bulk tensor
//     copies (TMA) of 64-key × 64-dim sub-tiles into a two-stage ring; another copies the query rows (bf16 caches
//     whose query rows form one matrix; else the consumers load them); `setmaxnreg` gives its registers to the others.
//   warpgroups 0 and 1, the consumers (schedule: docs/cuda.md, "The Hopper kernel"): warpgroup w scores the tiles of
//     stage w (S = Q·Kᵀ, 36 × wgmma.m64n64k16 from shared memory) and owns output columns
//     [256w, 256w + 256) of every tile (O_w = O_w·α + P·V_w, 4 × wgmma.m64n256k16 per tile; its own
//     probabilities from registers, the other warpgroup's from shared memory, V read N-major from the
//     key tile, so keys are stored once and serve as K and V).
//
// Shared memory (every tile in the 128-byte-swizzle canonical layout, 1024-byte aligned):
//   q_s  [9 column blocks][64 rows][128 B]  query rows (64 dims per column block), loaded per piece of work;
//                                            after the last scores, the staged bf16 output (epilogue)
//   kv_s [2 stages][9][64 keys][128 B]       the ring: stage t % 2 holds tile t; once tile a's scores
//                                            are done, stage 0's column block 8 (rope dims, read only by
//                                            the scores) holds P_a for warpgroup 1
//   pb   [64 rows][128 B]                    P_b (bf16) for warpgroup 0
//   red  [6][64] fp32                        m_a, m_b by pair parity (a slot is rewritten two pairs
//                                            later); row sums of both warpgroups at the end
//   ok   [2 stages] u64                      key present, bit k for key k (written by the producer with the tile)
//   full[2][9], empty[2][2] mbarriers        sub-tile landed; stage half (column blocks 0-3 / 4-8)
//                                            released by both consumers
//   seg  SegmentState                        the consumers' current and next piece of work (balanced
//                                            schedule: several sequences per CTA)
//   q_full[9], q_empty mbarriers             a copied query block landed; q_s released by the consumers
//   pair[3] mbarriers                        pair merge: the other CTA's ring free, its state landed, ours received
// Byte (r, chunk c) of a [9][64][128 B] tile: (c / 8) · 8192 + r · 128 + ((c % 8) ^ (r % 8)) · 16, the
// layout the copy engine writes with CU_TENSOR_MAP_SWIZZLE_128B.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>

#include "core/lse_math.h"
#include "cuda/decode_kernel.cuh"
#include "cuda/f16_scaling.h"
#include "cuda/sm90_consumer.cuh"
#include "cuda/sm90_decode.h"
#include "cuda/sm90_decode_ring.cuh"
#include "cuda/sm90_merge.cuh"
#include "cuda/sm90_pair_merge.cuh"
#include "cuda/sm90_ptx.cuh"

namespace mladcp::cuda_impl {
namespace {

using namespace sm90;
using namespace sm90_ring;
using namespace sm90_consumer;

static_assert(sm90_merge::MergeSmem::total <= Smem::pb && sm90_merge::kBarrierBytes <= kBlockBytes,
              "the fused merge's slots and table fit in q_s and the ring, its mbarriers in P_b's buffer");

// The consumers' segments in shared memory (one thread advances them; live registers stay free for the
// pipeline): the cursor and the current and next segment, by parity.
struct SegmentState {
  Segments segs;
  CtaWork w[2];
  int more[2];
  int njobs;  // fused merge: the merges this CTA owes (its states that arrived last)
  sm90_merge::MergeJob jobs[2];
};
static_assert(sizeof(SegmentState) <= 256, "Smem::seg");

// kFp8: an fp8-e4m3 cache (kv_map over its bytes), converted in the ring by the producer warpgroup; else bf16.
// q_copied: the producer copies the query rows through q_map (bf16 caches whose query rows form one matrix); else
// the consumers load them. kCluster: 1, or the CTAs of a cluster that merge their states (2: the pair merge of a
// split plan or of a balanced plan's parts, 4: of a balanced plan's parts; p.pair_merge); kBalanced: the balanced
// schedule (p.parts > 0). Each plan has its own instantiation, so that the kernels of the other plans carry none of
// its code (a change to one plan's code then leaves the others' machine code as it was: ptxas schedules the whole
// kernel at once, and an edit anywhere in it moved the pair loops of every plan by 1-4%,
// docs/perf/gpu-sm90-uniform-cut-2026-12-07.md).
template <bool kFp8, int kCluster, bool kBalanced>
__global__ void __launch_bounds__(kThreads, 1)
    mla_decode_sm90_kernel(const DecodeKernelParams p, const __grid_constant__ CUtensorMap kv_map,
                           const __grid_constant__ CUtensorMap q_map, bool q_copied) {
  extern __shared__ __align__(1024) uint8_t smem[];
  const int tid = threadIdx.x, lane = tid & 31;
  const int wg = tid >> 7;
  if (tid == 0) MLADCP_TIMELINE(kStart);

  // The tensor maps' descriptors, fetched while the setup reads the sequence lengths (the first copies need them).
  if (tid == 2 * 128) asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&kv_map)) : "memory");
  if (tid == 2 * 128 + 32 && q_copied)
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&q_map)) : "memory");

  constexpr int kSchedule = kBalanced ? 1 : 0;  // the plan's schedule, a constant in this instantiation
  constexpr bool kPair = kCluster > 1;          // clusters of kCluster CTAs merge their states
  Segments segs;
  if (!sm90_segments::cta_segments<kRows, kSchedule, kCluster>(p, segs)) return;
#if MLADCP_SM90_TIMELINE
  // Experiments: a balanced plan's CTAs mapped chunk-major (part + parts · row chunk: a part's row chunks then run on
  // SMs far apart, not on the two SMs of one TPC); only the first row chunk runs.
  if (kCluster == 1 && segs.balanced && sm90_timeline::g_chunk_major) {
    segs.rc = int(blockIdx.x / p.parts);
    segs.part = int(blockIdx.x % p.parts);
  }
  if (segs.rc != 0 && sm90_timeline::g_chunk0_only) return;
#endif

  const uint32_t full = smem_addr(smem + Smem::full), empty = smem_addr(smem + Smem::empty);
  if (tid == 0) {
    for (int i = 0; i < 2 * kSubTiles; ++i) mbar_init(bar_addr(full, i), 1);
    for (int i = 0; i < 4; ++i) mbar_init(bar_addr(empty, i), 8);  // one arrival per consumer warp
    for (int i = 0; i < 4; ++i) mbar_init(smem_addr(smem + Smem::staged) + 8 * i, 1);
    for (int i = 0; i < kSubTiles; ++i) mbar_init(smem_addr(smem + Smem::q_full) + 8 * i, 1);
    mbar_init(smem_addr(smem + Smem::q_empty), 8);   // one arrival per consumer warp
    mbar_init(smem_addr(smem + Smem::merge_go), 1);  // fused merge: consumer thread 0 publishes the jobs
    if (kPair) sm90_pair_merge::init_barriers<kCluster>(smem);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#if MLADCP_SM90_TIMELINE
    sm90_timeline::trace_clear(Smem::trace);
#endif
  }
  // A balanced plan in clusters (kCluster parts per sequence) under the uniform cut: the pieces of a sequence are the
  // cluster's CTAs, which merge them (with the positional cut, states and records for the combine kernel).
  // With the positional cut, the CTAs take the plain balanced plan's parts and row chunks instead (row chunk +
  // row_chunks · part), so that a cluster holds the row chunks of a part, which read the same keys: 1.3-5.6% faster
  // than parts 2c and 2c + 1 of one row chunk (docs/perf/gpu-sm90-cluster-row-chunks-2026-12-07.md).
  bool pieces_paired = false;
  const int plain_part = int(blockIdx.x / p.row_chunks), plain_rc = int(blockIdx.x % p.row_chunks);
  if (segs.balanced)
    segs.cur = sm90_segments::balanced_start<kThreads, kPair>(
        p, segs.part, reinterpret_cast<int64_t*>(smem + Smem::red), kPair ? &pieces_paired : nullptr, plain_part);
  if (kPair && segs.balanced && !pieces_paired) {
    segs.part = plain_part;
    segs.rc = plain_rc;
  }
  __syncthreads();
  if (kPair) sm90_pair_merge::cluster_arrive_relaxed();  // waited for before the first remote access
  if (tid == 0) {
    MLADCP_TIMELINE(kSetup);
    MLADCP_TIMELINE_SET(kSm, sm90_timeline::smid());
  }

  if (wg == 2) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kFp8 ? kProducerRegsFp8 : kProducerRegs));
    if (kFp8 && tid >= 2 * 128 + 32) {
      convert_fp8(p, segs, smem, tid - (2 * 128 + 32));
    } else if (!kFp8 && q_copied && tid == 2 * 128 + 32) {
      copy_queries(p, &q_map, segs, smem);
    } else if (tid == 2 * 128 || (!kFp8 && tid == 2 * 128 + 64)) {
      // bf16: lane 0 of warps 8 and 10 copy stages 0 and 1; fp8: lane 0 of warp 8 copies both.
      // The stage is a template argument: a thread keeps only its own tiles' page ids live.
      if constexpr (kFp8)
        produce_pages<true, -1>(p, &kv_map, segs, smem);
      else if (tid == 2 * 128)
        produce_pages<false, 0>(p, &kv_map, segs, smem);
      else
        produce_pages<false, 1>(p, &kv_map, segs, smem);
      // Fused merge: this thread copies the states of the merges the CTA owes, once the consumers are done.
      if (tid == 2 * 128 && p.fused_merge) {
        const SegmentState* const seg = reinterpret_cast<const SegmentState*>(smem + Smem::seg);
        sm90_merge::copy_states(p, seg->jobs, &seg->njobs, smem, smem_addr(smem + Smem::pb),
                                smem_addr(smem + Smem::merge_go));
      }
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kFp8 ? kConsumerRegsFp8 : kConsumerRegs));

  uint8_t* const q_s = smem + Smem::q;
  uint8_t* const kv_s = smem + Smem::kv;
  float* const red = reinterpret_cast<float*>(smem + Smem::red);  // [6][64]: m_a, m_b (two each), l of WG0, WG1
  const uint64_t* const ok = reinterpret_cast<const uint64_t*>(smem + Smem::ok);
  const int wi = (tid >> 5) & 3;  // warp within the warpgroup: rows 16·wi .. 16·wi + 15
  const int tid_in_wg = tid & 127;

  const uint32_t kv_addr = smem_addr(kv_s);
  // Operand descriptors (low words; everything here is warp-uniform, and each warpgroup's branch below
  // adds only constants, so the descriptors stay in uniform registers).
  constexpr uint32_t kStage = kTileBytes >> 4;        // one stage in descriptor address units
  constexpr uint32_t kHalf = (4 * kBlockBytes) >> 4;  // value columns 256-511 of a stage
  const uint32_t q_lo = kmajor_lo(smem_addr(q_s));
  const uint32_t k_lo0 = kmajor_lo(kv_addr);                              // keys of stage 0
  const uint32_t p_lo0 = kmajor_lo(kv_addr + 8 * kBlockBytes);            // P_a over the rope block of stage 0
  const uint32_t pb_lo = kmajor_lo(smem_addr(smem + Smem::pb));           // P_b in its own buffer
  const uint32_t v_lo0 = nmajor_lo(kv_addr);                              // values of stage 0, columns 0-255
  float* const qscale_s = reinterpret_cast<float*>(smem + Smem::qscale);  // fp8: 2^-e of each query row

  // Segment by segment; g0 numbers the first pair of a segment across the CTA (the ring's phases). The
  // barrier after each step of the cursor also keeps q_s and red from being written again before both
  // warpgroups are past the last epilogue (its row sums read, its scores retired).
  SegmentState* const seg = reinterpret_cast<SegmentState*>(smem + Smem::seg);
  if (tid == 0) {
    seg->segs = segs;
    seg->njobs = 0;
  }
  int64_t g0 = 0;
  int q_loads = 0;  // segments with keys so far (the copied queries' phases)
  for (int k = 0;; ++k) {
    if (tid == 0) seg->more[k & 1] = seg->segs.template next<kSchedule>(p, seg->w[k & 1]);
    named_bar_sync(kBarConsumers, kConsumerThreads);
    if (!seg->more[k & 1]) break;
    const CtaWork& w = seg->w[k & 1];
    const int npairs = w.npairs, k_begin = w.k_begin;

    // ---- query rows → q_s (rows past the sequence's R rows are zero), unless the producer copies them ----
    if (!q_copied && npairs > 0) {
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
      cp_async_wait_all();
      if constexpr (kFp8) {
        named_bar_sync(kBarConsumers, kConsumerThreads);
        scale_queries_to_f16(q_s, qscale_s, tid);
      }
      fence_proxy_async();
      named_bar_sync(kBarConsumers, kConsumerThreads);
    }
    // bf16 output of a segment with keys, written directly, is staged in q_s at the end (see the epilogue).
    const bool staged = w.direct && !p.out_fp32 && npairs > 0;
    // Copied queries: the first scores wait for each block (this segment's phase), and the warps release q_s at
    // the start of the last pair (their last scores of the segment have retired), or after the staged output.
    const uint32_t q_full = q_copied ? smem_addr(smem + Smem::q_full) : 0u;
    const uint32_t q_parity = uint32_t(q_loads) & 1;
    if (npairs > 0) ++q_loads;
    if (tid == 0) {
      if (k == 0) MLADCP_TIMELINE(kPieceStart);
      if (k == 1) MLADCP_TIMELINE(kPiece2);
      MLADCP_TIMELINE_ADD(kPieces, 1);
    }
    auto release_queries = [&](int i) {
      if (q_copied && !staged && i + 1 == npairs) {
        __syncwarp();
        if (lane == 0) mbar_arrive(smem_addr(smem + Smem::q_empty));
      }
    };

    // The pair trace (timeline build): warpgroup w's events by its first thread.
#define MLADCP_PAIR_EVENT(event)                                    \
  do {                                                              \
    if (tid_in_wg == 0) MLADCP_TRACE(g0 + i, sm90_timeline::event); \
  } while (0)
    RowState st;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      st.rs[e] = 16 * wi + (lane >> 2) + 8 * e;
      const int grow = w.row0 + st.rs[e];
      st.nvis[e] =
          grow < p.rows_per_seq ? int(sharding::visible_local_keys(w.len, p.q_len, grow / p.num_heads, p.shard)) : 0;
      st.m[e] = -INFINITY;
      st.l[e] = 0.0f;
      st.scale[e] = kFp8 ? p.score_scale_log2 * qscale_s[st.rs[e]] : p.score_scale_log2;
    }

    // The tile whose last keys lie past the segment's end (rows [tail_valid, 64) to zero), or -1.
    const int tail_valid = (w.k_end - k_begin) % kTile;
    const int tail_tile = tail_valid ? w.ntiles - 1 : -1;

    // Accumulators are first written by the tensor cores (the first products overwrite them).
    float o[128];
    float s[32];
    uint32_t pr[16];
    uint32_t no_rope[16];  // unused: this kernel reads Q's rope block from shared memory

    if (wg == 0) {
      // ---- warpgroup 0: tiles a (stage 0), columns [0, 256) ----
      if (npairs > 0) {  // scores of the first tile a
        issue_scores<kFp8, 0>(s, no_rope, nullptr, q_lo, k_lo0, full, uint32_t(g0) & 1, q_full, q_parity);
        wgmma_wait<0>();
        fence_regs(s);
        if (tid == 0 && k == 0) MLADCP_TIMELINE(kScoresWg0);
        if (tid == 0 && k == 1) MLADCP_TIMELINE(kScores2);
      }
      for (int i = 0; i < npairs; ++i) {
        release_queries(i);
        const bool more = i + 1 < npairs;
        const uint32_t par = uint32_t(g0 + i) & 1;  // the pair's ring phase
        float* const red_m = red + 128 * par;       // m_a and m_b of this pair: slots of its parity
        float mx[2], m_a[2], alpha[2], m_b[2], beta[2];
        MLADCP_PAIR_EVENT(kA0Start);
        __syncwarp();
        if (lane == 0) mbar_arrive(bar_addr(empty, 3));  // stage 1, columns 4-8: this warpgroup never reads them
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
        MLADCP_PAIR_EVENT(kA1MaPublished);
        // P_a = 2^(S_a − m_a); O_L = O_L·2^(m − m_a) + P_a·V_a,L (P_a from registers).
        exponentiate<kFp8>(s, pr, m_a, st.scale, st.l);
        if (2 * i == tail_tile) zero_tail_rows(kv_s, tail_valid, 0, wg, tid_in_wg);
        if (i > 0) rescale_rows(o, alpha);
        wgmma_fence();
        fence_regs(o);
        fence_regs(pr);
        issue_pv_regs<kFp8>(o, pr, v_lo0, i > 0);
        wgmma_commit();
        MLADCP_PAIR_EVENT(kA2PvIssued);
        // m_b from warpgroup 1; P_a·2^(m_a − m_b) over the rope block of stage 0 for warpgroup 1.
        named_bar_sync(kBarMb, kConsumerThreads);
        MLADCP_PAIR_EVENT(kA3MbReceived);
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          m_b[e] = red_m[64 + st.rs[e]];
          beta[e] = rescale_factor(m_a[e], m_b[e]);
          st.l[e] *= beta[e];
          st.m[e] = m_b[e];
        }
        store_p<kFp8>(kv_s + 8 * kBlockBytes, s, beta, st, lane);
        fence_proxy_async();
        named_bar_arrive(kBarPa, kConsumerThreads);
        MLADCP_PAIR_EVENT(kA4PaStored);
        __syncwarp();
        if (lane == 0) mbar_arrive(bar_addr(empty, 1));  // stage 0, columns 4-8: only warpgroup 1 reads them now
        wgmma_wait<0>();
        fence_regs(o);
        MLADCP_PAIR_EVENT(kA5PvRetired);
        __syncwarp();
        if (lane == 0) mbar_arrive(bar_addr(empty, 0));  // stage 0, columns 0-3: P_a·V_a,L retired
        // O_L ·= 2^(m_a − m_b), O_L += P_b·V_b,L (P_b from its own buffer, at m_b).
        rescale_rows(o, beta);
        named_bar_sync(kBarPb, kConsumerThreads);
        MLADCP_PAIR_EVENT(kA6PbReceived);
        if (2 * i + 1 == tail_tile) zero_tail_rows(kv_s + kTileBytes, tail_valid, 0, wg, tid_in_wg);
        wgmma_fence();
        fence_regs(o);
        issue_pv_smem<kFp8>(o, pb_lo, v_lo0 + kStage, true);
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(o);
        __syncwarp();
        if (lane == 0) mbar_arrive(bar_addr(empty, 2));  // stage 1, columns 0-3: P_b·V_b,L retired
        MLADCP_PAIR_EVENT(kA7Pv2Retired);
        if (more) {  // scores of the next tile a, for the next pair
          issue_scores<kFp8, 0>(s, no_rope, nullptr, q_lo, k_lo0, full, par ^ 1, 0, 0, tid_in_wg == 0 ? g0 + i : -1,
                                sm90_timeline::kA8Block0);
          wgmma_wait<0>();
          fence_regs(s);
          MLADCP_PAIR_EVENT(kA17Scores);
        }
      }
    } else {
      // ---- warpgroup 1: tiles b (stage 1), columns [256, 512) ----
      if (npairs > 0) {  // scores of the first tile b
        issue_scores<kFp8, 4>(s, no_rope, nullptr, q_lo, k_lo0 + kStage, bar_addr(full, kSubTiles), uint32_t(g0) & 1,
                              q_full, q_parity);
        wgmma_wait<0>();
        fence_regs(s);
        if (tid == 128 && k == 0) MLADCP_TIMELINE(kScoresWg1);
      }
      for (int i = 0; i < npairs; ++i) {
        release_queries(i);
        const bool more = i + 1 < npairs;
        const uint32_t par = uint32_t(g0 + i) & 1;  // the pair's ring phase
        float* const red_m = red + 128 * par;
        float mx[2], m_a[2], alpha[2], m_b[2], one[2] = {1.0f, 1.0f};
        MLADCP_PAIR_EVENT(kB0Start);
        // m_b = max(m_a, rowmax S_b), published; O_R's scale moves once per pair, from m to m_b.
        mask_scores(s, mx, ok + 1, k_begin + (2 * i + 1) * kTile, st, lane);
        __syncwarp();
        if (lane == 0) {  // columns 0-3 of both stages: this warpgroup reads them no more in this pair
          mbar_arrive(bar_addr(empty, 0));
          mbar_arrive(bar_addr(empty, 2));
        }
        named_bar_sync(kBarMa, kConsumerThreads);
        MLADCP_PAIR_EVENT(kB1MaReceived);
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
        exponentiate<kFp8>(s, pr, m_b, st.scale, st.l);
        if (2 * i + 1 == tail_tile) zero_tail_rows(kv_s + kTileBytes, tail_valid, 4, wg, tid_in_wg);
        if (i > 0) rescale_rows(o, alpha);
        wgmma_fence();
        fence_regs(o);
        fence_regs(pr);
        issue_pv_regs<kFp8>(o, pr, v_lo0 + kStage + kHalf, i > 0);
        wgmma_commit();
        MLADCP_PAIR_EVENT(kB2PvIssued);
        store_p<kFp8>(smem + Smem::pb, s, one, st, lane);
        fence_proxy_async();
        MLADCP_PAIR_EVENT(kB3PbStored);
        // O_R += P_a·V_a,R once warpgroup 0 has stored P_a at m_b.
        named_bar_sync(kBarPa, kConsumerThreads);
        MLADCP_PAIR_EVENT(kB4PaReceived);
        if (2 * i == tail_tile) zero_tail_rows(kv_s, tail_valid, 4, wg, tid_in_wg);
        wgmma_fence();
        issue_pv_smem<kFp8>(o, p_lo0, v_lo0 + kHalf, true);
        wgmma_commit();
        // P_b handed over only now: warpgroup 0's P_b·V_b,L queues behind P_a·V_a,R, so stage 0's columns 4-8 are
        // released before stage 1's columns 0-3 and the next tile a's copies get a product's time more.
        named_bar_arrive(kBarPb, kConsumerThreads);
        MLADCP_PAIR_EVENT(kB5Pv2Issued);
        wgmma_wait<1>();
        MLADCP_PAIR_EVENT(kB6PvRetired);
        __syncwarp();
        if (lane == 0) mbar_arrive(bar_addr(empty, 3));  // stage 1, columns 4-8: P_b·V_b,R retired
        wgmma_wait<0>();
        fence_regs(o);
        MLADCP_PAIR_EVENT(kB7Pv2Retired);
        __syncwarp();
        if (lane == 0) mbar_arrive(bar_addr(empty, 1));  // stage 0, columns 4-8: P_a·V_a,R retired
        if (more) {                                      // scores of the next tile b, for the next pair
          issue_scores<kFp8, 4>(s, no_rope, nullptr, q_lo, k_lo0 + kStage, bar_addr(full, kSubTiles), par ^ 1, 0, 0,
                                tid_in_wg == 0 ? g0 + i : -1, sm90_timeline::kB8Block4);
          wgmma_wait<0>();
          fence_regs(s);
          MLADCP_PAIR_EVENT(kB17Scores);
        }
      }
    }
#undef MLADCP_PAIR_EVENT
    wgmma_wait<0>();
    fence_regs(o);
    if (tid == 0) MLADCP_TIMELINE(kLoopWg0);
    if (tid == 128) MLADCP_TIMELINE(kLoopWg1);

    // ---- row sums of both warpgroups, then the rows: final output (one split) or the partial state (several) ----
    publish_row_sums(st, red, wg, lane);
    named_bar_sync(kBarConsumers, kConsumerThreads);
    if (tid == 0) MLADCP_TIMELINE(kRowSums);
    const bool direct = w.direct;
    // The rows' state goes to the other CTAs of the cluster (a split plan's two splits; the uniform cut's pieces of a
    // sequence of kCluster pieces), else to the workspace where not direct (the positional cut; a sequence of fewer
    // pieces in clusters of four).
    const bool in_cluster = kPair && !direct && (!kBalanced || (pieces_paired && w.states == kCluster));
    const bool to_workspace = !direct && !(kBalanced && in_cluster);
    if constexpr (kCluster == 4) {
      if (in_cluster)
        sm90_pair_merge::merge_quad(p, w, st, o, red, smem, wg, lane);
      else
        write_rows(p, w, st, o, red, q_s, staged, wg, lane);
    } else if constexpr (kPair) {
      if (in_cluster)
        sm90_pair_merge::merge_pair(p, w, st, o, red, smem, wg, lane);
      else
        write_rows(p, w, st, o, red, q_s, staged, wg, lane);
    } else {
      write_rows(p, w, st, o, red, q_s, staged, wg, lane);
    }
    if (staged && q_copied) {  // q_s free again: the producer may copy the next segment's queries
      __syncwarp();
      if (lane == 0) mbar_arrive(smem_addr(smem + Smem::q_empty));
    }
    if (w.record && !(kBalanced && in_cluster) && tid == 0)
      p.ws_record[int64_t(w.seq) * p.row_chunks + w.row0 / kRows] = w.rec;
    if (to_workspace && p.ws_merges != nullptr && tid == 0) {  // the combine kernel has a state to merge
      asm volatile("griddepcontrol.wait;\n" ::: "memory");     // after launch_decode's zeroing
      *p.ws_merges = 1;
    }
    // Fused merge (sm90_merge.cuh): the CTA whose state of the sequence's rows arrives last merges them all, after
    // its last segment (a CTA of the balanced schedule owes at most two: its first and last pieces).
    if (to_workspace && p.fused_merge) {
      __threadfence();
      named_bar_sync(kBarConsumers, kConsumerThreads);
      if (tid == 0 && sm90_merge::arrive(p, w)) seg->jobs[seg->njobs++] = {w.seq, w.row0, w.states};
    }
    if (tid == 0) MLADCP_TIMELINE(kWrittenWg0);
    if (tid == 0 && k == 0) MLADCP_TIMELINE(kWrittenFirst);
    if (tid == 128) MLADCP_TIMELINE(kWrittenWg1);
    g0 += npairs;
  }  // segments
  // The merges owed, once no product is left to issue (the break above follows a barrier: the jobs are visible).
  if (tid == 0 && seg->njobs > 0) MLADCP_TIMELINE(kMergeStart);
  if (seg->njobs > 0)
    sm90_merge::merge_jobs(p, seg->jobs, seg->njobs, smem, smem_addr(smem + Smem::pb), smem_addr(smem + Smem::merge_go),
                           tid, kBarConsumers, kConsumerThreads);
  else if (p.fused_merge && tid == 0)
    mbar_arrive(smem_addr(smem + Smem::merge_go));  // nothing to copy: the copying thread may exit
  if (tid == 0 && seg->njobs > 0) MLADCP_TIMELINE(kMergeEnd);
#if MLADCP_SM90_TIMELINE
  named_bar_sync(kBarConsumers, kConsumerThreads);  // every consumer event of the window is in
  if (tid == 0) sm90_timeline::trace_flush(Smem::trace);
#endif
  // The combine kernel (launched as a programmatic dependent) may start its prologue now; it waits for this grid's
  // completion before it reads any partial state. (Triggered at the kernel's start instead, calls ran
  // up to 13% longer: docs/perf/gpu-sm90-combine-2026-12-02.md.)
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

// cuTensorMapEncodeTiled from the driver, without linking libcuda.
PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      f = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

}  // namespace

#if MLADCP_SM90_TIMELINE
namespace {
// A device variable of this translation unit, all zeros.
template <class T>
cudaError_t zero_symbol(const T& symbol) {
  void* a = nullptr;
  const cudaError_t e = cudaGetSymbolAddress(&a, symbol);
  return e != cudaSuccess ? e : cudaMemset(a, 0, sizeof(T));
}
// An experiment's switch (a device int of this translation unit) set to 1 or 0.
cudaError_t set_switch(const int& symbol, bool on) {
  const int v = on ? 1 : 0;
  return cudaMemcpyToSymbol(symbol, &v, sizeof(v));
}
}  // namespace
cudaError_t sm90_timeline_reset() { return zero_symbol(sm90_timeline::g_points); }
cudaError_t sm90_timeline_read(uint64_t* points) {
  return cudaMemcpyFromSymbol(points, sm90_timeline::g_points, sizeof(sm90_timeline::g_points));
}
cudaError_t sm90_chunk0_only(bool on) { return set_switch(sm90_timeline::g_chunk0_only, on); }
cudaError_t sm90_chunk_major(bool on) { return set_switch(sm90_timeline::g_chunk_major, on); }
cudaError_t sm90_skip_empty_writes(bool on) { return set_switch(sm90_timeline::g_skip_empty_writes, on); }
cudaError_t sm90_trace_reset() { return zero_symbol(sm90_timeline::g_trace); }
cudaError_t sm90_trace_read(uint32_t* events) {
  return cudaMemcpyFromSymbol(events, sm90_timeline::g_trace, sizeof(sm90_timeline::g_trace));
}
#endif

bool sm90_decode_block_size_ok(int block_size) {
  return block_size == 16 || block_size == 32 || (block_size >= 64 && block_size % 64 == 0);
}

size_t sm90_decode_smem_bytes() { return size_t(Smem::total); }

cudaError_t set_sm90_decode_smem() {
  if (!encode_fn()) return cudaErrorNotSupported;
  for (const auto kernel : {mla_decode_sm90_kernel<false, 1, false>, mla_decode_sm90_kernel<false, 2, false>,
                            mla_decode_sm90_kernel<false, 1, true>, mla_decode_sm90_kernel<false, 2, true>,
                            mla_decode_sm90_kernel<false, 4, true>, mla_decode_sm90_kernel<true, 1, false>,
                            mla_decode_sm90_kernel<true, 2, false>, mla_decode_sm90_kernel<true, 1, true>,
                            mla_decode_sm90_kernel<true, 2, true>, mla_decode_sm90_kernel<true, 4, true>}) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Smem::total));
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

int64_t sm90_cluster_ctas(int cluster) {
  if (cluster != 2 && cluster != 4) return 0;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(cluster));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = size_t(Smem::total);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim = {unsigned(cluster), 1, 1};
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int64_t fewest = -1;
  const auto pairs = {mla_decode_sm90_kernel<false, 2, false>, mla_decode_sm90_kernel<false, 2, true>,
                      mla_decode_sm90_kernel<true, 2, false>, mla_decode_sm90_kernel<true, 2, true>};
  const auto quads = {mla_decode_sm90_kernel<false, 4, true>, mla_decode_sm90_kernel<true, 4, true>};
  for (const auto kernel : cluster == 2 ? pairs : quads) {
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess || clusters < 1) return 0;
    fewest = fewest < 0 || clusters < fewest ? clusters : fewest;
  }
  return int64_t(cluster) * fewest;
}

cudaError_t launch_sm90_decode(const DecodeKernelParams& p, bool fp8, int64_t grid, cudaStream_t stream) {
  // The paged cache as a 3-D tensor [num_blocks][block_size][576] with the caller's strides; one box = 64 dims ×
  // min(64, block_size) keys of one page: bf16 written 128-byte swizzled (a ring block), fp8 unswizzled
  // ([keys][64 B], the converters' input).
  CUtensorMap map;
  const cuuint64_t elem = fp8 ? 1 : 2;
  const cuuint64_t dims[3] = {cuuint64_t(kQkDim), cuuint64_t(p.block_size), cuuint64_t(p.num_blocks)};
  const cuuint64_t strides[2] = {cuuint64_t(p.kv_stride_token) * elem, cuuint64_t(p.kv_stride_block) * elem};
  const cuuint32_t box[3] = {64, cuuint32_t(p.block_size < kTile ? p.block_size : kTile), 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  // L2 fills of 256 bytes where two row chunks read each key (the second finds the whole 256 bytes), of 128 where
  // one CTA reads it once (16-64 heads: up to 3.5% faster; 128 heads 0.3-1% slower with 128:
  // docs/perf/gpu-sm90-l2-promotion-2026-12-02.md).
  const CUtensorMapL2promotion promotion =
      p.row_chunks > 1 ? CU_TENSOR_MAP_L2_PROMOTION_L2_256B : CU_TENSOR_MAP_L2_PROMOTION_L2_128B;
  const CUresult r = encode_fn()(
      &map, fp8 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<uint8_t*>(p.kv), dims,
      strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      fp8 ? CU_TENSOR_MAP_SWIZZLE_NONE : CU_TENSOR_MAP_SWIZZLE_128B, promotion, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return cudaErrorInvalidValue;
  // The query rows as one [tokens · H][576] matrix (one head group, tokens H rows apart), boxes of 64 dims × 64
  // rows written 128-byte swizzled: the producer copies them (bf16 caches; the fp8 path rescales them per row).
  CUtensorMap q_map;
  std::memset(&q_map, 0, sizeof(q_map));
  const bool q_copied = p.copy_queries && !fp8 && p.head_group_size == p.num_heads &&
                        p.q_stride_token == int64_t(p.num_heads) * p.q_stride_head && p.q_stride_head >= kQkDim;
  if (q_copied) {
    const cuuint64_t q_dims[2] = {cuuint64_t(kQkDim), cuuint64_t(int64_t(p.num_seqs) * p.q_len * p.num_heads)};
    const cuuint64_t q_strides[1] = {cuuint64_t(p.q_stride_head) * 2};
    const cuuint32_t q_box[2] = {64, cuuint32_t(p.rows_per_seq < kRows ? p.rows_per_seq : kRows)};
    const cuuint32_t q_elem_strides[2] = {1, 1};
    if (encode_fn()(&q_map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<uint16_t*>(p.q), q_dims, q_strides, q_box,
                    q_elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
      return cudaErrorInvalidValue;
  }
  // Fused merge, or a balanced plan's merge flag: a programmatic dependent of the kernel that zeroes the arrival
  // counters or the flag (decode_launch.cu).
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(grid));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = size_t(Smem::total);
  cfg.stream = stream;
  // Pair merge: clusters of the two split CTAs of a (sequence, row chunk) (sm90_pair_merge.cuh).
  cudaLaunchAttribute attr[2];
  cfg.attrs = attr;
  if (p.fused_merge || p.ws_merges != nullptr) {
    attr[cfg.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[cfg.numAttrs++].val.programmaticStreamSerializationAllowed = 1;
  }
  // Clusters: a split plan's pairs, or a balanced plan's cluster_parts parts (2 or 4).
  const int cluster = !p.pair_merge ? 1 : (p.parts > 0 ? p.cluster_parts : 2);
  if (cluster != 1 && cluster != 2 && cluster != 4) return cudaErrorInvalidValue;
  if (cluster > 1) {
    attr[cfg.numAttrs].id = cudaLaunchAttributeClusterDimension;
    attr[cfg.numAttrs++].val.clusterDim = {unsigned(cluster), 1, 1};
  }
  // The plan's instantiation (fp8 caches: the consumers load the queries).
  auto launch = [&](auto bf16_kernel, auto fp8_kernel) {
    return fp8 ? cudaLaunchKernelEx(&cfg, fp8_kernel, p, map, q_map, false)
               : cudaLaunchKernelEx(&cfg, bf16_kernel, p, map, q_map, q_copied);
  };
  const bool balanced = p.parts > 0;
  if (cluster == 4) return launch(mla_decode_sm90_kernel<false, 4, true>, mla_decode_sm90_kernel<true, 4, true>);
  if (cluster == 2 && balanced)
    return launch(mla_decode_sm90_kernel<false, 2, true>, mla_decode_sm90_kernel<true, 2, true>);
  if (cluster == 2) return launch(mla_decode_sm90_kernel<false, 2, false>, mla_decode_sm90_kernel<true, 2, false>);
  if (balanced) return launch(mla_decode_sm90_kernel<false, 1, true>, mla_decode_sm90_kernel<true, 1, true>);
  return launch(mla_decode_sm90_kernel<false, 1, false>, mla_decode_sm90_kernel<true, 1, false>);
}

}  // namespace mladcp::cuda_impl
