// The consumer warpgroups' pieces of the Hopper 64-row decode kernel (sm90_decode_kernel.cu; a producer warpgroup
// fills the ring, sm90_decode_ring.cuh): the wgmma products of a tile, masking and softmax, P stored for the other
// warpgroup, the rows' epilogue.
// Every function is executed by whole warpgroups (wgmma) or warps (shuffles) of the consumers, whose rows are those
// of the wgmma accumulator layout: rows 16·warp + lane/4 and + 8 of the warpgroup's 64.
// Included by the sm_90a kernels only.
#pragma once

#include <cstdint>

#include "core/lse_math.h"
#include "cuda/decode_kernel.cuh"
#include "cuda/f16_scaling.h"
#include "cuda/sm90_decode_ring.cuh"
#include "cuda/sm90_ptx.cuh"
#include "cuda/sm90_timeline.cuh"

namespace mladcp::cuda_impl::sm90_consumer {

using namespace sm90;
using sm90_ring::kBlockBytes;
using sm90_ring::kRows;
using sm90_ring::kSubTiles;
using sm90_ring::kTile;
using sm90_ring::kTileBytes;
using sm90_ring::Smem;  // the pair trace's window (timeline builds)
using sm90_segments::CtaWork;

// Named barriers (0 is __syncthreads): the hand-overs between the two consumer warpgroups (256 threads), one
// warpgroup alone (kBarOwn + wg), both consumers (kBarConsumers).
constexpr int kBarMa = 1, kBarMb = 2, kBarPa = 3, kBarPb = 4, kBarOwn = 5 /* + wg */, kBarConsumers = 7;
using sm90_ring::kConsumerThreads;
static_assert(kBarConsumers < sm90_ring::kBarConvert, "the fp8 converters' named barrier is distinct");

// The epilogue stages a warpgroup's bf16 output (64 rows × 256 columns: 512-byte rows at a pitch of 528 bytes, so
// that the 8 rows a warp writes at once fall on 8 different 16-byte bank groups) in q_s; each row then goes out as
// one bulk copy.
constexpr int kStagedPitch = 512 + 16;
constexpr int kStagedHalfBytes = kRows * kStagedPitch;
static_assert(2 * kStagedHalfBytes <= kTileBytes, "the staged output fits in q_s");

// Operand types of the products: bf16 (bf16 caches), or f16 (fp8 caches: e4m3 converts to f16 in one instruction
// per two values, the query rows are scaled into f16 per row, P is f16).
#define MLADCP_QK_ASM(T)                                            \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                      \
  "wgmma.mma_async.sync.aligned.m64n64k16.f32." T "." T             \
  " {"                                                              \
  "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"          \
  "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31" \
  "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
#define MLADCP_S32                                                                                            \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),  \
      "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), \
      "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
template <bool kF16>
__device__ __forceinline__ void wgmma_qk_m64n64(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  if constexpr (kF16)
    asm volatile(MLADCP_QK_ASM("f16") : MLADCP_S32 : "l"(desc_a), "l"(desc_b), "r"(accumulate));
  else
    asm volatile(MLADCP_QK_ASM("bf16") : MLADCP_S32 : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}
// S (64 rows × 64 keys) += Q·Kᵀ over 16 dims with Q from registers (the A fragment of the m64k16 shape).
#define MLADCP_QK_RS_ASM(T)                                         \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                      \
  "wgmma.mma_async.sync.aligned.m64n64k16.f32." T "." T             \
  " {"                                                              \
  "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"          \
  "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31" \
  "}, {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
__device__ __forceinline__ void wgmma_qk_rs_m64n64(float (&d)[32], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                   uint64_t desc_b, int accumulate) {
  asm volatile(MLADCP_QK_RS_ASM("bf16")
               : MLADCP_S32
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b), "r"(accumulate));
}
#undef MLADCP_QK_RS_ASM
#undef MLADCP_QK_ASM
#undef MLADCP_S32

#define MLADCP_O128                                                                                                   \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),         \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),          \
      "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),         \
      "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),         \
      "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),         \
      "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),         \
      "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),         \
      "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]),         \
      "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]),         \
      "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]),         \
      "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]),         \
      "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]),         \
      "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]),    \
      "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), \
      "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), \
      "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
#define MLADCP_O128_REGS                                                         \
  "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"                       \
  "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"             \
  "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"             \
  "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"             \
  "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"             \
  "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,"             \
  "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111," \
  "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"

// O (64 × 256) += P·V over 16 keys; P from shared memory (K-major descriptor), V N-major.
#define MLADCP_PV_SS_ASM(T)                     \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n" \
  "wgmma.mma_async.sync.aligned.m64n256k16.f32." T "." T " {" MLADCP_O128_REGS "}, %128, %129, p, 1, 1, 0, 1;\n}\n"
template <bool kF16>
__device__ __forceinline__ void wgmma_pv_ss(float (&d)[128], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  if constexpr (kF16)
    asm volatile(MLADCP_PV_SS_ASM("f16") : MLADCP_O128 : "l"(desc_a), "l"(desc_b), "r"(accumulate));
  else
    asm volatile(MLADCP_PV_SS_ASM("bf16") : MLADCP_O128 : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}
// O (64 × 256) += P·V over 16 keys; P from registers (the A fragment of the m64k16 shape).
#define MLADCP_PV_RS_ASM(T)                                                    \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"                                \
  "wgmma.mma_async.sync.aligned.m64n256k16.f32." T "." T " {" MLADCP_O128_REGS \
  "}, {%128,%129,%130,%131}, %132, p, 1, 1, 1;\n}\n"
template <bool kF16>
__device__ __forceinline__ void wgmma_pv_rs(float (&d)[128], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                            uint64_t desc_b, int accumulate) {
  if constexpr (kF16)
    asm volatile(MLADCP_PV_RS_ASM("f16")
                 : MLADCP_O128
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b), "r"(accumulate));
  else
    asm volatile(MLADCP_PV_RS_ASM("bf16")
                 : MLADCP_O128
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b), "r"(accumulate));
}
#undef MLADCP_PV_SS_ASM
#undef MLADCP_PV_RS_ASM
#undef MLADCP_O128
#undef MLADCP_O128_REGS

// This thread's A fragments of the query rows' rope block (64 rows × 64 dims, 128-byte rows swizzled in 16-byte
// chunks: chunk k of row r at (k ^ (r & 7)) · 16): for k-step ks, rows r0 = 16·wi + lane/4 and r0 + 8, dims
// 16·ks + 2·(lane & 3) (+ 1) and + 8 (the m64k16 register layout, as exponentiate packs P).
__device__ __forceinline__ void load_rope_fragments(uint32_t (&qr)[16], const uint8_t* rope) {
  const int lane = threadIdx.x & 31, wi = (threadIdx.x >> 5) & 3;
  const int r0 = 16 * wi + (lane >> 2), r1 = r0 + 8, byte = 4 * (lane & 3);
#pragma unroll
  for (int ks = 0; ks < 4; ++ks)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int chunk = 2 * ks + h;
      qr[4 * ks + 2 * h] = *reinterpret_cast<const uint32_t*>(rope + r0 * 128 + ((chunk ^ (r0 & 7)) << 4) + byte);
      qr[4 * ks + 2 * h + 1] = *reinterpret_cast<const uint32_t*>(rope + r1 * 128 + ((chunk ^ (r1 & 7)) << 4) + byte);
    }
}

// Where the scores take the query rows' rope block (dims 512-575, q_s column block 8) from.
enum class Rope {
  kShared,     // shared memory, like the other blocks
  kRegisters,  // qr (this thread's A fragments; RS products): 8 KiB less of shared-memory operand reads per tile
  kLoad,       // qr, loaded from q_s first (rope points to block 8), once that block has landed (a segment's first)
};

// S = Q·Kᵀ over the 64 keys of a stage (36 k-steps of 16 dims; the first overwrites S), one commit group
// per 64-dim column block, each issued once its copy (`full`, phase parity `parity`) has landed. The
// blocks go in the order the ring refills them: warpgroup 0 from block 0 (its stage's columns 0-3 are
// released first), warpgroup 1 from block 4. The mbarrier waits sit between commit groups, never
// inside one (a wait loop inside a group makes ptxas serialize every wgmma of the kernel), and nothing
// touches S until the caller's wgmma_wait.
// The first scores of a segment with copied queries also wait for each query column block (q_full, phase parity
// q_parity; 0: no wait). trace_pair ≥ 0: the pair trace's events trace_event + j as each block's wait returns (the
// timeline build only). kRope: where the rope block of Q comes from (bf16 only when not kShared).
template <bool kF16, int kFirstBlock, Rope kRope = Rope::kShared>
__device__ __forceinline__ void issue_scores(float (&s)[32], uint32_t (&qr)[16], const uint8_t* rope, uint32_t q_lo,
                                             uint32_t k_lo, uint32_t full, uint32_t parity, uint32_t q_full = 0,
                                             uint32_t q_parity = 0, int64_t trace_pair = -1, int trace_event = 0) {
  static_assert(kRope == Rope::kShared || !kF16, "the rope block from registers is a bf16 path");
  fence_regs(s);
#pragma unroll
  for (int j = 0; j < kSubTiles; ++j) {
    const int c = (kFirstBlock + j) % kSubTiles;
    if (q_full) mbar_wait(q_full + 8 * c, q_parity);
    if (kRope == Rope::kLoad && c == kSubTiles - 1) load_rope_fragments(qr, rope);
    mbar_wait(full + 8 * c, parity);
    if (trace_pair >= 0) MLADCP_TRACE(trace_pair, trace_event + j);
    wgmma_fence();
#pragma unroll
    for (int k4 = 0; k4 < 4; ++k4) {
      const uint32_t koff = uint32_t((c * kBlockBytes + k4 * 32) >> 4);
      if (kRope != Rope::kShared && c == kSubTiles - 1)
        wgmma_qk_rs_m64n64(s, qr[4 * k4], qr[4 * k4 + 1], qr[4 * k4 + 2], qr[4 * k4 + 3], desc(k_lo + koff),
                           j > 0 || k4 > 0);
      else
        wgmma_qk_m64n64<kF16>(s, desc(q_lo + koff), desc(k_lo + koff), j > 0 || k4 > 0);
    }
    wgmma_commit();
  }
}
// O += P·V with P in registers (p[4·ks .. 4·ks + 3]: keys 16·ks .. 16·ks + 15).
template <bool kF16>
__device__ __forceinline__ void issue_pv_regs(float (&o)[128], const uint32_t (&p)[16], uint32_t v_lo,
                                              bool accumulate) {
#pragma unroll
  for (int ks = 0; ks < kTile / 16; ++ks)
    wgmma_pv_rs<kF16>(o, p[4 * ks], p[4 * ks + 1], p[4 * ks + 2], p[4 * ks + 3],
                      desc(v_lo + uint32_t((ks * 16 * 128) >> 4)), ks > 0 || accumulate);
}
// O += P·V with P in shared memory.
template <bool kF16>
__device__ __forceinline__ void issue_pv_smem(float (&o)[128], uint32_t p_lo, uint32_t v_lo, bool accumulate) {
#pragma unroll
  for (int ks = 0; ks < kTile / 16; ++ks)
    wgmma_pv_ss<kF16>(o, desc(p_lo + uint32_t((ks * 32) >> 4)), desc(v_lo + uint32_t((ks * 16 * 128) >> 4)),
                      ks > 0 || accumulate);
}

// o (a warpgroup's 64 × 256 accumulator) ·= α of its rows, skipped when no row of the warp moved.
__device__ __forceinline__ void rescale_rows(float (&o)[128], const float (&alpha)[2]) {
  if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      o[4 * j + 0] *= alpha[0];
      o[4 * j + 1] *= alpha[0];
      o[4 * j + 2] *= alpha[1];
      o[4 * j + 3] *= alpha[1];
    }
  }
}

// Per-thread consumer state: rows (the wgmma accumulator layout: rows 16·warp + lane/4 and + 8).
struct RowState {
  int rs[2];
  int nvis[2];     // visible local keys of each row (causal rule in global coordinates)
  float m[2];      // running max (base-2 logits)
  float l[2];      // this warpgroup's tiles' sum of probabilities at scale m
  float scale[2];  // raw score → base-2 logit (softmax scale · kv scale · log2 e, over the row's f16 query scale)
};

// Scores of absent keys, keys past the split and keys after a row's causal limit become -inf (raw scores
// stay unscaled); mx gets the row maxima of the tile as base-2 logits (scale > 0 commutes with max).
// A tile whose 64 keys are all present and visible to both rows of the thread skips the per-key tests.
__device__ __forceinline__ void mask_scores(float (&s)[32], float (&mx)[2], const uint64_t* ok_bits, int kt,
                                            const RowState& st, int lane) {
  const uint64_t ok = *ok_bits;
  if (ok != ~0ull || kt + kTile > min(st.nvis[0], st.nvis[1])) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int tt = 8 * j + 2 * (lane & 3) + (e & 1);
        const bool valid = ((ok >> tt) & 1) && kt + tt < st.nvis[e >> 1];
        s[4 * j + e] = valid ? s[4 * j + e] : -INFINITY;
      }
  }
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    float m0 = fmaxf(s[2 * e], s[2 * e + 1]), m1 = fmaxf(s[4 + 2 * e], s[4 + 2 * e + 1]);
#pragma unroll
    for (int j = 2; j < 8; j += 2) {
      m0 = fmaxf(m0, fmaxf(s[4 * j + 2 * e], s[4 * j + 2 * e + 1]));
      m1 = fmaxf(m1, fmaxf(s[4 * j + 4 + 2 * e], s[4 * j + 4 + 2 * e + 1]));
    }
    mx[e] = fmaxf(m0, m1);
    mx[e] = fmaxf(mx[e], __shfl_xor_sync(0xffffffffu, mx[e], 1));
    mx[e] = fmaxf(mx[e], __shfl_xor_sync(0xffffffffu, mx[e], 2));
    mx[e] *= st.scale[e];
  }
}

// Two probabilities as an A/B operand word of the products' type.
template <bool kF16>
__device__ __forceinline__ uint32_t pack_operand(float lo, float hi) {
  if constexpr (kF16)
    return pack_f16(lo, hi);
  else
    return pack_bf16(lo, hi);
}

// s ← 2^(s·scale − m) (fp32, kept), row sums added to l, A fragments (bf16 or f16) into p.
template <bool kF16>
__device__ __forceinline__ void exponentiate(float (&s)[32], uint32_t (&p)[16], const float (&m)[2],
                                             const float (&scale)[2], float (&l)[2]) {
  float neg_m[2];
#pragma unroll
  for (int e = 0; e < 2; ++e) neg_m[e] = m[e] == -INFINITY ? 0.0f : -m[e];
  float part[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[4 * j + e] = fast_exp2(fmaf(s[4 * j + e], scale[e >> 1], neg_m[e >> 1]));
      part[e >> 1][j & 1] += s[4 * j + e];
    }
  l[0] += part[0][0] + part[0][1];
  l[1] += part[1][0] + part[1][1];
  // A fragment of k-step ks: (row, keys 16ks + 2t..), (row + 8, same), (row, keys 16ks + 8 + 2t..), (row + 8, same)
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    p[4 * ks + 0] = pack_operand<kF16>(s[8 * ks + 0], s[8 * ks + 1]);
    p[4 * ks + 1] = pack_operand<kF16>(s[8 * ks + 2], s[8 * ks + 3]);
    p[4 * ks + 2] = pack_operand<kF16>(s[8 * ks + 4], s[8 * ks + 5]);
    p[4 * ks + 3] = pack_operand<kF16>(s[8 * ks + 6], s[8 * ks + 7]);
  }
}

// P·scale (bf16 or f16) → a [64 rows][64 keys] K-major swizzled tile (the rope column block of a stage).
template <bool kF16>
__device__ __forceinline__ void store_p(uint8_t* dst, const float (&s)[32], const float (&scale)[2], const RowState& st,
                                        int lane) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int tt = 8 * j + 2 * (lane & 3);
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int r = st.rs[e];
      *reinterpret_cast<uint32_t*>(dst + r * 128 + (((tt >> 3) ^ (r & 7)) << 4) + (tt & 7) * 2) =
          pack_operand<kF16>(s[4 * j + 2 * e] * scale[e], s[4 * j + 2 * e + 1] * scale[e]);
    }
  }
}

// fp8 caches: the query rows in q_s (bf16) rescaled in place to f16, row r by 2^e_r, which puts its largest
// magnitude into [2^14, 2^15) (every bf16 value down to 2^-28 of it is then exact in f16); qscale[r] = 2^-e_r goes
// into the row's score scale. Four consumer threads per row (tid / 4), each every fourth 16-byte chunk.
__device__ __forceinline__ void scale_queries_to_f16(uint8_t* q_s, float* qscale, int tid) {
  const int r = tid >> 2, q4 = tid & 3;
  auto chunk = [&](int ch) {
    return reinterpret_cast<uint4*>(q_s + (ch >> 3) * kBlockBytes + r * 128 + (((ch & 7) ^ (r & 7)) << 4));
  };
  float mx = 0.0f;
  for (int ch = q4; ch < kRowChunks; ch += 4) {
    const uint4 v = *chunk(ch);
    for (const uint32_t w : {v.x, v.y, v.z, v.w}) {
      const float2 f = bf16x2_to_float2(w);
      mx = fmaxf(mx, fmaxf(fabsf(f.x), fabsf(f.y)));
    }
  }
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  const int ex = f16_row_exponent(mx);
  const float up = ldexpf(1.0f, ex);
  auto to_f16x2 = [&](uint32_t w) {
    const float2 f = bf16x2_to_float2(w);
    return pack_f16(f.x * up, f.y * up);
  };
  for (int ch = q4; ch < kRowChunks; ch += 4) {
    uint4* const c = chunk(ch);
    const uint4 v = *c;
    *c = make_uint4(to_f16x2(v.x), to_f16x2(v.y), to_f16x2(v.z), to_f16x2(v.w));
  }
  if (q4 == 0) qscale[r] = ldexpf(1.0f, -ex);
}

// The tile that holds the end of the split's keys may carry unused (possibly NaN) cache rows from a
// valid page past the sequence: zero rows [valid, 64) of column blocks [c0, c0 + 4) of the stage
// before multiplying them (scores of those keys are masked already). One warpgroup, its own half.
__device__ __forceinline__ void zero_tail_rows(uint8_t* stage, int valid, int c0, int wg, int tid_in_wg) {
  for (int i = tid_in_wg; i < (kTile - valid) * 4 * 8; i += 128) {
    const int r = valid + i / 32, c = c0 + (i / 8) % 4, ch = i % 8;
    *reinterpret_cast<uint4*>(stage + c * kBlockBytes + r * 128 + ch * 16) = make_uint4(0, 0, 0, 0);
  }
  fence_proxy_async();
  named_bar_sync(kBarOwn + wg, 128);
}

// Both warpgroups' row sums of a segment: this thread's rows' l over the quad, then written into red[4 + wg] for the
// epilogue (the caller's barrier makes them visible).
__device__ __forceinline__ void publish_row_sums(RowState& st, float* red, int wg, int lane) {
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    st.l[e] += __shfl_xor_sync(0xffffffffu, st.l[e], 1);
    st.l[e] += __shfl_xor_sync(0xffffffffu, st.l[e], 2);
  }
  if ((lane & 3) == 0) {
    red[(4 + wg) * 64 + st.rs[0]] = st.l[0];
    red[(4 + wg) * 64 + st.rs[1]] = st.l[1];
  }
}

// This thread's part of final row r (of the CTA's 64; token t, head h) in its warpgroup's 256 columns: val(j) is
// column pair j (columns 256·wg + 2·(lane % 4) + 8j, + 1). fp32 output straight to `out`; bf16 staged in q_s (its
// queries are no longer read) for flush_staged_rows; zeros straight to `out` for a segment without keys (q_s may be
// receiving the next segment's queries).
template <class Val>
__device__ __forceinline__ void write_final_row(const DecodeKernelParams& p, int64_t t, int h, int r, bool staged,
                                                uint8_t* q_s, int wg, int lane, const Val& val) {
  const int64_t ob = out_elem(p, t, h) + 256 * wg + 2 * (lane & 3);
  if (p.out_fp32) {
    float* dst = static_cast<float*>(p.out) + ob;
#pragma unroll
    for (int j = 0; j < 32; ++j) *reinterpret_cast<float2*>(dst + j * 8) = val(j);
  } else if (staged) {
    uint8_t* const row = q_s + wg * kStagedHalfBytes + r * kStagedPitch;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const float2 v = val(j);
      *reinterpret_cast<uint32_t*>(row + (j << 4) + 4 * (lane & 3)) = pack_bf16(v.x, v.y);
    }
  } else {
    uint16_t* dst = static_cast<uint16_t*>(p.out) + ob;
#pragma unroll
    for (int j = 0; j < 32; ++j) *reinterpret_cast<uint32_t*>(dst + j * 8) = 0u;
  }
}

// The staged bf16 rows of this warp (its 16 rows of the sequence's chunk at row0) out of q_s, one bulk copy per
// 512-byte row half, issued by lanes 0-15 (accumulator-layout stores of 4 bytes leave half sectors, which the
// memory system completes with a read; 16-byte stores by the threads kept the warps in the epilogue for several
// µs). No warpgroup barrier: a warp writes and sends only its own rows.
__device__ __forceinline__ void flush_staged_rows(const DecodeKernelParams& p, int seq, int row0, uint8_t* q_s, int wg,
                                                  int lane) {
  const int wi = (threadIdx.x >> 5) & 3;
  fence_proxy_async();
  __syncwarp();
  if (lane < 16) {
    const int r = 16 * wi + lane;
    const int grow = row0 + r;
    if (grow < p.rows_per_seq) {
      const int i = grow / p.num_heads, h = grow - i * p.num_heads;
      const int64_t t = int64_t(seq) * p.q_len + i;
      bulk_store(static_cast<uint16_t*>(p.out) + out_elem(p, t, h) + 256 * wg,
                 smem_addr(q_s + wg * kStagedHalfBytes + r * kStagedPitch), 512);
    }
    bulk_store_commit_and_wait_read();
  }
  __syncwarp();
}

// Row r's base-2 LSE and the factor that normalizes its output (both 0-row safe: l = 0 gives -inf and 0).
struct RowEnd {
  float lse2, inv;
};
__device__ __forceinline__ RowEnd row_end(const DecodeKernelParams& p, const RowState& st, const float* red, int hh) {
  const int r = st.rs[hh];
  const float l = red[256 + r] + red[320 + r];
  return {l > 0.0f ? st.m[hh] + log2f(l) : -INFINITY, l > 0.0f ? p.out_scale / l : 0.0f};
}

// The segment's rows of this thread, after both warpgroups' row sums are in red: the final output and LSE (one
// segment covers the sequence), or the partial state. bf16 output of a segment with keys (staged) goes through q_s
// and out as bulk copies (flush_staged_rows); q_s may be written again once the warp is past this.
__device__ __forceinline__ void write_rows(const DecodeKernelParams& p, const CtaWork& w, const RowState& st,
                                           const float (&o)[128], const float* red, uint8_t* q_s, bool staged, int wg,
                                           int lane) {
  const bool direct = w.direct;
#if MLADCP_SM90_TIMELINE
  if (w.ntiles == 0 && sm90_timeline::g_skip_empty_writes) return;  // experiment: an empty segment writes nothing
#endif
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = st.rs[hh];
    const int grow = w.row0 + r;
    if (grow >= p.rows_per_seq) continue;
    const RowEnd end = row_end(p, st, red, hh);
    // Column pair j of this row, normalized (no tile: O was never written, the row is 0). O is only read
    // here: a non-wgmma definition of an accumulator would serialize every wgmma of the kernel.
    const bool none = w.ntiles == 0;
    auto val = [&](int j) {
      return make_float2(none ? 0.0f : o[4 * j + 2 * hh] * end.inv, none ? 0.0f : o[4 * j + 2 * hh + 1] * end.inv);
    };
    const int i = grow / p.num_heads, h = grow - i * p.num_heads;
    const int64_t t = int64_t(w.seq) * p.q_len + i;
    if (direct) {
      write_final_row(p, t, h, r, staged, q_s, wg, lane, val);
      if (p.lse && wg == 0 && (lane & 3) == 0)
        p.lse[lse_elem(p, t, h)] = lse::convert(end.lse2, LseBase::k2, p.lse_base2 ? LseBase::k2 : LseBase::kE);
    } else {
      const int64_t state = w.state_block * p.rows_per_seq + grow;
      float* dst = p.ws_o + state * kLatentDim + 256 * wg + 2 * (lane & 3);
      const uint64_t keep = evict_last_policy();
#pragma unroll
      for (int j = 0; j < 32; ++j) store_evict_last(reinterpret_cast<float2*>(dst + j * 8), val(j), keep);
      if (wg == 0 && (lane & 3) == 0) store_evict_last(p.ws_lse + state, end.lse2, keep);
    }
  }
  if (staged) flush_staged_rows(p, w.seq, w.row0, q_s, wg, lane);
}

}  // namespace mladcp::cuda_impl::sm90_consumer
