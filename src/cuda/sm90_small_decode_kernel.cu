// Hopper (sm_90a) decode kernel of the "cuda" backend for few query rows: N = 16 or 32 query rows per CTA, bf16 or
// fp8-e4m3 caches, pages of any size; a copying warp, and two warpgroups that read their operand fragments of the
// keys from the ring into registers (fp8: converted there).
//
// Same contract, plan, workspace and combine as the other kernels (decode_kernel.cuh, decode_plan.h): one CTA = one
// chunk of N query rows over one split of a sequence's local keys (split schedule) or over the pieces of a part,
// sequence after sequence (balanced schedule, sm90_segments.cuh). A segment that covers its sequence writes out/lse
// directly, otherwise the normalized fp32 partial state for the combine kernel. Every role walks the segments with
// its own cursor; the ring's tiles and the P buffers are numbered across segments, so the copier streams the next
// segment's keys while the warpgroups finish the last, and each segment's rows are written by the products
// warpgroup from its accumulators.
//
// The products are turned around against the 64-row kernel (sm90_decode_kernel.cu): the 64 keys of a tile are
// the M dimension of every wgmma and the CTA's N query rows the N dimension, so few rows cost few tensor-core
// cycles (m64nNk16 on N rows instead of m64n64k16 on 64 rows, most of them empty):
//   Sᵀ [64 keys × N]   = K [64 × 576] · Qᵀ              36 × wgmma.m64nNk16, K from registers, Q from shared memory
//   Oᵀ [512 × N]      += Vᵀ [512 × 64] · Pᵀ [64 × N]     8 dim blocks × 4 key steps, Vᵀ from registers, P from
//                                                        shared memory
// The ring holds the cache's key rows as copied (no converted copy of a tile), in slots (Ring<kBf16, N>):
//   fp8:  5 slots of one tile (64 keys × 576 B, dense rows): up to 180 KiB of keys in flight per SM. Each warpgroup
//         reads its fragments with 16-byte reads and converts them to f16 in registers (exact: every e4m3 value is an
//         f16 value, one instruction per two). Each query row is scaled by a power of two 2^e_n into [2^14, 2^15) at
//         its maximum before rounding to f16 (f16_scaling.h; 2^-e_n goes into the row's score scale); P in [0, 1]
//         rounds to f16. kv_scale is folded into the score and output scales.
//   bf16: 5 (N = 16) or 4 (N = 32) slots of half a tile (32 keys × 1152 B at a 1168-byte stride, one bulk copy per
//         key): a tile takes two slots, up to 182 KiB in flight. The 16-byte stride offset puts 8 consecutive keys
//         on 8 different bank groups, so the fragments are read by ldmatrix (K) and ldmatrix.trans (Vᵀ) without
//         conflicts; queries and P are bf16 in their natural column order.
//
// fp8 fragment maps (thread = warp w of its warpgroup, lane = 4g + q):
//   K (M = keys, K = dims): the thread's rows g and g + 8 are keys 16w + g and + 8, and a 16-byte read at dims
//     64c + 16q of each key gives k-steps 4c .. 4c + 3: in k-step 4c + j, fragment columns 2q, 2q + 1, 2q + 8,
//     2q + 9 are dims 64c + 16q + 4j + 0, 1, 2, 3. The query rows are stored with the same permutation of each
//     k-step's 16 columns, so the products are unchanged. A quarter warp's reads hit 8 different 4-bank groups.
//   Vᵀ (M = dims, K = keys): in key step s the thread's columns 2q, 2q + 1, 2q + 8, 2q + 9 are keys 16s + q, + 4,
//     + 8, + 12 (P is stored in this key order), and its rows g, g + 8 of dim block b are dims 16(8w + g) + b and
//     + 8 + b: one 16-byte read per key (dims 16(8w + g) .. + 15) serves all 8 dim blocks; byte permutes pair two
//     keys' bytes. Keys are 576 bytes apart, as in a dense page (a page's run of keys is one copy), so a quarter
//     warp's reads meet two keys of each parity: two-way bank conflicts.
//
// bf16 fragment maps: K (M = keys, K = dims): warp w's keys 16w .. + 15 (slot w / 2), k-step j's dims 16j .. + 15,
//   one ldmatrix.x4 (lane l gives the row of key 16w + l % 8 + 8·(l / 8 % 2) at dims 16j + 8·(l / 16)). Vᵀ (M = dims,
//   K = keys): dim block b's rows g, g + 8 are dims 64b + 16w + g and + 8; key step s (slot s / 2), one
//   ldmatrix.x4.trans (lane l gives the row of key 16s + l % 8 + 8·(l / 16) at dims 64b + 16w + 8·(l / 8 % 2)).
//
// Threads: three warpgroups (384), one CTA per SM; `setmaxnreg` moves the copying warpgroup's registers to the
// others.
//   warpgroup 2, the copier (warp 8; warps 9-11 exit): per tile, the block ids of its 64 keys (two per lane), then
//     the copies into the tile's slots, completing on each slot's `full` mbarrier: fp8, one bulk copy per present
//     run of keys of one page (per key where the cache's rows are not dense); bf16, one per present key. Absent keys
//     (past the split, on an invalid block id) are zero-filled; the present keys of a slot are bits in `ok`.
//   warpgroup 0, the scores: per segment its query rows, then per tile: K fragments and Sᵀ, release of the stage, mask,
//   P
//     and O's rescale factors → buffer t % 2, handed over by a named barrier. A row's running maximum is raised only
//     when a score exceeds it by more than kMaxSlack (8 in base 2: P ≤ 256 in f16; sm90_ptx.cuh): one barrier ORs the
//     threads' verdicts, and only then are the column maxima of the 4 warps gathered and O rescaled. Past a row's first
//     keys that is rare, so most tiles take no cross-warp maxima and no rescale (12-17% faster at 16 heads).
//   warpgroup 1, the products: per tile, O rescaled (only when a row's maximum moved; then after the previous
//     tile's products), Vᵀ fragments and Oᵀ += Vᵀ·Pᵀ, the stage released; the previous tile's P buffer released once
//     this tile's first groups have retired its products. The scores of tile t + 1 run while the products of tile t
//     do, and the products of consecutive tiles overlap unless a maximum moved. At a segment's end the scores
//     warpgroup puts the row sums and LSE in `sums` and goes on with the next segment's queries; the products
//     warpgroup writes the rows (16 contiguous dims of each of its rows per thread) and releases `sums`.
//
// Shared memory (Smem<N, kBf16>):
//   kv     [slots][keys][stride]           key rows as copied (fp8: 5 × 64 × 576 B; bf16: 5 or 4 × 32 × 1168 B)
//   q      [9][N rows][128 B]              the CTA's query rows (fp8: scaled, f16, columns permuted; bf16: as given),
//                                          128-byte swizzle
//   p      [2][N rows][128 B]              P (f16 or bf16), 64 keys per row (128-byte swizzle)
//   red    [2][4 warps][N] fp32            per-warp column maxima, row sums (first the balanced cursor's scratch)
//   alpha  [2][N] fp32                     O's rescale factors of the tile
//   qs     [N] fp32                        2^-e_n of each query row (fp8)
//   sums   [2][N] fp32                     a segment's row sums and base-2 LSE
//   ok     [slots] u64                     present keys of each slot
//   full, empty [slots] u64                the ring's mbarriers
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "core/lse_math.h"
#include "cuda/decode_kernel.cuh"
#include "cuda/f16_scaling.h"
#include "cuda/sm90_decode.h"
#include "cuda/sm90_fp8_fragments.h"
#include "cuda/sm90_ptx.cuh"
#include "cuda/sm90_segments.cuh"

namespace mladcp::cuda_impl {
namespace {

using namespace sm90;
namespace fr = sm90_fp8_fragments;
using sm90_segments::CtaWork;

constexpr int kTile = 64;          // keys per tile
constexpr int kWg = 128;           // threads of a warpgroup
constexpr int kThreads = 3 * kWg;  // the scores and the products warpgroups, the copying warpgroup
// The CTA starts with 168 registers per thread (launch bounds); the copying warpgroup gives all but 56 back (its
// warps 1-3 exit at once), the two others take them: 128 · (168 − 56) = 256 · (224 − 168).
constexpr int kCopierRegs = 56, kMmaRegs = 224;
static_assert(kWg * kCopierRegs + 2 * kWg * kMmaRegs <= 168 * kThreads, "register budget");
static_assert(kF8RowBytes == fr::kKeyBytes, "the fp8 fragment maps' key rows");

// The ring: kSlots slots of 36 KiB; a tile takes one slot (fp8) or two in a row (bf16). fp8: [64 keys][576 B] (dense
// rows); bf16: [9 column blocks][32 keys][128 B] (128-byte swizzle: 16-byte chunk c of key k at c ^ (k % 8)).
template <bool kBf16>
struct Ring {
  static constexpr int kBlockBytes = 32 * 128;        // bf16: one column block of 64 dims × 32 keys
  static constexpr int kSlotBytes = 9 * kBlockBytes;  // 36864 either way
  static constexpr int kSlots = 5;
};
static_assert(Ring<false>::kSlotBytes == 64 * kF8RowBytes, "fp8 slot of one tile");
// Named barriers (0 is __syncthreads): the scores warpgroup among itself; P of the ring's tile t (buffer t % 2)
// written (scores → products) and read (products → scores); a segment's row sums written (scores → products) and
// read (products → scores).
constexpr int kBarScores = 1, kBarPFull = 2 /* + buffer */, kBarPEmpty = 4 /* + buffer */, kBarSums = 6,
              kBarSumsFree = 7;

template <int N, bool kBf16>
struct Smem {
  using R = Ring<kBf16>;
  static constexpr int kv = 0;
  static constexpr int q = (kv + R::kSlots * R::kSlotBytes + 1023) / 1024 * 1024;
  static constexpr int p = q + 9 * N * 128;          // [2 buffers][N rows][128 B]
  static constexpr int red = p + 2 * N * 128;        // [2 buffers][4 warps][N] fp32
  static constexpr int alpha = red + 2 * 4 * N * 4;  // [2 buffers][N] fp32: O's rescale factor of tile t
  static constexpr int qs = alpha + 2 * N * 4;       // [N] fp32
  static constexpr int sums = qs + N * 4;            // [N] fp32: row sums, then [N] base-2 LSE
  static constexpr int ok = sums + 2 * N * 4;
  static constexpr int full = ok + R::kSlots * 8;
  static constexpr int empty = full + R::kSlots * 8;
  static constexpr int total = empty + R::kSlots * 8;
  static_assert(q % 1024 == 0 && p % 1024 == 0 && ok % 8 == 0, "alignment of the swizzled tiles and the barriers");
};
static_assert(Smem<32, false>::total <= 227 * 1024 && Smem<16, false>::total <= 227 * 1024, "shared memory (fp8)");
static_assert(Smem<32, true>::total <= 227 * 1024 && Smem<16, true>::total <= 227 * 1024, "shared memory (bf16)");

// Register buffers of K and Vᵀ fragments in flight (each feeds a group of two wgmmas; a group's buffer is
// rewritten once the group kBufs later may start). 18 groups of K and 16 of V per tile: the buffer of each group
// is a compile-time constant. 32 rows keep two Vᵀ buffers (O takes 128 registers).
// Tunables, overridable with -D for timing variants (tools/gpu/run.sh variants; H200, 2026-12-02: 3, 6 or 9 K buffers
// and 4 or 6 Vᵀ buffers within 1%; K reads 2, 3 or 4 column blocks deep: 4 is 1.5-2% faster than 2).
#ifndef MLADCP_FP8_KBUFS
#define MLADCP_FP8_KBUFS 3
#endif
#ifndef MLADCP_FP8_VBUFS16
#define MLADCP_FP8_VBUFS16 4
#endif
#ifndef MLADCP_FP8_VBUFS32
#define MLADCP_FP8_VBUFS32 2
#endif
#ifndef MLADCP_FP8_KREADS
#define MLADCP_FP8_KREADS 4
#endif
constexpr int kKBufs = MLADCP_FP8_KBUFS;
template <int N>
constexpr int kVBufs = N == 16 ? MLADCP_FP8_VBUFS16 : MLADCP_FP8_VBUFS32;
constexpr int kKReads = MLADCP_FP8_KREADS;  // K's 16-byte reads run kKReads − 1 column blocks ahead of the conversions

// wgmma.m64nNk16 (f16 or bf16 in, fp32 accumulate), A (64 × 16) from registers, B (16 × N, K-major) from shared
// memory.
#define MLADCP_WGMMA_RS_N16(TYPE)                                                                      \
  asm volatile(                                                                                        \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"                                                     \
      "wgmma.mma_async.sync.aligned.m64n16k16.f32." TYPE "." TYPE                                      \
      " {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, "                                             \
      "p, 1, 1, 0;\n}\n"                                                                               \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]) \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate))
#define MLADCP_WGMMA_RS_N32(TYPE)                                                                                   \
  asm volatile(                                                                                                     \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"                                                                  \
      "wgmma.mma_async.sync.aligned.m64n32k16.f32." TYPE "." TYPE                                                   \
      " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, p, 1, 1, 0;\n}\n"          \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])                    \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate))
template <bool kBf16>
__device__ __forceinline__ void wgmma_rs(float (&d)[8], const uint32_t (&a)[4], uint64_t b, int accumulate) {
  if constexpr (kBf16)
    MLADCP_WGMMA_RS_N16("bf16");
  else
    MLADCP_WGMMA_RS_N16("f16");
}
template <bool kBf16>
__device__ __forceinline__ void wgmma_rs(float (&d)[16], const uint32_t (&a)[4], uint64_t b, int accumulate) {
  if constexpr (kBf16)
    MLADCP_WGMMA_RS_N32("bf16");
  else
    MLADCP_WGMMA_RS_N32("f16");
}
#undef MLADCP_WGMMA_RS_N16
#undef MLADCP_WGMMA_RS_N32

// Four 8 × 8 matrices of 16-bit values, row addresses from lanes 8i .. 8i + 7 for matrix i (ldmatrix), as they
// are or transposed.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// A probability as the P operand's 16 bits: bf16 (bf16 caches) or f16 (fp8 caches).
template <bool kBf16>
__device__ __forceinline__ uint16_t p16(float v) {
  if constexpr (kBf16)
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
  else
    return __half_as_ushort(__float2half_rn(v));
}

__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

// Where a slot of the ring's tile t sits (slot, mbarrier phase parity), advanced slot by slot by the copier and both
// warpgroups (sm90_fp8_fragments.h, host-tested).
template <bool kBf16>
using RingSlot = fr::RingSlot<Ring<kBf16>::kSlots>;

// One box of the paged bf16 cache (64 dims × up to 32 keys of one page) into shared memory, 128-byte swizzled,
// completing on `bar`; a block id outside the tensor map ([0, num_blocks)) fills zeros.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int dim, int row,
                                            int block, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(dim), "r"(row), "r"(block), "r"(bar), "l"(policy)
      : "memory");
}

// The copying warp: every tile of the CTA's segment into the ring, slot by slot (ring_slots: slots filled by the
// CTA's earlier segments). Lane i looks up keys i and i + 32 of a tile; the present keys of a slot are bits in `ok`.
//   fp8: a present key that starts a run of keys of one page (the tile's first key, a page's first key; every key
//     when the cache's rows are not dense) copies the run with one bulk copy; absent keys (past the split, on an
//     invalid block id) are zero-filled, so no stale byte of the ring reaches a product.
//   bf16 (pages of 16, 32 or a multiple of 64 keys): per slot of 32 keys, lane 0 issues 9 bulk tensor copies (18
//     on pages of 16) through kv_map; a page past the split or with an invalid block id is copied from block -1,
//     which fills zeros. Keys past the split in a present page are copied as they are: the scores mask them and
//     the products zero their value fragments.
template <int N, bool kBf16>
__device__ __forceinline__ void copy_tiles(const DecodeKernelParams& p, const CUtensorMap* kv_map, uint8_t* smem,
                                           const CtaWork& w, RingSlot<kBf16>& slot, int& ring_slots) {
  using L = Smem<N, kBf16>;
  using R = Ring<kBf16>;
  const int lane = threadIdx.x & 31;
  const uint32_t kv = smem_addr(smem + L::kv), full = smem_addr(smem + L::full), empty = smem_addr(smem + L::empty);
  uint64_t* const ok = reinterpret_cast<uint64_t*>(smem + L::ok);
  const int32_t* const bt_row = p.block_table + int64_t(w.seq) * p.block_table_stride;
  const int k_begin = w.k_begin, k_end = w.k_end, ntiles = w.ntiles;
  const uint64_t policy = evict_first_policy();
  const bool dense = p.kv_stride_token == kF8RowBytes;
  // Block id of key 32h + lane of tile t (-1: past the split or the table), read a tile ahead of its copy.
  auto block_id = [&](int t, int h) -> int32_t {
    const int k = k_begin + t * kTile + 32 * h + lane;
    if (t >= ntiles || k >= k_end) return -1;
    const int page = p.block_shift >= 0 ? k >> p.block_shift : k / p.block_size;
    return page < p.max_blocks_per_seq ? __ldg(bt_row + page) : -1;
  };
  // Waits until slot `sl` is free (both warpgroups are done with its last tile); its address.
  auto wait_slot = [&](const RingSlot<kBf16>& sl) {
    if (ring_slots++ >= R::kSlots) mbar_wait(bar_addr(empty, sl.st), sl.phase ^ 1);
    return kv + uint32_t(sl.st * R::kSlotBytes);
  };
  // Publishes the slot's present keys (32 bits per half: keys 32h + lane) and arms its `full` barrier with `bytes`.
  auto publish = [&](const RingSlot<kBf16>& sl, uint64_t bits, uint32_t bytes) {
    if (lane == 0) {
      ok[sl.st] = bits;
      mbar_arrive_expect_tx(bar_addr(full, sl.st), bytes);
    }
    __syncwarp();
  };
  int32_t next[2] = {block_id(0, 0), block_id(0, 1)};
  for (int t = 0; t < ntiles; ++t) {
    const int32_t cur[2] = {next[0], next[1]};
    next[0] = block_id(t + 1, 0);
    next[1] = block_id(t + 1, 1);
    bool present[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) present[h] = cur[h] >= 0 && cur[h] < p.num_blocks;
    if constexpr (kBf16) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t bits = __ballot_sync(0xffffffffu, present[h]);
        // Block ids of keys 0 and 16 of the slot (-1 where absent: the copy fills zeros).
        const int32_t b0 = __shfl_sync(0xffffffffu, present[h] ? cur[h] : -1, 0);
        const int32_t b16 = __shfl_sync(0xffffffffu, present[h] ? cur[h] : -1, 16);
        const RingSlot<kBf16> sl = slot;
        const uint32_t base = wait_slot(sl);
        publish(sl, bits, uint32_t(R::kSlotBytes));
        if (lane == 0) {
          const int k0 = k_begin + t * kTile + 32 * h;
          const int row = p.block_shift >= 0 ? k0 & (p.block_size - 1) : k0 % p.block_size;
          const uint32_t bar = bar_addr(full, sl.st);
#pragma unroll 1
          for (int c = 0; c < 9; ++c) {
            if (p.block_size >= 32) {
              tma_load_3d(base + uint32_t(c * R::kBlockBytes), kv_map, bar, 64 * c, row, b0, policy);
            } else {  // pages of 16 keys: two copies
              tma_load_3d(base + uint32_t(c * R::kBlockBytes), kv_map, bar, 64 * c, 0, b0, policy);
              tma_load_3d(base + uint32_t(c * R::kBlockBytes + 16 * 128), kv_map, bar, 64 * c, 0, b16, policy);
            }
          }
        }
        slot.next();
      }
    } else {
      const RingSlot<kBf16> sl = slot;
      const uint32_t stage = wait_slot(sl);
#pragma unroll
      for (int h = 0; h < 2; ++h)
        if (!present[h]) {
          const uint32_t row = stage + uint32_t((32 * h + lane) * kF8RowBytes);
          for (int c = 0; c < kF8RowBytes / 16; ++c)
            asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};\n" ::"r"(row + 16 * c), "r"(0) : "memory");
        }
      fence_proxy_async();  // the zeros before later bulk copies into the same bytes
      __syncwarp();         // and before lane 0's arrival below, which releases them to the warpgroups
      const uint64_t bits =
          uint64_t(__ballot_sync(0xffffffffu, present[0])) | (uint64_t(__ballot_sync(0xffffffffu, present[1])) << 32);
      publish(sl, bits, uint32_t(__popcll(bits)) * kF8RowBytes);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int j = 32 * h + lane, k = k_begin + t * kTile + j;
        const int row = p.block_shift >= 0 ? k & (p.block_size - 1) : k % p.block_size;
        if (!present[h] || (dense && j > 0 && row > 0)) continue;  // absent, or inside a run
        const int len = dense ? min(min(kTile - j, p.block_size - row), k_end - k) : 1;
        const uint8_t* const src = p.kv + int64_t(cur[h]) * p.kv_stride_block + int64_t(row) * p.kv_stride_token;
        bulk_copy(stage + uint32_t(j * kF8RowBytes), src, uint32_t(len * kF8RowBytes), bar_addr(full, sl.st), policy);
      }
      slot.next();
    }
  }
}

template <int N>
using Segments = sm90_segments::Segments<N>;

// A segment's rows from the products warpgroup's accumulators, normalized: the final output and LSE where the
// segment covers its sequence, else its partial state (kept in L2 for the combine kernel). fp8: the thread holds dims
// 16·(8·warp + g) .. + 15 of its query rows n(i) = 8·(i / 2) + 2·qd + i % 2, 64 contiguous bytes of each (32 in
// bf16); bf16 caches: write_rows_bf16 below. sums: [N] row sums, then [N] base-2 LSE.
template <int N>
__device__ __forceinline__ void write_rows(const DecodeKernelParams& p, const CtaWork& w, const float (&o)[8][N / 2],
                                           const float* sums, int warp, int g, int qd) {
  constexpr int kCols = N / 4;
  const int dim0 = 16 * (8 * warp + g);
  const bool none = w.ntiles == 0;  // O was never written: the rows are 0
  const uint64_t keep = evict_last_policy();
#pragma unroll
  for (int i = 0; i < kCols; ++i) {
    const int j = i / 2, e = i & 1, n = 8 * j + 2 * qd + e;
    const int grow = w.row0 + n;
    if (grow >= p.rows_per_seq) continue;
    const float sum = sums[n], lse2 = sums[N + n];
    const float inv = sum > 0.0f ? p.out_scale / sum : 0.0f;
    float v[16];
#pragma unroll
    for (int b = 0; b < 8; ++b) {
      v[b] = none ? 0.0f : o[b][4 * j + e] * inv;
      v[8 + b] = none ? 0.0f : o[b][4 * j + 2 + e] * inv;
    }
    const int tok_i = grow / p.num_heads, h = grow - tok_i * p.num_heads;
    const int64_t tok = int64_t(w.seq) * p.q_len + tok_i;
    if (w.direct) {
      const int64_t ob = out_elem(p, tok, h) + dim0;
      if (p.out_fp32) {
        float4* const dst = reinterpret_cast<float4*>(static_cast<float*>(p.out) + ob);
#pragma unroll
        for (int c = 0; c < 4; ++c) dst[c] = make_float4(v[4 * c], v[4 * c + 1], v[4 * c + 2], v[4 * c + 3]);
      } else {
        uint4* const dst = reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.out) + ob);
#pragma unroll
        for (int c = 0; c < 2; ++c)
          dst[c] = make_uint4(pack_bf16(v[8 * c], v[8 * c + 1]), pack_bf16(v[8 * c + 2], v[8 * c + 3]),
                              pack_bf16(v[8 * c + 4], v[8 * c + 5]), pack_bf16(v[8 * c + 6], v[8 * c + 7]));
      }
      if (p.lse && warp == 0 && g == 0)
        p.lse[lse_elem(p, tok, h)] = lse::convert(lse2, LseBase::k2, p.lse_base2 ? LseBase::k2 : LseBase::kE);
    } else {
      const int64_t state = w.state_block * p.rows_per_seq + grow;
      float4* const dst = reinterpret_cast<float4*>(p.ws_o + state * kLatentDim + dim0);
#pragma unroll
      for (int c = 0; c < 4; ++c)
        store_evict_last(dst + c, make_float4(v[4 * c], v[4 * c + 1], v[4 * c + 2], v[4 * c + 3]), keep);
      if (warp == 0 && g == 0) store_evict_last(p.ws_lse + state, lse2, keep);
    }
  }
}

// The same for bf16 caches, whose accumulators hold dims 64b + 16·warp + g and + 8 (b = 0..7) of each query row:
// the 8 lanes of a column pair qd hold 16 contiguous dims of a row per (b), written as 32-byte fp32 runs (partial
// states, fp32 output) or, paired through a shuffle, 16-byte bf16 runs.
template <int N>
__device__ __forceinline__ void write_rows_bf16(const DecodeKernelParams& p, const CtaWork& w,
                                                const float (&o)[8][N / 2], const float* sums, int warp, int g,
                                                int qd) {
  constexpr int kCols = N / 4;
  const bool none = w.ntiles == 0;  // O was never written: the rows are 0
  const uint64_t keep = evict_last_policy();
#pragma unroll
  for (int i = 0; i < kCols; ++i) {
    const int j = i / 2, e = i & 1, n = 8 * j + 2 * qd + e;
    const int grow = w.row0 + n;
    const bool valid = grow < p.rows_per_seq;  // uniform over the 8 lanes of qd (the shuffles below)
    const float sum = sums[n], lse2 = sums[N + n];
    const float inv = sum > 0.0f ? p.out_scale / sum : 0.0f;
    const int tok_i = grow / p.num_heads, h = grow - tok_i * p.num_heads;
    const int64_t tok = int64_t(w.seq) * p.q_len + tok_i;
#pragma unroll
    for (int b = 0; b < 8; ++b)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const float v = none ? 0.0f : o[b][4 * j + 2 * hf + e] * inv;
        const int dim = 64 * b + 16 * warp + 8 * hf + g;
        if (w.direct && !p.out_fp32) {
          const float v1 = __shfl_down_sync(0xffffffffu, v, 4);  // dim + 1 (lane g + 1 of the same qd)
          if (valid && (g & 1) == 0)
            *reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(p.out) + out_elem(p, tok, h) + dim) = pack_bf16(v, v1);
        } else if (valid && w.direct) {
          static_cast<float*>(p.out)[out_elem(p, tok, h) + dim] = v;
        } else if (valid) {
          store_evict_last(p.ws_o + (w.state_block * p.rows_per_seq + grow) * kLatentDim + dim, v, keep);
        }
      }
    if (valid && warp == 0 && g == 0) {
      if (w.direct) {
        if (p.lse)
          p.lse[lse_elem(p, tok, h)] = lse::convert(lse2, LseBase::k2, p.lse_base2 ? LseBase::k2 : LseBase::kE);
      } else {
        store_evict_last(p.ws_lse + w.state_block * p.rows_per_seq + grow, lse2, keep);
      }
    }
  }
}

template <int N, bool kBf16>
__global__ void __launch_bounds__(kThreads, 1)
    mla_decode_sm90_small_kernel(const DecodeKernelParams p, const __grid_constant__ CUtensorMap kv_map) {
  using L = Smem<N, kBf16>;
  using R = Ring<kBf16>;
  using Slot = RingSlot<kBf16>;
  constexpr int kAcc = N / 2;   // accumulator floats per thread of an m64nN product
  constexpr int kCols = N / 4;  // query rows of a thread: n = 8·(i / 2) + 2·(lane % 4) + i % 2
  constexpr int KB = kKBufs, VB = kVBufs<N>;
  extern __shared__ __align__(1024) uint8_t smem[];
  uint8_t* const kv_s = smem + L::kv;
  uint8_t* const q_s = smem + L::q;
  float* const sums = reinterpret_cast<float*>(smem + L::sums);
  const int tid = threadIdx.x, warp = (tid >> 5) & 3, lane = tid & 31;
  const int g = lane >> 2, qd = lane & 3;  // fragment row group and column pair of the thread

  // The CTA's segments (one split, or the pieces of its part): every role walks them with its own copy of the
  // cursor, and the ring's tiles and P buffers are numbered across segments (ring_tile).
  Segments<N> segs;
  if (!sm90_segments::cta_segments(p, segs)) return;
  const uint32_t full = smem_addr(smem + L::full), empty = smem_addr(smem + L::empty);
  if (tid == 0) {
    for (int i = 0; i < R::kSlots; ++i) {
      mbar_init(bar_addr(full, i), 1);
      mbar_init(bar_addr(empty, i), 2 * kWg);  // every thread of both warpgroups arrives
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  if (segs.balanced)
    segs.cur = sm90_segments::balanced_start<kThreads>(p, segs.part, reinterpret_cast<int64_t*>(smem + L::red));
  __syncthreads();

  if (tid >= 2 * kWg) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kCopierRegs));
    if (tid < 2 * kWg + 32) {
      Slot slot;
      int ring_slots = 0;
      CtaWork w;
      while (segs.next(p, w)) copy_tiles<N, kBf16>(p, &kv_map, smem, w, slot, ring_slots);
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kMmaRegs));
  const uint32_t kv_addr = smem_addr(kv_s);
  const uint32_t p_lo = kmajor_lo(smem_addr(smem + L::p));
  constexpr uint32_t kPBuf = (N * 128) >> 4;  // one P buffer in descriptor units

  if (tid >= kWg) {
    // ==== the products warpgroup: Oᵀ += Vᵀ·Pᵀ per tile, O in registers ====
    // fp8: Vᵀ fragments from keys qd (+ 4, 8, 12, and 16 per key step) at dims 16·(8·warp + g) .. + 15. bf16: this
    // lane's ldmatrix row, key l % 8 + 8·(l / 16) of the key step at dims 16·warp + 8·(l / 8 % 2) of the dim block
    // (16-byte chunk 2·warp + l / 8 % 2 of the block's row, swizzled by the key's l % 8).
    const uint32_t v_off =
        kBf16 ? uint32_t(((lane & 7) + 8 * (lane >> 4)) * 128 + (((2 * warp + ((lane >> 3) & 1)) ^ (lane & 7)) << 4))
              : fr::v_read_offset(warp, g, qd, 0, 0);
    // Oᵀ: dim block b, query rows n(i); fp8: dims 16·(8·warp + g) + b (+ 8), bf16: 64b + 16·warp + g (+ 8).
    float o[8][kAcc];
    uint32_t vf[VB][2][4];
    Slot slot;
    int ring_tile = 0;  // tiles of the CTA's earlier segments + t
    CtaWork w;
    while (segs.next(p, w)) {
      for (int t = 0; t < w.ntiles; ++t, ++ring_tile) {
        const int pb = ring_tile & 1;
        const Slot s0 = slot;  // the tile's slots: keys 0-31 and 32-63 (bf16), the whole tile (fp8)
        slot.next();
        Slot s1 = s0;
        if constexpr (kBf16) {
          s1 = slot;
          slot.next();
        }
        mbar_wait(bar_addr(full, s0.st), s0.phase);  // (the first slot of) tile t is in the ring
        const uint32_t stage = kv_addr + uint32_t(s0.st * R::kSlotBytes);
        // bf16: the tile that holds the segment's end (keys past it were copied with their page).
        const int tail_keys = w.k_end - (w.k_begin + t * kTile);
        const bool tail = kBf16 && tail_keys < kTile;
        // fp8: per key step, four 16-byte reads (keys qd, + 4, + 8, + 12) give the fragments of all 8 dim blocks, two
        // blocks per group; the reads of the next key step are issued before the current one's conversions.
        uint4 vr[2][4];
        auto read_v = [&](uint4(&v)[4], int ks) {
#pragma unroll
          for (int kk = 0; kk < 4; ++kk) v[kk] = lds128(stage + v_off + fr::v_read_offset(0, 0, 0, ks, kk));
        };
        if constexpr (!kBf16) read_v(vr[0], 0);
        named_bar_sync(kBarPFull + pb, 2 * kWg);  // P and the rescale factors of tile t are written
        {
          // O is rescaled only when a row's maximum moved (then the products of tile t − 1 are waited for first);
          // otherwise they may still run while tile t's are issued. Every warp holds all N rows: the same decision.
          const float* const alpha = reinterpret_cast<const float*>(smem + L::alpha) + pb * N;
          float a[kCols];
          bool moved = false;
#pragma unroll
          for (int i = 0; i < kCols; ++i) {
            a[i] = alpha[8 * (i / 2) + 2 * qd + (i & 1)];
            moved |= a[i] != 1.0f;
          }
          if (t > 0 && __any_sync(0xffffffffu, moved)) {
            wgmma_wait<0>();
#pragma unroll
            for (int b = 0; b < 8; ++b) fence_regs(o[b]);
#pragma unroll
            for (int i = 0; i < kCols; ++i)
#pragma unroll
              for (int b = 0; b < 8; ++b) {
                o[b][4 * (i / 2) + (i & 1)] *= a[i];
                o[b][4 * (i / 2) + 2 + (i & 1)] *= a[i];
              }
          }
        }
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
          if constexpr (kBf16) {
            if (ks == 2) {  // keys 32-63: the second slot (the first one's reads are done)
              mbar_arrive(bar_addr(empty, s0.st));
              mbar_wait(bar_addr(full, s1.st), s1.phase);
            }
          } else if (ks + 1 < 4) {
            read_v(vr[(ks + 1) & 1], ks + 1);
          }
#pragma unroll
          for (int bp = 0; bp < 4; ++bp) {
            const int grp = 4 * ks + bp, b = grp % VB;
            // Group grp − VB of this tile is done with buffer b. (The first VB groups do not wait: the previous
            // tile's last groups may still read fragments of the same buffer index, which are other values, so other
            // registers: each group's fragments are defined anew in this iteration.)
            if (grp >= VB) wgmma_wait<VB - 1>();
            if constexpr (kBf16) {
              const uint32_t base =
                  kv_addr + uint32_t((ks < 2 ? s0.st : s1.st) * R::kSlotBytes) + v_off + uint32_t(16 * (ks & 1) * 128);
              ldsm_x4_trans(vf[b][0], base + uint32_t(2 * bp * R::kBlockBytes));
              ldsm_x4_trans(vf[b][1], base + uint32_t((2 * bp + 1) * R::kBlockBytes));
              if (tail) {  // keys past the segment's end: their values are zero (they may be any bytes of the page)
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                  const int key = 16 * ks + 8 * (r >> 1) + 2 * qd;  // keys of register r: key, key + 1
                  const uint32_t keep = (key < tail_keys ? 0xffffu : 0u) | (key + 1 < tail_keys ? 0xffff0000u : 0u);
                  vf[b][0][r] &= keep;
                  vf[b][1][r] &= keep;
                }
              }
            } else {
              // Bytes 2·(bp % 2), + 1 of word bp / 2 (h = 0: dims + 0..7) or 2 + bp / 2 (h = 1: dims + 8..15) of
              // two keys, paired: [x_j, y_j, x_j+1, y_j+1] → dim blocks 2·bp and 2·bp + 1.
              const uint32_t sel = bp & 1 ? 0x7362u : 0x5140u;
#pragma unroll
              for (int r = 0; r < 4; ++r) {  // fragment register r: row half r % 2, key pair r / 2
                const int wi = (r & 1) * 2 + (bp >> 1), x = 2 * (r >> 1);
                const uint2 f = e4m3x4_to_f16x4(__byte_perm(word(vr[ks & 1][x], wi), word(vr[ks & 1][x + 1], wi), sel));
                vf[b][0][r] = f.x;
                vf[b][1][r] = f.y;
              }
            }
            wgmma_fence();
            const uint64_t pd = desc(p_lo + pb * kPBuf + uint32_t((ks * 32) >> 4));
            wgmma_rs<kBf16>(o[2 * bp], vf[b][0], pd, t > 0 || ks > 0);
            wgmma_rs<kBf16>(o[2 * bp + 1], vf[b][1], pd, t > 0 || ks > 0);
            wgmma_commit();
          }
        }
        // The groups above waited for every product of the ring's previous tile (or the segment's epilogue did): its
        // P buffer is free for the next tile. (The last arrival is matched by the scores warpgroup after its loop.)
        if (ring_tile > 0) named_bar_arrive(kBarPEmpty + (pb ^ 1), 2 * kWg);
        mbar_arrive(bar_addr(empty, s1.st));  // this thread's reads of the (last) slot are done
      }
      wgmma_wait<0>();
#pragma unroll
      for (int b = 0; b < 8; ++b) fence_regs(o[b]);
      named_bar_sync(kBarSums, 2 * kWg);  // the segment's row sums and LSE are in shared memory
      if constexpr (kBf16)
        write_rows_bf16<N>(p, w, o, sums, warp, g, qd);
      else
        write_rows<N>(p, w, o, sums, warp, g, qd);
      named_bar_arrive(kBarSumsFree, 2 * kWg);  // sums may be written again
      if (tid == kWg) {
        if (w.record) p.ws_record[int64_t(w.seq) * p.row_chunks + w.row0 / N] = w.rec;
        if (!w.direct && p.ws_merges != nullptr) {              // the combine kernel has a state to merge
          asm volatile("griddepcontrol.wait;\n" ::: "memory");  // after launch_decode's zeroing
          *p.ws_merges = 1;
        }
      }
    }  // segments
  } else {
    // ==== the scores warpgroup: query rows, then per tile Sᵀ = K·Qᵀ, softmax, P ====
    float* const red = reinterpret_cast<float*>(smem + L::red);
    uint8_t* const p_s = smem + L::p;
    const uint64_t* const ok_s = reinterpret_cast<const uint64_t*>(smem + L::ok);
    const uint32_t q_lo = kmajor_lo(smem_addr(q_s));
    const int key_a = 16 * warp + g;  // this thread's score rows: keys key_a and key_a + 8 of each tile
    // Its position in P's rows (fp8: the Vᵀ fragments' key order, fr::p_position(key_a), written out; bf16: the
    // key); key_a + 8: + 8.
    const int pos_a = kBf16 ? key_a : 16 * warp + 2 * (g & 3) + (g >> 2);
    static_assert(
        [] {
          for (int k = 0; k < 64; ++k)
            if ((k & 8) == 0 && (16 * (k >> 4) + 2 * (k & 3) + ((k >> 2) & 1) != fr::p_position(k) ||
                                 fr::p_position(k + 8) != fr::p_position(k) + 8))
              return false;
          return true;
        }(),
        "P positions of keys key_a and key_a + 8");
    // K fragments, fp8: keys key_a, + 8 at dims 16·qd (+ 64 per block); bf16: this lane's ldmatrix row, key
    // 16·(warp % 2) + l % 8 + 8·(l / 8 % 2) of the warp's slot at dims 8·(l / 16) (+ 16 per k-step): in k-step j, the
    // 16-byte chunk 2·(j % 4) + l / 16 of column block j / 4, swizzled by the key's l % 8 (k_chunk[j % 4]).
    const uint32_t k_off = kBf16 ? uint32_t((16 * (warp & 1) + (lane & 7) + 8 * ((lane >> 3) & 1)) * 128)
                                 : fr::k_read_offset(warp, g, qd, 0, 0);
    uint32_t k_chunk[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) k_chunk[j] = uint32_t(((2 * j + (lane >> 4)) ^ (lane & 7)) << 4);
    Slot slot;
    int ring_tile = 0;  // tiles of the CTA's earlier segments + t
    int segments = 0;
    CtaWork w;
    while (segs.next(p, w)) {
      // The segment's query rows go over the last one's: every warp of this warpgroup is past its last scores (the
      // barriers of the row sums below), and only this warpgroup reads q.
      // ---- query rows → q (rows past the sequence's R rows are zero). fp8: f16, row n scaled by 2^e_n, each
      // k-step's 16 columns in the K fragments' order: dims 4u .. 4u + 3 of column block c (u = 4·qq + j) at
      // positions 16j + 2qq, + 1, + 8, + 9. bf16: as given ----
      {
        constexpr int kPerRow = kWg / N;               // threads per row: 8 or 4, neighbouring lanes
        constexpr int kChunks = kRowChunks / kPerRow;  // 16-byte chunks (8 values) per thread: 9 or 18
        const int r = tid / kPerRow, sub = tid % kPerRow;
        const int grow = w.row0 + r;
        const bool valid = grow < p.rows_per_seq;
        const uint16_t* src = p.q;
        if (valid) {
          const int i = grow / p.num_heads, h = grow - i * p.num_heads;
          src = p.q + q_elem(p, int64_t(w.seq) * p.q_len + i, h);
        }
        uint4 qv[kChunks];
        if constexpr (kBf16) {
#pragma unroll
          for (int c = 0; c < kChunks; ++c) {
            const int ch = sub + kPerRow * c;  // dims 8·ch .. + 7
            qv[c] = valid ? *reinterpret_cast<const uint4*>(src + 8 * ch) : make_uint4(0, 0, 0, 0);
            *reinterpret_cast<uint4*>(q_s + (ch >> 3) * (N * 128) + r * 128 + (((ch & 7) ^ (r & 7)) << 4)) = qv[c];
          }
          if (sub == 0) reinterpret_cast<float*>(smem + L::qs)[r] = 1.0f;
        } else {
          float mx = 0.0f;
#pragma unroll
          for (int c = 0; c < kChunks; ++c) {
            qv[c] = valid ? *reinterpret_cast<const uint4*>(src + 8 * (sub + kPerRow * c)) : make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int k = 0; k < 4; ++k) {
              const float2 f = bf16x2_to_float2(word(qv[c], k));
              mx = fmaxf(mx, fmaxf(fabsf(f.x), fabsf(f.y)));
            }
          }
#pragma unroll
          for (int sh = 1; sh < kPerRow; sh <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, sh));
          const int e = f16_row_exponent(mx);
          const float up = ldexpf(1.0f, e);
          if (sub == 0) reinterpret_cast<float*>(smem + L::qs)[r] = ldexpf(1.0f, -e);
#pragma unroll
          for (int c = 0; c < kChunks; ++c) {
            const int ch = sub + kPerRow * c;  // dims 8·ch .. + 7
#pragma unroll
            for (int k = 0; k < 4; ++k) {
              const float2 f = bf16x2_to_float2(word(qv[c], k));
              const int pos = fr::query_pair_position(2 * (ch & 7) + (k >> 1), k & 1);  // dims 8·ch + 2k, + 1
              *reinterpret_cast<uint32_t*>(q_s + (ch >> 3) * (N * 128) + r * 128 + (((pos >> 3) ^ (r & 7)) << 4) +
                                           (pos & 7) * 2) = pack_f16(f.x * up, f.y * up);
            }
          }
        }
      }
      fence_proxy_async();
      named_bar_sync(kBarScores, kWg);  // the query rows and their scales are in shared memory

      // ---- per-thread state: query rows n(i), their visible keys and score scales, running max and sums ----
      int nvis[kCols];
      float m[kCols], l[kCols], row_scale[kCols];  // row_scale: score_scale_log2 · 2^-e_n
#pragma unroll
      for (int i = 0; i < kCols; ++i) {
        const int n = 8 * (i / 2) + 2 * qd + (i & 1);
        const int grow = w.row0 + n;
        nvis[i] =
            grow < p.rows_per_seq ? int(sharding::visible_local_keys(w.len, p.q_len, grow / p.num_heads, p.shard)) : 0;
        row_scale[i] = p.score_scale_log2 * reinterpret_cast<const float*>(smem + L::qs)[n];
        m[i] = -INFINITY;
        l[i] = 0.0f;
      }
      float s[kAcc];      // scores: keys key_a (+ 8), query rows n(i)
      float s_odd[kAcc];  // the odd column blocks' part (two independent accumulator chains)
      uint32_t kf[KB][2][4];

      for (int t = 0; t < w.ntiles; ++t, ++ring_tile) {
        const int pb = ring_tile & 1;
        const Slot s0 = slot;  // the tile's slots: keys 0-31 and 32-63 (bf16), the whole tile (fp8)
        slot.next();
        Slot s1 = s0;
        if constexpr (kBf16) {
          s1 = slot;
          slot.next();
        }
        mbar_wait(bar_addr(full, s0.st), s0.phase);  // tile t is in the ring
        if constexpr (kBf16) mbar_wait(bar_addr(full, s1.st), s1.phase);
        // Present keys: bit key_a of the tile (fp8), of the warp's slot (bf16: key_a % 32).
        const uint64_t okb = kBf16 ? ok_s[warp < 2 ? s0.st : s1.st] << (32 * (warp >> 1)) : ok_s[s0.st];
        const uint32_t stage = kv_addr + uint32_t((warp < 2 || !kBf16 ? s0.st : s1.st) * R::kSlotBytes);
        // Sᵀ over 576 dims. fp8: column block c's two 16-byte reads (keys key_a, key_a + 8) give 4 k-steps, two per
        // group; the reads run kKReads − 1 column blocks ahead of the conversions. bf16: one ldmatrix per k-step.
        uint4 kr[kKReads][2];
#pragma unroll
        for (int c = 0; c + 1 < kKReads && !kBf16; ++c) {
          kr[c][0] = lds128(stage + k_off + 64 * c);
          kr[c][1] = lds128(stage + k_off + 8 * kF8RowBytes + 64 * c);
        }
#pragma unroll
        for (int c = 0; c < 9; ++c) {
          if (c + kKReads - 1 < 9 && !kBf16) {
            const int cr = c + kKReads - 1;
            kr[cr % kKReads][0] = lds128(stage + k_off + 64 * cr);
            kr[cr % kKReads][1] = lds128(stage + k_off + 8 * kF8RowBytes + 64 * cr);
          }
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const int grp = 2 * c + hh, b = grp % KB;
            if (grp >= KB) wgmma_wait<KB - 1>();  // group grp − KB is done with buffer b
#pragma unroll
            for (int jj = 0; jj < 2; ++jj) {
              if constexpr (kBf16) {
                ldsm_x4(kf[b][jj], stage + k_off + uint32_t(c * R::kBlockBytes) + k_chunk[2 * hh + jj]);
                continue;
              }
              const uint2 fa = e4m3x4_to_f16x4(word(kr[c % kKReads][0], 2 * hh + jj));
              const uint2 fb = e4m3x4_to_f16x4(word(kr[c % kKReads][1], 2 * hh + jj));
              kf[b][jj][0] = fa.x;
              kf[b][jj][1] = fb.x;
              kf[b][jj][2] = fa.y;
              kf[b][jj][3] = fb.y;
            }
            wgmma_fence();
#pragma unroll
            for (int jj = 0; jj < 2; ++jj) {
              const uint64_t qd_desc = desc(q_lo + uint32_t((c * N * 128 + (2 * hh + jj) * 32) >> 4));
              if (c & 1)
                wgmma_rs<kBf16>(s_odd, kf[b][jj], qd_desc, c > 1 || hh > 0 || jj > 0);
              else
                wgmma_rs<kBf16>(s, kf[b][jj], qd_desc, c > 0 || hh > 0 || jj > 0);
            }
            wgmma_commit();
          }
        }
        wgmma_wait<0>();
        fence_regs(s);
        fence_regs(s_odd);
#pragma unroll
        for (int i = 0; i < kAcc; ++i) s[i] += s_odd[i];
        mbar_arrive(bar_addr(empty, s0.st));  // this thread's reads of the tile's slots are done
        if constexpr (kBf16) mbar_arrive(bar_addr(empty, s1.st));

        // Absent keys and keys after a row's causal limit → -inf. The running maxima m (base-2 logits) are raised
        // only when some score of the tile exceeds its row's by more than kMaxSlack (every tile of a row that has
        // seen no key yet): otherwise P = 2^(S·scale − m) ≤ 2^kMaxSlack is taken against the old maxima, O is not
        // rescaled, and the tile needs no maxima across the warps, only one barrier that ORs the threads' verdicts.
        const int kt = w.k_begin + t * kTile;
        const bool pres_a = (okb >> key_a) & 1, pres_b = (okb >> (key_a + 8)) & 1;
        bool over = false;
#pragma unroll
        for (int i = 0; i < kCols; ++i) {
          const int j = i / 2, e = i & 1;
          s[4 * j + e] = pres_a && kt + key_a < nvis[i] ? s[4 * j + e] : -INFINITY;
          s[4 * j + 2 + e] = pres_b && kt + key_a + 8 < nvis[i] ? s[4 * j + 2 + e] : -INFINITY;
          const float limit = m[i] + kMaxSlack;  // −inf while the row has seen no key
          over |= s[4 * j + e] * row_scale[i] > limit || s[4 * j + 2 + e] * row_scale[i] > limit;
        }
        float alpha[kCols];
#pragma unroll
        for (int i = 0; i < kCols; ++i) alpha[i] = 1.0f;
        if (named_bar_sync_or(kBarScores, kWg, over)) {
          // Column maxima of the warp's 16 keys, then of the tile's 64 (red is double-buffered: a warp writes buffer
          // pb again only after the barrier above of tile t + 2, past every read of it).
          float* const red_t = red + pb * 4 * N;
          float mx[kCols];
#pragma unroll
          for (int i = 0; i < kCols; ++i) {
            const int j = i / 2, e = i & 1;
            mx[i] = fmaxf(s[4 * j + e], s[4 * j + 2 + e]);
#pragma unroll
            for (int sh = 4; sh < 32; sh <<= 1) mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], sh));
          }
          if (lane < 4) {
#pragma unroll
            for (int i = 0; i < kCols; ++i) red_t[warp * N + 8 * (i / 2) + 2 * lane + (i & 1)] = mx[i];
          }
          named_bar_sync(kBarScores, kWg);  // every warp's maxima
#pragma unroll
          for (int i = 0; i < kCols; ++i) {
            const int n = 8 * (i / 2) + 2 * qd + (i & 1);
            const float tile_max = fmaxf(fmaxf(red_t[n], red_t[N + n]), fmaxf(red_t[2 * N + n], red_t[3 * N + n]));
            const float m_new = fmaxf(m[i], tile_max * row_scale[i]);
            alpha[i] = rescale_factor(m[i], m_new);
            m[i] = m_new;
          }
        }
        if (ring_tile >= 2)
          named_bar_sync(kBarPEmpty + pb, 2 * kWg);  // the products of the ring's tile 2 before
                                                     // are done with P buffer pb

        // P = 2^(S·scale − m) → P buffer pb, O's rescale factors → alpha buffer pb.
        uint8_t* const p_t = p_s + pb * N * 128;
        float* const alpha_t = reinterpret_cast<float*>(smem + L::alpha) + pb * N;
#pragma unroll
        for (int i = 0; i < kCols; ++i) {
          const int j = i / 2, e = i & 1, n = 8 * j + 2 * qd + e;
          const float neg_m = m[i] == -INFINITY ? 0.0f : -m[i];
          const float pa = fast_exp2(fmaf(s[4 * j + e], row_scale[i], neg_m));
          const float pb2 = fast_exp2(fmaf(s[4 * j + 2 + e], row_scale[i], neg_m));
          l[i] = l[i] * alpha[i] + (pa + pb2);
          uint8_t* const prow = p_t + n * 128;
          *reinterpret_cast<uint16_t*>(prow + (((pos_a >> 3) ^ (n & 7)) << 4) + (pos_a & 7) * 2) = p16<kBf16>(pa);
          *reinterpret_cast<uint16_t*>(prow + ((((pos_a + 8) >> 3) ^ (n & 7)) << 4) + (pos_a & 7) * 2) =
              p16<kBf16>(pb2);
          if (warp == 0 && g == 0) alpha_t[n] = alpha[i];
        }
        fence_proxy_async();
        named_bar_arrive(kBarPFull + pb, 2 * kWg);  // P and the rescale factors of tile t are written
      }

      // ---- row sums of the 64 keys of the 4 warps; base-2 LSE ----
#pragma unroll
      for (int i = 0; i < kCols; ++i)
#pragma unroll
        for (int sh = 4; sh < 32; sh <<= 1) l[i] += __shfl_xor_sync(0xffffffffu, l[i], sh);
      named_bar_sync(kBarScores, kWg);  // every warp is past its last reads of red
      if (lane < 4) {
#pragma unroll
        for (int i = 0; i < kCols; ++i) red[warp * N + 8 * (i / 2) + 2 * lane + (i & 1)] = l[i];
      }
      named_bar_sync(kBarScores, kWg);
      if (segments > 0) named_bar_sync(kBarSumsFree, 2 * kWg);  // the products read the last segment's sums
      if (warp == 0 && lane < 4) {
#pragma unroll
        for (int i = 0; i < kCols; ++i) {
          const int n = 8 * (i / 2) + 2 * lane + (i & 1);
          const float sum = red[n] + red[N + n] + red[2 * N + n] + red[3 * N + n];
          sums[n] = sum;
          sums[N + n] = sum > 0.0f ? m[i] + log2f(sum) : -INFINITY;
        }
      }
      named_bar_arrive(kBarSums, 2 * kWg);  // the row sums and LSE are in shared memory
      ++segments;
    }  // segments
    // The products' last arrivals on the P buffers and on the sums (each arrives once more than this warpgroup
    // waited above), so that no named barrier is left half arrived.
    if (ring_tile >= 2) named_bar_sync(kBarPEmpty + (ring_tile & 1), 2 * kWg);
    if (segments > 0) named_bar_sync(kBarSumsFree, 2 * kWg);
  }
  // The combine kernel (a programmatic dependent launch) may start its prologue; it waits for this grid.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

}  // namespace

bool sm90_small_bf16_block_size_ok(int block_size) {
  return block_size == 16 || block_size == 32 || (block_size >= 64 && block_size % 64 == 0);
}

size_t sm90_small_decode_smem_bytes(int rows_per_cta, bool fp8) {
  if (fp8) return size_t(rows_per_cta <= 16 ? Smem<16, false>::total : Smem<32, false>::total);
  return size_t(rows_per_cta <= 16 ? Smem<16, true>::total : Smem<32, true>::total);
}

cudaError_t set_sm90_small_decode_smem() {
  if (!sm90_tensor_map_encoder()) return cudaErrorNotSupported;
  cudaError_t e = cudaSuccess;
  auto raise = [&](auto kernel, int bytes) {
    if (e == cudaSuccess) e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  };
  raise(mla_decode_sm90_small_kernel<16, false>, Smem<16, false>::total);
  raise(mla_decode_sm90_small_kernel<32, false>, Smem<32, false>::total);
  raise(mla_decode_sm90_small_kernel<16, true>, Smem<16, true>::total);
  raise(mla_decode_sm90_small_kernel<32, true>, Smem<32, true>::total);
  return e;
}

cudaError_t launch_sm90_small_decode(const DecodeKernelParams& p, bool fp8, int64_t grid, cudaStream_t stream) {
  // bf16: the paged cache as a 3-D tensor [num_blocks][block_size][576] with the caller's strides; one box = 64 dims
  // × min(32, block_size) keys of one page, written 128-byte swizzled (fp8: unused).
  CUtensorMap map;
  std::memset(&map, 0, sizeof(map));
  if (!fp8) {
    const cuuint64_t dims[3] = {cuuint64_t(kQkDim), cuuint64_t(p.block_size), cuuint64_t(p.num_blocks)};
    const cuuint64_t strides[2] = {cuuint64_t(p.kv_stride_token) * 2, cuuint64_t(p.kv_stride_block) * 2};
    const cuuint32_t box[3] = {64, cuuint32_t(p.block_size < 32 ? p.block_size : 32), 1};
    const cuuint32_t elem_strides[3] = {1, 1, 1};
    if (sm90_tensor_map_encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<uint8_t*>(p.kv), dims, strides,
                                  box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                  CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
      return cudaErrorInvalidValue;
  }
  const dim3 g{unsigned(grid)}, b{unsigned(kThreads)};
  if (fp8 && p.rows_per_cta == 16)
    mla_decode_sm90_small_kernel<16, false><<<g, b, size_t(Smem<16, false>::total), stream>>>(p, map);
  else if (fp8)
    mla_decode_sm90_small_kernel<32, false><<<g, b, size_t(Smem<32, false>::total), stream>>>(p, map);
  else if (p.rows_per_cta == 16)
    mla_decode_sm90_small_kernel<16, true><<<g, b, size_t(Smem<16, true>::total), stream>>>(p, map);
  else
    mla_decode_sm90_small_kernel<32, true><<<g, b, size_t(Smem<32, true>::total), stream>>>(p, map);
  return cudaGetLastError();
}

}  // namespace mladcp::cuda_impl
