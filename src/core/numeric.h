// Scalar conversions between fp32 and the storage types (bf16, fp16, fp8-e4m3fn), usable on host
// and device. Round to nearest even; fp8 saturates to ±448 (the e4m3fn range, no infinities).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "mladcp/config.h"
#include "mladcp/dtype.h"

namespace mladcp::numeric {

MLADCP_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

MLADCP_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

MLADCP_HD float bf16_to_float(uint16_t h) { return bits_float(uint32_t(h) << 16); }

MLADCP_HD uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return uint16_t((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

MLADCP_HD float fp16_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    float v = float(man) * 5.9604644775390625e-08f;  // 2^-24
    return sign ? -v : v;
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (man << 13));
  return bits_float(sign | ((exp + 112u) << 23) | (man << 13));
}

MLADCP_HD uint16_t float_to_fp16(float f) {
  uint32_t u = float_bits(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  float a = fabsf(f);
  if (a != a) return uint16_t(sign | 0x7e00u);
  if (a >= 65520.0f) return uint16_t(sign | 0x7c00u);
  if (a < 6.103515625e-05f) {  // subnormal: multiples of 2^-24, round half to even
    float q = a * 16777216.0f;
    float r = rintf(q);
    return uint16_t(sign | uint16_t(r));
  }
  uint32_t ua = float_bits(a);
  ua += 0xfffu + ((ua >> 13) & 1u);
  uint32_t exp = (ua >> 23) - 112u;
  return uint16_t(sign | (exp << 10) | ((ua >> 13) & 0x3ffu));
}

// fp8 e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa; 0x7f/0xff are NaN; max finite 448.
MLADCP_HD float fp8e4m3_to_float(uint8_t v) {
  uint32_t sign = uint32_t(v & 0x80u) << 24;
  uint32_t exp = (v >> 3) & 0xfu;
  uint32_t man = v & 0x7u;
  if (exp == 15 && man == 7) return bits_float(0x7fc00000u | sign);
  if (exp == 0) {
    float m = float(man) * 0.001953125f;  // 2^-9
    return sign ? -m : m;
  }
  return bits_float(sign | ((exp + 120u) << 23) | (man << 20));
}

MLADCP_HD uint8_t float_to_fp8e4m3(float f) {
  uint32_t u = float_bits(f);
  uint8_t sign = uint8_t((u >> 24) & 0x80u);
  float a = fabsf(f);
  if (a != a) return uint8_t(sign | 0x7fu);
  if (a >= 448.0f) return uint8_t(sign | 0x7eu);  // saturate
  if (a < 0.015625f) {                            // below 2^-6: subnormal, multiples of 2^-9
    float r = rintf(a * 512.0f);
    return uint8_t(sign | uint8_t(r));  // r == 8 encodes 2^-6 exactly (exp 1, man 0)
  }
  uint32_t ua = float_bits(a);
  ua += 0x7ffffu + ((ua >> 20) & 1u);
  uint32_t exp = (ua >> 23) - 120u;
  uint32_t man = (ua >> 20) & 0x7u;
  if (exp > 15 || (exp == 15 && man == 7)) return uint8_t(sign | 0x7eu);
  return uint8_t(sign | (exp << 3) | man);
}

// Element i of a buffer of dtype t, widened to fp32 (host and device).
MLADCP_HD float load_as_float(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::kBF16:
      return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kFP16:
      return fp16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kFP32:
      return static_cast<const float*>(base)[i];
    case DType::kFP8E4M3:
      return fp8e4m3_to_float(static_cast<const uint8_t*>(base)[i]);
  }
  return 0.0f;
}

// Stores v into element i of a buffer of dtype t (rounded to nearest even; fp8 saturates).
MLADCP_HD void store_from_float(void* base, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kBF16:
      static_cast<uint16_t*>(base)[i] = float_to_bf16(v);
      break;
    case DType::kFP16:
      static_cast<uint16_t*>(base)[i] = float_to_fp16(v);
      break;
    case DType::kFP32:
      static_cast<float*>(base)[i] = v;
      break;
    case DType::kFP8E4M3:
      static_cast<uint8_t*>(base)[i] = float_to_fp8e4m3(v);
      break;
  }
}

}  // namespace mladcp::numeric
