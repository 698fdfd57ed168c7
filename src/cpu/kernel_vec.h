// Vector helpers shared by the host kernels, written with GCC vector extensions so that each
// instruction-set build (MLADCP_CPU_VW fp32 lanes) vectorizes them natively. Included inside the
// kernel's namespace by kernel_impl.h and kernel_amx.cpp.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#include "core/lse_math.h"
#include "mladcp/config.h"

#ifndef MLADCP_CPU_NS
#error "define MLADCP_CPU_NS and MLADCP_CPU_VW before including kernel_vec.h"
#endif

namespace mladcp::cpu::MLADCP_CPU_NS {
namespace {

constexpr int VW = MLADCP_CPU_VW;  // fp32 lanes per vector

typedef float vf __attribute__((vector_size(VW * 4), aligned(4), may_alias));
typedef int32_t vi __attribute__((vector_size(VW * 4), aligned(4), may_alias));
typedef uint32_t vu __attribute__((vector_size(VW * 4), aligned(4), may_alias));
typedef uint16_t vh __attribute__((vector_size(VW * 2), aligned(2), may_alias));
typedef uint8_t vb __attribute__((vector_size(VW)));

inline vf vload(const float* p) { return *reinterpret_cast<const vf*>(p); }
inline void vstore(float* p, vf v) { *reinterpret_cast<vf*>(p) = v; }
template <size_t... I>
inline vf splat_impl(float x, std::index_sequence<I...>) {
  return vf{((void)I, x)...};
}
// Broadcast (vf{} + x would add 0.0, which the compiler must keep for x = -0).
inline vf splat(float x) { return splat_impl(x, std::make_index_sequence<VW>{}); }

// 2^x, 0 for x < -126 (and -inf); x ≤ 127. Relative error about 2e-7: x = n + f with f in
// [-0.5, 0.5], 2^f by a degree-7 Taylor polynomial of e^(f·ln 2), 2^n added to the exponent bits.
inline vf exp2v(vf x) {
  const vi keep = x >= splat(-126.0f);
  x = x < splat(-126.0f) ? splat(-126.0f) : x;
  x = x > splat(127.0f) ? splat(127.0f) : x;
  const vf shifter = splat(12582912.0f);  // 1.5 · 2^23: adding it rounds to the nearest integer
  const vf t = x + shifter;
  const vf n = t - shifter;
  const vf f = (x - n) * lse::kLn2;
  vf poly = splat(1.0f / 5040.0f);
  poly = poly * f + (1.0f / 720.0f);
  poly = poly * f + (1.0f / 120.0f);
  poly = poly * f + (1.0f / 24.0f);
  poly = poly * f + (1.0f / 6.0f);
  poly = poly * f + 0.5f;
  poly = poly * f + 1.0f;
  poly = poly * f + 1.0f;
  const vi bits = (reinterpret_cast<const vi&>(poly) + ((reinterpret_cast<const vi&>(t) - 0x4b400000) << 23)) & keep;
  return reinterpret_cast<const vf&>(bits);
}

inline vf widen_bf16(const uint16_t* src) {
  const vu w = __builtin_convertvector(*reinterpret_cast<const vh*>(src), vu) << 16;
  return reinterpret_cast<const vf&>(w);
}

// One cached token (576 values) to fp32, without the per-tensor scale.
inline void convert_bf16(const uint16_t* __restrict src, float* __restrict dst) {
  for (int d = 0; d < kQkDim; d += VW) vstore(dst + d, widen_bf16(src + d));
}

// In-register transpose of a VW × VW block: log2(VW) butterfly stages of two-source shuffles.
template <int K, size_t... J>
constexpr vi low_mask(std::index_sequence<J...>) {
  return vi{int((J & K) == 0 ? J : VW + J - K)...};
}
template <int K, size_t... J>
constexpr vi high_mask(std::index_sequence<J...>) {
  return vi{int((J & K) == 0 ? J + K : VW + J)...};
}
template <int K>
inline void transpose_stage(vf* rows) {
  constexpr vi lo = low_mask<K>(std::make_index_sequence<VW>{});
  constexpr vi hi = high_mask<K>(std::make_index_sequence<VW>{});
  for (int i = 0; i < VW; ++i) {
    if (i & K) continue;
    const vf x = rows[i], y = rows[i + K];
    rows[i] = __builtin_shuffle(x, y, lo);
    rows[i + K] = __builtin_shuffle(x, y, hi);
  }
}
inline void transpose(vf* rows) {
  transpose_stage<1>(rows);
  transpose_stage<2>(rows);
  if constexpr (VW > 4) transpose_stage<4>(rows);
  if constexpr (VW > 8) transpose_stage<8>(rows);
}

// e4m3fn with integer arithmetic only (a float multiply on the fp32 denormals that a bit shift
// would produce costs a microcode assist on x86): normals move their exponent and mantissa into
// place and rebias the exponent (+120); subnormals are m · 2^-9; 0x7f/0xff are NaN.
inline void convert_fp8(const uint8_t* __restrict src, float* __restrict dst) {
  for (int d = 0; d < kQkDim; d += VW) {
    vb bytes;
    std::memcpy(&bytes, src + d, sizeof(bytes));
    // Widened in two steps: GCC turns the one-step byte to dword conversion into scalar code.
    const vu w = __builtin_convertvector(__builtin_convertvector(bytes, vh), vu);
    const vu mag = w & 0x7fu;
    const vu normal = (mag << 20) + (120u << 23);
    const vf sub = __builtin_convertvector(reinterpret_cast<const vi&>(mag), vf) * 0.001953125f;  // m · 2^-9
    vu bits = (mag >> 3) == 0u ? reinterpret_cast<const vu&>(sub) : normal;
    bits = mag == 0x7fu ? vu{} + 0x7fc00000u : bits;
    bits |= (w & 0x80u) << 24;
    vstore(dst + d, reinterpret_cast<const vf&>(bits));
  }
}

// Online softmax of one vector of rows (lanes) over a tile's scores st[j * stride + lane], j < keys:
// scores are scaled by `scale` into base-2 units; lane e sees keys j < limit[e]. Writes the
// probabilities 2^(s - m_new) back (0 for hidden keys), and updates the running max m, the running
// sum l and the factor alpha = 2^(m_old - m_new) by which the lane's output must be rescaled.
inline void softmax_rows(float* st, int stride, int keys, float scale, vi limit, vf& m, vf& l, vf& alpha) {
  vf tile_max = splat(-INFINITY);
  for (int j = 0; j < keys; ++j) {
    const vf s = vload(st + j * stride) * scale;
    tile_max = ((vi{} + j) < limit) & (s > tile_max) ? s : tile_max;
  }
  const vf m_new = tile_max > m ? tile_max : m;
  const vi none = m_new == splat(-INFINITY);
  const vf shift = none ? vf{} : m_new;
  alpha = none ? splat(1.0f) : exp2v(m - shift);
  vf sum = vf{};
  for (int j = 0; j < keys; ++j) {
    const vf s = vload(st + j * stride) * scale;
    const vf pj = (vi{} + j) < limit ? exp2v(s - shift) : vf{};
    vstore(st + j * stride, pj);
    sum += pj;
  }
  l = l * alpha + sum;
  m = m_new;
}

}  // namespace
}  // namespace mladcp::cpu::MLADCP_CPU_NS
