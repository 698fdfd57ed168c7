// The work of a Hopper decode CTA (sm90_decode_kernel.cu, sm90_fp8_decode_kernel.cu): one split of a sequence
// (split schedule) or the pieces of a part, sequence after sequence (balanced schedule, decode_plan.h), as
// segments of 64-key tiles. Included by the sm_90a kernels only.
#pragma once

#include <cstdint>

#include "cuda/decode_kernel.cuh"
#include "cuda/decode_plan.h"

namespace mladcp::cuda_impl::sm90_segments {

constexpr int kTile = cuda_plan::kTileTokens;  // keys per tile

// One segment of a CTA's work: a range of one sequence's local keys for the CTA's query rows.
struct CtaWork {
  int seq, len, row0, k_begin, k_end, ntiles, npairs;
  bool direct;          // the segment covers the sequence: out and lse written directly
  int64_t state_block;  // else its partial state: rows [state_block · R, + R) of the workspace
  int states;           // partial states of the sequence (splits, or parts spanned), 1 when direct
  bool record;          // write the merge record of the sequence's row chunk (balanced schedule, first part)
  cuda_plan::BalancedRecord rec;
};

__device__ __forceinline__ int local_keys(const DecodeKernelParams& p, int len) {
  return int(sharding::local_len(len, p.shard.world, p.shard.rank, p.shard.interleave));
}
// 64-key tiles of sequence `seq` on this shard (the balanced schedule's unit of work).
__device__ __forceinline__ int64_t local_tiles(const DecodeKernelParams& p, int seq) {
  return (int64_t(local_keys(p, clamped_len(p, seq))) + kTile - 1) / kTile;
}

// The segments of this CTA of kRows query rows, the same sequence for every thread: one split (split schedule)
// or the pieces of its part (balanced schedule, decode_plan.h).
template <int kRows>
struct Segments {
  bool balanced;
  int rc, part;
  int split, seq;  // split schedule: this CTA's split, or done
  cuda_plan::BalancedCursor cur;

  // kBalanced: the schedule where the caller knows it at compile time (1: balanced, 0: splits; -1: `balanced`).
  template <int kBalanced = -1>
  __device__ bool next(const DecodeKernelParams& p, CtaWork& w) {
    int k_first = 0, k_last = 0;
    if (kBalanced < 0 ? balanced : kBalanced == 1) {
      cuda_plan::BalancedPiece pc;
      auto tiles_of = [&](int sq) { return local_tiles(p, sq); };
      if (!cur.next(p.num_seqs, tiles_of, pc)) return false;
      w.seq = pc.seq;
      w.len = clamped_len(p, w.seq);
      k_first = pc.tile_begin * kTile;
      k_last = min(pc.tile_end * kTile, local_keys(p, w.len));
      w.direct = pc.whole;
      w.state_block = int64_t(part) * 2 + pc.slot;
      w.states = pc.parts;
      w.record = pc.first;
      w.rec = {part, pc.parts, pc.slot, 0};
    } else {
      if (seq < 0) return false;
      w.seq = seq;
      seq = -1;
      w.len = clamped_len(p, w.seq);
      const int n_max = local_keys(p, w.len);
      const int nsplits = cuda_plan::num_splits(n_max, p.split_len);
      if (split >= nsplits) return false;
      k_first = split * p.split_len;
      k_last = min(k_first + p.split_len, n_max);
      w.direct = nsplits == 1;
      w.state_block = int64_t(w.seq) * p.max_splits + split;
      w.states = nsplits;
      w.record = false;
    }
    w.row0 = rc * kRows;
    w.k_begin = k_first;
    w.k_end = k_last;
    w.ntiles = k_last > k_first ? (k_last - k_first + kTile - 1) / kTile : 0;
    w.npairs = (w.ntiles + 1) / 2;  // an odd count ends on an absent (zero-filled, masked) tile b
    return true;
  }
};

// This CTA's segments, from its index (row chunk, then split and sequence, or part; the pair merge: split, then row
// chunk and sequence, so that a cluster of two holds a sequence's two splits; balanced in clusters of kCluster: part %
// kCluster, then row chunk and part / kCluster, for the uniform cut; the kernel remaps the positional cut's). False
// where its split lies past its sequence's splits: the CTA has nothing to do (split schedule; the grid is sized from
// max_seq_len). kBalanced: the schedule, where the kernel is instantiated for one (1: balanced, 0: splits; -1: from
// p.parts).
template <int kRows, int kBalanced = -1, int kCluster = 1>
__device__ __forceinline__ bool cta_segments(const DecodeKernelParams& p, Segments<kRows>& segs) {
  segs.balanced = kBalanced < 0 ? p.parts > 0 : kBalanced == 1;
  // Balanced in clusters of kCluster (a constant of the kernel): parts kCluster·c + rank of a row chunk in one.
  if (kCluster > 1 && segs.balanced) {
    segs.rc = int((blockIdx.x / kCluster) % p.row_chunks);
    segs.part = int((blockIdx.x / kCluster) / p.row_chunks) * kCluster + int(blockIdx.x % kCluster);
    segs.split = 0;
    segs.seq = -1;
    return true;
  }
  if (p.pair_merge) {
    segs.split = int(blockIdx.x & 1);
    segs.rc = int((blockIdx.x >> 1) % p.row_chunks);
    segs.seq = int((blockIdx.x >> 1) / p.row_chunks);
    segs.part = 0;
    return segs.split < cuda_plan::num_splits(local_keys(p, clamped_len(p, segs.seq)), p.split_len);
  }
  segs.rc = int(blockIdx.x % p.row_chunks);
  const int64_t rest = blockIdx.x / p.row_chunks;
  segs.part = segs.balanced ? int(rest) : 0;
  segs.split = segs.balanced ? 0 : int(rest % p.max_splits);
  segs.seq = segs.balanced ? -1 : int(rest / p.max_splits);
  return segs.balanced || segs.split < cuda_plan::num_splits(local_keys(p, clamped_len(p, segs.seq)), p.split_len);
}

// Balanced schedule: where part `part` starts, found by all kThreads threads of the CTA together (two passes over
// the sequence lengths: the total and the longest, then the sequence holding the part's first position; the
// uniform cut, decode_plan.h, needs the first only). `scratch`: 2 · kThreads / 32 + 2 int64 of shared memory.
// `uniform`, where given: set to whether the cursor is the uniform cut's. kPositionalPart: the positional cut's
// cursor is that of part `positional_part` instead (a balanced plan in clusters maps its CTAs by the cut).
template <int kThreads, bool kPositionalPart = false>
__device__ cuda_plan::BalancedCursor balanced_start(const DecodeKernelParams& p, int part, int64_t* scratch,
                                                    bool* uniform = nullptr, int positional_part = 0) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  constexpr int kWarps = kThreads / 32;
  auto cost_of = [&](int sq) -> int64_t {
    if (sq >= p.num_seqs) return 0;
    return cuda_plan::balanced_cost(local_tiles(p, sq));
  };
  int64_t mine = 0, longest = 0;
  for (int sq = tid; sq < p.num_seqs; sq += kThreads) {
    const int64_t n = local_tiles(p, sq);
    mine += cuda_plan::balanced_cost(n);
    longest = n > longest ? n : longest;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    mine += __shfl_xor_sync(0xffffffffu, mine, o);
    const int64_t l = __shfl_xor_sync(0xffffffffu, longest, o);
    longest = l > longest ? l : longest;
  }
  if (lane == 0) {
    scratch[warp] = mine;
    scratch[kWarps + 2 + warp] = longest;
  }
  if (tid == 0) scratch[kWarps] = -1;
  __syncthreads();
  int64_t total = 0, max_tiles = 0;
#pragma unroll
  for (int i = 0; i < kWarps; ++i) {
    total += scratch[i];
    max_tiles = scratch[kWarps + 2 + i] > max_tiles ? scratch[kWarps + 2 + i] : max_tiles;
  }
  __syncthreads();
  const int piece_tiles = cuda_plan::uniform_piece_tiles(p.num_seqs, p.parts, total, int(max_tiles));
  if (uniform != nullptr) *uniform = piece_tiles > 0;
  if (piece_tiles > 0) {
    const int seq = part / (p.parts / p.num_seqs);
    return cuda_plan::uniform_cursor(part, p.parts, p.num_seqs, piece_tiles,
                                     seq < p.num_seqs ? int(local_tiles(p, seq)) : 0);
  }
  if constexpr (kPositionalPart) part = positional_part;
  const int64_t per_part = (total + p.parts - 1) / p.parts;
  const int64_t begin = int64_t(part) * per_part;
  // Sequence s holds positions [C_s, C_s + cost_s): a block scan of the costs, chunk by chunk.
  int64_t base = 0;
  for (int s0 = 0; s0 < p.num_seqs && base <= begin && begin < total; s0 += kThreads) {
    const int sq = s0 + tid;
    const int64_t c = cost_of(sq);
    int64_t incl = c;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int64_t v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    if (lane == 31) scratch[warp] = incl;
    __syncthreads();
    int64_t before = 0, chunk = 0;
#pragma unroll
    for (int i = 0; i < kWarps; ++i) {
      before += i < warp ? scratch[i] : 0;
      chunk += scratch[i];
    }
    const int64_t start = base + before + incl - c;
    if (sq < p.num_seqs && start <= begin && begin < start + c) {
      scratch[kWarps] = sq;
      scratch[kWarps + 1] = start;
    }
    __syncthreads();
    base += chunk;
  }
  __syncthreads();
  const int first_seq = int(scratch[kWarps]);
  const int64_t first_pos = first_seq >= 0 ? scratch[kWarps + 1] : 0;
  __syncthreads();  // scratch is the consumers' reduction buffer afterwards
  return cuda_plan::balanced_cursor(part, p.parts, int(total), first_seq, int(first_pos), p.num_seqs, p.whole_short);
}

}  // namespace mladcp::cuda_impl::sm90_segments
