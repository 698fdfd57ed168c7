// Hopper (sm_90a) decode kernel of the "cuda" backend for fp8-e4m3 caches: N = 16 or 32 query rows per CTA,
// pages of any size, warp-specialized (a converter warpgroup and a tensor-core warpgroup).
//
// Same contract, split plan, workspace and combine as the portable kernel (decode_kernel.cuh): one CTA = one
// (sequence, chunk of N query rows, split of local keys); a single-split sequence writes out/lse directly,
// otherwise the CTA writes the normalized fp32 partial state for the combine kernel.
//
// The products are turned around against the 64-row kernel (sm90_decode_kernel.cu): the 64 keys of a tile are
// the M dimension of every wgmma and the CTA's N query rows the N dimension, so few rows cost few tensor-core
// cycles (m64nNk16 on N rows instead of m64n64k16 on 64 rows, most of them empty):
//   Sᵀ [64 keys × N]   = K [64 × 576] · Qᵀ              36 × wgmma.m64nNk16, K and Q K-major in shared memory
//   Oᵀ [512 × N]      += Vᵀ [512 × 64] · Pᵀ [64 × N]     8 dim blocks × 4 key steps of wgmma.m64nNk16; V read
//                                                        transposed from the key tile (keys are stored once and
//                                                        serve as K and V), P from shared memory
// Operands are fp16 (one conversion instruction per two keys' elements, against four for bf16): every e4m3
// value is an fp16 value, so keys convert exactly; each query row is scaled by a power of two 2^e_n into
// [2^14, 2^15) at its maximum before rounding to fp16 (exact for bf16 values down to 2^-24 of the row's maximum;
// 2^-e_n goes into the row's score scale); P in [0, 1] rounds to fp16 (more precise than bf16). kv_scale is
// folded into the score and output scales.
//
// Threads: two warpgroups (256), one CTA per SM.
//   warpgroup 1, the converter: loads the fp8 keys of the next two tiles into registers (plain loads through the
//     block table, so any page size), and converts each tile into the ring stage (t % 2) once the tensor-core
//     warpgroup has released it. Absent keys (past the split, on an invalid block id) are written as zeros and
//     flagged in `ok`.
//   warpgroup 0, the tensor cores: query rows (once), then per tile: scores, mask, column maxima of its 4 warps
//     (named barrier), P → shared memory (named barrier), P·V, release of the stage.
// Ring: named barriers kBarFull + s (converter arrives, tensor cores wait) and kBarEmpty + s (the reverse).
//
// Shared memory (128-byte-swizzled tiles, 1024-byte aligned):
//   kv  [2 stages][9 column blocks][64 keys][128 B]  key tiles (fp16); at the end the normalized Oᵀ, transposed
//   q   [9][N rows][128 B]                 the CTA's query rows, scaled, fp16 (zero past the sequence's rows)
//   p   [N rows][128 B]                    P (fp16), 64 keys per row
//   red [4 warps][N] fp32                  per-warp column maxima, then row sums
//   qs  [N] fp32                           2^-e_n of each query row
//   ok  [2 stages][64] u8                  key present
// Loads: converter warp w loads keys [16w, 16w + 16) of a tile, 576 bytes each, as 18 loads of 16 bytes per lane:
// load j = 2m + h takes column block m (64 bytes of fp8) of keys 16w + 8h + lane / 4, 4 lanes per key, so a thread
// reads two keys of a tile (one block-table lookup each, issued two tiles ahead). Every load is 32-byte-sector
// efficient, and the 16-byte fp16 stores of each quarter warp (two keys of different parity) hit the 8 bank groups
// once each: 4 wavefronts per store, the minimum.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/lse_math.h"
#include "cuda/decode_kernel.cuh"
#include "cuda/f16_scaling.h"
#include "cuda/sm90_decode.h"
#include "cuda/sm90_ptx.cuh"

namespace mladcp::cuda_impl {
namespace {

using namespace sm90;

constexpr int kTile = 64;                     // keys per tile
constexpr int kThreads = 256;                 // the tensor-core and the converter warpgroups
constexpr int kBlockBytes = kSm90BlockBytes;  // [64 keys][128 B]: 64 dims of a tile
constexpr int kTileBytes = 9 * kBlockBytes;   // 73728
constexpr int kLoads = 18;                    // 16-byte fp8 loads per converter thread and tile
constexpr int kOutStride = kLatentDim + 4;    // floats per row of the transposed output (conflict-free stores)
// Named barriers (0 is __syncthreads): the tensor-core warpgroup among itself; the ring.
constexpr int kBarMma = 1, kBarFull = 2 /* + stage */, kBarEmpty = 4 /* + stage */;
// Bulk L2 prefetches of the keys two tiles ahead of the loads (0: none, for comparisons).
#ifndef MLADCP_FP8_L2_PREFETCH
#define MLADCP_FP8_L2_PREFETCH 1
#endif

template <int N>
struct F8Smem {
  static constexpr int kv = 0;
  static constexpr int q = kv + 2 * kTileBytes;
  static constexpr int p = q + 9 * N * 128;
  static constexpr int red = p + N * 128;
  static constexpr int qs = red + 4 * N * 4;
  static constexpr int ok = qs + N * 4;
  static constexpr int total = ok + 2 * kTile;
  static_assert(q % 1024 == 0 && p % 1024 == 0, "alignment of the swizzled tiles");
  static_assert(N * kOutStride * 4 <= 2 * kTileBytes, "the transposed output fits the ring");
};
static_assert(F8Smem<32>::total <= 227 * 1024, "shared memory of one Hopper CTA");

// wgmma.m64nNk16 (fp16 in, fp32 accumulate), both operands from shared memory; kTransA = 1 reads A
// M-major (Vᵀ from the key tile).
template <int kTransA>
__device__ __forceinline__ void wgmma_n16(float (&d)[8], uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7}, %8, %9, p, 1, 1, %11, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(a), "l"(b), "r"(accumulate), "n"(kTransA));
}
template <int kTransA>
__device__ __forceinline__ void wgmma_n32(float (&d)[16], uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, %19, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(a), "l"(b), "r"(accumulate), "n"(kTransA));
}
template <int kTransA, int A>
__device__ __forceinline__ void wgmma_n(float (&d)[A], uint64_t a, uint64_t b, int accumulate) {
  if constexpr (A == 8)
    wgmma_n16<kTransA>(d, a, b, accumulate);
  else
    wgmma_n32<kTransA>(d, a, b, accumulate);
}

// 16 bytes of the cache, not kept in L1 (each byte is read once per CTA), with the L2 256-byte prefetch hint
// (0.5-1.4% faster than without; L1-allocating loads were slower: run 12 of docs/perf/gpu-sm90-fp8-2026-12-01.md).
__device__ __forceinline__ uint4 load_stream(const uint8_t* ptr) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(ptr));
  return v;
}

template <int N>
__device__ __forceinline__ void convert_tiles(const DecodeKernelParams& p, uint8_t* smem, int seq, int k_begin,
                                              int k_end, int ntiles) {
  const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int kk = lane >> 2, part = lane & 3;  // keys 16w + kk and + 8; 16-byte part of each 64-byte column block
  uint8_t* const ok_s = smem + F8Smem<N>::ok;
  const int32_t* const bt_row = p.block_table + int64_t(seq) * p.block_table_stride;
  // Block ids of the thread's two keys of tile t (-1: absent), read two tiles before their loads.
  struct Pages {
    int32_t b[2];
  };
  auto lookup = [&](int t) {
    Pages pg;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int k = k_begin + t * kTile + 16 * warp + 8 * h + kk;
      const int page = p.block_shift >= 0 ? k >> p.block_shift : k / p.block_size;
      pg.b[h] = t < ntiles && k < k_end && page < p.max_blocks_per_seq ? __ldg(bt_row + page) : -1;
    }
    return pg;
  };
  // Loads of tile t into f (zeros for absent keys); ok: the two keys present.
  auto load = [&](uint4(&f)[kLoads], bool(&ok)[2], const Pages& pg, int t) {
    const uint8_t* base[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int k = k_begin + t * kTile + 16 * warp + 8 * h + kk;
      const int32_t b = pg.b[h];
      ok[h] = b >= 0 && b < p.num_blocks;
      const int row = p.block_shift >= 0 ? k & (p.block_size - 1) : k % p.block_size;
      base[h] = p.kv + (ok[h] ? int64_t(b) * p.kv_stride_block + int64_t(row) * p.kv_stride_token : 0) + 16 * part;
    }
#pragma unroll
    for (int j = 0; j < kLoads; ++j)
      f[j] = ok[j & 1] ? load_stream(base[j & 1] + 64 * (j >> 1)) : make_uint4(0, 0, 0, 0);
  };
  // Store addresses: chunks 2·part and 2·part + 1 of key row 16w + kk (+ 8 for h = 1) of column block m, swizzled
  // (chunk ^ kk) · 16; the column block (8192 m), the key half (1024 h) and the stage are constants of the store.
  const uint32_t row_base = smem_addr(smem + F8Smem<N>::kv) + (16 * warp + kk) * 128;
  const uint32_t st0 = row_base + (((2 * part) ^ kk) << 4), st1 = row_base + (((2 * part + 1) ^ kk) << 4);
  // The loaded tile → fp16 in ring stage `st`, its present keys → ok.
  auto store = [&](const uint4(&f)[kLoads], const bool(&ok)[2], int st) {
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      const uint2 x = e4m3x4_to_f16x4(f[j].x), y = e4m3x4_to_f16x4(f[j].y);
      const uint2 z = e4m3x4_to_f16x4(f[j].z), w = e4m3x4_to_f16x4(f[j].w);
      const uint4 lo = make_uint4(x.x, x.y, y.x, y.y), hi = make_uint4(z.x, z.y, w.x, w.y);
      const uint32_t off = uint32_t(st * kTileBytes + (j >> 1) * kBlockBytes + (j & 1) * 1024);
      asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(st0 + off), "r"(lo.x), "r"(lo.y), "r"(lo.z),
                   "r"(lo.w)
                   : "memory");
      asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(st1 + off), "r"(hi.x), "r"(hi.y), "r"(hi.z),
                   "r"(hi.w)
                   : "memory");
    }
    if (part == 0) {
      ok_s[st * kTile + 16 * warp + kk] = ok[0];
      ok_s[st * kTile + 16 * warp + 8 + kk] = ok[1];
    }
  };
  // The thread's two keys of tile t into L2 (bulk prefetches of 576 bytes, by one lane of the four per key).
  auto prefetch = [&](const Pages& pg, int t) {
    if (!MLADCP_FP8_L2_PREFETCH || part != 0) return;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int k = k_begin + t * kTile + 16 * warp + 8 * h + kk;
      const int32_t b = pg.b[h];
      if (b < 0 || b >= p.num_blocks) continue;
      const int row = p.block_shift >= 0 ? k & (p.block_size - 1) : k % p.block_size;
      const uint8_t* const a = p.kv + int64_t(b) * p.kv_stride_block + int64_t(row) * p.kv_stride_token;
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(a), "n"(kF8RowBytes) : "memory");
    }
  };
  // Two tiles of loads in flight: tile t in f[t % 2], into stage t % 2 once the tensor cores released tile t − 2;
  // meanwhile tiles t + 2 and t + 3 are prefetched into L2 and the block ids of t + 4 and t + 5 are read.
  // At the top of iteration t: ids[0..3] = block ids of tiles t + 2 .. t + 5.
  uint4 f0[kLoads], f1[kLoads];
  bool ok0[2], ok1[2];
  {
    const Pages pg0 = lookup(0), pg1 = lookup(1);
    if (ntiles > 0) load(f0, ok0, pg0, 0);
    if (ntiles > 1) load(f1, ok1, pg1, 1);
  }
  Pages ids[4] = {lookup(2), lookup(3), lookup(4), lookup(5)};
  prefetch(ids[0], 2);
  prefetch(ids[1], 3);
  // Tile t from f into stage st; then the loads of tile t + 2 into f, the L2 prefetch of tile t + 4 (block ids
  // `later`) and the block ids of tile t + 6 (into `next`, which held those of t + 2).
  auto step = [&](uint4(&f)[kLoads], bool(&ok)[2], Pages& next, const Pages& later, int st, int t) {
    if (t >= 2) named_bar_sync(kBarEmpty + st, kThreads);
    store(f, ok, st);
    fence_proxy_async();
    named_bar_arrive(kBarFull + st, kThreads);
    if (t + 2 < ntiles) load(f, ok, next, t + 2);
    prefetch(later, t + 4);
    next = lookup(t + 6);
  };
  for (int t = 0; t < ntiles; t += 2) {
    step(f0, ok0, ids[0], ids[2], 0, t);
    if (t + 1 < ntiles) step(f1, ok1, ids[1], ids[3], 1, t + 1);
    const Pages a = ids[0], b = ids[1];
    ids[0] = ids[2];
    ids[1] = ids[3];
    ids[2] = a;
    ids[3] = b;
  }
}

template <int N>
__global__ void __launch_bounds__(kThreads, 1) mla_decode_sm90_fp8_kernel(const DecodeKernelParams p) {
  using L = F8Smem<N>;
  constexpr int kAcc = N / 2;   // accumulator floats per thread of an m64nN product
  constexpr int kCols = N / 4;  // query rows of a thread: n = 8·(i / 2) + 2·(lane % 4) + i % 2
  constexpr int kMma = 128;     // threads of the tensor-core warpgroup
  extern __shared__ __align__(1024) uint8_t smem[];
  uint8_t* const kv_s = smem + L::kv;
  uint8_t* const q_s = smem + L::q;
  uint8_t* const p_s = smem + L::p;
  float* const red = reinterpret_cast<float*>(smem + L::red);
  const uint8_t* const ok_s = smem + L::ok;
  const int tid = threadIdx.x, warp = (tid >> 5) & 3, lane = tid & 31;

  SplitWork work;
  if (!split_work(p, work)) return;
  const int seq = work.seq, split = work.split, len = work.len, nsplits = work.nsplits;
  const int k_begin = work.k_begin, k_end = work.k_end;
  const int ntiles = k_end > k_begin ? (k_end - k_begin + kTile - 1) / kTile : 0;
  const int row0 = work.rc * N;

  if (tid >= kMma) {
    convert_tiles<N>(p, smem, seq, k_begin, k_end, ntiles);
    return;
  }

  // ---- query rows → q: fp16, row n scaled by 2^e_n (rows past the sequence's R rows are zero) ----
  {
    constexpr int kPerRow = kMma / N;              // threads per row: 8 or 4, neighbouring lanes
    constexpr int kChunks = kRowChunks / kPerRow;  // 16-byte chunks (8 values) per thread: 9 or 18
    const int r = tid / kPerRow, sub = tid % kPerRow;
    const int grow = row0 + r;
    const bool valid = grow < p.rows_per_seq;
    const uint16_t* src = p.q;
    if (valid) {
      const int i = grow / p.num_heads, h = grow - i * p.num_heads;
      src = p.q + q_elem(p, int64_t(seq) * p.q_len + i, h);
    }
    uint4 qv[kChunks];
    float mx = 0.0f;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      qv[c] = valid ? *reinterpret_cast<const uint4*>(src + 8 * (sub + kPerRow * c)) : make_uint4(0, 0, 0, 0);
      const uint32_t w[4] = {qv[c].x, qv[c].y, qv[c].z, qv[c].w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 f = bf16x2_to_float2(w[k]);
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
      const int ch = sub + kPerRow * c;
      const uint32_t w[4] = {qv[c].x, qv[c].y, qv[c].z, qv[c].w};
      uint4 h;
      uint32_t* hv = &h.x;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 f = bf16x2_to_float2(w[k]);
        hv[k] = pack_f16(f.x * up, f.y * up);
      }
      *reinterpret_cast<uint4*>(q_s + (ch >> 3) * (N * 128) + r * 128 + (((ch & 7) ^ (r & 7)) << 4)) = h;
    }
  }
  fence_proxy_async();
  named_bar_sync(kBarMma, kMma);  // the query rows and their scales are in shared memory

  // ---- per-thread state: query rows n(i), their visible keys and score scales, running max and sums ----
  int nvis[kCols];
  float m[kCols], l[kCols], row_scale[kCols];  // row_scale: score_scale_log2 · 2^-e_n
#pragma unroll
  for (int i = 0; i < kCols; ++i) {
    const int n = 8 * (i / 2) + 2 * (lane & 3) + (i & 1);
    const int grow = row0 + n;
    nvis[i] = grow < p.rows_per_seq ? int(sharding::visible_local_keys(len, p.q_len, grow / p.num_heads, p.shard)) : 0;
    row_scale[i] = p.score_scale_log2 * reinterpret_cast<const float*>(smem + L::qs)[n];
    m[i] = -INFINITY;
    l[i] = 0.0f;
  }
  const int key_a = 16 * warp + (lane >> 2);  // this thread's score rows: key_a and key_a + 8 of each tile

  const uint32_t kv_addr = smem_addr(kv_s);
  const uint32_t k_lo = kmajor_lo(kv_addr), v_lo = nmajor_lo(kv_addr);
  const uint32_t q_lo = kmajor_lo(smem_addr(q_s)), p_lo = kmajor_lo(smem_addr(p_s));
  constexpr uint32_t kStage = kTileBytes >> 4;  // one stage in descriptor units

  // Accumulators are first written by the tensor cores (the first products overwrite them).
  float o[8][kAcc];  // dim block b: dims 64b + key_a (+ 8), query rows n(i)
  float s[kAcc];     // scores: keys key_a (+ 8), query rows n(i)

  // Tile t from stage st (a compile-time constant, so that the operand descriptors stay uniform).
  auto tile = [&](int t, auto stage) {
    constexpr int st = decltype(stage)::value;
    named_bar_sync(kBarFull + st, kThreads);  // tile t is in stage st

    // Sᵀ = K·Qᵀ over 576 dims (independent accumulators for interleaved k-steps measured no faster: runs 3, 5).
    wgmma_fence();
    fence_regs(s);
#pragma unroll
    for (int c = 0; c < 9; ++c)
#pragma unroll
      for (int k4 = 0; k4 < 4; ++k4)
        wgmma_n<0>(s, desc(k_lo + st * kStage + uint32_t((c * kBlockBytes + k4 * 32) >> 4)),
                   desc(q_lo + uint32_t((c * N * 128 + k4 * 32) >> 4)), c > 0 || k4 > 0);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(s);

    // Absent keys and keys after a row's causal limit → -inf; column maxima of the warp's 16 keys.
    const int kt = k_begin + t * kTile;
    const bool pres_a = ok_s[st * kTile + key_a] != 0, pres_b = ok_s[st * kTile + key_a + 8] != 0;
    float mx[kCols];
#pragma unroll
    for (int i = 0; i < kCols; ++i) {
      const int j = i / 2, e = i & 1;
      s[4 * j + e] = pres_a && kt + key_a < nvis[i] ? s[4 * j + e] : -INFINITY;
      s[4 * j + 2 + e] = pres_b && kt + key_a + 8 < nvis[i] ? s[4 * j + 2 + e] : -INFINITY;
      mx[i] = fmaxf(s[4 * j + e], s[4 * j + 2 + e]);
#pragma unroll
      for (int sh = 4; sh < 32; sh <<= 1) mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], sh));
    }
    if (lane < 4) {
#pragma unroll
      for (int i = 0; i < kCols; ++i) red[warp * N + 8 * (i / 2) + 2 * lane + (i & 1)] = mx[i];
    }
    named_bar_sync(kBarMma, kMma);  // (B) every warp's maxima

    // New maxima (base-2 logits), P = 2^(S·scale − m) → shared memory, O rescaled.
    float alpha[kCols];
    bool moved = false;
#pragma unroll
    for (int i = 0; i < kCols; ++i) {
      const int j = i / 2, e = i & 1, n = 8 * j + 2 * (lane & 3) + e;
      const float tile_max = fmaxf(fmaxf(red[n], red[N + n]), fmaxf(red[2 * N + n], red[3 * N + n]));
      const float m_new = fmaxf(m[i], tile_max * row_scale[i]);
      alpha[i] = rescale_factor(m[i], m_new);
      moved |= alpha[i] != 1.0f;
      m[i] = m_new;
      const float neg_m = m_new == -INFINITY ? 0.0f : -m_new;
      const float pa = fast_exp2(fmaf(s[4 * j + e], row_scale[i], neg_m));
      const float pb = fast_exp2(fmaf(s[4 * j + 2 + e], row_scale[i], neg_m));
      l[i] = l[i] * alpha[i] + (pa + pb);
      uint8_t* const prow = p_s + n * 128;
      *reinterpret_cast<__half*>(prow + (((key_a >> 3) ^ (n & 7)) << 4) + (key_a & 7) * 2) = __float2half_rn(pa);
      *reinterpret_cast<__half*>(prow + ((((key_a + 8) >> 3) ^ (n & 7)) << 4) + (key_a & 7) * 2) = __float2half_rn(pb);
    }
    if (t > 0 && __any_sync(0xffffffffu, moved)) {
#pragma unroll
      for (int b = 0; b < 8; ++b)
#pragma unroll
        for (int i = 0; i < kCols; ++i) {
          const int j = i / 2, e = i & 1;
          o[b][4 * j + e] *= alpha[i];
          o[b][4 * j + 2 + e] *= alpha[i];
        }
    }
    fence_proxy_async();
    named_bar_sync(kBarMma, kMma);  // (C) P is in shared memory

    // Oᵀ += Vᵀ·Pᵀ: dim block b = column block b of the tile, read M-major; 16 keys per step, the 8 dim
    // blocks (independent accumulators) one after the other.
    wgmma_fence();
#pragma unroll
    for (int b = 0; b < 8; ++b) fence_regs(o[b]);
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
#pragma unroll
      for (int b = 0; b < 8; ++b)
        wgmma_n<1>(o[b], desc(v_lo + st * kStage + uint32_t((b * kBlockBytes + ks * 16 * 128) >> 4)),
                   desc(p_lo + uint32_t((ks * 32) >> 4)), t > 0 || ks > 0);
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int b = 0; b < 8; ++b) fence_regs(o[b]);
    // Stage st is free for tile t + 2 (P is written again only after the next (B), which every warp reaches
    // after this wait).
    if (t + 2 < ntiles) named_bar_arrive(kBarEmpty + st, kThreads);
  };
  for (int t = 0; t < ntiles; t += 2) {
    tile(t, std::integral_constant<int, 0>{});
    if (t + 1 < ntiles) tile(t + 1, std::integral_constant<int, 1>{});
  }

  // ---- row sums of the 64 keys of the 4 warps ----
#pragma unroll
  for (int i = 0; i < kCols; ++i)
#pragma unroll
    for (int sh = 4; sh < 32; sh <<= 1) l[i] += __shfl_xor_sync(0xffffffffu, l[i], sh);
  named_bar_sync(kBarMma, kMma);  // every warp is past its last reads of red and its last product
  if (lane < 4) {
#pragma unroll
    for (int i = 0; i < kCols; ++i) red[warp * N + 8 * (i / 2) + 2 * lane + (i & 1)] = l[i];
  }
  named_bar_sync(kBarMma, kMma);

  // ---- normalized Oᵀ → the ring as [N rows][kOutStride] fp32 (the converter is done with it); base-2 LSE
  // per row → p ----
  float* const ot = reinterpret_cast<float*>(kv_s);
  float* const row_lse = reinterpret_cast<float*>(p_s);
  const bool none = ntiles == 0;  // O was never written: the rows are 0
#pragma unroll
  for (int i = 0; i < kCols; ++i) {
    const int j = i / 2, e = i & 1, n = 8 * j + 2 * (lane & 3) + e;
    const float sum = red[n] + red[N + n] + red[2 * N + n] + red[3 * N + n];
    const float inv = sum > 0.0f ? p.out_scale / sum : 0.0f;
#pragma unroll
    for (int b = 0; b < 8; ++b) {
      ot[n * kOutStride + 64 * b + key_a] = none ? 0.0f : o[b][4 * j + e] * inv;
      ot[n * kOutStride + 64 * b + key_a + 8] = none ? 0.0f : o[b][4 * j + 2 + e] * inv;
    }
    if (warp == 0 && lane < 4) row_lse[n] = sum > 0.0f ? m[i] + log2f(sum) : -INFINITY;
  }
  named_bar_sync(kBarMma, kMma);
  // ---- write: final output (one split) or the partial state (several); a warp per row, 16 columns a lane ----
  const bool direct = nsplits == 1;
  for (int n = warp; n < N; n += 4) {
    const int grow = row0 + n;
    if (grow >= p.rows_per_seq) break;
    const int i = grow / p.num_heads, h = grow - i * p.num_heads;
    const int64_t tok = int64_t(seq) * p.q_len + i;
    const float lse2 = row_lse[n];
    if (direct) {
      const int64_t ob = out_elem(p, tok, h);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int col = 4 * lane + 128 * q;
        const float4 v = *reinterpret_cast<const float4*>(ot + n * kOutStride + col);
        if (p.out_fp32) {
          *reinterpret_cast<float4*>(static_cast<float*>(p.out) + ob + col) = v;
        } else {
          uint2 w;
          w.x = pack_bf16(v.x, v.y);
          w.y = pack_bf16(v.z, v.w);
          *reinterpret_cast<uint2*>(static_cast<uint16_t*>(p.out) + ob + col) = w;
        }
      }
      if (p.lse && lane == 0)
        p.lse[lse_elem(p, tok, h)] = lse::convert(lse2, LseBase::k2, p.lse_base2 ? LseBase::k2 : LseBase::kE);
    } else {
      const int64_t state = (int64_t(seq) * p.max_splits + split) * p.rows_per_seq + grow;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int col = 4 * lane + 128 * q;
        *reinterpret_cast<float4*>(p.ws_o + state * kLatentDim + col) =
            *reinterpret_cast<const float4*>(ot + n * kOutStride + col);
      }
      if (lane == 0) p.ws_lse[state] = lse2;
    }
  }
  // The combine kernel (a programmatic dependent launch) may start its prologue; it waits for this grid.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

}  // namespace

size_t sm90_fp8_decode_smem_bytes(int rows_per_cta) {
  return size_t(rows_per_cta <= 16 ? F8Smem<16>::total : F8Smem<32>::total);
}

cudaError_t set_sm90_fp8_decode_smem() {
  cudaError_t e = cudaFuncSetAttribute(mla_decode_sm90_fp8_kernel<16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       F8Smem<16>::total);
  if (e == cudaSuccess)
    e = cudaFuncSetAttribute(mla_decode_sm90_fp8_kernel<32>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             F8Smem<32>::total);
  return e;
}

cudaError_t launch_sm90_fp8_decode(const DecodeKernelParams& p, int64_t grid, cudaStream_t stream) {
  if (p.rows_per_cta == 16)
    mla_decode_sm90_fp8_kernel<16><<<dim3(unsigned(grid)), dim3(kThreads), size_t(F8Smem<16>::total), stream>>>(p);
  else
    mla_decode_sm90_fp8_kernel<32><<<dim3(unsigned(grid)), dim3(kThreads), size_t(F8Smem<32>::total), stream>>>(p);
  return cudaGetLastError();
}

}  // namespace mladcp::cuda_impl
