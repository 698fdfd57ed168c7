// The operand fragment maps of the Hopper fp8 kernel (sm90_fp8_decode_kernel.cu) as plain arithmetic, shared with
// the host tests that check them (tests/cuda/sm90_decode_test.cpp): which dims and keys a thread's wgmma fragments
// hold, where the query rows and P are stored to match, where the fragments are read from the ring, and the stage
// and mbarrier phase of each tile in the ring.
//
// Thread t of a warpgroup: warp w = t / 32, lane = 4g + q. The ring holds a tile's 64 keys as dense 576-byte fp8 rows.
//   K (Sᵀ = K·Qᵀ; M = keys, K = dims): fragment rows g and g + 8 of warp w are keys 16w + g and + 8; k-step 4c + j
//     of column block c (64 dims) holds, in fragment column n, dim 64c + k_fragment_dim(j, n). One 16-byte read at
//     dims 64c + 16q of a key gives the thread's columns of 4 k-steps. The query rows are stored with each k-step's
//     columns in the same order (query_position), so the products are those of the natural order.
//   Vᵀ (Oᵀ += Vᵀ·Pᵀ; M = dims, K = keys): key step s holds, in fragment column n, key 16s + v_fragment_key(n);
//     fragment rows g and g + 8 of dim block b are dims 16(8w + g) + b and + 8 + b (one 16-byte read per key serves
//     all 8 dim blocks). P is stored with each key step's keys in the same order (p_position).
#pragma once

#include <cstdint>

#include "mladcp/config.h"

namespace mladcp::cuda_impl::sm90_fp8_fragments {

inline constexpr int kKeyBytes = 576;  // one key's fp8 row in the ring

// Dim (within its 64-dim column block) of fragment column n (0-15) of the block's k-step j (0-3): the 4 bytes at
// dims 16q + 4j of a 16-byte read feed columns 2q, 2q + 1 (bytes 0, 1) and 2q + 8, 2q + 9 (bytes 2, 3).
MLADCP_HD constexpr int k_fragment_dim(int j, int n) { return 16 * ((n & 7) >> 1) + 4 * j + (n & 1) + 2 * (n >> 3); }

// Position (k-step 16·j + column) in a query row's 64-dim block of dims 4u + 2h and + 1 (u = 0-15, h = 0-1): the
// pair's two positions are adjacent. query_position(l) of dim l (0-63) is the inverse of k_fragment_dim.
MLADCP_HD constexpr int query_pair_position(int u, int h) { return 16 * (u & 3) + 2 * (u >> 2) + 8 * h; }
MLADCP_HD constexpr int query_position(int l) { return query_pair_position(l >> 2, (l >> 1) & 1) + (l & 1); }

// Key (within its 16-key step) of fragment column n of Vᵀ: lane q's columns 2q, 2q + 1, 2q + 8, 2q + 9 are keys
// q, q + 4, q + 8, q + 12 (the four lanes of a quarter warp read keys of both parities).
MLADCP_HD constexpr int v_fragment_key(int n) { return ((n & 7) >> 1) + 4 * ((n & 1) + 2 * (n >> 3)); }

// Position in a P row (64 keys) of key u (0-63): the inverse of v_fragment_key within each key step.
MLADCP_HD constexpr int p_position(int u) { return 16 * (u >> 4) + 2 * (u & 3) + ((u >> 2) & 1) + 8 * ((u >> 3) & 1); }

// Byte offsets in a stage of the 16-byte reads of the thread (warp w, lane 4g + q): K rows (key 16w + g, + 8h) at
// column block c; Vᵀ keys (key step s, the thread's kk-th key: q + 4kk) at its 16 dims.
MLADCP_HD constexpr uint32_t k_read_offset(int w, int g, int q, int h, int c) {
  return uint32_t((16 * w + g + 8 * h) * kKeyBytes + 64 * c + 16 * q);
}
MLADCP_HD constexpr uint32_t v_read_offset(int w, int g, int q, int s, int kk) {
  return uint32_t((16 * s + q + 4 * kk) * kKeyBytes + 16 * (8 * w + g));
}

// Where tile t of a CTA's split sits in a ring of kStages stages: stage t % kStages, and the parity of the stage's
// mbarrier phases (t / kStages) % 2; next() moves to tile t + 1.
template <int kStages>
struct RingSlot {
  int st = 0;
  uint32_t phase = 0;
  MLADCP_HD void next() {
    if (++st == kStages) {
      st = 0;
      phase ^= 1;
    }
  }
};

}  // namespace mladcp::cuda_impl::sm90_fp8_fragments
