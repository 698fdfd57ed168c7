// Split-KV plan of the "cuda" decode (host and device; no CUDA headers).
//
// Query rows: a sequence has R = num_heads · q_len query rows (row = token · H + head). A CTA takes
// up to 64 of them (16, 32 or 64: rows_per_cta) against one contiguous range of the sequence's local
// keys (a split). Two policies choose the split length (MlaDecodeParams::split_policy):
//  - kBatchInvariant (default): 2048 keys whatever the batch; the number of splits of a sequence
//    depends only on its own local length. Nothing depends on the batch size or on the device, so the
//    result for a sequence is bitwise the same whatever else is in the batch (batch invariance).
//  - kFillDevice: other lengths when the batch shape alone would leave SMs idle, chosen from
//    host-known values only (num_seqs, max_seq_len, row chunks, the device's resident-CTA count) to
//    minimize whole waves × (split length + a wave's fixed cost): shorter splits (down to 256 keys, a
//    multiple of the 64-key tile) where there are too few CTAs, or one split of up to 4096 keys per
//    sequence where that saves a wave and the combine; a batch that fills the device keeps 2048.
//
// Grid: row_chunks × max_splits × num_seqs CTAs, sized on the host from max_seq_len; a CTA whose
// split lies past its sequence's split count exits at once. A sequence with one split writes `out`
// and `lse` directly; with more, each split writes an fp32 partial state (o / l, log2 l + max) to the
// workspace and a combine kernel merges them with lse::Combiner.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "mladcp/config.h"
#include "mladcp/decode.h"
#include "mladcp/sharding.h"

namespace mladcp::cuda_plan {

inline constexpr int kTileTokens = 64;  // keys per pipeline stage

// On Hopper (sm_90) the bf16 calls with more query rows per sequence than this run the Hopper kernel (64 rows
// per CTA); the others the portable 16-row kernel, two CTAs per SM (cuda_backend.cpp, choose_kernel). 16 rows
// moved to the Hopper kernel once it passed Sm90Decode.FewRowsOnTheHopperKernel (1-16 rows) on the H200: 10-16%
// faster there (docs/perf/gpu-sm90-fp8-2026-12-01.md); at most 8 rows stay (unmeasured).
inline constexpr int kPortableMaxRowsOnHopper = 8;

// On Hopper the fp8 calls with at most this many query rows per sequence run the Hopper fp8 kernel (16 or 32
// rows per CTA); the others the portable kernel (cuda_backend.cpp, choose_kernel).
inline constexpr int kHopperFp8MaxRows = 32;

// 16, 32 or 64 query rows per CTA.
MLADCP_HD int rows_per_cta(int rows_per_seq) { return rows_per_seq <= 16 ? 16 : (rows_per_seq <= 32 ? 32 : 64); }

// Local keys per split: 2048 for every CTA shape. Each split costs a partial state of rows · 2 KiB
// written and read again by the combine kernel, against 1152 B per key read (bf16), so splits must
// stay long; 2048 keys still give a 4K-context batch of 128 sequences one full wave of 16-row CTAs
// (two per SM), a single 128K sequence 64 splits, and a DCP shard of 16K keys with 128 gathered heads
// 16 CTAs (4096 left it 8, the case DCP exists for: few long sequences, all heads).
inline constexpr int kSplitTokens = 2048;

// Splits of a sequence with `local_keys` keys on this shard: at least 1 (an empty sequence still has
// one CTA per row chunk, which writes out = 0, lse = -inf).
MLADCP_HD int num_splits(int64_t local_keys, int split_len) {
  return local_keys <= split_len ? 1 : int((local_keys + split_len - 1) / split_len);
}

// kFillDevice: the shortest split it takes, in keys (shorter splits cost more in partial states and
// pipeline start-up than they gain in parallelism).
inline constexpr int kFillMinSplit = 256;

// kFillDevice: a sequence may take one split of up to this many times the invariant length (no
// partial state, no combine). Longer splits only in that case: with several splits per sequence, a batch
// of mixed lengths would wait on the few long splits of its longest sequences (measured: 128 heads,
// 32 sequences of 8K with every other sequence empty, 4096-key splits ran 1.34× the 2048-key plan).
inline constexpr int kFillMaxSplitFactor = 2;

// kFillDevice: what a wave of CTAs costs beyond its keys (query load and first copies, all CTAs at
// once; the partial-state write and its share of the combine), in keys of work: about 7 tiles of the
// Hopper kernel (a one-wave grid of 4-tile CTAs measured 27 µs against 2.5 µs per further tile, H200,
// docs/perf/gpu-sm90-ablation-2026-12-01.md); weighs more splits against fewer in the wave count below.
inline constexpr int kFillCtaOverheadKeys = 448;

// kFillDevice split length for `base_ctas` = row_chunks · num_seqs CTAs per split index, sequences of
// at most `max_local` local keys, on a device that holds `wave_ctas` split CTAs at once. A batch
// that fills the device (base_ctas ≥ wave_ctas) keeps the invariant length. Otherwise each candidate
// is costed as waves · (keys per split + kFillCtaOverheadKeys) (the grid runs in whole waves) and the
// cheapest wins, the fewer splits on a tie: every split count from the invariant one up to two waves'
// worth (lengths multiples of the 64-key tile in [kFillMinSplit, invariant_len]), and one split per
// sequence when max_local is at most kFillMaxSplitFactor · invariant_len.
inline int fill_split_tokens(int64_t max_local, int64_t base_ctas, int64_t wave_ctas, int invariant_len) {
  if (base_ctas < 1 || wave_ctas <= base_ctas || max_local <= kFillMinSplit) return invariant_len;
  int64_t best_len = invariant_len, best_cost = -1;
  auto consider = [&](int64_t len) {
    const int64_t splits = (max_local + len - 1) / len;
    const int64_t waves = (base_ctas * splits + wave_ctas - 1) / wave_ctas;
    const int64_t cost = waves * (len + kFillCtaOverheadKeys);
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
      best_len = len;
    }
  };
  const int64_t whole = (max_local + kTileTokens - 1) / kTileTokens * kTileTokens;
  if (whole > invariant_len && whole <= int64_t(kFillMaxSplitFactor) * invariant_len) consider(whole);
  const int64_t first = (max_local + invariant_len - 1) / invariant_len;
  int64_t last = (2 * wave_ctas + base_ctas - 1) / base_ctas;
  const int64_t most = (max_local + kFillMinSplit - 1) / kFillMinSplit;
  if (last > most) last = most;
  for (int64_t want = first; want <= last; ++want) {
    int64_t len = (max_local + want - 1) / want;
    len = (len + kTileTokens - 1) / kTileTokens * kTileTokens;
    if (len < kFillMinSplit) len = kFillMinSplit;
    if (len > invariant_len) len = invariant_len;
    consider(len);
  }
  return int(best_len);
}

// ---- balanced schedule: kFillDevice on the Hopper kernels (64 rows; fp8 16/32 rows) ----
//
// One wave of persistent CTAs: `parts` parts × row_chunks CTAs (parts = the device's wave / row chunks).
// Work positions: sequence s takes kBalancedOverheadTiles positions (its query load and epilogue) and then
// one per 64-key tile of its local keys (an empty sequence: one placeholder), laid end to end in sequence
// order; W positions in all. Part p takes positions [p·T, (p+1)·T), T = ceil(W / parts), and its CTAs run
// the tiles there, sequence by sequence (each CTA one row chunk). A sequence inside one part is written
// directly. One spread over several parts leaves a partial state per part, in slot 0 of a part where it
// is the part's first sequence and slot 1 where it is its last; the part holding its first tile writes a
// merge record (BalancedRecord) that the combine kernel reads. Balanced by keys whatever the lengths: the
// grid does not depend on max_seq_len, and no CTA waits on a longer split of another sequence.
#ifndef MLADCP_BALANCED_OVERHEAD_TILES
#define MLADCP_BALANCED_OVERHEAD_TILES 4
#endif
inline constexpr int kBalancedOverheadTiles = MLADCP_BALANCED_OVERHEAD_TILES;

// Work positions of a sequence with `tiles` 64-key tiles.
MLADCP_HD int64_t balanced_cost(int64_t tiles) { return kBalancedOverheadTiles + (tiles > 0 ? tiles : 1); }

// What a part runs of one sequence.
struct BalancedPiece {
  int seq = 0;
  int tile_begin = 0, tile_end = 0;  // tiles of the sequence in this part (none for an empty sequence)
  bool whole = false;                // the sequence lies in this part only: out and lse written directly
  int slot = 0;                      // partial-state slot of this part (0: its first sequence, 1: its last)
  bool first = false;                // this part holds the sequence's first position: writes the record
  int parts = 1;                     // parts the sequence spans
};

// Merge record of a sequence's row chunk (int4 in the workspace, [B][row_chunks]), written by the CTA of that chunk
// in the sequence's first part: first part, parts spanned, slot in the first part. Partial state k of the sequence
// (k < parts) lies in part first_part + k, slot (k == 0 ? slot : 0).
struct BalancedRecord {
  int first_part, parts, slot, unused;
};

// The pieces of one part, in sequence order. Start it at the sequence whose positions hold the part's first
// position (balanced_cursor); next() reads each sequence's tile count through tiles_of(seq). Positions
// are 32-bit: make_plan takes the balanced schedule only where every position fits.
struct BalancedCursor {
  int part = 0;
  int per_part = 1, begin = 0, end = 0;  // T; positions [begin, end) of this part
  bool whole_short = false;              // sequences of at most T positions are never cut (see below)
  int seq = 0;                           // next sequence to look at
  int pos = 0;                           // its first position
  int count = 0;                         // pieces returned so far

  template <class TilesOf>
  MLADCP_HD bool next(int num_seqs, const TilesOf& tiles_of, BalancedPiece& out) {
    while (seq < num_seqs) {
      const int n = int(tiles_of(seq));
      const int cost = int(balanced_cost(n));
      const int p0 = pos, w0 = pos + kBalancedOverheadTiles, w1 = pos + cost;
      if (p0 >= end) return false;  // this and every later sequence start past the part
      const int s = seq++;
      pos = w1;
      if (whole_short && cost <= per_part) {
        // Whole: the part holding the sequence's middle position runs all of it (a part then holds whole
        // sequences only, except where a longer one is cut: it can only be the part's first or last).
        const int mid = p0 + cost / 2;
        if (mid < begin || mid >= end) continue;
        out.seq = s;
        out.tile_begin = 0;
        out.tile_end = n;
        out.whole = true;
        out.slot = 0;
        out.first = true;
        out.parts = 1;
        ++count;
        return true;
      }
      const int lo = w0 > begin ? w0 : begin, hi = w1 < end ? w1 : end;
      if (lo >= hi) continue;  // only this sequence's overhead positions lie in the part
      out.seq = s;
      out.tile_begin = n > 0 ? lo - w0 : 0;
      out.tile_end = n > 0 ? hi - w0 : 0;
      out.whole = lo == w0 && hi == w1;
      out.slot = count == 0 ? 0 : 1;
      out.first = lo == w0;
      out.parts = (w1 - 1) / per_part - w0 / per_part + 1;
      ++count;
      return true;
    }
    return false;
  }
};

// The cursor of part `part` of `parts` over `total` positions, starting at sequence first_seq (first
// position first_pos) or, with first_seq < 0 (the part lies past the work), at nothing.
MLADCP_HD BalancedCursor balanced_cursor(int part, int parts, int total, int first_seq, int first_pos, int num_seqs,
                                         bool whole_short) {
  BalancedCursor c;
  c.part = part;
  c.whole_short = whole_short;
  c.per_part = (total + parts - 1) / parts;
  if (c.per_part < 1) c.per_part = 1;
  c.begin = part * c.per_part;
  c.end = c.begin + c.per_part < total ? c.begin + c.per_part : total;
  c.seq = first_seq >= 0 ? first_seq : num_seqs;
  c.pos = first_pos;
  return c;
}

// The uniform cut: where every part would hold about as many tiles as the positional cut gives it, sequence s
// runs in parts [s·S, s·S + ceil(n_s / L)), part s·S + j holding tiles [j·L, (j + 1)·L) of it, S = parts / num_seqs
// parts per sequence and L = ceil(max_tiles / S) tiles per piece; parts past num_seqs · S have nothing. Every part
// then runs one piece: no part switches sequences (a switch costs the next queries and the state of the last one; at
// 64 heads, every key from DRAM, the positional cut ran 64 × 8K 19% slower than a split plan of the same bytes, and
// the uniform cut 4.5% faster than the positional one: docs/perf/gpu-sm90-uniform-cut-2026-12-07.md). The pieces'
// partial states and records keep the positional cut's format (slot 0 of each part; the record in the sequence's first
// part), so the combine kernel reads either. Taken where L ≤ T + kUniformSlackTiles (T = ceil(total / parts), the
// positional cut's positions per part): a batch of equal lengths with at least one part per sequence; batches of mixed
// lengths or with empty sequences (max_tiles far above the mean) keep the positional cut. Returns L, or 0 for the
// positional cut.
inline constexpr int kUniformSlackTiles = 2;
MLADCP_HD int uniform_piece_tiles(int num_seqs, int parts, int64_t total, int max_tiles) {
  if (num_seqs < 1 || max_tiles < 1 || parts < num_seqs) return 0;
  const int per_seq = parts / num_seqs;
  const int piece = (max_tiles + per_seq - 1) / per_seq;
  const int64_t per_part = (total + parts - 1) / parts;
  return piece <= per_part + kUniformSlackTiles ? piece : 0;
}

// The uniform cut's cursor of part `part` (piece_tiles = uniform_piece_tiles(...) > 0), as a positional cursor whose
// part covers piece j = part % S of sequence part / S: the sequence's positions laid out from first_pos, a multiple of
// piece_tiles less the overhead, so that next() returns exactly that piece and counts its parts as ceil(n / L) (one
// whole placeholder piece for an empty sequence). `tiles`: the sequence's tiles; parts past its pieces get nothing.
MLADCP_HD BalancedCursor uniform_cursor(int part, int parts, int num_seqs, int piece_tiles, int tiles) {
  BalancedCursor c;
  c.part = part;
  c.per_part = piece_tiles;
  const int per_seq = parts / num_seqs, s = part / per_seq, j = part - s * per_seq;
  const int pieces = tiles > 0 ? (tiles + piece_tiles - 1) / piece_tiles : 1;
  const int first_pos = piece_tiles * ((kBalancedOverheadTiles + piece_tiles - 1) / piece_tiles) -
                        kBalancedOverheadTiles;  // first_pos + overhead: a multiple of piece_tiles
  const int w0 = first_pos + kBalancedOverheadTiles;
  const int last = (j + 1) * piece_tiles < tiles ? (j + 1) * piece_tiles : tiles;
  c.begin = w0 + j * piece_tiles;
  c.end = w0 + (last > 0 ? last : 1);
  c.seq = s < num_seqs && j < pieces ? s : num_seqs;
  c.pos = first_pos;
  return c;
}

// kFillDevice's schedule on a kernel that can run both (the Hopper kernels). kAutoManyWaves: kAuto's choice with a
// higher bar, for the fp8 16/32-row kernel, whose pieces cost more to switch than its CTAs to start (H200,
// docs/perf/gpu-sm90-fp8-balanced-2026-12-02.md: 16 heads × 128 × 4K and × 64 × 8K at q_len 2, two waves of two or
// four splits per sequence, ran 4% and 11% slower balanced; 3.9 and 7.8 waves 8.5% and 12.7% faster, and two waves
// of 64 splits per sequence 2.6%).
enum class Schedule { kSplits, kAuto, kBalanced, kAutoManyWaves };

// Whether kFillDevice takes the balanced schedule, for a batch of `num_seqs` sequences in `row_chunks` chunks
// whose split plan has `split_grid` CTAs and `max_splits` splits per sequence, on a device running `wave_ctas`
// CTAs at once (make_plan, and the planner's model of it: plan/perf_model.cpp).
// kAuto takes it where the split plan runs several waves of several splits per sequence (its waves' fixed costs
// and the partial states of many short splits dominate there); a plan of one wave, or of whole sequences per
// CTA, stays: the balanced parts, cut across sequences, would add partial states and a combine to it (measured
// slower on 128 heads × 64 × 4K and × 128 × 1K: docs/perf/gpu-sm90-ws-2026-12-01.md, runs 16-18).
// Whole sequences: with k ≥ 1 sequences per part and ceil(k) / k ≤ 1.1 (lengths assumed alike) the balanced
// schedule puts whole sequences on each part, as evenly as cutting them would, without partial states (128
// heads × 128 × 8K: 564 → 533 µs).
inline constexpr int64_t kManyWavesSplits = 8;
struct BalancedChoice {
  bool take = false;
  int64_t parts = 1;         // wave_ctas / row_chunks
  bool whole_short = false;  // sequences of at most one part's positions are never cut
};
inline BalancedChoice balanced_choice(int64_t num_seqs, int64_t row_chunks, int64_t split_grid, int64_t max_splits,
                                      int64_t wave_ctas, Schedule schedule) {
  BalancedChoice c;
  c.parts = std::max<int64_t>(1, wave_ctas / std::max<int64_t>(1, row_chunks));
  c.whole_short = num_seqs >= c.parts && 10 * ((num_seqs + c.parts - 1) / c.parts) * c.parts <= 11 * num_seqs;
  const bool pays = split_grid > wave_ctas && max_splits > 1;
  // kAutoManyWaves: more than two waves of splits, or more splits per sequence than the combine's few-state mode.
  const bool pays_more = pays && (split_grid > 2 * wave_ctas || max_splits > kManyWavesSplits);
  c.take = wave_ctas > 0 && (schedule == Schedule::kBalanced || (schedule == Schedule::kAuto && pays) ||
                             (schedule == Schedule::kAutoManyWaves && pays_more));
  return c;
}

// The fused merge (Hopper 64-row kernel): the CTA whose partial state of a (sequence, row chunk) arrives last merges
// the sequence's states for its rows, reading each from L2 (64 rows: 128 KiB per state), so no combine kernel runs
// after the split kernel (that launch and its pass over the states cost 9-16 µs on the H200:
// docs/perf/gpu-sm90-combine-2026-12-02.md). One CTA reads every state of its rows, so the merge takes it only
// where a sequence has few states: a split plan of at most kFusedMaxStates splits, a balanced plan of at least one
// sequence per kFusedMaxStates parts (more states per sequence: the combine kernel, which spreads them over the
// device). Taken only where the backend asks for it (CudaBackendOptions::fused_merge, off by default: the merge
// itself is still slower than the combine kernel).
inline constexpr int kFusedMaxStates = 4;

// The pair merge (Hopper 64-row kernel): a split plan of exactly two splits per sequence (max_splits == 2) runs the
// two split CTAs of each (sequence, row chunk) as one cluster, and each CTA sends the partial state of the output
// columns the other finishes (256 of the 512) through distributed shared memory: no state goes to the workspace and
// no combine kernel runs. The arithmetic is the combine kernel's, bit for bit (sm90_pair_merge.cuh).
// A balanced plan of two parts per sequence (2 · num_seqs ≤ parts < 3 · num_seqs, parts even) runs its parts in
// clusters of two as well (parts 2c and 2c + 1 of a row chunk): where the kernel takes the uniform cut, the two
// pieces of a sequence are those two parts, merged the same way; with the positional cut (lengths that differ) the
// parts write states and records for the combine kernel as in the plain balanced plan. The host knows the parts per
// sequence, the kernel the cut; the combine kernel is launched in either case and exits at once where no state was
// written. Taken only where the device runs the whole grid's clusters at once (`pair_ctas`). A plan of four parts per
// sequence runs in clusters of four the same way (parts rounded down to a multiple of 4, `quad_ctas`; a sequence of
// two or three pieces leaves its states to the combine kernel).

struct DecodePlan {
  int rows_per_seq = 0;      // H · q_len
  int rows_per_cta = 16;     // 16, 32 or 64
  int row_chunks = 0;        // ceil(rows_per_seq / rows_per_cta)
  int split_len = 0;         // local keys per split
  int max_splits = 1;        // splits of the longest possible sequence (from max_seq_len)
  int64_t grid = 0;          // CTAs of the split kernel
  int parts = 0;             // > 0: the balanced schedule (grid = parts · row_chunks), else splits of split_len
  bool whole_short = false;  // balanced: sequences of at most one part's positions are never cut
  bool fused_merge = false;  // the split kernel merges the states (kFusedMaxStates), no combine kernel
  bool pair_merge = false;   // two splits (or balanced: parts) per sequence merged in a cluster of their two CTAs
  int cluster_parts = 0;     // balanced with pair_merge: parts per cluster (2 or 4)
  size_t ws_record_offset = 0, ws_lse_offset = 0, ws_o_offset = 0;
  size_t ws_counter_offset = 0;  // fused merge: int [B][row_chunks], arrivals of partial states (zeroed per call)
  // Balanced schedule with the combine kernel: int, set by a CTA that writes a partial state (zeroed per call), so
  // that the combine kernel exits at once where every sequence was written whole.
  size_t ws_merges_offset = 0;
  size_t workspace_bytes = 0;  // 0 when no sequence can have two splits
};

inline size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

// Host-only: the plan of a validated call (default strides applied or not; only shapes and the
// policy are read). `wave_ctas`: split CTAs the device runs at once (SMs × resident CTAs per SM),
// read by kFillDevice only. `cta_rows`: the kernel's rows per CTA (the Hopper kernel always takes 64,
// packing 16·q_len rows and leaving the rest empty); 0 = rows_per_cta(H · q_len). `schedule`: whether
// kFillDevice takes the balanced schedule (only the Hopper kernels run it): never, where it pays, always.
// `fused`: the kernel can merge the states itself (the Hopper 64-row kernel); taken where the states are few.
// `pair_ctas`, `quad_ctas`: CTAs the device runs at once in clusters of two and of four of the kernel (the Hopper
// 64-row kernel; 0: none); taken by split plans of two splits, and by balanced plans of two or four parts per sequence
// whose grid fits them (unless `balanced_clusters` is false).
inline DecodePlan make_plan(const MlaDecodeParams& p, int64_t wave_ctas, int cta_rows = 0,
                            Schedule schedule = Schedule::kSplits, bool fused = false, int64_t pair_ctas = 0,
                            int64_t quad_ctas = 0, bool balanced_clusters = true) {
  DecodePlan plan;
  plan.rows_per_seq = p.num_heads * p.q_len;
  plan.rows_per_cta = cta_rows > 0 ? cta_rows : rows_per_cta(plan.rows_per_seq);
  plan.row_chunks = (plan.rows_per_seq + plan.rows_per_cta - 1) / plan.rows_per_cta;
  plan.split_len = kSplitTokens;
  const int64_t max_local = sharding::local_len(p.max_seq_len, p.shard.world, p.shard.rank, p.shard.interleave);
  if (p.split_policy == SplitPolicy::kFillDevice)
    plan.split_len = fill_split_tokens(max_local, int64_t(plan.row_chunks) * p.num_seqs, wave_ctas, plan.split_len);
  plan.max_splits = num_splits(max_local, plan.split_len);
  plan.grid = int64_t(plan.row_chunks) * plan.max_splits * p.num_seqs;
  const int64_t most_positions = int64_t(p.num_seqs) * balanced_cost((max_local + kTileTokens - 1) / kTileTokens);
  const BalancedChoice b =
      balanced_choice(p.num_seqs, plan.row_chunks, plan.grid, plan.max_splits, wave_ctas, schedule);
  if (p.split_policy == SplitPolicy::kFillDevice && b.take && most_positions < (int64_t(1) << 30)) {
    plan.parts = int(b.parts);
    plan.whole_short = b.whole_short;
    plan.grid = int64_t(plan.parts) * plan.row_chunks;
    plan.split_len = kSplitTokens;
    plan.max_splits = 1;
    // Clusters of four: as many parts as fit in them, a multiple of 4 (a GPC of 18 SMs holds four such clusters).
    const int quad_parts = int(std::min<int64_t>(plan.parts, quad_ctas / plan.row_chunks)) / 4 * 4;
    const bool clusters = balanced_clusters && p.num_seqs > 0;
    if (clusters && plan.parts % 2 == 0 && plan.parts / p.num_seqs == 2 && pair_ctas >= plan.grid) {
      plan.pair_merge = true;
      plan.cluster_parts = 2;
    } else if (clusters && quad_parts / p.num_seqs == 4) {
      plan.pair_merge = true;
      plan.cluster_parts = 4;
      plan.parts = quad_parts;
      plan.grid = int64_t(plan.parts) * plan.row_chunks;
    }
    const size_t states = size_t(plan.parts) * 2 * size_t(plan.rows_per_seq);
    plan.fused_merge = fused && !plan.pair_merge && int64_t(p.num_seqs) * kFusedMaxStates >= plan.parts;
    plan.ws_record_offset = 0;
    plan.ws_lse_offset = align_up(size_t(p.num_seqs) * size_t(plan.row_chunks) * sizeof(BalancedRecord), 256);
    plan.ws_o_offset = align_up(plan.ws_lse_offset + states * sizeof(float), 256);
    plan.workspace_bytes = plan.ws_o_offset + states * size_t(kLatentDim) * sizeof(float);
  } else if (plan.max_splits == 2 && pair_ctas > 0) {
    plan.pair_merge = true;  // no workspace: the states stay in the cluster's shared memory
  } else if (plan.max_splits > 1) {
    const size_t states = size_t(p.num_seqs) * size_t(plan.max_splits) * size_t(plan.rows_per_seq);
    plan.fused_merge = fused && plan.max_splits <= kFusedMaxStates;
    plan.ws_lse_offset = 0;
    plan.ws_o_offset = align_up(states * sizeof(float), 256);
    plan.workspace_bytes = plan.ws_o_offset + states * size_t(kLatentDim) * sizeof(float);
  }
  if (plan.fused_merge) {
    plan.ws_counter_offset = align_up(plan.workspace_bytes, 256);
    plan.workspace_bytes = plan.ws_counter_offset + size_t(p.num_seqs) * size_t(plan.row_chunks) * sizeof(int);
  } else if (plan.parts > 0) {
    plan.ws_merges_offset = align_up(plan.workspace_bytes, 256);
    plan.workspace_bytes = plan.ws_merges_offset + sizeof(int);
  }
  return plan;
}

}  // namespace mladcp::cuda_plan
