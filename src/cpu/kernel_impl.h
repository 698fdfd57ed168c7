// The fp32 chunk kernel, written once with GCC vector extensions and compiled per instruction set
// (kernel_generic.cpp, kernel_avx2.cpp, kernel_avx512.cpp define MLADCP_CPU_NS, MLADCP_CPU_VW and
// MLADCP_CPU_ACC_REGS and include this file). See kernel.h for the contract.
//
// Per tile of kTileKeys keys:
//   kv[j][0:576]  = dequantized keys (fp32, converted once for every row of the chunk)
//   st[j][r]      = Σ_d kv[j][d] · qt[d][r]               (qt = Q^T scaled to base-2 scores)
//   online softmax down each column r of st (rows are vector lanes: no horizontal reductions)
//   o[r][0:512]   = alpha[r] · o[r] + Σ_j st[j][r] · kv[j][0:512]
// Both products are register-blocked outer products: an accumulator block of MK keys × NV row
// vectors (scores) and MR rows × NC column vectors (output), fed by broadcasts.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#include "cpu/kernel.h"
#include "cpu/kernel_vec.h"

namespace mladcp::cpu::MLADCP_CPU_NS {
namespace {

constexpr int kAccRegs = MLADCP_CPU_ACC_REGS;  // vector accumulators a micro-kernel may hold
constexpr int kDPanel = 64;                    // qt rows kept in L1 while a row block sweeps the keys

// Accumulator shapes. Scores: MK keys × NV row vectors, MK a power of two dividing kTileKeys.
constexpr int score_keys(int nv) {
  int mk = kTileKeys;
  while (mk > 1 && mk * nv > kAccRegs) mk /= 2;
  return mk;
}
constexpr int kMaxScoreVecs = kAccRegs >= 24 ? 4 : 2;  // row vectors per score block
// Output: MR rows × NC column vectors.
constexpr int kOutCols = kAccRegs >= 24 ? 4 : 2;
constexpr int kOutRows = 6;

// st[j][v] (+)= Σ_{d < kDPanel} kv[j][d] · qt[d][v] for MK keys j and NV row vectors v.
template <int MK, int NV>
inline void score_block(const float* __restrict kv, const float* __restrict qt, int qt_stride, float* __restrict st,
                        int st_stride, bool first) {
  vf acc[MK][NV];
  for (int k = 0; k < MK; ++k)
    for (int v = 0; v < NV; ++v) acc[k][v] = first ? vf{} : vload(st + k * st_stride + v * VW);
  for (int d = 0; d < kDPanel; ++d) {
    vf b[NV];
    for (int v = 0; v < NV; ++v) b[v] = vload(qt + d * qt_stride + v * VW);
#pragma GCC unroll 64
    for (int k = 0; k < MK; ++k) {
      const vf a = splat(kv[k * kQkDim + d]);
      for (int v = 0; v < NV; ++v) acc[k][v] += a * b[v];
    }
  }
  for (int k = 0; k < MK; ++k)
    for (int v = 0; v < NV; ++v) vstore(st + k * st_stride + v * VW, acc[k][v]);
}

template <int NV>
void scores_nv(const float* kv, int keys, const float* qt, int stride, float* st) {
  constexpr int MK = score_keys(NV);
  for (int d0 = 0; d0 < kQkDim; d0 += kDPanel)
    for (int j0 = 0; j0 < keys; j0 += MK)
      score_block<MK, NV>(kv + j0 * kQkDim + d0, qt + d0 * stride, stride, st + j0 * stride, stride, d0 == 0);
}

// Scores of `keys` tile keys (a multiple of 16, rows zero-padded) for row vectors [v0, nvec).
void scores(const float* kv, int keys, const float* qt, int stride, float* st, int v0, int nvec) {
  for (int v = v0; v < nvec; v += kMaxScoreVecs) {
    const int nv = std::min(kMaxScoreVecs, nvec - v);
    const float* q = qt + v * VW;
    float* s = st + v * VW;
    switch (nv) {
      case 1:
        scores_nv<1>(kv, keys, q, stride, s);
        break;
      case 2:
        scores_nv<2>(kv, keys, q, stride, s);
        break;
      case 3:
        if constexpr (kMaxScoreVecs >= 3) scores_nv<3>(kv, keys, q, stride, s);
        break;
      case 4:
        if constexpr (kMaxScoreVecs >= 4) scores_nv<4>(kv, keys, q, stride, s);
        break;
    }
  }
}

// o[m][c] = alpha[m] · o[m][c] + Σ_{j < keys} pt[j][m] · kv[j][c] for MR rows and NC column vectors.
template <int MR>
inline void output_block(const float* __restrict pt, int pt_stride, const float* __restrict kv, int keys,
                         float* __restrict o, const float* __restrict alpha) {
  constexpr int NC = kOutCols;
  vf acc[MR][NC];
  for (int m = 0; m < MR; ++m)
    for (int c = 0; c < NC; ++c) acc[m][c] = vload(o + m * kLatentDim + c * VW) * alpha[m];
  for (int j = 0; j < keys; ++j) {
    vf b[NC];
    for (int c = 0; c < NC; ++c) b[c] = vload(kv + j * kQkDim + c * VW);
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const vf a = splat(pt[j * pt_stride + m]);
      for (int c = 0; c < NC; ++c) acc[m][c] += a * b[c];
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int c = 0; c < NC; ++c) vstore(o + m * kLatentDim + c * VW, acc[m][c]);
}

// Output update of rows [r0, r1) from `keys` probabilities per row (pt, key-major).
void outputs(const float* pt, int stride, const float* kv, int keys, float* o, const float* alpha, int r0, int r1) {
  constexpr int cols = kOutCols * VW;
  for (int c = 0; c < kLatentDim; c += cols) {
    for (int r = r0; r < r1; r += kOutRows) {
      const float* p = pt + r;
      const float* v = kv + c;
      float* out = o + r * kLatentDim + c;
      const float* a = alpha + r;
      switch (std::min(kOutRows, r1 - r)) {
        case 1:
          output_block<1>(p, stride, v, keys, out, a);
          break;
        case 2:
          output_block<2>(p, stride, v, keys, out, a);
          break;
        case 3:
          output_block<3>(p, stride, v, keys, out, a);
          break;
        case 4:
          output_block<4>(p, stride, v, keys, out, a);
          break;
        case 5:
          output_block<5>(p, stride, v, keys, out, a);
          break;
        case 6:
          output_block<6>(p, stride, v, keys, out, a);
          break;
      }
    }
  }
}

// Keys [k0, k0 + n) of the chunk's sequence into kv[0, n); rows [n, pad) zeroed.
void load_tile(const MlaDecodeParams& p, int seq, int64_t k0, int n, int pad, float* kv) {
  const int32_t* table = p.block_table + seq * p.block_table_stride;
  for (int j = 0; j < n; ++j) {
    const int64_t k = k0 + j;
    const int64_t elem = int64_t(table[k / p.block_size]) * p.kv_stride_block + (k % p.block_size) * p.kv_stride_token;
    if (p.kv_dtype == DType::kFP8E4M3)
      convert_fp8(static_cast<const uint8_t*>(p.kv_cache) + elem, kv + j * kQkDim);
    else
      convert_bf16(static_cast<const uint16_t*>(p.kv_cache) + elem, kv + j * kQkDim);
  }
  if (pad > n) std::memset(kv + n * kQkDim, 0, sizeof(float) * size_t(pad - n) * kQkDim);
}

// Scratch layout (floats): kv [kTileKeys][576] | qt [576][128] | st [kTileKeys][128] | o [128][512] |
// m, l, alpha [128].
constexpr size_t kKvOff = 0;
constexpr size_t kQtOff = kKvOff + size_t(kTileKeys) * kQkDim;
constexpr size_t kStOff = kQtOff + size_t(kQkDim) * kMaxChunkRows;
constexpr size_t kOOff = kStOff + size_t(kTileKeys) * kMaxChunkRows;
constexpr size_t kMOff = kOOff + size_t(kMaxChunkRows) * kLatentDim;
constexpr size_t kLOff = kMOff + kMaxChunkRows;
constexpr size_t kAlphaOff = kLOff + kMaxChunkRows;
constexpr size_t kScratchFloats = kAlphaOff + kMaxChunkRows;

void run_chunk(const ChunkArgs& a, float* scratch) {
  const MlaDecodeParams& p = *a.p;
  const int H = p.num_heads;
  const int R = a.row_end - a.row_begin;
  const int nvec = (R + VW - 1) / VW;
  const int RP = nvec * VW;  // row stride of qt and st
  float* kv = scratch + kKvOff;
  float* qt = scratch + kQtOff;
  float* st = scratch + kStOff;
  float* o = scratch + kOOff;
  float* m = scratch + kMOff;
  float* l = scratch + kLOff;
  float* alpha = scratch + kAlphaOff;

  // Q^T in base-2 score units, built from VW × VW blocks transposed in registers; padding lanes
  // are zero and see no key.
  int64_t visible[kMaxChunkRows];
  const uint16_t* qrow[kMaxChunkRows];
  for (int r = 0; r < RP; ++r) {
    if (r >= R) {
      visible[r] = 0;
      qrow[r] = nullptr;
      continue;
    }
    const int row = a.row_begin + r, i = row / H, h = row % H;
    const int64_t t = int64_t(a.seq) * p.q_len + i;
    qrow[r] = static_cast<const uint16_t*>(p.q) + q_offset(p, t, h);
    visible[r] = std::min(a.visible[i], a.key_end);
    m[r] = -INFINITY;
    l[r] = 0.0f;
  }
  for (int rb = 0; rb < RP; rb += VW) {
    for (int d0 = 0; d0 < kQkDim; d0 += VW) {
      vf blk[VW];
      for (int e = 0; e < VW; ++e) blk[e] = qrow[rb + e] ? widen_bf16(qrow[rb + e] + d0) * a.score_scale : vf{};
      transpose(blk);
      for (int e = 0; e < VW; ++e) vstore(qt + (d0 + e) * RP + rb, blk[e]);
    }
  }
  std::memset(o, 0, sizeof(float) * size_t(R) * kLatentDim);

  int ra = 0;  // rows are ordered by query token, so the rows that see a key form a suffix
  for (int64_t k0 = a.key_begin; k0 < a.key_end; k0 += kTileKeys) {
    const int n = int(std::min<int64_t>(kTileKeys, a.key_end - k0));
    while (ra < R && visible[ra] <= k0) ++ra;
    if (ra == R) break;
    const int padded = (n + 15) & ~15;
    load_tile(p, a.seq, k0, n, padded, kv);
    const int v0 = ra / VW;
    scores(kv, padded, qt, RP, st, v0, nvec);

    // Online softmax, one vector of rows at a time: lanes are rows, the loop runs over keys.
    for (int v = v0; v < nvec; ++v) {
      const int rb = v * VW;
      vi lim{};
      vf mv{}, lv{}, av{};
      for (int e = 0; e < VW; ++e) {
        const bool row = rb + e < R;
        lim[e] = row ? int32_t(std::clamp<int64_t>(visible[rb + e] - k0, 0, n)) : 0;
        mv[e] = row ? m[rb + e] : -INFINITY;
        lv[e] = row ? l[rb + e] : 0.0f;
      }
      softmax_rows(st + rb, RP, n, 1.0f, lim, mv, lv, av);
      for (int e = 0; e < VW && rb + e < R; ++e) {
        m[rb + e] = mv[e];
        l[rb + e] = lv[e];
        alpha[rb + e] = av[e];
      }
    }
    outputs(st, RP, kv, n, o, alpha, ra, R);
  }

  for (int r = 0; r < R; ++r) {
    float* out = a.out + int64_t(r) * kLatentDim;
    if (!(l[r] > 0.0f)) {  // no key of this chunk is visible to the row
      std::memset(out, 0, sizeof(float) * kLatentDim);
      a.lse2[r] = -INFINITY;
      continue;
    }
    const float inv = a.value_scale / l[r];
    for (int c = 0; c < kLatentDim; c += VW) vstore(out + c, vload(o + r * kLatentDim + c) * inv);
    a.lse2[r] = m[r] + std::log2(l[r]);
  }
}

}  // namespace

const KernelVariant kVariant = {MLADCP_CPU_ISA, run_chunk, kScratchFloats};

}  // namespace mladcp::cpu::MLADCP_CPU_NS
