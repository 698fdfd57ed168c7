// The fused merge of the Hopper decode kernel (sm90_decode_kernel.cu): the CTA whose partial state of a (sequence,
// row chunk) arrives last merges all of that sequence's states for its 64 rows, so no combine kernel runs after the
// split kernel (decode_plan.h, kFusedMaxStates). The arithmetic is the combine kernel's, bit for bit (the weights
// from warp_combiner, decode_kernel.cuh; lse::weighted; a row's states summed in the combine kernel's order, each
// product and sum rounded separately): the result depends only on the row's states, never on which CTA arrived
// last, nor on whether the batch's plan merges in the split kernel or in the combine kernel (batch invariance,
// tested bit for bit on the same plan). Taken only with CudaBackendOptions::fused_merge: it is still 4-15% slower
// than the combine kernel where it merges (the states reach a merging SM at ~23 GB/s, and only half the SMs merge;
// docs/perf/gpu-sm90-fused-merge-2026-12-02.md).
//
// Protocol, per CTA with a partial state (consumer threads):
//   1. every thread writes its part of the state (the balanced schedule's record first), then __threadfence(); a
//      barrier;
//   2. thread 0 waits for the counters' zeroing kernel (griddepcontrol.wait: the split kernel is its programmatic
//      dependent), adds one to the (sequence, chunk) counter, and fences; the CTA that brings it to the state count
//      owes the merge and files it (MergeJob);
//   3. after the CTA's last segment (the next top-of-loop barrier publishes the jobs), a producer thread copies the
//      states 8 rows at a time into the shared memory the pipeline no longer needs (copy_states: bulk copies, 12 in
//      flight), while each consumer warp computes its rows' weights, then adds its row of every 8 from there
//      (merge_jobs). (With consumer thread 0 issuing the copies between its own rows and each warp computing its
//      rows' combiners one at a time, the merge took ~20 µs.)
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
// mbarrier and released by the 8 consumer warps on its `empty` one; then the weights of each row's first
// kTableStates states, and each row's combiner (maximum and sum).
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

// A CTA's merge jobs (at most two) as both sides of the merge see them: states, rows, groups of 8 rows, units.
struct Jobs {
  MergeJob j0, j1;
  StateBlocks b0, b1;
  int rows0 = 0, rows1 = 0, groups0 = 0, groups1 = 0, total = 0;
  // (Selects, not arrays indexed at run time: those would live in local memory.)
  __device__ MergeJob job(int i) const { return i ? j1 : j0; }
  __device__ StateBlocks blocks(int i) const { return i ? b1 : b0; }
  __device__ int rows(int i) const { return i ? rows1 : rows0; }
  __device__ int groups(int i) const { return i ? groups1 : groups0; }
  __device__ float lse(const DecodeKernelParams& p, int i, int k, int row) const {
    return __ldcg(p.ws_lse + blocks(i)(k) * p.rows_per_seq + job(i).row0 + row);
  }
};
__device__ __forceinline__ Jobs load_jobs(const DecodeKernelParams& p, const MergeJob* jobs_s, int njobs) {
  Jobs J;
  J.j0 = jobs_s[0];
  J.j1 = njobs > 1 ? jobs_s[1] : MergeJob{0, 0, 0};
  J.b0 = state_blocks(p, J.j0);
  if (njobs > 1) J.b1 = state_blocks(p, J.j1);
  J.rows0 = min(kRows, p.rows_per_seq - J.j0.row0);
  J.rows1 = njobs > 1 ? min(kRows, p.rows_per_seq - J.j1.row0) : 0;
  J.groups0 = (J.rows0 + kSlotRows - 1) / kSlotRows;
  J.groups1 = (J.rows1 + kSlotRows - 1) / kSlotRows;
  J.total = J.groups0 * J.j0.states + J.groups1 * J.j1.states;
  return J;
}

// The copying side, run by one producer thread once its tiles are issued: waits for `go` (the consumers have
// published the CTA's jobs and initialised the slots' mbarriers at bars), then copies every unit in order, each
// into its slot once the 8 consumer warps have released the slot's previous unit. Its acquire of the jobs follows
// consumer thread 0's (which counted the arrivals) through `go`; a proxy fence then orders the other CTAs' generic
// state writes before its bulk reads.
__device__ __forceinline__ void copy_states(const DecodeKernelParams& p, const MergeJob* jobs_s, const int* njobs_s,
                                            uint8_t* smem, uint32_t bars, uint32_t go) {
  mbar_wait(go, 0);
  const int njobs = *njobs_s;
  if (njobs == 0) return;
  MLADCP_TIMELINE(kMergeGo);
  const Jobs J = load_jobs(p, jobs_s, njobs);
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
  const uint32_t full = bars, empty = bars + kSlots * 8;
  const uint64_t policy = evict_first_policy();
  const int R = p.rows_per_seq;
  Cursor c;
#pragma unroll 1
  for (int u = 0; u < J.total; ++u) {
    if (u >= kSlots) mbar_wait(bar_addr(empty, u % kSlots), uint32_t(u / kSlots - 1) & 1);
    const MergeJob j = J.job(c.job);
    const int row = kSlotRows * c.group;
    const uint32_t bytes = uint32_t(min(kSlotRows, R - j.row0 - row)) * kRowBytes;
    const uint32_t bar = bar_addr(full, u % kSlots);
    mbar_arrive_expect_tx(bar, bytes);
    bulk_copy(smem_addr(smem + (u % kSlots) * kSlotBytes),
              p.ws_o + (J.blocks(c.job)(c.k) * R + j.row0 + row) * kLatentDim, bytes, bar, policy);
    c.next(j.states, J.groups(c.job));
  }
}

// The merging side: the CTA's merges (njobs > 0 of them, in shared memory) by the 256 consumer threads (ctid), after
// the CTA's last segment (no product in flight); `smem`: the start of q_s, bars: kBarrierBytes there too (P_b's
// buffer), go: the mbarrier copy_states waits on. Warp wi merges rows wi, wi + 8, ... of each job, lane l its columns
// 4 l + 128 q (q < 4): 16-byte shared loads, 8-byte (bf16) or 16-byte (fp32) global stores, whole sectors.
__device__ __forceinline__ void merge_jobs(const DecodeKernelParams& p, const MergeJob* jobs_s, int njobs,
                                           uint8_t* smem, uint32_t bars, uint32_t go, int ctid, int bar_id,
                                           int bar_threads) {
  const int lane = ctid & 31, wi = ctid >> 5;
  const Jobs J = load_jobs(p, jobs_s, njobs);
  float* const table = reinterpret_cast<float*>(smem + MergeSmem::table);
  float2* const combiner = reinterpret_cast<float2*>(smem + MergeSmem::combiner);
  const uint32_t full = bars, empty = bars + kSlots * 8;

  if (ctid == 0) {
    for (int b = 0; b < kSlots; ++b) {
      mbar_init(bar_addr(full, b), 1);
      mbar_init(bar_addr(empty, b), 8);  // one arrival per consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    mbar_arrive(go);  // the copies may start
  }
  named_bar_sync(bar_id, bar_threads);

  // Each warp's rows: their combiners (with warp_combiner's arithmetic) and their states' weights into the table.
  // Up to 32 states, a row takes g lanes (the power of two >= its state count) and a warp 32 / g rows at once: the
  // butterflies over the g lanes are warp_combiner's (its steps over lanes >= g add -inf to maxima and +0 to sums).
#pragma unroll 1
  for (int job = 0; job < njobs; ++job) {
    const int n = J.job(job).states, rows = J.rows(job);
    float* const tj = table + job * kTableStates * kRows;
    if (n <= kTableStates) {
      const int g = n <= 2 ? n : n <= 4 ? 4 : n <= 8 ? 8 : n <= 16 ? 16 : 32, s = lane & (g - 1);
#pragma unroll 1
      for (int r0 = 0; r0 < 8; r0 += 32 / g) {
        const int r = r0 + lane / g, row = wi + 8 * r;
        const bool live = r < 8 && row < rows && s < n;
        const float l = live ? J.lse(p, job, s, row) : -INFINITY;
        lse::Combiner c(LseBase::k2);
        c.observe_max(l);
        for (int o = g / 2; o > 0; o >>= 1) c.max_l = fmaxf(c.max_l, __shfl_xor_sync(0xffffffffu, c.max_l, o));
        c.accumulate(l);
        for (int o = g / 2; o > 0; o >>= 1) c.sum += __shfl_xor_sync(0xffffffffu, c.sum, o);
        if (live) tj[s * kRows + row] = c.weight(l);
        if (live && s == 0) combiner[job * kRows + row] = make_float2(c.max_l, c.sum);
      }
    } else {
#pragma unroll 1
      for (int row = wi; row < rows; row += 8) {
        const lse::Combiner c = warp_combiner(n, [&](int k) { return J.lse(p, job, k, row); });
        tj[lane * kRows + row] = c.weight(J.lse(p, job, lane, row));
        if (lane == 0) combiner[job * kRows + row] = make_float2(c.max_l, c.sum);
      }
    }
  }
  __syncwarp();
  if (ctid == 0) MLADCP_TIMELINE(kMergeWeights);

  float4 sum[4], chain[4];  // the row's sum of chains, and the current chain (columns 4 lane + 128 q)
  Cursor x;
#pragma unroll 1
  for (int u = 0; u < J.total; ++u) {
    const MergeJob j = J.job(x.job);
    const int row = kSlotRows * x.group + wi;
    const bool valid = row < J.rows(x.job);
    lse::Combiner c(LseBase::k2);
    const float2 cm = combiner[x.job * kRows + row];
    c.max_l = cm.x;
    c.sum = cm.y;
    const float wt = !valid               ? 0.0f
                     : x.k < kTableStates ? table[(x.job * kTableStates + x.k) * kRows + row]
                                          : c.weight(J.lse(p, x.job, x.k, row));
    if (x.k == x.w)
#pragma unroll
      for (int q = 0; q < 4; ++q) chain[q] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    mbar_wait(bar_addr(full, u % kSlots), uint32_t(u / kSlots) & 1);
    if (ctid == 0 && u == 0) MLADCP_TIMELINE(kMergeFirst);
    if (valid) {
      const float4* src = reinterpret_cast<const float4*>(smem + (u % kSlots) * kSlotBytes + wi * kRowBytes) + lane;
#pragma unroll
      for (int q = 0; q < 4; ++q) add_weighted(chain[q], wt, src[32 * q]);
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(bar_addr(empty, u % kSlots));  // the warp is done with the slot
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
        const int64_t ob = row_out(p, j.seq, j.row0 + row) + 4 * lane;
#pragma unroll
        for (int q = 0; q < 4; ++q) store4(p.out, p.out_fp32, ob + 128 * q, sum[q]);
        if (lane == 0) store_row_lse(p, j.seq, j.row0 + row, c);
      }
    }
    x.next(n, J.groups(x.job));
  }
}

}  // namespace mladcp::cuda_impl::sm90_merge
