// The fused merge of the Hopper decode kernel (sm90_decode_kernel.cu): the CTA whose partial state of a (sequence,
// row chunk) arrives last merges all of that sequence's states for its 64 rows, so no combine kernel runs after the
// split kernel (decode_plan.h, kFusedMaxStates). The arithmetic is the combine kernel's, bit for bit (the weights
// from warp_combiner, decode_kernel.cuh; lse::weighted; a row's states summed in the combine kernel's order, each
// product and sum rounded separately): the result depends only on the row's states, never on which CTA arrived
// last, nor on whether the batch's plan merges in the split kernel or in the combine kernel (batch invariance,
// tested bit for bit on the same plan). Taken only with CudaBackendOptions::fused_merge: still slower than the
// combine kernel where it merges (docs/perf/gpu-sm90-fused-merge-2026-12-02.md).
//
// Protocol, per CTA with a partial state (consumer threads):
//   1. every thread writes its part of the state (the balanced schedule's record first), then __threadfence(); a
//      barrier;
//   2. thread 0 waits for the counters' zeroing kernel (griddepcontrol.wait: the split kernel is its programmatic
//      dependent), adds one to the (sequence, chunk) counter, and fences; the CTA that brings it to the state count
//      owes the merge and files it (MergeJob);
//   3. after the CTA's last segment (the next top-of-loop barrier publishes the jobs), thread 0 copies the states
//      8 rows at a time into the shared memory the pipeline no longer needs (bulk copies, 12 in flight), and each
//      consumer warp adds its row of every 8 from there (merge_jobs).
// Included by sm90_decode_kernel.cu only (sm_90a).
#pragma once

#include <cstdint>

#include "core/lse_math.h"
#include "cuda/decode_kernel.cuh"
#include "cuda/sm90_decode_ring.cuh"

namespace mladcp::cuda_impl::sm90_merge {

using sm90_ring::CtaWork;
using sm90_ring::kRows;
using namespace sm90;

// A merge this CTA owes: the (sequence, row chunk) whose last state it wrote, and the sequence's state count.
struct MergeJob {
  int seq, row0, states;
};
constexpr int kConsumerThreadsMerge = 256;  // the threads that merge (the consumer warpgroups)

// Whether this CTA's state of w's (sequence, row chunk) is the last to arrive (thread 0; every thread has written
// its part and fenced, and the CTA has met at a barrier since).
__device__ __forceinline__ bool arrive(const DecodeKernelParams& p, const CtaWork& w) {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  int* const counter = p.ws_counter + int64_t(w.seq) * p.row_chunks + w.row0 / kRows;
  const int before = atomicAdd(counter, 1);
  __threadfence();
  return before == w.states - 1;
}

// The row-block index of state k of the job's sequence in the workspace (rows [index · R, + R)): the map of the
// combine kernel's row_states (decode_launch.cu) for a whole chunk. Calling row_states here instead (it also
// recomputes the state count) put spills into this kernel's pair loops.
struct StateBlocks {
  int64_t first = 0, step = 1, slot0 = 0;
  __device__ int64_t operator()(int k) const { return first + k * step + (k == 0 ? slot0 : 0); }
};
__device__ __forceinline__ StateBlocks state_blocks(const DecodeKernelParams& p, const MergeJob& w) {
  StateBlocks b;
  if (p.parts > 0) {
    const int4 r = __ldcg(reinterpret_cast<const int4*>(p.ws_record + int64_t(w.seq) * p.row_chunks + w.row0 / kRows));
    b.first = int64_t(r.x) * 2;  // first_part, two slots per part
    b.step = 2;
    b.slot0 = r.z;  // slot in the first part
  } else {
    b.first = int64_t(w.seq) * p.max_splits;
  }
  return b;
}

// The merge's shared memory, free after the CTA's last segment (offsets from the start of q_s, which the ring
// follows): kSlots slots of 8 rows of one state (16 KiB), each filled by one bulk copy that completes on its `full`
// mbarrier and released by the 8 consumer warps on its `empty` one; then a table of each row's first kTableStates
// LSEs, which become their weights, and each row's combiner (maximum and sum).
constexpr int kRowBytes = kLatentDim * 4;  // one row of a state: 512 fp32
constexpr int kSlotRows = 8, kSlotBytes = kSlotRows * kRowBytes, kSlots = 12;
constexpr int kTableStates = 32;
struct MergeSmem {
  static constexpr int table = kSlots * kSlotBytes;                      // float [2 jobs][kTableStates][kRows]
  static constexpr int combiner = table + 2 * kTableStates * kRows * 4;  // float2 [2 jobs][kRows]
  static constexpr int total = combiner + 2 * kRows * 8;
};
constexpr int kBarrierBytes = 2 * kSlots * 8;

// The units of a CTA's merges, in order: job, group of 8 rows, then the row's states in chains w = 0, 1, ... < 8,
// chain w taking states w, w + 8, ...: each chain is summed from +0 and the chains' sums are added in order (the
// combine kernel's arithmetic: a row of at most 8 states is summed in state order, a row of more takes the sums of
// its CTA's 8 warps, in warp order).
struct Cursor {
  int job = 0, group = 0, w = 0, k = 0;
  __device__ __forceinline__ void next(int n, int groups) {
    k += 8;
    if (k < n) return;
    k = ++w;
    if (w < min(8, n)) return;
    w = k = 0;
    if (++group < groups) return;
    group = 0;
    ++job;
  }
};

// Runs the CTA's merges (njobs of them, in shared memory) with the 256 consumer threads (ctid), after the CTA's last
// segment (no product in flight, the producer warps done); `smem`: the start of q_s, bars: kBarrierBytes there too.
// Thread 0 (the one that counted the arrivals: its acquire orders the other CTAs' state writes before its bulk
// copies, after a proxy fence) keeps kSlots units in flight. Warp wi merges rows wi, wi + 8, ... of each job, lane
// l its columns 4 l + 128 q (q < 4): 16-byte shared loads, 8-byte (bf16) or 16-byte (fp32) global stores, whole
// sectors. The code is small and its loops are not unrolled (each merging CTA runs it once).
__device__ __forceinline__ void merge_jobs(const DecodeKernelParams& p, const MergeJob* jobs_s, int njobs,
                                           uint8_t* smem, uint32_t bars, int ctid, int bar_id, int bar_threads) {
  const int lane = ctid & 31, wi = ctid >> 5;
  const MergeJob j0 = jobs_s[0], j1 = njobs > 1 ? jobs_s[1] : MergeJob{0, 0, 0};
  const StateBlocks b0 = state_blocks(p, j0), b1 = njobs > 1 ? state_blocks(p, j1) : StateBlocks{};
  const int R = p.rows_per_seq;
  const int rows0 = min(kRows, R - j0.row0), rows1 = njobs > 1 ? min(kRows, R - j1.row0) : 0;
  const int groups0 = (rows0 + kSlotRows - 1) / kSlotRows, groups1 = (rows1 + kSlotRows - 1) / kSlotRows;
  // (Selects, not arrays indexed at run time: those would live in local memory.)
  auto job_of = [&](int job) { return job ? j1 : j0; };
  auto blocks_of = [&](int job) { return job ? b1 : b0; };
  auto lse_at = [&](int job, int k, int row) {
    const MergeJob j = job_of(job);
    return __ldcg(p.ws_lse + blocks_of(job)(k) * R + j.row0 + row);
  };
  float* const table = reinterpret_cast<float*>(smem + MergeSmem::table);
  float2* const combiner = reinterpret_cast<float2*>(smem + MergeSmem::combiner);
  const uint32_t full = bars, empty = bars + kSlots * 8;

  if (ctid == 0) {
    for (int b = 0; b < kSlots; ++b) {
      mbar_init(bar_addr(full, b), 1);
      mbar_init(bar_addr(empty, b), 8);  // one arrival per consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("fence.proxy.async.global;\n" ::: "memory");  // the states' generic writes before bulk reads
  }
  named_bar_sync(bar_id, bar_threads);
  const int total = groups0 * j0.states + groups1 * j1.states;
  const uint64_t policy = evict_first_policy();
  Cursor issued;  // thread 0: the next unit to copy
  auto issue = [&](int u) {
    const MergeJob j = job_of(issued.job);
    const int row = kSlotRows * issued.group;
    const uint32_t bytes = uint32_t(min(kSlotRows, R - j.row0 - row)) * kRowBytes;
    const uint32_t bar = bar_addr(full, u % kSlots);
    mbar_arrive_expect_tx(bar, bytes);
    bulk_copy(smem_addr(smem + (u % kSlots) * kSlotBytes),
              p.ws_o + (blocks_of(issued.job)(issued.k) * R + j.row0 + row) * kLatentDim, bytes, bar, policy);
    issued.next(j.states, issued.job ? groups1 : groups0);
  };
  if (ctid == 0) {
#pragma unroll 1
    for (int u = 0; u < kSlots && u < total; ++u) issue(u);
  }

  // The table's LSEs, every load in flight at once (entry e: job e / (32 · 64), state e / 64 % 32, row e % 64).
#pragma unroll 4
  for (int e = ctid; e < 2 * kTableStates * kRows; e += kConsumerThreadsMerge) {
    const int job = e / (kTableStates * kRows), k = e / kRows % kTableStates, row = e % kRows;
    if (job < njobs && k < job_of(job).states && row < (job ? rows1 : rows0)) table[e] = lse_at(job, k, row);
  }
  named_bar_sync(bar_id, bar_threads);
  if (ctid == 0) MLADCP_TIMELINE(kMergeTable);
    // Each warp's rows: their combiners, and the table's LSEs become weights (only this warp reads its rows).
#pragma unroll 1
  for (int job = 0; job < njobs; ++job) {
    const int n = job_of(job).states;
#pragma unroll 1
    for (int row = wi; row < (job ? rows1 : rows0); row += 8) {
      float* const t = table + job * kTableStates * kRows + row;
      const lse::Combiner c =
          warp_combiner(n, [&](int k) { return k < kTableStates ? t[k * kRows] : lse_at(job, k, row); });
      if (lane < n) t[lane * kRows] = c.weight(t[lane * kRows]);
      if (lane == 0) combiner[job * kRows + row] = make_float2(c.max_l, c.sum);
    }
  }
  __syncwarp();
  if (ctid == 0) MLADCP_TIMELINE(kMergeWeights);

  float4 sum[4], chain[4];  // the row's sum of chains, and the current chain (columns 4 lane + 128 q)
  Cursor x;
#pragma unroll 1
  for (int u = 0; u < total; ++u) {
    const MergeJob j = job_of(x.job);
    const int row = kSlotRows * x.group + wi;
    const bool valid = row < (x.job ? rows1 : rows0);
    lse::Combiner c(LseBase::k2);
    const float2 cm = combiner[x.job * kRows + row];
    c.max_l = cm.x;
    c.sum = cm.y;
    const float wt = !valid               ? 0.0f
                     : x.k < kTableStates ? table[(x.job * kTableStates + x.k) * kRows + row]
                                          : c.weight(lse_at(x.job, x.k, row));
    if (x.k == x.w)
#pragma unroll
      for (int q = 0; q < 4; ++q) chain[q] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    mbar_wait(bar_addr(full, u % kSlots), uint32_t(u / kSlots) & 1);
    if (ctid == 0 && u == 0) MLADCP_TIMELINE(kMergeFirst);
    if (valid) {
      const float4* src = reinterpret_cast<const float4*>(smem + (u % kSlots) * kSlotBytes + wi * kRowBytes) + lane;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float4 v = src[32 * q];
        chain[q].x = __fadd_rn(chain[q].x, lse::weighted(wt, v.x));
        chain[q].y = __fadd_rn(chain[q].y, lse::weighted(wt, v.y));
        chain[q].z = __fadd_rn(chain[q].z, lse::weighted(wt, v.z));
        chain[q].w = __fadd_rn(chain[q].w, lse::weighted(wt, v.w));
      }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(bar_addr(empty, u % kSlots));  // the warp is done with the slot
    if (ctid == 0 && u + kSlots < total) {
      mbar_wait(bar_addr(empty, u % kSlots), uint32_t(u / kSlots) & 1);
      issue(u + kSlots);
    }
    const int n = j.states;
    if (x.k + 8 >= n) {  // the chain ends: into the row's sum
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        if (x.w == 0) {
          sum[q] = chain[q];
        } else {
          sum[q].x = __fadd_rn(sum[q].x, chain[q].x);
          sum[q].y = __fadd_rn(sum[q].y, chain[q].y);
          sum[q].z = __fadd_rn(sum[q].z, chain[q].z);
          sum[q].w = __fadd_rn(sum[q].w, chain[q].w);
        }
      }
      if (x.w + 1 == min(8, n) && valid) {  // the row's last chain: the merged row goes out
        const int grow = j.row0 + row;
        const int i = grow / p.num_heads, h = grow - i * p.num_heads;
        const int64_t t = int64_t(j.seq) * p.q_len + i;
        const int64_t ob = out_elem(p, t, h) + 4 * lane;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          if (p.out_fp32)
            *reinterpret_cast<float4*>(static_cast<float*>(p.out) + ob + 128 * q) = sum[q];
          else
            *reinterpret_cast<uint2*>(static_cast<uint16_t*>(p.out) + ob + 128 * q) =
                make_uint2(pack_bf16(sum[q].x, sum[q].y), pack_bf16(sum[q].z, sum[q].w));
        }
        if (p.lse && lane == 0)
          p.lse[lse_elem(p, t, h)] = lse::convert(c.merged_lse(), LseBase::k2, p.lse_base2 ? LseBase::k2 : LseBase::kE);
      }
    }
    x.next(n, x.job ? groups1 : groups0);
  }
}

}  // namespace mladcp::cuda_impl::sm90_merge
