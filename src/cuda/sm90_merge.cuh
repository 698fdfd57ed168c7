// The fused merge of the Hopper decode kernel (sm90_decode_kernel.cu): the CTA whose partial state of a (sequence,
// row chunk) arrives last merges all of that sequence's states for its 64 rows, so no combine kernel runs after the
// split kernel (decode_plan.h, kFusedMaxStates). The arithmetic is the combine kernel's, bit for bit (lse::Combiner
// in base 2 with its lane sums and butterflies, lse::weighted, the states added in state order from +0, each product
// and sum rounded separately): the result depends only on the row's states, never on which CTA arrived last, nor on
// whether the batch's plan merges in the split kernel or in the combine kernel (batch invariance). Taken only with
// CudaBackendOptions::fused_merge (off by default: this merge still takes 26-32 µs per CTA for two states of 64 rows,
// more than the combine kernel costs; docs/perf/gpu-sm90-combine-2026-12-02.md).
//
// Protocol, per CTA with a partial state (consumer threads):
//   1. every thread writes its part of the state (the balanced schedule's record first), then __threadfence(); a
//      barrier;
//   2. thread 0 waits for the counters' zeroing kernel (griddepcontrol.wait: the split kernel is its programmatic
//      dependent), adds one to the (sequence, chunk) counter, and fences; the CTA that brings it to the state count
//      owes the merge and files it (MergeJob);
//   3. after the CTA's last segment (the next top-of-loop barrier publishes the jobs), the consumer threads read every
//      state of a job through L2 (ld.global.cg), in the accumulator layout of the epilogue: rows rs[0..1], column
//      pairs col0 + 8 j, j < 32.
// Included by sm90_decode_kernel.cu only (sm_90a).
#pragma once

#include <cstdint>

#include "core/lse_math.h"
#include "cuda/decode_kernel.cuh"
#include "cuda/sm90_decode_ring.cuh"

namespace mladcp::cuda_impl::sm90_merge {

using sm90_ring::CtaWork;
using sm90_ring::kRows;

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

// LSEs (then weights) of a row's first kHeldStates states are kept in registers, read all at once; later states'
// are read again where needed (sequences of more states than the plan expects: correct, slower).
constexpr int kHeldStates = 4;

// lse::Combiner over a row's n states (held[k]: state k's LSE for k < kHeldStates, lse_of(k) any) with the combine
// kernel's arithmetic, so that a row gets the same bits whichever of the two merges it (decode_launch.cu: lane i of
// a warp observes states i, i + 32, ... in order, then the warp reduces the maximum and the sum by xor butterflies
// over its 32 lanes). Here the 32 lanes' sums are slots of one thread, added in the butterflies' pattern (each
// pair's two sums are equal).
template <class LseOf>
__device__ __forceinline__ lse::Combiner row_combiner(int n, const float (&held)[kHeldStates], const LseOf& lse_of) {
  lse::Combiner c(LseBase::k2);
#pragma unroll
  for (int k = 0; k < kHeldStates; ++k)
    if (k < n) c.observe_max(held[k]);  // the maximum is exact in any order
#pragma unroll 1
  for (int k = kHeldStates; k < n; ++k) c.observe_max(lse_of(k));
  float t[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) t[i] = 0.0f;
  auto add_term = [&](int i, float l) {
    l = lse::sanitize(l);
    if (l != -INFINITY) t[i] += lse::exp_b(l - c.max_l, LseBase::k2);
  };
#pragma unroll
  for (int i = 0; i < 32; ++i)
    if (i < n) add_term(i, i < kHeldStates ? held[i < kHeldStates ? i : 0] : lse_of(i));
#pragma unroll 1
  for (int base = 32; base < n; base += 32)
#pragma unroll
    for (int i = 0; i < 32; ++i)
      if (base + i < n) add_term(i, lse_of(base + i));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
#pragma unroll
    for (int i = 0; i < 32; ++i)
      if ((i & o) == 0) t[i] = t[i ^ o] = t[i] + t[i ^ o];
  c.sum = t[0];
  return c;
}

// Merges the states of the job's rows rs[0..1] (this thread's column pairs col0 + 8 j) and writes out (and lse from
// the threads with write_lse). Run after the CTA's last segment: the output accumulators are dead there, so the
// loads in flight have registers.
__device__ __forceinline__ void merge_rows(const DecodeKernelParams& p, const MergeJob& w, const int (&rs)[2], int col0,
                                           bool write_lse) {
  const int n = w.states;
  const int64_t R = p.rows_per_seq;
  const StateBlocks block = state_blocks(p, w);
  int grow[2];
  bool valid[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    grow[hh] = w.row0 + rs[hh];
    valid[hh] = grow[hh] < R;
  }
  auto lse_at = [&](int hh, int k) { return valid[hh] ? __ldcg(p.ws_lse + block(k) * R + grow[hh]) : -INFINITY; };

  // Both rows' first LSEs in one round trip, then their combiners; `held` becomes the weights.
  float held[2][kHeldStates];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh)
#pragma unroll
    for (int k = 0; k < kHeldStates; ++k) held[hh][k] = k < n ? lse_at(hh, k) : -INFINITY;
  lse::Combiner c[2] = {row_combiner(n, held[0], [&](int k) { return lse_at(0, k); }),
                        row_combiner(n, held[1], [&](int k) { return lse_at(1, k); })};
#pragma unroll
  for (int hh = 0; hh < 2; ++hh)
#pragma unroll
    for (int k = 0; k < kHeldStates; ++k) held[hh][k] = c[hh].weight(held[hh][k]);

  // Output columns in four chunks of 8 pairs per row; the held states' loads in flight together.
  const float2* src[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh)
    src[hh] = reinterpret_cast<const float2*>(p.ws_o + int64_t(grow[hh]) * kLatentDim + col0);
  const int64_t block_floats = R * kLatentDim;
#pragma unroll 1
  for (int jc = 0; jc < 4; ++jc) {
    float2 acc[2][8];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[hh][j] = make_float2(0.0f, 0.0f);
    auto load = [&](int k, float2(&v)[2][8]) {
      const int64_t off = block(k) * block_floats / 2 + jc * 32;  // in float2
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int j = 0; j < 8; ++j) v[hh][j] = valid[hh] ? __ldcg(src[hh] + off + 4 * j) : make_float2(0.0f, 0.0f);
    };
    auto add = [&](const float(&wt)[2], const float2(&v)[2][8]) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          acc[hh][j].x = __fadd_rn(acc[hh][j].x, lse::weighted(wt[hh], v[hh][j].x));
          acc[hh][j].y = __fadd_rn(acc[hh][j].y, lse::weighted(wt[hh], v[hh][j].y));
        }
    };
#pragma unroll
    for (int k0 = 0; k0 < kHeldStates; k0 += 2) {  // two states' loads in flight
      float2 v[2][2][8];
#pragma unroll
      for (int k = k0; k < k0 + 2; ++k)
        if (k < n) load(k, v[k - k0]);
#pragma unroll
      for (int k = k0; k < k0 + 2; ++k)
        if (k < n) {
          const float wt[2] = {held[0][k], held[1][k]};
          add(wt, v[k - k0]);
        }
    }
#pragma unroll 1
    for (int k = kHeldStates; k < n; ++k) {
      float2 v[2][8];
      load(k, v);
      const float wt[2] = {c[0].weight(lse_at(0, k)), c[1].weight(lse_at(1, k))};
      add(wt, v);
    }
    // This chunk of the merged rows.
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      if (!valid[hh]) continue;
      const int i = grow[hh] / p.num_heads, h = grow[hh] - i * p.num_heads;
      const int64_t ob = out_elem(p, int64_t(w.seq) * p.q_len + i, h) + col0 + jc * 64;
      if (p.out_fp32) {
        float* dst = static_cast<float*>(p.out) + ob;
#pragma unroll
        for (int j = 0; j < 8; ++j) *reinterpret_cast<float2*>(dst + j * 8) = acc[hh][j];
      } else {
        uint16_t* dst = static_cast<uint16_t*>(p.out) + ob;
#pragma unroll
        for (int j = 0; j < 8; ++j) *reinterpret_cast<uint32_t*>(dst + j * 8) = pack_bf16(acc[hh][j].x, acc[hh][j].y);
      }
    }
  }
  if (write_lse) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      if (!valid[hh]) continue;
      const int i = grow[hh] / p.num_heads, h = grow[hh] - i * p.num_heads;
      p.lse[lse_elem(p, int64_t(w.seq) * p.q_len + i, h)] =
          lse::convert(c[hh].merged_lse(), LseBase::k2, p.lse_base2 ? LseBase::k2 : LseBase::kE);
    }
  }
}

}  // namespace mladcp::cuda_impl::sm90_merge
