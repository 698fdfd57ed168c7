// DCP sharding of the KV cache along the sequence (one module; host and device).
//
// W ranks, interleave I ≥ 1: global position p lives on rank (p / I) % W. Rank r numbers its own
// tokens densely; local index k holds global position (k / I)·W·I + r·I + k % I. So local order is
// global order, and a prefix of P global positions is exactly a prefix of local_len(r, P) local
// tokens on rank r. That is how the causal rule is applied in global coordinates: query token t of a
// sequence with global length G and q_len tokens sees global positions < G - q_len + t + 1, i.e. the
// first local_len(r, G - q_len + t + 1) local tokens.
#pragma once

#include <cstdint>

#include "mladcp/config.h"

namespace mladcp {

// One rank's place in a DCP group. world == 1 means no sharding.
struct DcpShard {
  int world = 1;       // W ≥ 1
  int rank = 0;        // 0 ≤ rank < W
  int interleave = 1;  // I ≥ 1; block_size % I == 0 is required by the paged cache
};

namespace sharding {

MLADCP_HD int owner(int64_t p, int world, int interleave) { return int((p / interleave) % world); }

// Number of positions among the first `len` global positions that live on `rank`. May be 0.
MLADCP_HD int64_t local_len(int64_t len, int world, int rank, int interleave) {
  if (len <= 0) return 0;
  const int64_t span = int64_t(world) * interleave;
  int64_t rem = len % span - int64_t(rank) * interleave;
  rem = rem < 0 ? 0 : (rem > interleave ? interleave : rem);
  return (len / span) * interleave + rem;
}

MLADCP_HD int64_t local_to_global(int64_t k, int world, int rank, int interleave) {
  return (k / interleave) * int64_t(world) * interleave + int64_t(rank) * interleave + k % interleave;
}

// Local index of a global position on its owner rank.
MLADCP_HD int64_t global_to_local(int64_t p, int world, int interleave) {
  const int64_t span = int64_t(world) * interleave;
  return (p / span) * interleave + p % interleave;
}

// Keys visible to query token t (0 ≤ t < q_len) of a sequence of global length G, counted on this
// rank: the causal rule in global coordinates.
MLADCP_HD int64_t visible_local_keys(int64_t global_len, int q_len, int t, const DcpShard& s) {
  return local_len(global_len - q_len + t + 1, s.world, s.rank, s.interleave);
}

// ---- Virtual blocks and slots (the paged cache under DCP) ------------------------------------------
//
// The block table is kept in virtual blocks of block_size·W global positions: entry b of a sequence's
// row names ONE block id, and every rank stores its block_size tokens of virtual block b in its own
// physical block of that id. Since block_size % I == 0, each rank holds exactly block_size tokens of
// a full virtual block, so rank r's local token k lives in block_table[k / block_size] at offset
// k % block_size: the decode reads the same table densely, with no per-rank translation.

MLADCP_HD int64_t virtual_block_size(int block_size, int world) { return int64_t(block_size) * world; }

// Block-table entries a sequence of global length `len` uses (the same on every rank).
MLADCP_HD int64_t num_virtual_blocks(int64_t len, int block_size, int world) {
  const int64_t v = virtual_block_size(block_size, world);
  return len <= 0 ? 0 : (len + v - 1) / v;
}

// Physical blocks rank `rank` reads for a sequence of global length `len` (≤ num_virtual_blocks).
MLADCP_HD int64_t num_local_blocks(int64_t len, int block_size, const DcpShard& s) {
  const int64_t local = local_len(len, s.world, s.rank, s.interleave);
  return (local + block_size - 1) / block_size;
}

// Offset of global position p inside its physical block on its owner: (vbo / (W·I))·I + vbo % I with
// vbo = p % (block_size·W). Equals global_to_local(p) % block_size.
MLADCP_HD int offset_in_block(int64_t p, int block_size, int world, int interleave) {
  const int64_t vbo = p % virtual_block_size(block_size, world);
  return int((vbo / (int64_t(world) * interleave)) * interleave + vbo % interleave);
}

// Cache slot (block_id · block_size + offset) of global position p on rank s.rank, or -1 when another
// rank owns p. `block_table_row` is the sequence's row of virtual-block ids.
MLADCP_HD int64_t slot_of(int64_t p, const int32_t* block_table_row, int block_size, const DcpShard& s) {
  if (owner(p, s.world, s.interleave) != s.rank) return -1;
  const int64_t block = block_table_row[p / virtual_block_size(block_size, s.world)];
  return block * block_size + offset_in_block(p, block_size, s.world, s.interleave);
}

}  // namespace sharding
}  // namespace mladcp
