// Sharding math and slot mapping against a brute-force enumeration of positions: walk the global
// positions in order, hand out runs of I tokens round-robin over W ranks, number each rank's tokens
// densely, and check every closed formula (and the slot mapping) against that enumeration.
#include "mladcp/sharding.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "mladcp/kv_cache.h"

namespace mladcp {
namespace {

struct Enumeration {
  std::vector<int> owner;                  // [L] owner rank of each global position
  std::vector<int64_t> local_index;        // [L] index among the owner's tokens
  std::vector<std::vector<int64_t>> held;  // [W] global positions held by each rank, in order
};

Enumeration enumerate(int64_t len, int world, int interleave) {
  Enumeration e;
  e.held.resize(size_t(world));
  int rank = 0, run = 0;
  for (int64_t p = 0; p < len; ++p) {
    e.owner.push_back(rank);
    e.local_index.push_back(int64_t(e.held[size_t(rank)].size()));
    e.held[size_t(rank)].push_back(p);
    if (++run == interleave) {
      run = 0;
      rank = (rank + 1) % world;
    }
  }
  return e;
}

std::string where(int W, int I, int64_t L) {
  return "W=" + std::to_string(W) + " I=" + std::to_string(I) + " L=" + std::to_string(L);
}

TEST(Sharding, ClosedFormsMatchEnumeration) {
  for (int W = 1; W <= 5; ++W) {
    for (int I = 1; I <= 8; ++I) {
      const int64_t max_len = int64_t(W) * I * 3 + 1;
      const Enumeration full = enumerate(max_len, W, I);
      for (int64_t L = 0; L <= max_len; ++L) {
        const Enumeration e = enumerate(L, W, I);
        int64_t total = 0;
        for (int r = 0; r < W; ++r) {
          const int64_t n = int64_t(e.held[size_t(r)].size());
          total += sharding::local_len(L, W, r, I);
          ASSERT_EQ(sharding::local_len(L, W, r, I), n) << where(W, I, L) << " r=" << r;
          for (int64_t k = 0; k < n; ++k) {
            const int64_t p = e.held[size_t(r)][size_t(k)];
            ASSERT_EQ(sharding::local_to_global(k, W, r, I), p) << where(W, I, L) << " r=" << r << " k=" << k;
            ASSERT_EQ(sharding::global_to_local(p, W, I), k) << where(W, I, L) << " p=" << p;
          }
        }
        ASSERT_EQ(total, L) << where(W, I, L);
        for (int64_t p = 0; p < L; ++p) ASSERT_EQ(sharding::owner(p, W, I), full.owner[size_t(p)]) << where(W, I, L);
        // Causal rule in global coordinates: query token t of q_len sees positions <= L - q_len + t,
        // i.e. on rank r the local tokens whose global position is in that prefix.
        for (int q_len = 1; q_len <= 4 && q_len <= std::max<int64_t>(L, 1); ++q_len) {
          for (int t = 0; t < q_len; ++t) {
            for (int r = 0; r < W; ++r) {
              const DcpShard s{W, r, I};
              int64_t want = 0;
              for (int64_t p : e.held[size_t(r)]) want += p <= L - q_len + t;
              ASSERT_EQ(sharding::visible_local_keys(L, q_len, t, s), want)
                  << where(W, I, L) << " r=" << r << " q_len=" << q_len << " t=" << t;
            }
          }
        }
      }
    }
  }
}

// The virtual block table: every rank stores block_size tokens of each full virtual block, so rank
// r's local token k lives in table entry k / block_size, and slot_of agrees with that dense layout.
TEST(Sharding, SlotMappingMatchesEnumeration) {
  std::mt19937 rng(12345);
  for (int W = 1; W <= 5; ++W) {
    for (int I = 1; I <= 8; ++I) {
      for (int mult : {1, 2, 3}) {
        const int bs = I * mult;
        const int64_t L = int64_t(W) * I * 3 + 1;
        const Enumeration e = enumerate(L, W, I);
        const int64_t vblocks = sharding::num_virtual_blocks(L, bs, W);
        ASSERT_EQ(vblocks, (L + int64_t(bs) * W - 1) / (int64_t(bs) * W));
        // Random distinct ids, one per virtual block, shared by all ranks; one spare entry poisoned.
        const int num_blocks = int(vblocks) + 5;
        std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
        std::iota(ids.begin(), ids.end(), 0);
        std::shuffle(ids.begin(), ids.end(), rng);
        std::vector<int32_t> table(ids.begin(), ids.begin() + vblocks);
        table.push_back(-7);
        std::vector<int32_t> seq_ids(size_t(L), 0);
        std::vector<int64_t> positions(static_cast<size_t>(L));
        std::iota(positions.begin(), positions.end(), 0);
        std::vector<int> owners_seen(size_t(L), 0);
        for (int r = 0; r < W; ++r) {
          const DcpShard s{W, r, I};
          ASSERT_LE(sharding::num_local_blocks(L, bs, s), vblocks);
          SlotMappingParams p;
          p.num_tokens = int(L);
          p.seq_ids = seq_ids.data();
          p.positions = positions.data();
          p.block_table = table.data();
          p.num_seqs = 1;
          p.max_blocks_per_seq = int(table.size());
          p.block_size = bs;
          p.num_blocks = num_blocks;
          p.shard = s;
          std::vector<int64_t> slots(size_t(L), -99);
          p.slot_mapping = slots.data();
          ASSERT_TRUE(compute_slot_mapping_host(p).ok()) << where(W, I, L) << " bs=" << bs;
          std::set<int64_t> used;
          for (int64_t pos = 0; pos < L; ++pos) {
            const int64_t slot = slots[size_t(pos)];
            if (e.owner[size_t(pos)] != r) {
              ASSERT_EQ(slot, -1) << where(W, I, L) << " bs=" << bs << " r=" << r << " pos=" << pos;
              continue;
            }
            ++owners_seen[size_t(pos)];
            const int64_t k = e.local_index[size_t(pos)];
            ASSERT_EQ(slot, int64_t(table[size_t(k / bs)]) * bs + k % bs)
                << where(W, I, L) << " bs=" << bs << " r=" << r << " pos=" << pos;
            ASSERT_EQ(sharding::offset_in_block(pos, bs, W, I), k % bs);
            ASSERT_TRUE(used.insert(slot).second) << "slot " << slot << " used twice on rank " << r;
          }
        }
        for (int64_t pos = 0; pos < L; ++pos) ASSERT_EQ(owners_seen[size_t(pos)], 1) << where(W, I, L);
      }
    }
  }
}

TEST(Sharding, InvalidShardsAreRejectedWithTheirName) {
  EXPECT_EQ(validate_shard({0, 0, 1}, 64).code(), StatusCode::kInvalidArgument);
  EXPECT_NE(validate_shard({0, 0, 1}, 64).message().find("shard.world"), std::string::npos);
  EXPECT_NE(validate_shard({2, 2, 1}, 64).message().find("shard.rank"), std::string::npos);
  EXPECT_NE(validate_shard({2, -1, 1}, 64).message().find("shard.rank"), std::string::npos);
  EXPECT_NE(validate_shard({2, 0, 0}, 64).message().find("shard.interleave"), std::string::npos);
  EXPECT_NE(validate_shard({2, 0, 3}, 64).message().find("multiple of shard.interleave=3"), std::string::npos);
  EXPECT_NE(validate_shard({2, 0, 1}, 0).message().find("block_size"), std::string::npos);
  EXPECT_TRUE(validate_shard({4, 3, 64}, 64).ok());
  EXPECT_TRUE(validate_shard({3, 1, 8}, 64).ok());
}

TEST(Sharding, SlotMappingRejectsBadInputWithoutWriting) {
  const std::vector<int32_t> table = {3, 1};
  std::vector<int32_t> seq_ids = {0, 0};
  std::vector<int64_t> positions = {5, 2};
  std::vector<int64_t> slots = {-99, -99};
  SlotMappingParams p;
  p.num_tokens = 2;
  p.seq_ids = seq_ids.data();
  p.positions = positions.data();
  p.block_table = table.data();
  p.num_seqs = 1;
  p.max_blocks_per_seq = 2;
  p.block_size = 4;
  p.num_blocks = 4;
  p.shard = {2, 0, 2};
  p.slot_mapping = slots.data();
  ASSERT_TRUE(compute_slot_mapping_host(p).ok());
  EXPECT_EQ(slots[0], 3 * 4 + 3);  // position 5: rank 0 (run 2), its local token 3, block 3
  EXPECT_EQ(slots[1], -1);         // position 2: rank 1's

  auto expect_error = [&](SlotMappingParams q, const std::string& name) {
    std::vector<int64_t> out = {-99, -99};
    q.slot_mapping = out.data();
    const Status s = compute_slot_mapping_host(q);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << name;
    EXPECT_NE(s.message().find(name), std::string::npos) << s.message();
    EXPECT_EQ(out[0], -99) << name << ": written on error";
    EXPECT_EQ(out[1], -99) << name << ": written on error";
  };
  SlotMappingParams q = p;
  q.block_size = 3;  // not a multiple of I = 2
  expect_error(q, "block_size=3");
  q = p;
  seq_ids[1] = 1;
  expect_error(q, "seq_ids[1]=1");
  seq_ids[1] = 0;
  positions[1] = -1;
  expect_error(q, "positions[1]=-1");
  positions[1] = 16;  // virtual block 2 of a 2-entry row
  expect_error(q, "max_blocks_per_seq=2");
  positions[1] = 2;
  q.num_blocks = 2;  // id 3 out of range for position 5, which this rank owns
  expect_error(q, "block id out of range");
}

}  // namespace
}  // namespace mladcp
