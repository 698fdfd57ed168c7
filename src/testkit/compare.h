// Backend-agnostic helpers for checking decode and merge outputs on the host: sentinel-filled
// buffers (to prove every element was written and nothing was written on error), tolerances derived
// from the output dtype, and element-wise comparison with a readable report. No GoogleTest here, so
// device tests and tools can use them on buffers they copied back themselves.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "mladcp/dtype.h"

namespace mladcp::test {

// Quiet NaNs with a payload no arithmetic produces: a buffer element still holding one was never
// written. bf16 sentinel widened to fp32 keeps its bits (0x7fde0000), so both are recognizable as floats.
inline constexpr uint32_t kSentinelF32 = 0x7fdeadbeu;
inline constexpr uint16_t kSentinelB16 = 0x7fdeu;  // bf16 and fp16 both read it as a NaN

inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline bool is_sentinel(float v) { return bits_of(v) == kSentinelF32 || bits_of(v) == uint32_t(kSentinelB16) << 16; }

// Fills `count` elements of `dtype` at `data` with the sentinel (fp8: 0x7f, its NaN).
inline void fill_sentinel(void* data, DType dtype, size_t count) {
  switch (dtype) {
    case DType::kFP32:
      std::fill_n(static_cast<uint32_t*>(data), count, kSentinelF32);
      break;
    case DType::kBF16:
    case DType::kFP16:
      std::fill_n(static_cast<uint16_t*>(data), count, kSentinelB16);
      break;
    case DType::kFP8E4M3:
      std::fill_n(static_cast<uint8_t*>(data), count, uint8_t(0x7f));
      break;
  }
}
inline void fill_sentinel(std::vector<float>& v) { fill_sentinel(v.data(), DType::kFP32, v.size()); }

// Element i of a buffer of `dtype`, widened to fp32 (bf16 sentinels stay recognizable).
inline float load_float(const void* data, DType dtype, size_t i) {
  switch (dtype) {
    case DType::kFP32:
      return static_cast<const float*>(data)[i];
    case DType::kBF16:
      return numeric::bf16_to_float(static_cast<const uint16_t*>(data)[i]);
    case DType::kFP16: {
      const uint16_t h = static_cast<const uint16_t*>(data)[i];
      return h == kSentinelB16 ? float_of(uint32_t(kSentinelB16) << 16) : numeric::fp16_to_float(h);
    }
    case DType::kFP8E4M3:
      return numeric::fp8e4m3_to_float(static_cast<const uint8_t*>(data)[i]);
  }
  return 0.0f;
}

inline std::vector<float> to_float(const void* data, DType dtype, size_t count) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = load_float(data, dtype, i);
  return v;
}

// Number of elements still holding the sentinel (0 means every element was written).
inline size_t count_sentinels(const void* data, DType dtype, size_t count) {
  size_t n = 0;
  for (size_t i = 0; i < count; ++i) {
    switch (dtype) {
      case DType::kFP32:
        n += static_cast<const uint32_t*>(data)[i] == kSentinelF32;
        break;
      case DType::kBF16:
      case DType::kFP16:
        n += static_cast<const uint16_t*>(data)[i] == kSentinelB16;
        break;
      case DType::kFP8E4M3:
        n += static_cast<const uint8_t*>(data)[i] == 0x7f;
        break;
    }
  }
  return n;
}
inline size_t count_sentinels(const std::vector<float>& v) { return count_sentinels(v.data(), DType::kFP32, v.size()); }

// |got - want| <= rel·|want| + scale_rel·max|want| + abs. The scale term absorbs cancellation: an
// output element near zero is a sum of terms of the size of the largest outputs, and inherits
// their absolute rounding error.
struct Tolerance {
  double rel = 0.0;
  double scale_rel = 0.0;
  double abs = 0.0;
};

// Decode/merge output compared with an fp64/fp32 oracle. bf16: one rounding of the result is at
// most 2^-9 relative; 2^-8 leaves room for the fp32 accumulation before it. fp32: accumulation
// over up to a few thousand keys in fp32 stays well inside 1e-5 of the output scale.
inline Tolerance output_tolerance(DType out_dtype) {
  switch (out_dtype) {
    case DType::kBF16:
      return {1.0 / 256.0, 1e-4, 0.0};
    case DType::kFP16:
      return {1.0 / 1024.0, 1e-4, 0.0};
    case DType::kFP32:
      return {1e-5, 1e-5, 0.0};
    case DType::kFP8E4M3:
      return {1.0 / 8.0, 1e-2, 0.0};
  }
  return {};
}

// Two decodes of one problem on the tensor-core path (e.g. DCP against single-device decode), each
// rounding its own fp32 result: the bf16 probabilities of P·V cost up to 2^-8 of the output scale on
// each side, and two independent roundings to bf16 may land one unit in the last place (2^-7) apart.
inline Tolerance device_pair_tolerance(DType out_dtype) {
  Tolerance t{1.0 / 256.0, 1.0 / 256.0, 0.0};
  if (out_dtype == DType::kBF16) t.rel += 1.0 / 128.0;
  if (out_dtype == DType::kFP16) t.rel += 1.0 / 1024.0;
  return t;
}

// LSE is always fp32; its size is log(keys) + max score (a few units to a few tens).
inline Tolerance lse_tolerance() { return {1e-5, 0.0, 2e-5}; }

struct Comparison {
  bool ok = true;
  size_t count = 0;
  size_t bad = 0;         // outside tolerance (including the two below)
  size_t unwritten = 0;   // still holding the sentinel
  size_t non_finite = 0;  // NaN/inf where a finite value was expected, or a wrong infinity
  double max_abs_err = 0.0;
  double max_rel_err = 0.0;  // max abs error / max |want| (normwise relative)
  double scale = 0.0;        // max |want| over finite elements
  size_t worst = 0;          // index of the largest error (or of the first non-finite mismatch)
  float worst_got = 0.0f, worst_want = 0.0f;
  std::string report;  // one paragraph: what, counts, errors, worst element with its index
};

// "[i0, i1, ...]" of flat index `i` in a row-major tensor of shape `dims` (or "[i]" without dims).
inline std::string format_index(size_t i, const std::vector<int64_t>& dims) {
  std::string s = "[";
  if (dims.empty()) {
    s += std::to_string(i);
    s += ']';
    return s;
  }
  std::vector<int64_t> idx(dims.size());
  for (size_t k = dims.size(); k-- > 0;) {
    idx[k] = int64_t(i % size_t(dims[k]));
    i /= size_t(dims[k]);
  }
  for (size_t k = 0; k < idx.size(); ++k) {
    if (k) s += ", ";
    s += std::to_string(idx[k]);
  }
  s += ']';
  return s;
}

// Compares got with want element by element. An infinite `want` (an empty row's LSE) must be matched
// exactly; a NaN `want` is reported as an oracle failure.
inline Comparison compare(const float* got, const float* want, size_t count, const Tolerance& tol,
                          const std::string& what, const std::vector<int64_t>& dims = {}) {
  Comparison c;
  c.count = count;
  for (size_t i = 0; i < count; ++i)
    if (std::isfinite(want[i])) c.scale = std::max(c.scale, double(std::fabs(want[i])));
  bool worst_is_mismatch = false;
  // The first never-written or wrongly non-finite element is reported as the worst one.
  const auto note_mismatch = [&](size_t i, float g, float w) {
    if (worst_is_mismatch) return;
    c.worst = i;
    c.worst_got = g;
    c.worst_want = w;
    worst_is_mismatch = true;
  };
  size_t first_nan_want = count;
  if (count > 0) {
    c.worst_got = got[0];
    c.worst_want = want[0];
  }
  for (size_t i = 0; i < count; ++i) {
    const float g = got[i], w = want[i];
    if (std::isnan(w)) {
      if (first_nan_want == count) first_nan_want = i;
      ++c.bad;
      continue;
    }
    if (is_sentinel(g)) {
      ++c.unwritten;
      ++c.bad;
      note_mismatch(i, g, w);
      continue;
    }
    if (!std::isfinite(w) || !std::isfinite(g)) {
      if (g == w) continue;  // the same infinity
      ++c.non_finite;
      ++c.bad;
      note_mismatch(i, g, w);
      continue;
    }
    const double err = std::fabs(double(g) - double(w));
    const double bound = tol.rel * std::fabs(double(w)) + tol.scale_rel * c.scale + tol.abs;
    if (err > bound) {
      ++c.bad;
    }
    if (err > c.max_abs_err) {
      c.max_abs_err = err;
      if (!worst_is_mismatch) {
        c.worst = i;
        c.worst_got = g;
        c.worst_want = w;
      }
    }
  }
  c.max_rel_err = c.scale > 0.0 ? c.max_abs_err / c.scale : c.max_abs_err;
  c.ok = c.bad == 0;
  std::ostringstream os;
  os.precision(6);
  os << what << ": " << (c.ok ? "ok" : "MISMATCH") << ", " << c.bad << " of " << count
     << " elements outside tolerance (" << c.unwritten << " never written, " << c.non_finite
     << " wrong NaN/inf); max abs err " << c.max_abs_err << ", max rel err " << c.max_rel_err
     << " (to max|want| = " << c.scale << "); tolerance " << tol.rel << "*|want| + " << tol.scale_rel << "*max|want| + "
     << tol.abs;
  if (count > 0)
    os << "; worst at " << format_index(c.worst, dims) << ": got " << c.worst_got << ", want " << c.worst_want;
  if (first_nan_want < count) os << "; the expectation holds NaN at " << format_index(first_nan_want, dims);
  c.report = os.str();
  return c;
}

inline Comparison compare(const std::vector<float>& got, const std::vector<float>& want, const Tolerance& tol,
                          const std::string& what, const std::vector<int64_t>& dims = {}) {
  if (got.size() != want.size()) {
    Comparison c;
    c.ok = false;
    c.report =
        what + ": size mismatch, got " + std::to_string(got.size()) + " elements, want " + std::to_string(want.size());
    return c;
  }
  return compare(got.data(), want.data(), got.size(), tol, what, dims);
}

}  // namespace mladcp::test
