// The chunk kernel on Intel AMX (tile matrix unit, bf16 inputs, fp32 accumulation), for CPUs with
// AMX-BF16 and AVX512-BF16. Same contract and same online softmax as the fp32 kernel; the two
// products run as tile dot products:
//   scores^T [16 keys × 16 rows] += K [16 keys × 32 dims] · Q^T [32 dims × 16 rows]   (18 steps of 32)
//   out      [16 rows × 16 dims] += P [16 rows × 32 keys] · V [32 keys × 16 dims]
// K comes straight from a bf16 cache when 16 consecutive keys share a block (else from a bf16
// staging tile; fp8 converts exactly to bf16). Q and K are exact bf16, so the scores are as exact
// as fp32 FMAs. P is split into hi + lo bf16 parts (P - hi - lo is below 2^-17·P) so the output
// keeps fp32 accuracy; V is exact bf16. This file is compiled with AMX and AVX-512 flags and is
// only called after kernel.cpp found the features (and the OS permission for the tile state).

// GCC 12's AVX-512 intrinsic headers trip -Wmaybe-uninitialized on their own "undefined" vectors.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "cpu/kernel.h"

#define MLADCP_CPU_NS amx
#define MLADCP_CPU_VW 16
#include "cpu/kernel_vec.h"

namespace mladcp::cpu::amx {
namespace {

constexpr int kDimSteps = kQkDim / 32;       // 18 steps of 32 dims for the scores
constexpr int kKeyBlocks = kTileKeys / 16;   // 4 blocks of 16 keys per tile
constexpr int kColBlocks = kLatentDim / 16;  // 32 output column blocks of 16

// Tiles: scores use 0-3 (one accumulator per key block), 4/6 (K) and 5/7 (Q^T). The output uses
// 2-3 (P hi, keys 0-31 and 32-63), 6-7 (P lo), and alternates (accumulator, V) between (0, 1) and
// (4, 5).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

void configure_tiles() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
}

// 16 × 16 transpose of 32-bit elements in registers: four butterfly stages of two-source permutes.
// Stage k pairs rows i and i + k: the low result takes x[j] where bit k of j is clear and y[j - k]
// where it is set; the high result x[j + k] and y[j].
struct TransposeIndices {
  alignas(64) int32_t lo[4][16];
  alignas(64) int32_t hi[4][16];
  constexpr TransposeIndices() : lo(), hi() {
    for (int s = 0, k = 1; s < 4; ++s, k *= 2)
      for (int j = 0; j < 16; ++j) {
        lo[s][j] = (j & k) == 0 ? j : 16 + j - k;
        hi[s][j] = (j & k) == 0 ? j + k : 16 + j;
      }
  }
};
constexpr TransposeIndices kTranspose;

inline void transpose16(__m512i* r) {
  for (int s = 0, k = 1; s < 4; ++s, k *= 2) {
    const __m512i lo = _mm512_load_si512(kTranspose.lo[s]), hi = _mm512_load_si512(kTranspose.hi[s]);
    for (int base = 0; base < 16; base += 2 * k) {
      for (int i = base; i < base + k; ++i) {
        const __m512i x = r[i], y = r[i + k];
        r[i] = _mm512_permutex2var_epi32(x, lo, y);
        r[i + k] = _mm512_permutex2var_epi32(x, hi, y);
      }
    }
  }
}

// V tiles are interleaved with the in-lane unpacks (one instruction each), which leaves the 32 columns
// of a column pair in the order of the 128-bit lanes: accumulator column 16·b + 4·q + i holds latent
// column 8·q + 4·b + i (b: tile, q: lane, i < 4). These indices put the columns back in order
// (value < 16: from the first tile, else from the second).
struct UnpackOrder {
  alignas(64) int32_t first[16];
  alignas(64) int32_t second[16];
  constexpr UnpackOrder() : first(), second() {
    for (int j = 0; j < 32; ++j) {
      const int q = j / 8, b = (j / 4) % 2, i = j % 4;
      (j < 16 ? first[j] : second[j - 16]) = 16 * b + 4 * q + i;
    }
  }
};
constexpr UnpackOrder kUnpackOrder;

// One cached fp8 token (576 values) to bf16, exactly: normals rebias the exponent ((mag << 4) +
// (120 << 7) in bf16 bits), subnormals m · 2^-9 come from an 8-entry table; 0x7f/0xff are NaN.
inline void fp8_to_bf16(const uint8_t* src, uint16_t* dst) {
  alignas(64) static const uint16_t kSub[32] = {0x0000, 0x3b00, 0x3b80, 0x3bc0, 0x3c00, 0x3c20, 0x3c40, 0x3c60};
  const __m512i table = _mm512_load_si512(kSub);
  for (int d = 0; d < kQkDim; d += 32) {
    const __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + d)));
    const __m512i mag = _mm512_and_si512(w, _mm512_set1_epi16(0x7f));
    __m512i v = _mm512_add_epi16(_mm512_slli_epi16(mag, 4), _mm512_set1_epi16(120 << 7));
    v = _mm512_mask_permutexvar_epi16(v, _mm512_cmplt_epu16_mask(mag, _mm512_set1_epi16(8)), mag, table);
    v = _mm512_mask_mov_epi16(v, _mm512_cmpeq_epi16_mask(mag, _mm512_set1_epi16(0x7f)), _mm512_set1_epi16(0x7fc0));
    v = _mm512_or_si512(v, _mm512_slli_epi16(_mm512_and_si512(w, _mm512_set1_epi16(0x80)), 8));
    _mm512_storeu_si512(dst + d, v);
  }
}

// V columns [32·cp, 32·cp + 32) of the tile's keys (rows[j], nullptr = a zero key) in the pair-
// interleaved B layout, for the column blocks 2·cp and 2·cp + 1 and both key halves, columns in
// unpack order (see UnpackOrder): out[(half · 2 + b) · 512 + pair · 32 + 2c + i] =
// V[half · 32 + 2·pair + i][32·cp + 8·(c / 4) + 4·b + c % 4].
inline void pack_value_columns(const uint16_t* const* rows, int key_pairs, int cp, uint16_t* out) {
  for (int pair = 0; pair < key_pairs; ++pair) {
    const uint16_t* r0 = rows[2 * pair];
    const uint16_t* r1 = rows[2 * pair + 1];
    const __m512i x0 = r0 ? _mm512_loadu_si512(r0 + cp * 32) : _mm512_setzero_si512();
    const __m512i x1 = r1 ? _mm512_loadu_si512(r1 + cp * 32) : _mm512_setzero_si512();
    uint16_t* base = out + (pair / 16) * 2 * 512 + (pair % 16) * 32;
    _mm512_store_si512(base, _mm512_unpacklo_epi16(x0, x1));
    _mm512_store_si512(base + 512, _mm512_unpackhi_epi16(x0, x1));
  }
}

// Scratch layout (bytes, each part 64-byte aligned).
constexpr size_t kQtBytes = size_t(kMaxChunkRows) * kQkDim * 2;     // [rb][18][16 pairs][16 rows] dwords
constexpr size_t kStageBytes = size_t(kTileKeys) * kQkDim * 2;      // [64 keys][576] bf16
constexpr size_t kVpBytes = 2 * 4 * 1024;                           // two buffers of 4 V tiles
constexpr size_t kStBytes = size_t(kMaxChunkRows) * kTileKeys * 4;  // [rb][64 keys][16 rows] fp32
constexpr size_t kPBytes = size_t(kMaxChunkRows) * kTileKeys * 2;   // [rb][16 rows][64 keys] bf16
constexpr size_t kOBytes = size_t(kMaxChunkRows) * kLatentDim * 4;  // [rows][512] fp32
constexpr size_t kQtOff = 0;
constexpr size_t kStageOff = kQtOff + kQtBytes;
constexpr size_t kVpOff = kStageOff + kStageBytes;
constexpr size_t kStOff = kVpOff + kVpBytes;
constexpr size_t kPhiOff = kStOff + kStBytes;
constexpr size_t kPloOff = kPhiOff + kPBytes;
constexpr size_t kOOff = kPloOff + kPBytes;
constexpr size_t kMOff = kOOff + kOBytes;
constexpr size_t kScratchBytes = kMOff + 3 * kMaxChunkRows * 4;

void run_chunk(const ChunkArgs& a, float* scratch_floats) {
  const MlaDecodeParams& p = *a.p;
  uint8_t* scratch = reinterpret_cast<uint8_t*>(scratch_floats);
  const int H = p.num_heads;
  const int R = a.row_end - a.row_begin;
  const int RB = (R + 15) / 16, RP = RB * 16;
  uint32_t* qt = reinterpret_cast<uint32_t*>(scratch + kQtOff);
  uint16_t* stage = reinterpret_cast<uint16_t*>(scratch + kStageOff);
  uint16_t* vp = reinterpret_cast<uint16_t*>(scratch + kVpOff);
  float* st = reinterpret_cast<float*>(scratch + kStOff);
  uint16_t* p_hi = reinterpret_cast<uint16_t*>(scratch + kPhiOff);
  uint16_t* p_lo = reinterpret_cast<uint16_t*>(scratch + kPloOff);
  float* o = reinterpret_cast<float*>(scratch + kOOff);
  float* m = reinterpret_cast<float*>(scratch + kMOff);
  float* l = m + kMaxChunkRows;
  float* alpha = l + kMaxChunkRows;

  configure_tiles();

  // Q^T in the pair-interleaved B layout, one 16 × 16 dword transpose per (row block, 32 dims).
  int64_t visible[kMaxChunkRows];
  const uint16_t* qrow[kMaxChunkRows];
  for (int r = 0; r < RP; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
    if (r >= R) {
      visible[r] = 0;
      qrow[r] = nullptr;
      continue;
    }
    const int row = a.row_begin + r, i = row / H, h = row % H;
    qrow[r] = static_cast<const uint16_t*>(p.q) + q_offset(p, int64_t(a.seq) * p.q_len + i, h);
    visible[r] = std::min(a.visible[i], a.key_end);
  }
  for (int rb = 0; rb < RB; ++rb) {
    for (int ds = 0; ds < kDimSteps; ++ds) {
      __m512i blk[16];
      for (int e = 0; e < 16; ++e)
        blk[e] = qrow[rb * 16 + e] ? _mm512_loadu_si512(qrow[rb * 16 + e] + ds * 32) : _mm512_setzero_si512();
      transpose16(blk);
      uint32_t* dst = qt + (size_t(rb) * kDimSteps + ds) * 256;
      for (int e = 0; e < 16; ++e) _mm512_store_si512(dst + e * 16, blk[e]);
    }
  }
  std::memset(o, 0, sizeof(float) * size_t(RP) * kLatentDim);

  const bool fp8 = p.kv_dtype == DType::kFP8E4M3;
  // Keys are tile-loaded from the cache when every 16-key group lies in one block.
  const bool direct = !fp8 && p.block_size % 16 == 0;
  const size_t esize = fp8 ? 1 : 2;
  const int32_t* table = p.block_table + a.seq * p.block_table_stride;
  // Addresses of keys [k, k + count): one division, then a running (block, slot).
  auto row_addresses = [&](int64_t k, int count, const uint8_t** out) {
    int64_t block = k / p.block_size, slot = k % p.block_size;
    for (int j = 0; j < count; ++j) {
      out[j] = static_cast<const uint8_t*>(p.kv_cache) +
               (int64_t(table[block]) * p.kv_stride_block + slot * p.kv_stride_token) * int64_t(esize);
      if (++slot == p.block_size) {
        slot = 0;
        ++block;
      }
    }
  };
  const long kstride = direct ? long(p.kv_stride_token * 2) : long(kQkDim * 2);

  int ra = 0;
  for (int64_t k0 = a.key_begin; k0 < a.key_end; k0 += kTileKeys) {
    const int n = int(std::min<int64_t>(kTileKeys, a.key_end - k0));
    while (ra < R && visible[ra] <= k0) ++ra;
    if (ra == R) break;
    const int rb0 = ra / 16;
    const int key_blocks = (n + 15) / 16;

    // Key rows in bf16: in the cache, or converted into the staging tile (zero rows past n).
    const uint8_t* src[kTileKeys];
    const uint16_t* rows[kTileKeys];
    row_addresses(k0, n, src);
    for (int j = 0; j < kTileKeys; ++j) {
      if (j >= n) {
        rows[j] = nullptr;
      } else if (direct) {
        rows[j] = reinterpret_cast<const uint16_t*>(src[j]);
      } else {
        uint16_t* dst = stage + size_t(j) * kQkDim;
        if (fp8)
          fp8_to_bf16(src[j], dst);
        else
          std::memcpy(dst, src[j], kQkDim * sizeof(uint16_t));
        rows[j] = dst;
      }
    }
    if (!direct && n < key_blocks * 16)
      std::memset(stage + size_t(n) * kQkDim, 0, sizeof(uint16_t) * size_t(key_blocks * 16 - n) * kQkDim);
    const uint16_t* kblock[kKeyBlocks];
    for (int kb = 0; kb < key_blocks; ++kb) kblock[kb] = direct ? rows[kb * 16] : stage + size_t(kb) * 16 * kQkDim;

    // Scores^T for the active row blocks. Two row blocks at a time: accumulators 0-3 hold
    // (key block kb, kb + 1) × (row block rb, rb + 1), K in tiles 4/6 and Q^T in 5/7, one tile load
    // per dot product. A single row block: accumulators 0-3 hold the four key blocks, Q^T in 5
    // and K alternating between 4 and 6.
    int rb = rb0;
    for (; rb + 1 < RB; rb += 2) {
      const uint32_t* q0 = qt + size_t(rb) * kDimSteps * 256;
      const uint32_t* q1 = q0 + kDimSteps * 256;
      float* s0 = st + size_t(rb) * kTileKeys * 16;
      float* s1 = s0 + kTileKeys * 16;
      for (int kb = 0; kb < key_blocks; kb += 2) {
        const bool pair = kb + 1 < key_blocks;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int ds = kDimSteps - 1; ds >= 0; --ds) {
          _tile_loadd(5, q0 + ds * 256, 64);
          _tile_loadd(7, q1 + ds * 256, 64);
          _tile_loadd(4, kblock[kb] + ds * 32, kstride);
          _tile_dpbf16ps(0, 4, 5);
          _tile_dpbf16ps(2, 4, 7);
          if (pair) {
            _tile_loadd(6, kblock[kb + 1] + ds * 32, kstride);
            _tile_dpbf16ps(1, 6, 5);
            _tile_dpbf16ps(3, 6, 7);
          }
        }
        _tile_stored(0, s0 + kb * 16 * 16, 64);
        _tile_stored(2, s1 + kb * 16 * 16, 64);
        if (pair) {
          _tile_stored(1, s0 + (kb + 1) * 16 * 16, 64);
          _tile_stored(3, s1 + (kb + 1) * 16 * 16, 64);
        }
      }
    }
    if (rb < RB) {
      // One row block: two key blocks at a time (accumulators 0, 1); Q^T double-buffered in 5/7 and
      // K in 2/3 and 4/6, so the next step's loads never wait for a dot product still reading.
      const uint32_t* qtb = qt + size_t(rb) * kDimSteps * 256;
      float* s = st + size_t(rb) * kTileKeys * 16;
      for (int kb = 0; kb < key_blocks; kb += 2) {
        const bool pair = kb + 1 < key_blocks;
        _tile_zero(0);
        _tile_zero(1);
        for (int ds = kDimSteps - 2; ds >= 0; ds -= 2) {
          _tile_loadd(5, qtb + ds * 256, 64);
          _tile_loadd(2, kblock[kb] + ds * 32, kstride);
          if (pair) _tile_loadd(3, kblock[kb + 1] + ds * 32, kstride);
          _tile_dpbf16ps(0, 2, 5);
          if (pair) _tile_dpbf16ps(1, 3, 5);
          _tile_loadd(7, qtb + (ds + 1) * 256, 64);
          _tile_loadd(4, kblock[kb] + (ds + 1) * 32, kstride);
          if (pair) _tile_loadd(6, kblock[kb + 1] + (ds + 1) * 32, kstride);
          _tile_dpbf16ps(0, 4, 7);
          if (pair) _tile_dpbf16ps(1, 6, 7);
        }
        _tile_stored(0, s + kb * 16 * 16, 64);
        if (pair) _tile_stored(1, s + (kb + 1) * 16 * 16, 64);
      }
    }

    // Online softmax per row block (lanes are rows), then P split into bf16 hi + lo, transposed
    // to [rows][keys] for the A operand.
    bool rescale = false;
    for (int rb = rb0; rb < RB; ++rb) {
      vi lim{};
      vf mv{}, lv{}, av{};
      for (int e = 0; e < 16; ++e) {
        const int r = rb * 16 + e;
        lim[e] = r < R ? int32_t(std::clamp<int64_t>(visible[r] - k0, 0, n)) : 0;
        mv[e] = m[r];
        lv[e] = l[r];
      }
      float* s = st + size_t(rb) * kTileKeys * 16;
      softmax_rows(s, 16, kTileKeys, a.score_scale, lim, mv, lv, av);  // keys past n get probability 0
      for (int e = 0; e < 16; ++e) {
        m[rb * 16 + e] = mv[e];
        l[rb * 16 + e] = lv[e];
        alpha[rb * 16 + e] = av[e];
        rescale |= av[e] != 1.0f;
      }
      for (int kb = 0; kb < kKeyBlocks; ++kb) {
        __m512i blk[16];
        for (int j = 0; j < 16; ++j) blk[j] = _mm512_load_si512(s + (kb * 16 + j) * 16);
        transpose16(blk);  // blk[e]: probabilities of row e for the 16 keys of block kb
        for (int e = 0; e < 16; ++e) {
          const __m512 pr = _mm512_castsi512_ps(blk[e]);
          const __m256bh hi = _mm512_cvtneps_pbh(pr);
          const __m512 back = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)hi), 16));
          const __m256bh lo = _mm512_cvtneps_pbh(_mm512_sub_ps(pr, back));
          const size_t at = (size_t(rb) * 16 + e) * kTileKeys + kb * 16;
          _mm256_store_si256(reinterpret_cast<__m256i*>(p_hi + at), (__m256i)hi);
          _mm256_store_si256(reinterpret_cast<__m256i*>(p_lo + at), (__m256i)lo);
        }
      }
    }
    if (rescale) {
      for (int r = rb0 * 16; r < RP; ++r) {
        if (alpha[r] == 1.0f) continue;
        const __m512 f = _mm512_set1_ps(alpha[r]);
        float* orow = o + size_t(r) * kLatentDim;
        for (int c = 0; c < kLatentDim; c += 16) _mm512_store_ps(orow + c, _mm512_mul_ps(_mm512_load_ps(orow + c), f));
      }
    }

    // out += P_hi · V + P_lo · V, 32 columns (two column blocks) at a time. The V tiles of a column
    // pair are packed into one of two small L1 buffers one step ahead of their use, so the tile
    // loads never wait for the stores that wrote them.
    const bool second_half = n > 32;
    const int key_pairs = second_half ? kTileKeys / 2 : 16;
    const bool one_block = RB - rb0 == 1;
    auto load_p = [&](int rb) {
      const uint16_t* hi = p_hi + size_t(rb) * 16 * kTileKeys;
      const uint16_t* lo = p_lo + size_t(rb) * 16 * kTileKeys;
      _tile_loadd(2, hi, kTileKeys * 2);
      _tile_loadd(6, lo, kTileKeys * 2);
      if (second_half) {
        _tile_loadd(3, hi + 32, kTileKeys * 2);
        _tile_loadd(7, lo + 32, kTileKeys * 2);
      }
    };
    if (one_block) load_p(rb0);
    pack_value_columns(rows, key_pairs, 0, vp);
    for (int cp = 0; cp < kColBlocks / 2; ++cp) {
      const uint16_t* buf = vp + (cp & 1) * 4 * 512;
      if (cp + 1 < kColBlocks / 2) pack_value_columns(rows, key_pairs, cp + 1, vp + ((cp + 1) & 1) * 4 * 512);
      for (int rb = rb0; rb < RB; ++rb) {
        if (!one_block) load_p(rb);
        float* orow = o + size_t(rb) * 16 * kLatentDim + cp * 32;
        _tile_loadd(0, orow, kLatentDim * 4);
        _tile_loadd(1, buf, 64);
        _tile_loadd(4, orow + 16, kLatentDim * 4);
        _tile_loadd(5, buf + 512, 64);
        _tile_dpbf16ps(0, 2, 1);
        _tile_dpbf16ps(4, 2, 5);
        _tile_dpbf16ps(0, 6, 1);
        _tile_dpbf16ps(4, 6, 5);
        if (second_half) {
          _tile_loadd(1, buf + 1024, 64);
          _tile_loadd(5, buf + 1536, 64);
          _tile_dpbf16ps(0, 3, 1);
          _tile_dpbf16ps(4, 3, 5);
          _tile_dpbf16ps(0, 7, 1);
          _tile_dpbf16ps(4, 7, 5);
        }
        _tile_stored(0, orow, kLatentDim * 4);
        _tile_stored(4, orow + 16, kLatentDim * 4);
      }
    }
  }
  _tile_release();

  for (int r = 0; r < R; ++r) {
    float* out = a.out + int64_t(r) * kLatentDim;
    if (!(l[r] > 0.0f)) {  // no key of this chunk is visible to the row
      std::memset(out, 0, sizeof(float) * kLatentDim);
      a.lse2[r] = -INFINITY;
      continue;
    }
    const __m512 f = _mm512_set1_ps(a.value_scale / l[r]);
    const __m512i first = _mm512_load_si512(kUnpackOrder.first), second = _mm512_load_si512(kUnpackOrder.second);
    for (int c = 0; c < kLatentDim; c += 32) {
      const __m512 x = _mm512_load_ps(o + size_t(r) * kLatentDim + c);
      const __m512 y = _mm512_load_ps(o + size_t(r) * kLatentDim + c + 16);
      _mm512_storeu_ps(out + c, _mm512_mul_ps(_mm512_permutex2var_ps(x, first, y), f));
      _mm512_storeu_ps(out + c + 16, _mm512_mul_ps(_mm512_permutex2var_ps(x, second, y), f));
    }
    a.lse2[r] = m[r] + std::log2(l[r]);
  }
}

}  // namespace

const KernelVariant kVariant = {Isa::kAmx, run_chunk, (kScratchBytes + 3) / 4};

}  // namespace mladcp::cpu::amx
