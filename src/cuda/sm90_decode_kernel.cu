// Hopper (sm_90a) split kernel of the "cuda" decode for 64 query rows per CTA, bf16 cache: both
// products on warpgroup tensor-core instructions (wgmma) that read their operands from shared memory.
//
// Same contract, plan, workspace and combine as the portable kernel (decode_kernel.cuh): one CTA =
// one (sequence, chunk of 64 query rows, split of local keys); a single-split sequence writes out/lse
// directly, otherwise the CTA writes the normalized fp32 partial state for mla_decode_combine_kernel.
//
// Threads: two warpgroups (256 threads) on the "seesaw" schedule described above the kernel: warpgroup
// w scores every other 64-key tile (S = Q·Kᵀ, 36 × wgmma.m64n64k16, Q and K from shared memory,
// K-major) and owns output columns [256w, 256w + 256) of both tiles of a pair (O_w = O_w·α + P·V_w,
// 4 × wgmma.m64n256k16 per tile; P and V from shared memory, V read N-major through the transposed-B
// form, so keys are stored once and serve as K and V). The running max is handed from one warpgroup
// to the other through shared memory, so both use the same max for a row; row sums stay per
// warpgroup and are added at the end.
//
// Shared memory (every tile in the 128-byte-swizzle canonical layout, 1024-byte aligned):
//   q_s  [9 column blocks][64 rows][128 B]   query rows (64 dims per column block), loaded once
//   kv_s [2 stages][9][64 keys][128 B]        key tiles (stage t % 2 holds tile t), by cp.async; once
//                                             a tile's scores are done, its column block 8 (rope
//                                             dims) holds its bf16 probabilities P [64 rows][64 keys]
// Byte (r, chunk c) of a [9][64][128 B] tile: (c / 8) · 8192 + r · 128 + ((c % 8) ^ (r % 8)) · 16.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/lse_math.h"
#include "cuda/decode_kernel.cuh"
#include "cuda/sm90_decode.h"

namespace mladcp::cuda_impl {
namespace {

constexpr int kSm90Rows = 64;
constexpr int kSm90Tile = 64;                    // keys per tile
constexpr int kSm90Threads = 256;                // two warpgroups
constexpr int kBlockBytes = 64 * 128;            // one 64-dim column block of a 64-row tile
constexpr int kSm90TileBytes = 9 * kBlockBytes;  // 73728: 64 rows × 576 bf16

// Shared-memory layout (byte offsets).
struct Sm90Smem {
  static constexpr int q = 0;
  static constexpr int kv = q + kSm90TileBytes;
  static constexpr int red = kv + 2 * kSm90TileBytes;  // [2][64] fp32: m_a, m_b of a pair; at the end row sums
  static constexpr int tok_ok = red + 2 * 64 * 4;      // [2 stages][64 keys]: key present
  static constexpr int total = tok_ok + 2 * kSm90Tile;
};
static_assert(Sm90Smem::total <= 227 * 1024, "shared memory of one Hopper CTA");
static_assert(Sm90Smem::kv % 1024 == 0, "128-byte swizzle atoms are 1024-byte aligned");

__device__ __forceinline__ uint32_t sw128_off(int r, int c) {
  return uint32_t((c >> 3) * kBlockBytes + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

// wgmma shared-memory matrix descriptor, 128-byte swizzle: start address, leading and stride byte
// offsets (all in 16-byte units), layout type 1 in bits 62-63.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(lbo_bytes >> 4) << 16) | (uint64_t(sbo_bytes >> 4) << 32) |
         (uint64_t(1) << 62);
}
// K-major operand (rows of 64 contiguous k values per column block): 8-row groups 1024 bytes apart;
// the leading offset is unused when one instruction's k extent (16) lies inside the 128-byte row.
__device__ __forceinline__ uint64_t kmajor_desc(uint32_t addr) { return sw128_desc(addr, 16, 1024); }
// N-major B operand (V: 64 contiguous output dims per column block, one key per 128-byte row):
// column blocks (64 dims) kBlockBytes apart (leading), 8-key groups 1024 bytes apart (stride).
__device__ __forceinline__ uint64_t nmajor_desc(uint32_t addr) { return sw128_desc(addr, kBlockBytes, 1024); }

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Generic-proxy shared-memory writes (cp.async, st.shared) visible to the async proxy (wgmma).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Keeps the compiler from moving accesses of accumulator registers across a wgmma issue or wait.
template <int N>
__device__ __forceinline__ void fence_regs(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

__device__ __forceinline__ void wgmma_qk_m64n64(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
      "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// Named barriers (ids 1..15; 0 is __syncthreads). A producer warpgroup arrives, a consumer warpgroup waits
// (256 threads in all), or one warpgroup synchronizes its own 128 threads.
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void wgmma_pv_m64n256(float (&d)[128], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"
      "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"
      "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,"
      "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,"
      "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"
      "}, %128, %129, p, 1, 1, 0, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]),
        "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]),
        "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]),
        "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]),
        "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]),
        "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]),
        "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]),
        "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]),
        "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// O_w += P·V_w: 4 k-steps of 16 keys (P: 32 bytes into its rows; V: key rows 16·ks).
// accumulate = false: the first k step overwrites O (the first tile).
__device__ __forceinline__ void issue_output(float (&o)[128], uint64_t p_desc, uint64_t v_desc, bool accumulate) {
#pragma unroll
  for (int ks = 0; ks < kSm90Tile / 16; ++ks)
    wgmma_pv_m64n256(o, p_desc + uint64_t((ks * 32) >> 4), v_desc + uint64_t((ks * 16 * 128) >> 4),
                     ks > 0 || accumulate);
}

// ---- Seesaw schedule: the two warpgroups take alternate 64-key tiles ----
//
// Tiles come in pairs (a = 2i in stage 0, b = 2i + 1 in stage 1). Warpgroup 0 computes the scores of
// tile a (S_a = Q·K_aᵀ, 36 × wgmma.m64n64k16, all 64 keys of every row in one warpgroup, so the row
// maxima need only warp shuffles), warpgroup 1 those of tile b. Warpgroup w still owns output columns
// [256w, 256w + 256) and multiplies both tiles' probabilities into them. Per pair:
//
//   WG0: S_a | softmax a (m_a = max(m, rowmax S_a)), P_a → smem | O_L += P_a·V_a ... | O_L·2^(m_a-m_b) | O_L += P_b·V_b
//   WG1: S_b | ........ waits for m_a, softmax b (m_b = max(m_a, rowmax S_b)) → smem | O_R·2^(m-m_a) | O_R += P_a·V_a
//                                                                         | O_R·2^(m_a-m_b) | O_R += P_b·V_b
//
// so warpgroup 0's P_a·V_a runs on the tensor cores while warpgroup 1 does its softmax, and the two
// warpgroups drift apart by about a softmax (the seesaw). A tile's probabilities are written over its
// rope column block (dims 512..575, used only by the scores), so no separate P buffer is needed.
// Synchronization is by named barriers between the warpgroups (no CTA-wide barrier in the loop):
//   kBarPa / kBarPb        P_a, m_a (WG0 → WG1) and P_b, m_b (WG1 → WG0) written
//   kBarFree0 / kBarFree1  WG0 is done with stage 0 / WG1 with stage 1 (its P·V retired)
//   kBarLoaded0 / 1        the next tile of stage 0 / 1 has landed (loader → the warpgroup scoring it)
//   kBarOwn + w            warpgroup w's own P visible to its own wgmma
// Whoever frees a stage last refills it: warpgroup 1 loads the next tile a (as soon as P_a·V_a retired
// on both sides, in the middle of the pair), warpgroup 0 the next tile b; each waits for its own
// cp.async groups and arrives on the consumer's "loaded" barrier.
constexpr int kBarLoaded0 = 1, kBarLoaded1 = 2, kBarPa = 3, kBarPb = 4, kBarFree0 = 5, kBarFree1 = 6, kBarOwn = 7;
constexpr int kPairThreads = kSm90Threads;  // a producer warpgroup arrives, a consumer warpgroup waits

// S = Q·Kᵀ over the 64 keys of a stage.
__device__ __forceinline__ void issue_scores64(float (&s)[32], uint64_t q_desc, uint64_t k_desc) {
#pragma unroll
  for (int kk = 0; kk < kQkDim / 16; ++kk) {
    const uint64_t koff = uint64_t(((kk >> 2) * kBlockBytes + (kk & 3) * 32) >> 4);
    wgmma_qk_m64n64(s, q_desc + koff, k_desc + koff, kk > 0);
  }
}

__device__ __forceinline__ float rescale_factor(float m_from, float m_to) {
  return m_from == -INFINITY ? 1.0f : exp2f(m_from - m_to);
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

__global__ void __launch_bounds__(kSm90Threads, 1) mla_decode_sm90_seesaw_kernel(const DecodeKernelParams p) {
  extern __shared__ __align__(1024) uint8_t smem[];
  uint8_t* const q_s = smem + Sm90Smem::q;
  uint8_t* const kv_s = smem + Sm90Smem::kv;
  float* const red = reinterpret_cast<float*>(smem + Sm90Smem::red);  // [2][64]: m_a, m_b; at the end row sums
  uint8_t* const tok_ok = smem + Sm90Smem::tok_ok;                    // [2 stages][64 keys]

  const int tid = threadIdx.x, lane = tid & 31;
  const int wg = tid >> 7;        // warpgroup: scores of the tiles of stage wg, output columns [256wg, +256)
  const int wi = (tid >> 5) & 3;  // warp within the warpgroup: rows 16·wi .. 16·wi + 15
  int64_t bid = blockIdx.x;
  const int rc = int(bid % p.row_chunks);
  bid /= p.row_chunks;
  const int split = int(bid % p.max_splits);
  const int seq = int(bid / p.max_splits);

  const int len = clamped_len(p, seq);
  const int n_max = int(sharding::local_len(len, p.shard.world, p.shard.rank, p.shard.interleave));
  const int nsplits = cuda_plan::num_splits(n_max, p.split_len);
  if (split >= nsplits) return;
  const int k_begin = split * p.split_len;
  const int k_end = min(k_begin + p.split_len, n_max);
  const int ntiles = k_end > k_begin ? (k_end - k_begin + kSm90Tile - 1) / kSm90Tile : 0;
  const int npairs = (ntiles + 1) / 2;  // an odd count ends on an absent (zero-filled, masked) tile b
  const int row0 = rc * kSm90Rows;

  // ---- query rows → q_s (rows past the sequence's R rows are zero) ----
  for (int c = tid; c < kSm90Rows * kRowChunks; c += kSm90Threads) {
    const int r = c / kRowChunks, ch = c - r * kRowChunks;
    const int grow = row0 + r;
    const bool valid = grow < p.rows_per_seq;
    const uint16_t* src = p.q;
    if (valid) {
      const int i = grow / p.num_heads, h = grow - i * p.num_heads;
      src = p.q + q_elem(p, int64_t(seq) * p.q_len + i, h) + ch * 8;
    }
    cp_async_16(smem_addr(q_s + sw128_off(r, ch)), src, valid);
  }
  cp_async_commit();

  // ---- key tile loader of one warpgroup: 8 threads per key row, 9 chunks of 16 bytes each (chunk
  // ls + 8j lands in column block j), four row passes of 16 rows. Tile t goes to stage t % 2; absent
  // keys (and every key of a tile past the split) are zero-filled.
  constexpr int kTpr = 8, kPasses = 4, kRowsPerPass = 128 / kTpr;
  const int lt = tid & 127, lr = lt / kTpr, ls = lt % kTpr;
  const int32_t* const bt_row = p.block_table + int64_t(seq) * p.block_table_stride;
  int32_t blk_next[kPasses];
  auto fetch_blocks = [&](int tile) {
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int k = k_begin + tile * kSm90Tile + lr + pass * kRowsPerPass;
      int32_t b = -1;
      if (tile < ntiles && k < k_end) {
        const int page = k / p.block_size;
        if (page < p.max_blocks_per_seq) b = __ldg(bt_row + page);
      }
      blk_next[pass] = b;
    }
  };
  auto issue = [&](int tile) {
    uint8_t* const dst = kv_s + (tile & 1) * kSm90TileBytes;
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int row = lr + pass * kRowsPerPass;
      const int k = k_begin + tile * kSm90Tile + row;
      const int32_t b = blk_next[pass];
      const bool valid = tile < ntiles && k < k_end && b >= 0 && b < p.num_blocks;
      const uint8_t* src = p.kv;
      if (valid) src += (int64_t(b) * p.kv_stride_block + int64_t(k % p.block_size) * p.kv_stride_token) * 2;
#pragma unroll
      for (int j = 0; j < 9; ++j)
        cp_async_16(smem_addr(dst + j * kBlockBytes + row * 128 + ((ls ^ (row & 7)) << 4)), src + (ls + 8 * j) * 16,
                    valid);
      if (ls == 0) tok_ok[(tile & 1) * kSm90Tile + row] = valid ? 1 : 0;
    }
    cp_async_commit();
  };

  // Warpgroup 1 loads the tiles of stage 0, warpgroup 0 those of stage 1: tile (1 - wg) first.
  if (npairs > 0) {
    fetch_blocks(1 - wg);
    issue(1 - wg);
    fetch_blocks(3 - wg);
  }
  cp_async_wait_all();
  fence_proxy_async();
  __syncthreads();

  // ---- per-thread rows (the wgmma accumulator layout: rows 16·wi + lane/4 and + 8) ----
  const int rs[2] = {16 * wi + (lane >> 2), 16 * wi + (lane >> 2) + 8};
  int nrow[2];  // visible local keys of each row (causal rule in global coordinates)
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int grow = row0 + rs[e];
    nrow[e] = grow < p.rows_per_seq ? int(sharding::visible_local_keys(len, p.q_len, grow / p.num_heads, p.shard)) : 0;
  }
  float m_run[2] = {-INFINITY, -INFINITY};
  float l_run[2] = {0.0f, 0.0f};  // this warpgroup's tiles only, at the scale m_run

  // Accumulators are first written by the tensor cores (the first tile's products overwrite them):
  // an ordinary definition of a register that a wgmma in flight may own makes ptxas serialize every
  // wgmma of the kernel (C7515), and a zero initialization before the loop counts as one.
  float o[128];
  float s[32];

  const uint32_t kv_addr = smem_addr(kv_s);
  constexpr uint64_t kStage = uint64_t(kSm90TileBytes >> 4);  // one stage in descriptor address units
  const uint64_t q_desc = kmajor_desc(smem_addr(q_s));
  const uint64_t k_desc = kmajor_desc(kv_addr) + uint64_t(wg) * kStage;  // this warpgroup's stage
  const uint64_t p_desc0 = kmajor_desc(kv_addr + 8 * kBlockBytes);       // P over the rope block of stage 0
  const uint64_t v_desc0 = nmajor_desc(kv_addr + uint32_t(wg * 4 * kBlockBytes));
  uint8_t* const p_own = kv_s + wg * kSm90TileBytes + 8 * kBlockBytes;  // this warpgroup's P

  for (int i = 0; i < npairs; ++i) {
    const bool more = i + 1 < npairs;
    const int tile = 2 * i + wg;  // the tile this warpgroup scores (stage wg)

    // ---- scores of this warpgroup's tile ----
    if (i > 0) named_bar_sync(wg == 0 ? kBarLoaded0 : kBarLoaded1, kPairThreads);
    wgmma_fence();
    fence_regs(s);
    issue_scores64(s, q_desc, k_desc);
    wgmma_commit();
    if (wg == 0 && i > 0) {  // the tile b this warpgroup requested at the end of the last pair
      cp_async_wait_all();
      fence_proxy_async();
      named_bar_arrive(kBarLoaded1, kPairThreads);
    }
    wgmma_wait<0>();
    fence_regs(s);

    // ---- mask, base-2 logits, row maxima of this tile ----
    const int kt = k_begin + tile * kSm90Tile;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int tt = 8 * j + 2 * (lane & 3) + (e & 1);
        const bool ok = tok_ok[wg * kSm90Tile + tt] && kt + tt < nrow[e >> 1];
        const float v = ok ? s[4 * j + e] * p.score_scale_log2 : -INFINITY;
        s[4 * j + e] = v;
        mx[e >> 1] = fmaxf(mx[e >> 1], v);
      }
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      mx[e] = fmaxf(mx[e], __shfl_xor_sync(0xffffffffu, mx[e], 1));
      mx[e] = fmaxf(mx[e], __shfl_xor_sync(0xffffffffu, mx[e], 2));
    }

    // m_a: the running max after tile a (warpgroup 0 computes it, warpgroup 1 reads it).
    float m_a[2], m_new[2];
    if (wg == 1) named_bar_sync(kBarPa, kPairThreads);
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      m_a[e] = wg == 0 ? fmaxf(m_run[e], mx[e]) : red[rs[e]];
      m_new[e] = wg == 0 ? m_a[e] : fmaxf(m_a[e], mx[e]);  // warpgroup 1: m_b
    }

    // ---- P = 2^(S - m_new) → this tile's rope block (bf16), row sums ----
    float alpha[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      alpha[e] = rescale_factor(m_run[e], m_new[e]);
      l_run[e] *= alpha[e];
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int tt = 8 * j + 2 * (lane & 3);
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float m_use = m_new[e] == -INFINITY ? 0.0f : m_new[e];
        const float p0 = exp2f(s[4 * j + 2 * e] - m_use);
        const float p1 = exp2f(s[4 * j + 2 * e + 1] - m_use);
        l_run[e] += p0 + p1;
        const int r = rs[e];
        *reinterpret_cast<uint32_t*>(p_own + r * 128 + (((tt >> 3) ^ (r & 7)) << 4) + (tt & 7) * 2) = pack_bf16(p0, p1);
      }
    }
    if ((lane & 3) == 0) {
      red[wg * 64 + rs[0]] = m_new[0];
      red[wg * 64 + rs[1]] = m_new[1];
    }
    fence_proxy_async();
    named_bar_sync(kBarOwn + wg, 128);  // this warpgroup's P complete
    named_bar_arrive(wg == 0 ? kBarPa : kBarPb, kPairThreads);

    if (wg == 0) {
      // ---- O_L = O_L·2^(m - m_a) + P_a·V_a; then, once WG1 has m_b, ·2^(m_a - m_b) + P_b·V_b ----
      if (i > 0) rescale_rows(o, alpha);
      m_run[0] = m_a[0];
      m_run[1] = m_a[1];
      wgmma_fence();
      fence_regs(o);
      issue_output(o, p_desc0, v_desc0, i > 0);
      wgmma_commit();
      named_bar_sync(kBarPb, kPairThreads);
      float m_b[2], beta[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        m_b[e] = red[64 + rs[e]];
        beta[e] = rescale_factor(m_run[e], m_b[e]);
        l_run[e] *= beta[e];
        m_run[e] = m_b[e];
      }
      wgmma_wait<0>();
      fence_regs(o);
      if (more) named_bar_arrive(kBarFree0, kPairThreads);  // P_a·V_a retired here
      rescale_rows(o, beta);
      wgmma_fence();
      fence_regs(o);
      issue_output(o, p_desc0 + kStage, v_desc0 + kStage, true);
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(o);
      if (more) {  // stage 1 free on both sides: request the next tile b
        named_bar_sync(kBarFree1, kPairThreads);
        issue(tile + 3);
        fetch_blocks(tile + 5);
      }
    } else {
      // ---- O_R = O_R·2^(m - m_a) + P_a·V_a, then ·2^(m_a - m_b) + P_b·V_b ----
      float a1[2], beta[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        a1[e] = rescale_factor(m_run[e], m_a[e]);
        beta[e] = rescale_factor(m_a[e], m_new[e]);
        m_run[e] = m_new[e];
      }
      if (i > 0) rescale_rows(o, a1);
      wgmma_fence();
      fence_regs(o);
      issue_output(o, p_desc0, v_desc0, i > 0);
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(o);
      if (more) {  // stage 0 free on both sides: request the next tile a
        named_bar_sync(kBarFree0, kPairThreads);
        issue(tile + 1);
        fetch_blocks(tile + 3);
      }
      rescale_rows(o, beta);
      wgmma_fence();
      fence_regs(o);
      issue_output(o, p_desc0 + kStage, v_desc0 + kStage, true);
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(o);
      if (more) {
        named_bar_arrive(kBarFree1, kPairThreads);
        cp_async_wait_all();
        fence_proxy_async();
        named_bar_arrive(kBarLoaded0, kPairThreads);
      }
    }
  }
  wgmma_wait<0>();
  fence_regs(o);
  cp_async_wait_all();  // nothing in flight at exit (also when there was no tile)

  // ---- row sums of both warpgroups ----
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    l_run[e] += __shfl_xor_sync(0xffffffffu, l_run[e], 1);
    l_run[e] += __shfl_xor_sync(0xffffffffu, l_run[e], 2);
  }
  __syncthreads();  // every read of the last tile maxima is done
  if ((lane & 3) == 0) {
    red[wg * 64 + rs[0]] = l_run[0];
    red[wg * 64 + rs[1]] = l_run[1];
  }
  __syncthreads();

  // ---- write: final output (one split) or the partial state (several) ----
  const bool direct = nsplits == 1;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = rs[hh];
    const int grow = row0 + r;
    if (grow >= p.rows_per_seq) continue;
    const float l = red[r] + red[64 + r];
    const float m = m_run[hh];
    const float lse2 = l > 0.0f ? m + log2f(l) : -INFINITY;
    const float inv = l > 0.0f ? p.out_scale / l : 0.0f;
    if (ntiles == 0) {  // no tile: O was never written
#pragma unroll
      for (int j = 0; j < 32; ++j) o[4 * j + 2 * hh] = o[4 * j + 2 * hh + 1] = 0.0f;
    }
    const int i = grow / p.num_heads, h = grow - i * p.num_heads;
    const int64_t t = int64_t(seq) * p.q_len + i;
    const int col0 = 256 * wg + 2 * (lane & 3);
    if (direct) {
      const int64_t ob = out_elem(p, t, h) + col0;
      if (p.out_fp32) {
        float* dst = static_cast<float*>(p.out) + ob;
#pragma unroll
        for (int j = 0; j < 32; ++j)
          *reinterpret_cast<float2*>(dst + j * 8) = make_float2(o[4 * j + 2 * hh] * inv, o[4 * j + 2 * hh + 1] * inv);
      } else {
        uint16_t* dst = static_cast<uint16_t*>(p.out) + ob;
#pragma unroll
        for (int j = 0; j < 32; ++j)
          *reinterpret_cast<uint32_t*>(dst + j * 8) = pack_bf16(o[4 * j + 2 * hh] * inv, o[4 * j + 2 * hh + 1] * inv);
      }
      if (p.lse && wg == 0 && (lane & 3) == 0)
        p.lse[lse_elem(p, t, h)] = lse::convert(lse2, LseBase::k2, p.lse_base2 ? LseBase::k2 : LseBase::kE);
    } else {
      const int64_t state = (int64_t(seq) * p.max_splits + split) * p.rows_per_seq + grow;
      float* dst = p.ws_o + state * kLatentDim + col0;
#pragma unroll
      for (int j = 0; j < 32; ++j)
        *reinterpret_cast<float2*>(dst + j * 8) = make_float2(o[4 * j + 2 * hh] * inv, o[4 * j + 2 * hh + 1] * inv);
      if (wg == 0 && (lane & 3) == 0) p.ws_lse[state] = lse2;
    }
  }
}

}  // namespace

size_t sm90_decode_smem_bytes() { return size_t(Sm90Smem::total); }

cudaError_t set_sm90_decode_smem() {
  return cudaFuncSetAttribute(mla_decode_sm90_seesaw_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              int(Sm90Smem::total));
}

cudaError_t launch_sm90_decode(const DecodeKernelParams& p, int64_t grid, cudaStream_t stream) {
  mla_decode_sm90_seesaw_kernel<<<dim3(unsigned(grid)), dim3(kSm90Threads), size_t(Sm90Smem::total), stream>>>(p);
  return cudaGetLastError();
}

}  // namespace mladcp::cuda_impl
