// MlaDecodeParams::split_policy. The planner (host arithmetic, runs everywhere); kFillDevice against
// the oracle on shapes that it cuts into many short splits (single long sequences, DCP shards with
// empty shards, q_len > 1, fp8, 128 heads, head groups with padded strides), its determinism and CUDA
// graph capture; validation of an unknown policy on the cuda and the host backends.
#include <cuda_runtime.h>

#include <cstring>
#include <string>
#include <vector>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_test_util.h"
#include "cuda/decode_plan.h"

namespace mladcp::test {
namespace {

MlaDecodeParams plan_params(int seqs, int heads, int q_len, int max_seq_len, DcpShard shard = {}) {
  MlaDecodeParams p;
  p.num_seqs = seqs;
  p.num_heads = heads;
  p.q_len = q_len;
  p.max_seq_len = max_seq_len;
  p.shard = shard;
  p.split_policy = SplitPolicy::kFillDevice;
  return p;
}

// ---- planner ------------------------------------------------------------------------------------

// The pair merge takes exactly the split plans of two splits per sequence where the kernel can run it, and needs
// no workspace there.
TEST(SplitPolicyPlan, PairMergeTakesPlansOfTwoSplits) {
  using cuda_plan::Schedule;
  MlaDecodeParams inv = plan_params(8, 128, 1, 4096);
  inv.split_policy = SplitPolicy::kBatchInvariant;
  const cuda_plan::DecodePlan two = cuda_plan::make_plan(inv, 132, 64, Schedule::kSplits, false, true);
  EXPECT_TRUE(two.pair_merge);
  EXPECT_EQ(two.max_splits, 2);
  EXPECT_EQ(two.grid, 8 * 2 * 2);
  EXPECT_EQ(two.workspace_bytes, 0u);
  EXPECT_FALSE(cuda_plan::make_plan(inv, 132, 64, Schedule::kSplits, false, false).pair_merge);
  EXPECT_GT(cuda_plan::make_plan(inv, 132, 64, Schedule::kSplits, false, false).workspace_bytes, 0u);
  inv.max_seq_len = 4097;  // three splits
  EXPECT_FALSE(cuda_plan::make_plan(inv, 132, 64, Schedule::kSplits, false, true).pair_merge);
  inv.max_seq_len = 2048;  // one
  EXPECT_FALSE(cuda_plan::make_plan(inv, 132, 64, Schedule::kSplits, false, true).pair_merge);
  // kFillDevice: 32 sequences of 4K at 128 heads take two splits of 2048 (one wave of 128 CTAs); the fused merge
  // asked for as well leaves them to the pair merge; the balanced schedule has no pairs.
  const MlaDecodeParams fill = plan_params(32, 128, 1, 4096);
  const cuda_plan::DecodePlan f = cuda_plan::make_plan(fill, 132, 64, Schedule::kAuto, true, true);
  EXPECT_TRUE(f.pair_merge);
  EXPECT_FALSE(f.fused_merge);
  EXPECT_EQ(f.split_len, 2048);
  EXPECT_FALSE(cuda_plan::make_plan(fill, 132, 64, Schedule::kBalanced, false, true).pair_merge);  // 1 cluster
}

// The balanced schedule in clusters: plans of two parts per sequence (an even count of parts) whose whole grid the
// device runs at once in clusters of two, and of four (parts rounded down to a multiple of 4) in clusters of four; they
// keep the workspace (the positional cut writes states there).
TEST(SplitPolicyPlan, PairMergeTakesBalancedPlansOfTwoPartsPerSequence) {
  using cuda_plan::Schedule;
  const auto plan = [](int seqs, int heads, int q_len, int ctx, int64_t pair_ctas, int64_t quad_ctas = 0) {
    return cuda_plan::make_plan(plan_params(seqs, heads, q_len, ctx), 132, 64, Schedule::kBalanced, false, pair_ctas,
                                quad_ctas);
  };
  const cuda_plan::DecodePlan b64 = plan(64, 64, 1, 8192, 132, 128);  // 132 parts, 64 sequences
  EXPECT_EQ(b64.parts, 132);
  EXPECT_TRUE(b64.pair_merge);
  EXPECT_EQ(b64.cluster_parts, 2);
  EXPECT_FALSE(b64.fused_merge);
  EXPECT_GT(b64.workspace_bytes, 0u);
  EXPECT_GT(b64.ws_merges_offset, 0u);
  EXPECT_TRUE(plan(32, 128, 1, 16384, 132).pair_merge);   // 66 parts of 2 row chunks, 32 sequences
  EXPECT_TRUE(plan(45, 64, 1, 8192, 132).pair_merge);     // 132 / 45 = 2 (the last 42 parts idle in the uniform cut)
  EXPECT_FALSE(plan(64, 64, 1, 8192, 130).pair_merge);    // the clusters of 132 CTAs do not fit at once
  EXPECT_FALSE(plan(64, 64, 1, 8192, 0).pair_merge);      // the kernel has no clusters
  EXPECT_FALSE(plan(44, 64, 1, 8192, 132).pair_merge);    // three parts per sequence
  EXPECT_FALSE(plan(67, 64, 1, 8192, 132).pair_merge);    // one
  EXPECT_FALSE(plan(16, 128, 2, 16384, 132).pair_merge);  // 33 parts of 4 row chunks: odd
  // With the fused merge asked for, the pair plan does not take it.
  EXPECT_FALSE(cuda_plan::make_plan(plan_params(64, 64, 1, 8192), 132, 64, Schedule::kBalanced, true, 132).fused_merge);
  // Four parts per sequence: clusters of four where they fit, on a multiple of 4 parts.
  const cuda_plan::DecodePlan q128 = plan(16, 128, 1, 16384, 132, 128);  // 66 parts → 64 of 2 row chunks
  EXPECT_TRUE(q128.pair_merge);
  EXPECT_EQ(q128.cluster_parts, 4);
  EXPECT_EQ(q128.parts, 64);
  EXPECT_EQ(q128.grid, 128);
  EXPECT_GT(q128.workspace_bytes, 0u);
  EXPECT_FALSE(plan(16, 128, 1, 16384, 132, 124).pair_merge);  // 31 clusters of four: 60 parts, three per sequence
  EXPECT_EQ(plan(16, 128, 1, 16384, 132, 124).parts, 66);
  EXPECT_EQ(plan(32, 64, 1, 16384, 132, 128).parts, 128);              // as many parts as the clusters of four hold
  const cuda_plan::DecodePlan q64 = plan(32, 64, 1, 16384, 132, 132);  // 132 parts, 32 sequences
  EXPECT_EQ(q64.cluster_parts, 4);
  EXPECT_EQ(q64.parts, 132);
  const cuda_plan::DecodePlan q2 = plan(8, 128, 2, 16384, 132, 128);  // 33 parts of 4 row chunks → 32
  EXPECT_EQ(q2.cluster_parts, 4);
  EXPECT_EQ(q2.parts, 32);
  EXPECT_EQ(q2.grid, 128);
  EXPECT_FALSE(plan(17, 128, 1, 16384, 132, 132).pair_merge);  // 64 parts hold only three per sequence
  EXPECT_FALSE(plan(16, 128, 1, 16384, 132, 0).pair_merge);
}

TEST(SplitPolicyPlan, FillDeviceSplitsFewLongSequences) {
  // One 32K sequence on a DCP rank of two (16K local keys), 128 gathered heads: 2 row chunks.
  MlaDecodeParams p = plan_params(1, 128, 1, 32768, {2, 0, 1});
  const cuda_plan::DecodePlan inv = [&] {
    MlaDecodeParams q = p;
    q.split_policy = SplitPolicy::kBatchInvariant;
    return cuda_plan::make_plan(q, 132);
  }();
  EXPECT_EQ(inv.split_len, 2048);
  EXPECT_EQ(inv.grid, 16);
  const cuda_plan::DecodePlan fill = cuda_plan::make_plan(p, 132);
  EXPECT_EQ(fill.split_len, 256);  // 66 splits wanted, 249 keys each, rounded to the tile: 256
  EXPECT_EQ(fill.max_splits, 64);
  EXPECT_EQ(fill.grid, 128);
  EXPECT_GE(fill.workspace_bytes, size_t(64) * 128 * (kLatentDim + 1) * 4);
  // Eight such sequences: 16 CTAs per split index; 8 splits of 2048 are exactly one wave of 128 CTAs,
  // where 9 shorter splits (144 CTAs) would need a second, nearly empty wave: the invariant length stays.
  EXPECT_EQ(cuda_plan::make_plan(plan_params(8, 128, 1, 32768, {2, 0, 1}), 132).split_len, 2048);
  // 128K on two ranks, one sequence: 64 splits of 1024 (one wave) beat 128 of 512 (two waves).
  EXPECT_EQ(cuda_plan::make_plan(plan_params(1, 128, 1, 131072, {2, 1, 1}), 132).split_len, 1024);
  // 64 sequences of 4K with 16 heads (16-row CTAs, two per SM): 4 splits of 1024 fill one wave of 264.
  EXPECT_EQ(cuda_plan::make_plan(plan_params(64, 16, 1, 4096), 264).split_len, 1024);
  // 64 sequences of 4K with 128 heads: 128 CTAs of one split each (one wave, no combine) beat 256 of
  // 2048 keys (two waves and a combine). 32 sequences of 16K keep 8 splits of 2048: several splits per
  // sequence are never longer than the invariant length.
  EXPECT_EQ(cuda_plan::make_plan(plan_params(64, 128, 1, 4096), 132).split_len, 4096);
  EXPECT_EQ(cuda_plan::make_plan(plan_params(64, 128, 1, 4096), 132).max_splits, 1);
  EXPECT_EQ(cuda_plan::make_plan(plan_params(32, 128, 1, 16384), 132).split_len, 2048);
  const int longest = cuda_plan::kFillMaxSplitFactor * 2048;
  // Never below kFillMinSplit, always a multiple of the tile, never above kFillMaxSplitFactor × the
  // invariant length, and longer than the invariant length only as one split per sequence.
  for (int len : {1, 100, 300, 1000, 5000, 70000, 1 << 20})
    for (int seqs : {1, 2, 7, 64, 300})
      for (int heads : {1, 16, 64, 128})
        for (int64_t wave : {0, 78, 132, 264, 1024}) {
          const cuda_plan::DecodePlan f = cuda_plan::make_plan(plan_params(seqs, heads, 1, len), wave);
          SCOPED_TRACE("len " + std::to_string(len) + " seqs " + std::to_string(seqs) + " heads " +
                       std::to_string(heads) + " wave " + std::to_string(wave));
          EXPECT_LE(f.split_len, longest);
          if (f.split_len > 2048) EXPECT_EQ(f.max_splits, 1);
          if (f.split_len != 2048) {
            EXPECT_GE(f.split_len, cuda_plan::kFillMinSplit);
            EXPECT_EQ(f.split_len % cuda_plan::kTileTokens, 0);
          }
          const int64_t base = int64_t(f.row_chunks) * seqs;
          if (base >= wave) EXPECT_EQ(f.split_len, 2048) << "a batch that fills the device keeps the invariant plan";
          // At most about two waves (or the invariant grid, or one split of every row chunk).
          if (f.split_len > cuda_plan::kFillMinSplit && f.split_len < 2048 && wave > 0)
            EXPECT_LE(f.grid, 2 * wave + base);
          if (f.max_splits > 1) EXPECT_GT(f.workspace_bytes, 0u);
        }
}

// The balanced schedule (kFillDevice on the Hopper kernel), host arithmetic: every tile of every sequence
// runs in exactly one part, once; every sequence has one merge record, and the records name exactly the
// partial states its parts write (at most two per part, distinct slots).
TEST(SplitPolicyPlan, BalancedScheduleCoversEveryTileOnce) {
  uint64_t rng = 12345;
  auto next = [&](int mod) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return int((rng >> 33) % uint64_t(mod));
  };
  int uniform_cuts = 0;
  for (int trial = 0; trial < 90; ++trial) {
    const int num_seqs = 1 + next(trial < 30 ? 12 : 300);
    std::vector<int> tiles(num_seqs);
    for (int& t : tiles) t = next(4) == 0 ? 0 : (next(3) == 0 ? 1 + next(3) : next(trial % 2 ? 40 : 600));
    if (trial >= 60) {  // equal lengths (the uniform cut where there are parts enough), some with one empty
      const int n = 1 + next(trial % 2 ? 40 : 600);
      for (int& t : tiles) t = n;
      if (trial % 3 == 0) tiles[size_t(next(num_seqs))] = 0;
    }
    int64_t total = 0;
    int max_tiles = 0;
    for (int t : tiles) {
      total += cuda_plan::balanced_cost(t);
      max_tiles = std::max(max_tiles, t);
    }
    for (int parts : {1, 2, 3, 7, 33, 66, 132, 1000})
      for (bool whole_short : {false, true}) {
        SCOPED_TRACE("trial " + std::to_string(trial) + " seqs " + std::to_string(num_seqs) + " parts " +
                     std::to_string(parts) + (whole_short ? " whole_short" : ""));
        std::vector<std::vector<std::pair<int, int>>> covered(num_seqs);  // (part, piece index) per tile
        std::vector<std::vector<int>> parts_of(num_seqs);
        std::vector<std::vector<int64_t>> states_of(num_seqs);
        std::vector<cuda_plan::BalancedRecord> rec(num_seqs, cuda_plan::BalancedRecord{-1, 0, 0, 0});
        std::vector<int> records(num_seqs, 0), tile_runs(num_seqs, 0);
        // The kernel's start (sm90_segments::balanced_start): the uniform cut, or the sequence whose positions
        // hold the part's first position.
        const int piece_tiles = cuda_plan::uniform_piece_tiles(num_seqs, parts, total, max_tiles);
        if (piece_tiles > 0) ++uniform_cuts;
        for (int part = 0; part < parts; ++part) {
          const int64_t per = (total + parts - 1) / parts, begin = int64_t(part) * per;
          int first = -1;
          int64_t pos = 0, first_pos = 0;
          for (int s = 0; s < num_seqs && begin < total; ++s) {
            const int64_t c = cuda_plan::balanced_cost(tiles[s]);
            if (pos <= begin && begin < pos + c) {
              first = s;
              first_pos = pos;
              break;
            }
            pos += c;
          }
          cuda_plan::BalancedCursor cur =
              piece_tiles > 0
                  ? cuda_plan::uniform_cursor(
                        part, parts, num_seqs, piece_tiles,
                        part / (parts / num_seqs) < num_seqs ? tiles[part / (parts / num_seqs)] : 0)
                  : cuda_plan::balanced_cursor(part, parts, int(total), first, int(first_pos), num_seqs, whole_short);
          cuda_plan::BalancedPiece pc;
          std::vector<cuda_plan::BalancedPiece> pieces;
          while (cur.next(
              num_seqs, [&](int s) { return tiles[s]; }, pc))
            pieces.push_back(pc);
          int slot_used[2] = {0, 0};
          for (size_t i = 0; i < pieces.size(); ++i) {
            const cuda_plan::BalancedPiece& q = pieces[i];
            ASSERT_GE(q.seq, 0);
            ASSERT_LT(q.seq, num_seqs);
            if (i > 0) EXPECT_GT(q.seq, pieces[i - 1].seq) << "pieces in sequence order";
            parts_of[q.seq].push_back(part);
            if (!q.whole) {
              EXPECT_TRUE(i == 0 || i + 1 == pieces.size()) << "only a part's first or last piece is partial";
              ++slot_used[q.slot];
              states_of[q.seq].push_back(int64_t(part) * 2 + q.slot);
            }
            if (q.first) {
              ++records[q.seq];
              rec[q.seq] = {part, q.parts, q.slot, 0};
            }
            EXPECT_LE(q.tile_begin, q.tile_end);
            EXPECT_LE(q.tile_end, tiles[q.seq]);
            if (tiles[q.seq] > 0) EXPECT_LT(q.tile_begin, q.tile_end) << "a piece holds at least one tile";
            for (int t = q.tile_begin; t < q.tile_end; ++t) covered[q.seq].push_back({part, int(i)});
            ++tile_runs[q.seq];
          }
          EXPECT_LE(slot_used[0], 1);
          EXPECT_LE(slot_used[1], 1);
          if (piece_tiles > 0) {
            EXPECT_LE(pieces.size(), 1u) << "the uniform cut: one piece per part";
            for (const cuda_plan::BalancedPiece& q : pieces) EXPECT_LE(q.tile_end - q.tile_begin, piece_tiles);
          }
        }
        for (int s = 0; s < num_seqs; ++s) {
          SCOPED_TRACE("seq " + std::to_string(s) + " tiles " + std::to_string(tiles[s]));
          EXPECT_EQ(int(covered[s].size()), tiles[s]) << "every tile exactly once";
          EXPECT_EQ(records[s], 1) << "one merge record";
          ASSERT_FALSE(parts_of[s].empty());
          EXPECT_EQ(rec[s].first_part, parts_of[s].front());
          const int64_t per = (total + parts - 1) / parts;
          if (piece_tiles == 0 && whole_short && cuda_plan::balanced_cost(tiles[s]) <= per)
            EXPECT_EQ(parts_of[s].size(), 1u) << "never cut";
          EXPECT_EQ(rec[s].parts, int(parts_of[s].size()));
          for (size_t k = 1; k < parts_of[s].size(); ++k) EXPECT_EQ(parts_of[s][k], parts_of[s][k - 1] + 1);
          if (parts_of[s].size() == 1) {
            EXPECT_TRUE(states_of[s].empty()) << "a sequence inside one part is written directly";
          } else {
            ASSERT_EQ(states_of[s].size(), parts_of[s].size());
            for (size_t k = 0; k < states_of[s].size(); ++k)  // what the combine kernel reads
              EXPECT_EQ(states_of[s][k], int64_t(rec[s].first_part + int(k)) * 2 + (k == 0 ? rec[s].slot : 0));
          }
        }
      }
  }
  EXPECT_GT(uniform_cuts, 20) << "the trials of equal lengths take the uniform cut";
  // The uniform cut where it pays and only there: equal lengths, at least one part per sequence.
  EXPECT_EQ(cuda_plan::uniform_piece_tiles(64, 132, 64 * cuda_plan::balanced_cost(128), 128), 64);  // 64 × 8K
  EXPECT_EQ(cuda_plan::uniform_piece_tiles(16, 66, 16 * cuda_plan::balanced_cost(256), 256), 64);   // 16 × 16K
  EXPECT_EQ(cuda_plan::uniform_piece_tiles(16, 66, 16 * cuda_plan::balanced_cost(1024), 1024), 0);  // 16 × 64K
  EXPECT_EQ(cuda_plan::uniform_piece_tiles(128, 66, 128 * cuda_plan::balanced_cost(128), 128), 0);  // 128 × 8K
  EXPECT_EQ(cuda_plan::uniform_piece_tiles(32, 66,  // every other sequence empty: positional
                                           16 * cuda_plan::balanced_cost(128) + 16 * cuda_plan::balanced_cost(0), 128),
            0);
  // The plan: one wave of CTAs, records and two partial-state slots per part in the workspace.
  MlaDecodeParams p = plan_params(16, 128, 1, 65536);
  const cuda_plan::DecodePlan b = cuda_plan::make_plan(p, 132, 64, cuda_plan::Schedule::kAuto);
  EXPECT_EQ(b.parts, 66);
  EXPECT_EQ(b.grid, 132);
  EXPECT_GE(b.workspace_bytes, size_t(66) * 2 * 128 * (kLatentDim + 1) * 4 + 16 * sizeof(cuda_plan::BalancedRecord));
  p.split_policy = SplitPolicy::kBatchInvariant;  // batch invariance keeps fixed splits
  EXPECT_EQ(cuda_plan::make_plan(p, 132, 64, cuda_plan::Schedule::kAuto).parts, 0);
  // One wave, or whole sequences per CTA, keep the split plan: 64 × 4K (one 4096-key split per sequence),
  // 8 × 4K (one wave of 512-key splits).
  EXPECT_EQ(cuda_plan::make_plan(plan_params(64, 128, 1, 4096), 132, 64, cuda_plan::Schedule::kAuto).parts, 0);
  // 128 × 8K: 128 sequences over 66 parts, two whole sequences per part (no partial state); 128 × 1K keeps its
  // two waves of whole sequences.
  const cuda_plan::DecodePlan w =
      cuda_plan::make_plan(plan_params(128, 128, 1, 8192), 132, 64, cuda_plan::Schedule::kAuto);
  EXPECT_EQ(w.parts, 66);
  EXPECT_TRUE(w.whole_short);
  EXPECT_EQ(cuda_plan::make_plan(plan_params(128, 128, 1, 1024), 132, 64, cuda_plan::Schedule::kAuto).parts, 0);
  EXPECT_FALSE(cuda_plan::make_plan(plan_params(16, 128, 1, 65536), 132, 64, cuda_plan::Schedule::kAuto).whole_short);
  EXPECT_FALSE(cuda_plan::make_plan(plan_params(80, 128, 1, 65536), 132, 64, cuda_plan::Schedule::kAuto).whole_short);
  EXPECT_EQ(cuda_plan::make_plan(plan_params(8, 128, 1, 4096), 132, 64, cuda_plan::Schedule::kAuto).parts, 0);
  EXPECT_EQ(cuda_plan::make_plan(plan_params(32, 128, 1, 16384), 132, 64, cuda_plan::Schedule::kAuto).parts, 66);
  EXPECT_EQ(cuda_plan::make_plan(plan_params(64, 64, 1, 8192), 132, 64, cuda_plan::Schedule::kAuto).parts, 132);
  // The fp8 16/32-row kernel's higher bar (kAutoManyWaves): more than two waves of splits, or more than 8 splits per
  // sequence; two waves of 2-4 splits per sequence keep the split plan.
  const auto many = [](int seqs, int heads, int q_len, int ctx) {
    return cuda_plan::make_plan(plan_params(seqs, heads, q_len, ctx), 132, heads * q_len <= 16 ? 16 : 32,
                                cuda_plan::Schedule::kAutoManyWaves)
        .parts;
  };
  EXPECT_EQ(many(32, 16, 1, 32768), 132);   // 512 CTAs: 3.9 waves
  EXPECT_EQ(many(16, 16, 1, 131072), 132);  // 1024 CTAs
  EXPECT_EQ(many(4, 16, 1, 131072), 132);   // 256 CTAs of 64 splits per sequence
  EXPECT_EQ(many(128, 16, 1, 4096), 0);     // 256 CTAs of 2 splits per sequence
  EXPECT_EQ(many(64, 16, 2, 8192), 0);      // 256 CTAs of 4 splits per sequence, 32 rows
}

// The fused merge (a kernel that can merge, `fused`): where every sequence has at most kFusedMaxStates states (split
// plans) or the parts are at most kFusedMaxStates per sequence (balanced), with the counters in the workspace.
TEST(SplitPolicyPlan, FusedMergeWhereStatesAreFew) {
  auto plan = [](int seqs, int heads, int ctx, bool fused) {
    return cuda_plan::make_plan(plan_params(seqs, heads, 1, ctx), 132, 64, cuda_plan::Schedule::kAuto, fused);
  };
  const cuda_plan::DecodePlan two = plan(32, 128, 4096, true);  // 2 splits of 2048
  EXPECT_EQ(two.parts, 0);
  EXPECT_EQ(two.max_splits, 2);
  EXPECT_TRUE(two.fused_merge);
  EXPECT_GE(two.ws_counter_offset, size_t(32) * 2 * 128 * (kLatentDim + 1) * 4);
  EXPECT_EQ(two.workspace_bytes, two.ws_counter_offset + 32 * 2 * sizeof(int));
  EXPECT_FALSE(plan(32, 128, 4096, false).fused_merge);
  EXPECT_EQ(plan(32, 128, 4096, false).workspace_bytes, two.ws_counter_offset);
  EXPECT_FALSE(plan(1, 128, 32768, true).fused_merge);   // 64 splits: the combine kernel
  EXPECT_TRUE(plan(32, 128, 16384, true).fused_merge);   // balanced, 66 parts for 32 sequences
  EXPECT_FALSE(plan(16, 128, 16384, true).fused_merge);  // balanced, 66 parts for 16 sequences
  EXPECT_FALSE(plan(4, 16, 131072, true).fused_merge);   // balanced, 132 parts for 4 sequences
  EXPECT_FALSE(plan(128, 128, 1024, true).fused_merge);  // one split per sequence: nothing to merge
  // Balanced with the combine kernel: the merge flag after the states (the combine kernel exits while it is 0).
  const cuda_plan::DecodePlan bal = plan(16, 128, 16384, false);
  EXPECT_GT(bal.parts, 0);
  EXPECT_GT(bal.ws_merges_offset, 0u);
  EXPECT_EQ(bal.workspace_bytes, bal.ws_merges_offset + sizeof(int));
  EXPECT_EQ(two.ws_merges_offset, 0u);
  EXPECT_EQ(plan(32, 128, 16384, true).ws_merges_offset, 0u);  // fused: its own counters
}

// ---- oracle ---------------------------------------------------------------------------------------

// fp32 out + natural LSE and bf16 out + base-2 LSE under kFillDevice, sentinel-guarded.
::testing::AssertionResult fill_matches_oracle(Backend& cuda, const synthetic::Config& cfg) {
  const synthetic::Problem prob = make_problem(cfg);
  const DecodeBuffers want = expected_decode(prob, LseBase::kE);
  const DeviceProblem dev(prob);
  for (const auto& [dt, base] : {std::pair{DType::kFP32, LseBase::kE}, std::pair{DType::kBF16, LseBase::k2}}) {
    ::testing::AssertionResult r = device_decode_matches(
        cuda, prob, dev, want, dt, base, describe(cfg) + " split_policy=fill out=" + dtype_name(dt),
        [](MlaDecodeParams& p) { p.split_policy = SplitPolicy::kFillDevice; });
    if (!r) return r;
  }
  return ::testing::AssertionSuccess();
}

// Workspace of the two policies for a problem: kFillDevice must plan more splits on these shapes.
void expect_more_splits(Backend& cuda, const synthetic::Config& cfg) {
  const synthetic::Problem prob = make_problem(cfg);
  MlaDecodeParams p = prob.params(nullptr, DType::kFP32, nullptr);
  p.split_policy = SplitPolicy::kBatchInvariant;
  const size_t inv = cuda.workspace_bytes(p);
  p.split_policy = SplitPolicy::kFillDevice;
  EXPECT_GT(cuda.workspace_bytes(p), inv) << describe(cfg) << ": kFillDevice should cut this shape finer";
}

struct Case {
  std::string name;
  synthetic::Config cfg;
  bool finer = true;  // kFillDevice needs more workspace than kBatchInvariant (more, shorter splits)
};

// What gtest prints for a failing parameter: the case name and its shape, not the struct's bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name << " (" << describe(c.cfg) << ")"; }

std::vector<Case> fill_cases() {
  std::vector<Case> cases;
  uint64_t seed = 700;
  auto add = [&](std::string name, synthetic::Config c, bool finer = true) {
    c.seed = ++seed;
    cases.push_back({std::move(name), std::move(c), finer});
  };
  add("one_seq_h16", config(16, 1, 64, {3000}, 0));
  add("one_seq_h128", config(128, 1, 64, {5000}, 0));  // 2 row chunks of 64 (the Hopper kernel on sm_90)
  // At most 4 splits per sequence (H200: 4 of 256 keys): merged by the Hopper kernel itself.
  add("eight_seqs_h128_fused", config(128, 1, 64, {1000, 900, 1, 0, 800, 1020, 64, 990}, 0));
  add("two_seqs_h64_empty_rows", config(64, 1, 64, {4100, 0}, 0));
  add("qlen3_h32", config(32, 3, 32, {2600, 3, 700}, 0));  // causal rule across short splits
  add("qlen4_h8_fp8", config(8, 4, 64, {3300, 4}, 0, DType::kFP8E4M3));
  // DCP shards of one global problem: every rank, interleave 1 and 64, an empty shard, q_len 1 and 2.
  for (int il : {1, 64})
    for (int r = 0; r < 2; ++r)
      for (int q : {1, 2})
        add("dcp_w2_i" + std::to_string(il) + "_r" + std::to_string(r) + "_q" + std::to_string(q),
            config(128, q, 64, {q, 40, 6000}, 0, DType::kBF16, {2, r, il}));
  add("dcp_w4_i1_r3_fp8", config(16, 2, 64, {2, 9000}, 0, DType::kFP8E4M3, {4, 3, 1}));
  // Many sequences of mixed lengths (empty, one key, tile edges, long): on Hopper the balanced schedule
  // puts several sequences in one part and spreads the long ones over several, on pages of 64, 32, 16.
  const std::vector<int> mixed = {0, 1, 63, 64, 65, 700, 0, 2049, 130, 4100, 5, 0, 333, 9000, 64, 1500, 2, 0, 6500};
  add("mixed_h64_bs64", config(64, 1, 64, mixed, 0), false);
  std::vector<int> mixed_q2 = mixed;  // a non-empty sequence holds at least its q_len new tokens
  for (int& l : mixed_q2) l = l == 1 ? 2 : l;
  add("mixed_h128_q2_bs32", config(128, 2, 32, mixed_q2, 0), false);
  add("mixed_h32_bs16", config(32, 1, 16, mixed, 0), false);
  add("mixed_h16_fp8_bs64", config(16, 1, 64, mixed, 0, DType::kFP8E4M3), false);  // the Hopper fp8 kernel
  // 132 short sequences at 128 heads: two per part on an H200, never cut (the balanced schedule's whole mode).
  std::vector<int> many(132);
  for (size_t i = 0; i < many.size(); ++i) many[i] = int((i * 37) % 301);
  add("many_h128_whole", config(128, 1, 64, many, 0), false);
  // One long sequence among short ones: the balanced schedule cuts it into many parts while the batch still has
  // few parts per sequence, so the fused merge takes a sequence of dozens of states (more than a warp's 32 lanes).
  std::vector<int> one_long(40);
  for (size_t i = 0; i < one_long.size(); ++i) one_long[i] = int(1 + (i * 13) % 50);
  one_long[7] = 12000;
  add("one_long_h64_fused", config(64, 1, 64, one_long, 0), false);
  return cases;
}

class SplitPolicyOracle : public ::testing::TestWithParam<Case> {};

TEST_P(SplitPolicyOracle, FillDeviceMatchesReference) {
  MLADCP_SKIP_WITHOUT_GPU();
  auto cuda = make_backend("cuda");
  if (GetParam().finer) expect_more_splits(*cuda, GetParam().cfg);
  EXPECT_TRUE(fill_matches_oracle(*cuda, GetParam().cfg));
  // Both schedules of the Hopper kernels whatever the automatic choice (elsewhere the option is ignored), with the
  // states always merged by the combine kernel (the default) and by the kernel itself where they are few.
  for (const cuda_plan::Schedule schedule : {cuda_plan::Schedule::kSplits, cuda_plan::Schedule::kBalanced})
    for (const bool fused : {false, true}) {
      CudaBackendOptions o;
      o.fill_schedule = schedule;
      o.fused_merge = fused;
      auto forced = make_cuda_backend(o);
      EXPECT_TRUE(fill_matches_oracle(*forced, GetParam().cfg))
          << (schedule == cuda_plan::Schedule::kBalanced ? "balanced" : "splits") << " schedule"
          << (fused ? ", fused merge" : "");
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, SplitPolicyOracle, ::testing::ValuesIn(fill_cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

// The same plan's states merged by the Hopper kernel itself and by the combine kernel: the same bits (batch
// invariance across the two merges), also for rows of more than 8 states (the combine kernel's mode where the
// CTA's warps each sum a chain of states) and of more than 32 (more states than a warp's lanes).
TEST(SplitPolicy, FusedMergeMatchesCombineBitwise) {
  MLADCP_SKIP_WITHOUT_GPU();
  std::vector<int> one_long(40);
  for (size_t i = 0; i < one_long.size(); ++i) one_long[i] = int(1 + (i * 17) % 60);
  one_long[3] = 14000;
  const std::vector<synthetic::Config> cfgs = {config(64, 1, 64, one_long, 31),
                                               config(128, 1, 64, {1000, 900, 1, 0, 800, 1020, 64, 990}, 32)};
  for (const synthetic::Config& cfg : cfgs) {
    const synthetic::Problem prob = make_problem(cfg);
    const DeviceProblem dev(prob);
    const size_t T = size_t(prob.num_tokens()), H = size_t(cfg.num_heads);
    for (const cuda_plan::Schedule schedule : {cuda_plan::Schedule::kSplits, cuda_plan::Schedule::kBalanced}) {
      std::vector<uint8_t> out_bytes[2], lse_bytes[2];
      for (const bool fused : {false, true}) {
        CudaBackendOptions o;
        o.fill_schedule = schedule;
        o.fused_merge = fused;
        auto cuda = make_cuda_backend(o);
        GuardedBuffer out(DType::kBF16, T * H * kLatentDim), lse(DType::kFP32, T * H);
        MlaDecodeParams p = dev.params(prob, out.data(), DType::kBF16, lse.as<float>(), LseBase::kE);
        p.split_policy = SplitPolicy::kFillDevice;
        MLADCP_ASSERT_OK(run_device_decode(*cuda, p));
        ASSERT_TRUE(out.download(&out_bytes[fused]));
        ASSERT_TRUE(lse.download(&lse_bytes[fused]));
      }
      const char* what = schedule == cuda_plan::Schedule::kBalanced ? "balanced" : "splits";
      EXPECT_EQ(out_bytes[0], out_bytes[1]) << describe(cfg) << " (" << what << "): out differs between the merges";
      EXPECT_EQ(lse_bytes[0], lse_bytes[1]) << describe(cfg) << " (" << what << "): lse differs between the merges";
    }
  }
}

// The pair merge (a split plan of two splits per sequence on the Hopper 64-row kernel: each sequence's two split
// CTAs run as a cluster and merge their states in shared memory) against the oracle, and bit for bit against the
// combine kernel on the same plan (batch invariance across the two merges): both policies, sequences of one and two
// splits and empty ones, 16-128 heads, q_len 2, pages of 16-64 keys, fp8, a DCP shard, bf16 and fp32 outputs.
TEST(SplitPolicy, PairMergeMatchesCombineBitwise) {
  MLADCP_SKIP_WITHOUT_GPU();
  const std::vector<int> lens = {4096, 3001, 2049, 2048, 1, 0, 4000, 17, 2111};
  const std::vector<int> lens_q2 = {4096, 3001, 2049, 2048, 2, 0, 4000, 17, 2111};  // q_len 2: at least 2 tokens
  std::vector<int> wide(32);  // kFillDevice: two splits of 2048 fill one wave at 128 heads (64 CTAs per split index)
  for (size_t i = 0; i < wide.size(); ++i) wide[i] = int(4096 - (i * 389) % 4000);
  wide[5] = 0;
  wide[9] = 2048;
  const std::vector<synthetic::Config> cfgs = {
      config(128, 1, 64, lens, 41),
      config(64, 2, 32, lens_q2, 42),
      config(16, 1, 64, lens, 43),
      config(128, 1, 64, lens, 44, DType::kFP8E4M3),
      config(128, 1, 16, {8192, 6000, 4097, 30, 0, 4200}, 45, DType::kBF16, {2, 1, 1}),
      config(128, 1, 64, wide, 46)};
  for (const synthetic::Config& cfg : cfgs) {
    const synthetic::Problem prob = make_problem(cfg);
    const DecodeBuffers want = expected_decode(prob, LseBase::kE);
    const DeviceProblem dev(prob);
    const size_t T = size_t(prob.num_tokens()), H = size_t(cfg.num_heads);
    const bool fill_is_pair = cfg.seq_lens.size() == wide.size();
    for (const SplitPolicy policy : {SplitPolicy::kBatchInvariant, SplitPolicy::kFillDevice}) {
      if (policy == SplitPolicy::kFillDevice && !fill_is_pair) continue;  // many short splits there: no pair
      for (const DType out_dtype : {DType::kBF16, DType::kFP32}) {
        std::vector<uint8_t> out_bytes[2], lse_bytes[2];
        for (const bool pair : {false, true}) {
          CudaBackendOptions o;
          o.pair_merge = pair;
          o.fill_schedule = cuda_plan::Schedule::kSplits;
          auto cuda = make_cuda_backend(o);
          const std::string what = describe(cfg) + (policy == SplitPolicy::kFillDevice ? " fill" : " invariant") +
                                   " out=" + dtype_name(out_dtype) + (pair ? " pair merge" : " combine kernel");
          EXPECT_TRUE(device_decode_matches(*cuda, prob, dev, want, out_dtype, LseBase::k2, what,
                                            [&](MlaDecodeParams& p) { p.split_policy = policy; }));
          GuardedBuffer out(out_dtype, T * H * kLatentDim), lse(DType::kFP32, T * H);
          MlaDecodeParams p = dev.params(prob, out.data(), out_dtype, lse.as<float>(), LseBase::kE);
          p.split_policy = policy;
          if (policy == SplitPolicy::kFillDevice && pair)
            EXPECT_EQ(cuda->workspace_bytes(p), 0u) << what << ": not planned as a pair merge";
          MLADCP_ASSERT_OK(run_device_decode(*cuda, p));
          ASSERT_TRUE(out.download(&out_bytes[pair]));
          ASSERT_TRUE(lse.download(&lse_bytes[pair]));
        }
        EXPECT_EQ(out_bytes[0], out_bytes[1]) << describe(cfg) << ": out differs between the merges";
        EXPECT_EQ(lse_bytes[0], lse_bytes[1]) << describe(cfg) << ": lse differs between the merges";
      }
    }
  }
}

// The balanced schedule in clusters (two or four parts per sequence on the Hopper 64-row kernel): under the uniform cut
// the pieces of a sequence merge in their cluster; with lengths that differ (the positional cut), and in clusters of
// four for a sequence of two or three pieces, the parts write states for the combine kernel. Against the oracle, and
// bit for bit against the plain balanced plan (states merged by the combine kernel): sequences of all pieces, of fewer
// (one: written directly), empty, 64 and 128 heads, fp8, bf16 and fp32 outputs. The batch holds parts / 2 or
// parts / 4 sequences (parts: SMs / row chunks, rounded down to a multiple of 4).
TEST(SplitPolicy, PairMergeOfBalancedPartsMatchesCombineBitwise) {
  MLADCP_SKIP_WITHOUT_GPU();
  int device = 0, sms = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), cudaSuccess);
  const auto lengths = [](int n, int len) {
    std::vector<int> lens(size_t(n), len);
    lens[1] = 0;        // the empty sequence's placeholder piece, written directly
    lens[2] = len / 2;  // one piece, written directly
    lens[3] = len - 1;  // a partial last tile
    return lens;
  };
  std::vector<int> mixed(size_t(sms / 2));  // lengths far from equal: the positional cut
  for (size_t i = 0; i < mixed.size(); ++i) mixed[i] = int(1 + (i * 389) % 1700);
  mixed[4] = 0;
  std::vector<int> quad = lengths(sms / 8, 1300);  // 128 heads, four parts per sequence (132 SMs: 16 of 64 parts)
  quad[5] = 1000;                                  // three pieces of 6 tiles (and [2], two): the combine kernel
  const std::vector<synthetic::Config> cfgs = {
      config(64, 1, 64, lengths(sms / 2, 640), 47), config(128, 1, 64, lengths(sms / 4, 800), 48),
      config(64, 1, 32, lengths(sms / 2, 300), 49, DType::kFP8E4M3), config(64, 1, 64, mixed, 50),
      config(128, 1, 64, quad, 51),
      // Four parts per sequence at one row chunk (132 SMs: 32 sequences of 128 or 132 parts).
      config(64, 1, 64, lengths(sms / 4 - 1, 1000), 52),
      config(64, 1, 64, lengths(sms / 4 - 1, 500), 53, DType::kFP8E4M3)};
  for (const synthetic::Config& cfg : cfgs) {
    const synthetic::Problem prob = make_problem(cfg);
    const DecodeBuffers want = expected_decode(prob, LseBase::kE);
    const DeviceProblem dev(prob);
    const size_t T = size_t(prob.num_tokens()), H = size_t(cfg.num_heads);
    for (const DType out_dtype : {DType::kBF16, DType::kFP32}) {
      std::vector<uint8_t> out_bytes[2], lse_bytes[2];
      for (const bool pair : {false, true}) {
        CudaBackendOptions o;
        o.balanced_clusters = pair;
        o.balanced_quads = pair;
        o.fill_schedule = cuda_plan::Schedule::kBalanced;
        auto cuda = make_cuda_backend(o);
        const std::string what =
            describe(cfg) + " out=" + dtype_name(out_dtype) + (pair ? " balanced pairs" : " balanced, combine kernel");
        const auto fill = [](MlaDecodeParams& p) { p.split_policy = SplitPolicy::kFillDevice; };
        EXPECT_TRUE(device_decode_matches(*cuda, prob, dev, want, out_dtype, LseBase::k2, what, fill));
        GuardedBuffer out(out_dtype, T * H * kLatentDim), lse(DType::kFP32, T * H);
        MlaDecodeParams p = dev.params(prob, out.data(), out_dtype, lse.as<float>(), LseBase::kE);
        fill(p);
        MLADCP_ASSERT_OK(run_device_decode(*cuda, p));
        ASSERT_TRUE(out.download(&out_bytes[pair]));
        ASSERT_TRUE(lse.download(&lse_bytes[pair]));
      }
      EXPECT_EQ(out_bytes[0], out_bytes[1]) << describe(cfg) << ": out differs between the merges";
      EXPECT_EQ(lse_bytes[0], lse_bytes[1]) << describe(cfg) << ": lse differs between the merges";
    }
  }
}

// Head groups with padded strides under both policies: CudaDecode.HeadGroupsWithPaddedStrides.

// kFillDevice is deterministic for a given batch, eager and in a CUDA graph.
TEST(SplitPolicy, FillDeviceDeterministicAndGraphCapturable) {
  MLADCP_SKIP_WITHOUT_GPU();
  const int H = 128;
  const synthetic::Problem prob = make_problem(config(H, 1, 64, {7000, 33}, 91));
  DeviceProblem dev(prob);
  auto cuda = make_backend("cuda");
  const size_t T = size_t(prob.num_tokens());
  GuardedBuffer out(DType::kBF16, T * H * kLatentDim), lse(DType::kFP32, T * H);
  MlaDecodeParams p = dev.params(prob, out.data(), DType::kBF16, lse.as<float>(), LseBase::kE);
  p.split_policy = SplitPolicy::kFillDevice;
  ::testing::AssertionResult ok = ::testing::AssertionSuccess();
  MLADCP_ASSERT_OK(run_device_decode(*cuda, p));
  std::vector<uint8_t> first_out, first_lse, out_bytes, lse_bytes;
  ASSERT_TRUE(out.download(&first_out));
  ASSERT_TRUE(lse.download(&first_lse));
  MLADCP_ASSERT_OK(run_device_decode(*cuda, p));
  ASSERT_TRUE(out.download(&out_bytes));
  ASSERT_TRUE(lse.download(&lse_bytes));
  EXPECT_EQ(out_bytes, first_out) << "two identical kFillDevice calls gave different bits";
  EXPECT_EQ(lse_bytes, first_lse) << "two identical kFillDevice calls gave different bits";

  DeviceBuffer ws;
  MLADCP_ASSERT_OK(ws.allocate(cuda->workspace_bytes(p)));
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ExecContext ctx;
  ctx.stream = stream;
  ctx.workspace = ws.data();
  ctx.workspace_size = ws.size();
  ASSERT_EQ(cudaMemsetAsync(p.out, 0, T * H * kLatentDim * 2, stream), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  const Status s = cuda->decode(p, ctx);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  MLADCP_ASSERT_OK(s);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ASSERT_TRUE(out.download(&out_bytes));
  ASSERT_TRUE(lse.download(&lse_bytes));
  EXPECT_EQ(out_bytes, first_out) << "the replayed graph differs from the eager call";
  EXPECT_EQ(lse_bytes, first_lse) << "the replayed graph differs from the eager call";
  (void)cudaGraphExecDestroy(exec);
  (void)cudaGraphDestroy(graph);
  (void)cudaStreamDestroy(stream);
  (void)ok;
}

// ---- validation ---------------------------------------------------------------------------------

// An unknown policy is an argument error naming split_policy on every backend, and writes nothing.
TEST(SplitPolicy, UnknownPolicyRejected) {
  const synthetic::Problem prob = make_problem(config(16, 1, 16, {40, 3}, 5));
  for (const char* name : {"cpu-reference", "cpu", "cuda"}) {
    if (std::string(name) == "cuda" && cuda_device_count() == 0) continue;
    auto be = make_backend(name);
    const size_t T = size_t(prob.num_tokens()), H = 16;
    if (std::string(name) == "cuda") {
      DeviceProblem dev(prob);
      GuardedBuffer out(DType::kFP32, T * H * kLatentDim), lse(DType::kFP32, T * H);
      MlaDecodeParams p = dev.params(prob, out.data(), DType::kFP32, lse.as<float>(), LseBase::kE);
      p.split_policy = static_cast<SplitPolicy>(7);
      const Status s = run_device_decode(*be, p);
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << name << ": " << s.to_string();
      EXPECT_NE(s.message().find("split_policy"), std::string::npos) << name << ": " << s.to_string();
      ::testing::AssertionResult ok = ::testing::AssertionSuccess();
      const std::vector<float> got = out.download_float(&ok);
      EXPECT_EQ(count_sentinels(got), got.size()) << name << ": out written on an argument error";
    } else {
      std::vector<float> out(T * H * kLatentDim), lse(T * H);
      fill_sentinel(out.data(), DType::kFP32, out.size());
      fill_sentinel(lse.data(), DType::kFP32, lse.size());
      MlaDecodeParams p = prob.params(out.data(), DType::kFP32, lse.data());
      p.split_policy = static_cast<SplitPolicy>(-1);
      ExecContext ctx;
      const Status s = be->decode(p, ctx);
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << name << ": " << s.to_string();
      EXPECT_NE(s.message().find("split_policy"), std::string::npos) << name << ": " << s.to_string();
      EXPECT_EQ(count_sentinels(out), out.size()) << name << ": out written on an argument error";
      // A valid policy is accepted (and ignored) by host backends.
      p.split_policy = SplitPolicy::kFillDevice;
      EXPECT_TRUE(be->decode(p, ctx).ok()) << name;
    }
  }
}

}  // namespace
}  // namespace mladcp::test
