// The pair merge of the Hopper decode kernel (sm90_decode_kernel.cu; decode_plan.h, DecodePlan::pair_merge): a split
// plan of two splits per sequence runs the two split CTAs of each (sequence, row chunk) as a cluster of 2 (CTA rank =
// split), and each CTA finishes the output columns of its own rank's warpgroup: CTA 0 columns 0-255, CTA 1 columns
// 256-511. In CTA r, warpgroup 1 − r sends its normalized partial state (64 rows × 256 fp32, and the rows' base-2 LSE)
// into the other CTA's ring by asynchronous remote stores (st.async, completing on that CTA's `full` barrier), and
// warpgroup r merges what it receives with its own columns and writes them. No state goes through global memory and
// no combine kernel runs after the split kernel (that kernel and its pass over the states cost 9-16 µs a call:
// docs/perf/gpu-sm90-combine-2026-12-02.md).
//
// The arithmetic is the combine kernel's, bit for bit: the states are the values the split kernel would write to the
// workspace (o · out_scale / l, m + log2 l), the weights come from an lse::Combiner of the two LSEs (the same max and
// sum as warp_combiner's for two states: (0 + e0) + e1 is e0 + e1), and the row is (+0 + w0·o0) + w1·o1, each product
// and sum rounded separately (add_weighted). So batch invariance holds whichever merge a plan takes (tested bit for
// bit against the combine kernel on the same plan).
//
// Protocol (the barriers of Smem::pair, each with one arrival): after both warpgroups' last products and the row sums
// (every copy into the ring has landed and been read), thread 0 arms its `full` barrier for the bytes it will receive
// and tells the other CTA its ring is free (a remote arrival on that CTA's `free`); the sending warpgroup waits on its
// own `free`, stores, then waits on `done` (the other CTA has received everything, so nothing this CTA sent is in
// flight when it exits); the receiving warpgroup waits on `full`, answers on the other CTA's `done`, and merges. The
// cluster barrier arrived at at the kernel's start and waited for here orders the barriers' initialization before
// any remote arrival. A CTA whose sequence has one split (the other split CTA exits at once) writes directly and
// touches no other CTA.
// A balanced plan of two parts per sequence runs the same merge on the uniform cut's two pieces of a sequence (parts 2c
// and 2c + 1 of a row chunk, one cluster); one of four parts, merge_quad below.
// Included by sm90_decode_kernel.cu only (sm_90a).
#pragma once

#include <cstdint>

#include "core/lse_math.h"
#include "cuda/decode_kernel.cuh"
#include "cuda/sm90_consumer.cuh"
#include "cuda/sm90_decode_ring.cuh"
#include "cuda/sm90_ptx.cuh"

namespace mladcp::cuda_impl::sm90_pair_merge {

using namespace sm90;
using sm90_consumer::RowState;
using sm90_ring::CtaWork;
using sm90_ring::Smem;

// The received state in the ring: [32 float4][128 threads] (float4 j of a thread: column pair j of its two rows, as
// the accumulator layout holds them; a warp's stores and loads cover 512 contiguous bytes), then the 64 rows' LSEs.
constexpr uint32_t kValueBytes = 32 * 128 * 16;
constexpr uint32_t kLseOffset = kValueBytes;
constexpr uint32_t kBytes = kValueBytes + 64 * 4;
static_assert(kBytes <= 2 * sm90_ring::kTileBytes, "the received state fits in the ring");
// Barriers at Smem::pair: the other CTA's ring is free, the state has landed here, the other CTA has received ours.
constexpr int kFree = 0, kFull = 1, kDone = 2;

__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// The shared::cluster address of this CTA's shared-memory address `addr` in CTA `rank` of the cluster.
__device__ __forceinline__ uint32_t map_rank(uint32_t addr, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
// All threads: arrive at the kernel's start (after the barriers' initialization), wait before the first remote access.
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void remote_arrive(uint32_t cluster_bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(cluster_bar) : "memory");
}
// mbar_wait (sm90_ptx.cuh) with acquire at cluster scope: the awaited arrivals and stores come from the other CTA.
__device__ __forceinline__ void wait_cluster(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void st_async(uint32_t cluster_addr, float4 v, uint32_t cluster_bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];\n" ::"r"(
                   cluster_addr),
               "r"(__float_as_uint(v.x)), "r"(__float_as_uint(v.y)), "r"(__float_as_uint(v.z)),
               "r"(__float_as_uint(v.w)), "r"(cluster_bar)
               : "memory");
}
__device__ __forceinline__ void st_async(uint32_t cluster_addr, float v, uint32_t cluster_bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(cluster_addr),
               "r"(__float_as_uint(v)), "r"(cluster_bar)
               : "memory");
}

// The barriers, by thread 0 at the kernel's start (before its fence.mbarrier_init), for clusters of kCluster CTAs: the
// ring free and the state received count one arrival per other CTA.
template <int kCluster = 2>
__device__ __forceinline__ void init_barriers(uint8_t* smem) {
  const uint32_t bars = smem_addr(smem + Smem::pair);
  mbar_init(bars + 8 * kFree, kCluster - 1);
  mbar_init(bars + 8 * kFull, 1);
  mbar_init(bars + 8 * kDone, kCluster - 1);
}

// Column group j (of 32) of both rows of this thread, normalized as the workspace state would be (a segment without
// tiles: zeros, O was never written).
__device__ __forceinline__ float4 normalized_columns(const float (&o)[128], const sm90_consumer::RowEnd (&end)[2],
                                                     bool none, int j) {
  if (none) return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  return make_float4(o[4 * j] * end[0].inv, o[4 * j + 1] * end[0].inv, o[4 * j + 2] * end[1].inv,
                     o[4 * j + 3] * end[1].inv);
}

// The epilogue of a pair-merge segment (w: one of the sequence's two splits), by all 256 consumer threads after the
// row sums' barrier: in place of write_rows.
__device__ __forceinline__ void merge_pair(const DecodeKernelParams& p, const CtaWork& w, const RowState& st,
                                           const float (&o)[128], const float* red, uint8_t* smem, int wg, int lane) {
  const int tid_in_wg = threadIdx.x & 127;
  const uint32_t rank = cluster_rank(), other = rank ^ 1u;
  const uint32_t bars = smem_addr(smem + Smem::pair);
  const uint32_t ring = smem_addr(smem + Smem::kv);
  cluster_wait();
  if (threadIdx.x == 0) {  // both warpgroups are past their last products: the ring is free
    fence_proxy_async();
    mbar_arrive_expect_tx(bar_addr(bars, kFull), kBytes);
    remote_arrive(map_rank(bar_addr(bars, kFree), other));
  }
  sm90_consumer::RowEnd end[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) end[hh] = sm90_consumer::row_end(p, st, red, hh);
  const bool none = w.ntiles == 0;
  auto mine = [&](int j) { return normalized_columns(o, end, none, j); };
  if (uint32_t(wg) != rank) {  // send: the other CTA finishes these columns
    wait_cluster(bar_addr(bars, kFree), 0);
    const uint32_t dst = map_rank(ring, other), full = map_rank(bar_addr(bars, kFull), other);
#pragma unroll
    for (int j = 0; j < 32; ++j) st_async(dst + uint32_t((j * 128 + tid_in_wg) * 16), mine(j), full);
    if ((lane & 3) == 0) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) st_async(dst + kLseOffset + uint32_t(st.rs[hh] * 4), end[hh].lse2, full);
    }
    wait_cluster(bar_addr(bars, kDone), 0);
    return;
  }
  // Receive and merge: state s is split s (CTA rank s).
  wait_cluster(bar_addr(bars, kFull), 0);
  if (tid_in_wg == 0) remote_arrive(map_rank(bar_addr(bars, kDone), other));
  const uint8_t* const in = smem + Smem::kv;
  const float* const in_lse = reinterpret_cast<const float*>(in + kLseOffset);
  float w0[2], w1[2];
  lse::Combiner comb[2] = {lse::Combiner(LseBase::k2), lse::Combiner(LseBase::k2)};
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const float l_mine = end[hh].lse2, l_other = in_lse[st.rs[hh]];
    const float l0 = rank == 0 ? l_mine : l_other, l1 = rank == 0 ? l_other : l_mine;
    comb[hh].observe_max(l0);
    comb[hh].observe_max(l1);
    comb[hh].accumulate(l0);
    comb[hh].accumulate(l1);
    w0[hh] = comb[hh].weight(l0);
    w1[hh] = comb[hh].weight(l1);
  }
  uint8_t* const q_s = smem + Smem::q;
  const bool staged = !p.out_fp32;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = st.rs[hh];
    const int grow = w.row0 + r;
    if (grow >= p.rows_per_seq) continue;
    auto val = [&](int j) {
      const float4 a = mine(j);
      const float4 b = *reinterpret_cast<const float4*>(in + (j * 128 + tid_in_wg) * 16);
      const float ax = hh == 0 ? a.x : a.z, ay = hh == 0 ? a.y : a.w;
      const float bx = hh == 0 ? b.x : b.z, by = hh == 0 ? b.y : b.w;
      const float x0 = rank == 0 ? ax : bx, y0 = rank == 0 ? ay : by;
      const float x1 = rank == 0 ? bx : ax, y1 = rank == 0 ? by : ay;
      float2 acc = make_float2(0.0f, 0.0f);
      acc.x = __fadd_rn(acc.x, lse::weighted(w0[hh], x0));
      acc.y = __fadd_rn(acc.y, lse::weighted(w0[hh], y0));
      acc.x = __fadd_rn(acc.x, lse::weighted(w1[hh], x1));
      acc.y = __fadd_rn(acc.y, lse::weighted(w1[hh], y1));
      return acc;
    };
    const int i = grow / p.num_heads, h = grow - i * p.num_heads;
    sm90_consumer::write_final_row(p, int64_t(w.seq) * p.q_len + i, h, r, staged, q_s, wg, lane, val);
    if (rank == 0 && (lane & 3) == 0) store_row_lse(p, w.seq, grow, comb[hh]);
  }
  if (staged) sm90_consumer::flush_staged_rows(p, w.seq, w.row0, q_s, wg, lane);
}

// ---- clusters of four: the uniform cut's four pieces of a sequence (a balanced plan of four parts per sequence) ----
//
// CTA r (cluster rank r = the piece) finishes output columns [128r, 128r + 128), a quarter held by its warpgroup r / 2.
// Warpgroup w of every CTA sends the quarters 2w and 2w + 1 of its columns (64 rows × 128 fp32 and the rows' base-2
// LSEs) to the CTAs that finish them, except its own CTA's; CTA r receives three such quarters into slot s (the
// sender's rank) of its ring. The barriers count one arrival per other CTA: thread 0 arms `full` for the three quarters
// and arrives on the other three CTAs' `free`; the receiving warpgroup answers on their `done` and merges the four
// states; every warpgroup waits on `done` (its stores landed in all three) before it leaves. The arithmetic is the
// combine kernel's for four states, bit for bit: warp_combiner's sum for states in lanes 0-3 is (e0 + e2) + (e1 + e3),
// the row (((+0 + w0·o0) + w1·o1) + w2·o2) + w3·o3.
constexpr int kQuarterPairs = 16;  // float4 column groups of a quarter per thread
constexpr uint32_t kQuarterValueBytes = kQuarterPairs * 128 * 16;
constexpr uint32_t kQuarterSlotBytes = kQuarterValueBytes + 64 * 4;
static_assert(4 * kQuarterSlotBytes <= 2 * sm90_ring::kTileBytes, "four received quarters fit in the ring");
constexpr int kQuarterPitch = 256 + 16;  // staged bf16 quarter rows in q_s (skewed by 16 bytes: no bank conflicts)
static_assert(sm90_ring::kRows * kQuarterPitch <= sm90_ring::kTileBytes, "the staged quarter fits in q_s");

// In place of write_rows for a segment whose sequence has four pieces, by all 256 consumer threads after the row
// sums' barrier.
__device__ __forceinline__ void merge_quad(const DecodeKernelParams& p, const CtaWork& w, const RowState& st,
                                           const float (&o)[128], const float* red, uint8_t* smem, int wg, int lane) {
  const int tid_in_wg = threadIdx.x & 127;
  const uint32_t rank = cluster_rank();
  const uint32_t bars = smem_addr(smem + Smem::pair);
  const uint32_t ring = smem_addr(smem + Smem::kv);
  cluster_wait();
  if (threadIdx.x == 0) {  // both warpgroups are past their last products: the ring is free
    fence_proxy_async();
    mbar_arrive_expect_tx(bar_addr(bars, kFull), 3 * kQuarterSlotBytes);
    for (uint32_t c = 0; c < 4; ++c)
      if (c != rank) remote_arrive(map_rank(bar_addr(bars, kFree), c));
  }
  sm90_consumer::RowEnd end[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) end[hh] = sm90_consumer::row_end(p, st, red, hh);
  const bool none = w.ntiles == 0;
  auto mine = [&](int j) { return normalized_columns(o, end, none, j); };
  wait_cluster(bar_addr(bars, kFree), 0);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const uint32_t q = 2 * uint32_t(wg) + uint32_t(half);
    if (q == rank) continue;
    const uint32_t dst = map_rank(ring + rank * kQuarterSlotBytes, q), full = map_rank(bar_addr(bars, kFull), q);
#pragma unroll
    for (int j = 0; j < kQuarterPairs; ++j)
      st_async(dst + uint32_t((j * 128 + tid_in_wg) * 16), mine(kQuarterPairs * half + j), full);
    if ((lane & 3) == 0) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) st_async(dst + kQuarterValueBytes + uint32_t(st.rs[hh] * 4), end[hh].lse2, full);
    }
  }
  if (uint32_t(wg) != rank / 2) {  // this warpgroup finishes no columns here
    wait_cluster(bar_addr(bars, kDone), 0);
    return;
  }
  wait_cluster(bar_addr(bars, kFull), 0);
  if (tid_in_wg == 0)
    for (uint32_t c = 0; c < 4; ++c)
      if (c != rank) remote_arrive(map_rank(bar_addr(bars, kDone), c));
  const uint8_t* const in = smem + Smem::kv;
  const bool upper = (rank & 1) != 0;  // this CTA's quarter: its warpgroup's column groups 16-31, else 0-15
  float wt[2][4];
  lse::Combiner comb[2] = {lse::Combiner(LseBase::k2), lse::Combiner(LseBase::k2)};
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    float l[4];
#pragma unroll
    for (int s = 0; s < 4; ++s)
      l[s] = uint32_t(s) == rank
                 ? end[hh].lse2
                 : reinterpret_cast<const float*>(in + s * kQuarterSlotBytes + kQuarterValueBytes)[st.rs[hh]];
#pragma unroll
    for (int s = 0; s < 4; ++s) comb[hh].observe_max(l[s]);
    lse::Combiner even = comb[hh], odd = comb[hh];  // warp_combiner's butterfly over lanes 0-3
    even.accumulate(l[0]);
    even.accumulate(l[2]);
    odd.accumulate(l[1]);
    odd.accumulate(l[3]);
    comb[hh].sum = even.sum + odd.sum;
#pragma unroll
    for (int s = 0; s < 4; ++s) wt[hh][s] = comb[hh].weight(l[s]);
  }
  uint8_t* const q_s = smem + Smem::q;
  const bool staged = !p.out_fp32;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = st.rs[hh];
    const int grow = w.row0 + r;
    if (grow >= p.rows_per_seq) continue;
    auto val = [&](int j) {
      float2 acc = make_float2(0.0f, 0.0f);
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const float4 v =
            uint32_t(s) == rank
                ? (upper ? mine(kQuarterPairs + j) : mine(j))  // constant indices: o stays in registers
                : *reinterpret_cast<const float4*>(in + s * kQuarterSlotBytes + (j * 128 + tid_in_wg) * 16);
        acc.x = __fadd_rn(acc.x, lse::weighted(wt[hh][s], hh == 0 ? v.x : v.z));
        acc.y = __fadd_rn(acc.y, lse::weighted(wt[hh][s], hh == 0 ? v.y : v.w));
      }
      return acc;
    };
    const int i = grow / p.num_heads, h = grow - i * p.num_heads;
    const int64_t col0 = out_elem(p, int64_t(w.seq) * p.q_len + i, h) + 128 * int64_t(rank) + 2 * (lane & 3);
    if (staged) {
      uint8_t* const row = q_s + r * kQuarterPitch;
#pragma unroll
      for (int j = 0; j < kQuarterPairs; ++j) {
        const float2 v = val(j);
        *reinterpret_cast<uint32_t*>(row + (j << 4) + 4 * (lane & 3)) = pack_bf16(v.x, v.y);
      }
    } else {
      float* const dst = static_cast<float*>(p.out) + col0;
#pragma unroll
      for (int j = 0; j < kQuarterPairs; ++j) *reinterpret_cast<float2*>(dst + j * 8) = val(j);
    }
    if (rank == 0 && (lane & 3) == 0) store_row_lse(p, w.seq, grow, comb[hh]);
  }
  if (staged) {  // this warp's 16 staged rows, one 256-byte bulk copy each
    fence_proxy_async();
    __syncwarp();
    if (lane < 16) {
      const int r = 16 * (int(threadIdx.x >> 5) & 3) + lane;
      const int grow = w.row0 + r;
      if (grow < p.rows_per_seq) {
        const int i = grow / p.num_heads, h = grow - i * p.num_heads;
        bulk_store(static_cast<uint16_t*>(p.out) + out_elem(p, int64_t(w.seq) * p.q_len + i, h) + 128 * rank,
                   smem_addr(q_s + r * kQuarterPitch), 256);
      }
      bulk_store_commit_and_wait_read();
    }
    __syncwarp();
  }
  wait_cluster(bar_addr(bars, kDone), 0);  // this warpgroup's own quarter has landed in the other CTA too
}

}  // namespace mladcp::cuda_impl::sm90_pair_merge
