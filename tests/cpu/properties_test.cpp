// Properties of host decode that the oracle comparison alone does not pin down: split invariance
// (DCP's correctness condition), block-table permutation invariance, poisoned padding and unused
// pages, huge ids in unused block-table entries, head groups and strides, thread-count determinism,
// and that asking for no LSE changes nothing else.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "common/decode_check.h"
#include "cpu/backends_under_test.h"
#include "mladcp/merge.h"

namespace mladcp::test {
namespace {

synthetic::Config base_config(uint64_t seed, int heads, int q_len, int block, DType kv, std::vector<int32_t> lens) {
  synthetic::Config c;
  c.seed = seed;
  c.num_heads = heads;
  c.q_len = q_len;
  c.block_size = block;
  c.kv_dtype = kv;
  c.kv_scale = kv == DType::kFP8E4M3 ? 0.5f : 1.0f;
  c.seq_lens = std::move(lens);
  c.num_seqs = int(c.seq_lens.size());
  return c;
}

bool same_bits(const DecodeBuffers& a, const DecodeBuffers& b) {
  if (a.out != b.out || a.lse.has_value() != b.lse.has_value()) return false;
  return !a.lse || std::memcmp(a.lse->data(), b.lse->data(), a.lse->size() * sizeof(float)) == 0;
}

// Decode over all keys == merge (MergeParams) of the decodes over the W shards of the same problem.
TEST(SplitInvarianceTest, MergeOfShardsEqualsDecodeOverAllKeys) {
  for (const BackendUnderTest& b : host_backends_under_test()) {
    if (b.label == "cpu-reference") continue;  // the oracle is the expectation below
    std::unique_ptr<Backend> backend = b.make();
    uint64_t seed = 40;
    for (int world : {1, 2, 3, 4}) {
      for (int interleave : {1, 2, 16}) {
        for (LseBase base : {LseBase::kE, LseBase::k2}) {
          ++seed;
          synthetic::Config global =
              base_config(seed, 8, 1 + int(seed % 4), 16, seed % 3 ? DType::kBF16 : DType::kFP8E4M3,
                          {3 + int32_t(seed % 4), 0, 40, 97, 130});
          const synthetic::Problem whole = make_problem(global);
          const DecodeBuffers want = expected_decode(whole, base);
          const int T = whole.num_tokens(), H = global.num_heads;
          // Partial states of every rank, stacked [W, T, H, 512] and [W, T, H].
          std::vector<float> parts(size_t(world) * T * H * kLatentDim), lses(size_t(world) * T * H);
          for (int r = 0; r < world; ++r) {
            synthetic::Config shard = global;
            shard.shard = DcpShard{world, r, interleave};
            DecodeBuffers got(T, H, DType::kFP32, base);
            ASSERT_TRUE(run_decode(*backend, make_problem(shard), got).ok());
            std::memcpy(&parts[size_t(r) * T * H * kLatentDim], got.out.data(), got.out.size());
            std::memcpy(&lses[size_t(r) * T * H], got.lse->data(), got.lse->size() * sizeof(float));
          }
          DecodeBuffers merged(T, H, DType::kFP32, base);
          MergeParams m;
          m.num_states = world;
          m.num_tokens = T;
          m.num_heads = H;
          m.in_out = parts.data();
          m.in_dtype = DType::kFP32;
          m.in_lse = lses.data();
          m.in_base = base;
          m.out = merged.out.data();
          m.out_dtype = DType::kFP32;
          m.out_lse = merged.lse_ptr();
          m.out_base = base;
          ASSERT_TRUE(backend->merge(m, {}).ok());
          EXPECT_TRUE(compare_decode(merged, want,
                                     b.label + " merged over W=" + std::to_string(world) +
                                         " I=" + std::to_string(interleave) + " on " + describe(global)));
        }
      }
    }
  }
}

// Physical block placement is invisible: the same keys in other pages give the same bits.
TEST(BlockTableTest, PermutingPhysicalBlocksChangesNothing) {
  for (const BackendUnderTest& b : host_backends_under_test()) {
    std::unique_ptr<Backend> backend = b.make();
    for (int block : {1, 16, 64}) {
      const synthetic::Config c = base_config(60 + block, 16, 2, block, DType::kBF16, {70, 2, 0, 131});
      const synthetic::Problem p = make_problem(c);
      synthetic::Problem moved = p;
      std::vector<int32_t> perm(size_t(p.num_blocks));
      std::iota(perm.begin(), perm.end(), 0);
      std::mt19937_64 rng(7 + block);
      std::shuffle(perm.begin(), perm.end(), rng);
      const size_t block_bytes = size_t(block) * kQkDim * dtype_size(c.kv_dtype);
      for (int old_id = 0; old_id < p.num_blocks; ++old_id)
        std::memcpy(&moved.kv_cache[size_t(perm[size_t(old_id)]) * block_bytes],
                    &p.kv_cache[size_t(old_id) * block_bytes], block_bytes);
      for (int32_t& id : moved.block_table)
        if (id >= 0 && id < p.num_blocks) id = perm[size_t(id)];
      DecodeBuffers x(p.num_tokens(), c.num_heads, DType::kFP32, LseBase::kE);
      DecodeBuffers y(p.num_tokens(), c.num_heads, DType::kFP32, LseBase::kE);
      ASSERT_TRUE(run_decode(*backend, p, x).ok());
      ASSERT_TRUE(run_decode(*backend, moved, y).ok());
      EXPECT_TRUE(same_bits(x, y)) << b.label << " on " << describe(c);
    }
  }
}

// Unused slots and pages hold NaN (synthetic poisons them) and unused block-table entries hold huge
// ids: the result equals the one on a clean cache, bit for bit, and the ids are not rejected.
TEST(PoisonTest, NanPaddingAndHugeUnusedIdsAreNeverRead) {
  for (const BackendUnderTest& b : host_backends_under_test()) {
    std::unique_ptr<Backend> backend = b.make();
    for (DType kv : {DType::kBF16, DType::kFP8E4M3}) {
      synthetic::Config c = base_config(80, 16, 3, 16, kv, {5, 0, 17, 3, 66});
      c.shard = DcpShard{2, 1, 2};
      c.poison = true;
      synthetic::Problem poisoned = make_problem(c);
      // Every entry past a sequence's blocks: huge, negative or the largest int.
      int unused = 0;
      for (int s = 0; s < c.num_seqs; ++s) {
        const int64_t local = sharding::local_len(c.seq_lens[size_t(s)], 2, 1, 2);
        const int64_t used = (local + c.block_size - 1) / c.block_size;
        for (int64_t i = used; i < poisoned.max_blocks_per_seq; ++i) {
          int32_t& id = poisoned.block_table[size_t(s) * poisoned.max_blocks_per_seq + i];
          id = (++unused % 3 == 0) ? -1 : (unused % 3 == 1 ? INT32_MAX : synthetic::kUnusedBlockId);
        }
      }
      ASSERT_GT(unused, 0);
      c.poison = false;
      const synthetic::Problem clean = make_problem(c);
      DecodeBuffers x(poisoned.num_tokens(), c.num_heads, DType::kFP32, LseBase::k2);
      DecodeBuffers y(clean.num_tokens(), c.num_heads, DType::kFP32, LseBase::k2);
      const Status s = run_decode(*backend, poisoned, x);
      ASSERT_TRUE(s.ok()) << b.label << ": " << s.to_string();
      ASSERT_TRUE(run_decode(*backend, clean, y).ok());
      EXPECT_TRUE(same_bits(x, y)) << b.label << " on " << describe(c);
      EXPECT_EQ(count_sentinels(x.out.data(), DType::kFP32, x.out_elems()), 0u);
      for (float v : x.out_float()) ASSERT_FALSE(std::isnan(v)) << b.label;
    }
  }
}

// Head groups (the DCP gather layout [G, T, Hg, ...]) and padded strides: same bits as the plain
// layout, and nothing written outside the rows.
TEST(LayoutTest, HeadGroupsAndStridesMatchThePlainLayout) {
  for (const BackendUnderTest& b : host_backends_under_test()) {
    std::unique_ptr<Backend> backend = b.make();
    const int H = 12, G = 3, Hg = H / G;
    const synthetic::Config c = base_config(90, H, 2, 16, DType::kBF16, {40, 0, 2, 77});
    const synthetic::Problem p = make_problem(c);
    const int T = p.num_tokens();
    DecodeBuffers plain(T, H, DType::kFP32, LseBase::kE);
    ASSERT_TRUE(run_decode(*backend, p, plain).ok());

    // Grouped, with gaps: q head stride 600, token stride Hg*600+8; out head stride 520, token
    // stride Hg*520+4, group stride T*token+16; lse token stride Hg+1, group stride T*(Hg+1)+3.
    const int64_t qh = 600, qt = Hg * qh + 8, qg = T * qt + 32;
    const int64_t oh = 520, ot = Hg * oh + 4, og = T * ot + 16;
    const int64_t lt = Hg + 1, lg = T * lt + 3;
    std::vector<uint16_t> q(size_t(G * qg), 0x7fc0);
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h)
        std::memcpy(&q[size_t((h / Hg) * qg + t * qt + (h % Hg) * qh)], &p.q[(size_t(t) * H + h) * kQkDim],
                    kQkDim * sizeof(uint16_t));
    std::vector<float> out(size_t(G * og)), lse(size_t(G * lg));
    fill_sentinel(out);
    fill_sentinel(lse);
    MlaDecodeParams params = p.params(out.data(), DType::kFP32, lse.data(), LseBase::kE);
    params.head_group_size = Hg;
    params.q = q.data();
    params.q_stride_head = qh;
    params.q_stride_token = qt;
    params.q_stride_group = qg;
    params.out_stride_head = oh;
    params.out_stride_token = ot;
    params.out_stride_group = og;
    params.lse_stride_token = lt;
    params.lse_stride_group = lg;
    ASSERT_TRUE(backend->decode(params, {}).ok()) << b.label;

    const std::vector<float> want = plain.out_float();
    size_t written = 0;
    for (int t = 0; t < T; ++t) {
      for (int h = 0; h < H; ++h) {
        const float* row = &out[size_t((h / Hg) * og + t * ot + (h % Hg) * oh)];
        ASSERT_EQ(std::memcmp(row, &want[(size_t(t) * H + h) * kLatentDim], kLatentDim * sizeof(float)), 0)
            << b.label << " token " << t << " head " << h;
        const float l = lse[size_t((h / Hg) * lg + t * lt + (h % Hg))];
        const float w = (*plain.lse)[size_t(t) * H + h];
        ASSERT_TRUE(l == w || (std::isinf(l) && std::isinf(w))) << b.label;
        written += kLatentDim;
      }
    }
    // Every gap still holds the sentinel.
    EXPECT_EQ(out.size() - count_sentinels(out), written) << b.label;
    EXPECT_EQ(lse.size() - count_sentinels(lse), size_t(T * H)) << b.label;
  }
}

// The thread count never changes the bits; no LSE requested changes nothing else.
TEST(DeterminismTest, ThreadCountAndLseRequestDoNotChangeTheOutput) {
  for (const BackendUnderTest& b : host_backends_under_test()) {
    std::unique_ptr<Backend> backend = b.make();
    const synthetic::Config c = base_config(95, 32, 2, 64, DType::kFP8E4M3, {900, 2, 0, 300, 1500});
    const synthetic::Problem p = make_problem(c);
    DecodeBuffers first(p.num_tokens(), c.num_heads, DType::kBF16, LseBase::kE);
    ExecContext one;
    one.num_threads = 1;
    const Status s = run_decode(*backend, p, first, one);
    ASSERT_TRUE(s.ok()) << b.label << ": " << s.to_string();
    for (int threads : {0, 2, 3}) {
      ExecContext ctx;
      ctx.num_threads = threads;
      DecodeBuffers again(p.num_tokens(), c.num_heads, DType::kBF16, LseBase::kE);
      ASSERT_TRUE(run_decode(*backend, p, again, ctx).ok());
      EXPECT_TRUE(same_bits(first, again)) << b.label << " with " << threads << " threads";
    }
    DecodeBuffers no_lse(p.num_tokens(), c.num_heads, DType::kBF16, std::nullopt);
    ASSERT_TRUE(run_decode(*backend, p, no_lse).ok());
    EXPECT_EQ(no_lse.out, first.out) << b.label;
  }
}

// The oracle itself on a case small enough to check by hand: one key gives out = kv_c and
// lse = score; two equal keys give lse = score + ln 2; base 2 is base e times log2(e).
TEST(ReferenceTest, HandCheckedRows) {
  synthetic::Config c = base_config(3, 2, 2, 4, DType::kBF16, {2, 0});
  synthetic::Problem p = make_problem(c);
  // Make key 1 a copy of key 0 (both in the sequence's first block).
  uint16_t* kv = reinterpret_cast<uint16_t*>(p.kv_cache.data());
  const size_t b0 = size_t(p.block_table[0]) * 4 * kQkDim;
  std::memcpy(kv + b0 + kQkDim, kv + b0, kQkDim * sizeof(uint16_t));
  std::unique_ptr<Backend> oracle = make_backend("cpu-reference");
  DecodeBuffers e(p.num_tokens(), 2, DType::kFP32, LseBase::kE), two(p.num_tokens(), 2, DType::kFP32, LseBase::k2);
  ASSERT_TRUE(run_decode(*oracle, p, e).ok());
  ASSERT_TRUE(run_decode(*oracle, p, two).ok());
  const std::vector<float> out = e.out_float();
  for (int t = 0; t < 2; ++t) {
    for (int h = 0; h < 2; ++h) {
      double dot = 0.0;
      for (int d = 0; d < kQkDim; ++d)
        dot += double(numeric::bf16_to_float(p.q[(size_t(t) * 2 + h) * kQkDim + d])) *
               double(numeric::bf16_to_float(kv[b0 + size_t(d)]));
      const double score = double(c.softmax_scale) * dot;
      const double want_lse = t == 0 ? score : score + std::log(2.0);
      EXPECT_NEAR((*e.lse)[size_t(t) * 2 + h], want_lse, 1e-5 * (1 + std::fabs(want_lse)));
      EXPECT_NEAR((*two.lse)[size_t(t) * 2 + h], want_lse / std::log(2.0), 1e-5 * (1 + std::fabs(want_lse)));
      for (int d = 0; d < kLatentDim; ++d)
        ASSERT_EQ(out[(size_t(t) * 2 + h) * kLatentDim + d], numeric::bf16_to_float(kv[b0 + size_t(d)]));
    }
  }
  // The empty sequence: out 0, lse -inf.
  for (int t = 2; t < 4; ++t)
    for (int h = 0; h < 2; ++h) {
      EXPECT_EQ((*e.lse)[size_t(t) * 2 + h], -INFINITY);
      EXPECT_EQ((*two.lse)[size_t(t) * 2 + h], -INFINITY);
      for (int d = 0; d < kLatentDim; ++d) ASSERT_EQ(out[(size_t(t) * 2 + h) * kLatentDim + d], 0.0f);
    }
}

}  // namespace
}  // namespace mladcp::test
