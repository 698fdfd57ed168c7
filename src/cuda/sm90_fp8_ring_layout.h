// The in-place fp8 → f16 expansion in the ring of the Hopper 64-row kernel (sm90_decode_ring.cuh) as plain
// arithmetic, shared with the host tests that check it (tests/cuda/sm90_decode_test.cpp): where each column block's
// fp8 bytes land in its stage, and after which blocks the converters meet.
//
// A stage holds 9 column blocks of 64 keys × 64 dims in 16-bit elements (8 KiB each), in two halves that the
// consumers release separately: blocks 0-3 and blocks 4-8. A half's fp8 bytes (4 KiB a block) land in the back of
// the half, block after block; the converters write the half's f16 blocks in ascending order, reading the next
// block's fp8 bytes in each step before writing their own block.
#pragma once

#include <cstdint>

#include "mladcp/config.h"

namespace mladcp::cuda_impl::sm90_fp8_ring {

inline constexpr int kBlocks = 9;
inline constexpr int kF16BlockBytes = 64 * 128;
inline constexpr int kF8BlockBytes = 64 * 64;

// The half of column block c: its first block and its end.
MLADCP_HD constexpr int half_first(int c) { return c < 4 ? 0 : 4; }
MLADCP_HD constexpr int half_end(int c) { return c < 4 ? 4 : kBlocks; }

// Byte offset in its stage of column block c's fp8 bytes ([64 keys][64 B]).
MLADCP_HD constexpr uint32_t fp8_block_offset(int c) {
  return uint32_t(half_end(c) * kF16BlockBytes - (half_end(c) - half_first(c)) * kF8BlockBytes +
                  (c - half_first(c)) * kF8BlockBytes);
}

// Whether the converters meet (and release the blocks converted so far) after converting block c: where the next
// step writes f16 bytes over fp8 bytes read before this point (blocks 2 and 3 over the fp8 bytes of 0-1 and 2-3;
// 6, 7, 8 over those of 4, 5-6, 7-8), and after a half's last block.
MLADCP_HD constexpr bool convert_sync_after(int c) { return c == 1 || c == 2 || c == 3 || c == 5 || c == 7 || c == 8; }

}  // namespace mladcp::cuda_impl::sm90_fp8_ring
