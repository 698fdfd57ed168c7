// Validation of the merge params and the host implementations of both merge forms.
#include <cmath>
#include <cstring>
#include <vector>

#include "core/lse_math.h"
#include "core/numeric.h"
#include "core/validate.h"
#include "mladcp/merge.h"

namespace mladcp {

using detail::invalid;

namespace {

bool is_float_dtype(DType t) { return t == DType::kBF16 || t == DType::kFP16 || t == DType::kFP32; }

}  // namespace

Status validate(const MergeParams& p) {
  if (p.num_states < 1) return invalid("num_states=", p.num_states, ": must be >= 1");
  if (p.num_tokens < 0) return invalid("num_tokens=", p.num_tokens, ": must be >= 0");
  if (p.num_heads < 1) return invalid("num_heads=", p.num_heads, ": must be >= 1");
  if (p.head_dim < 1) return invalid("head_dim=", p.head_dim, ": must be >= 1");
  if (!is_float_dtype(p.in_dtype)) return invalid("in_dtype=", dtype_name(p.in_dtype), ": accepted bf16, fp16, fp32");
  if (!is_float_dtype(p.out_dtype))
    return invalid("out_dtype=", dtype_name(p.out_dtype), ": accepted bf16, fp16, fp32");
  if (!detail::valid_lse_base(p.in_base)) return invalid("in_base=", int(p.in_base), ": ", detail::kAcceptedLseBases);
  if (!detail::valid_lse_base(p.out_base))
    return invalid("out_base=", int(p.out_base), ": ", detail::kAcceptedLseBases);
  if (p.num_tokens == 0) return Status::Ok();
  if (!p.in_out) return invalid("in_out: null pointer (expected [N, T, H, D])");
  if (!p.in_lse) return invalid("in_lse: null pointer (expected [N, T, H] fp32)");
  if (!p.out) return invalid("out: null pointer (expected [T, H, D])");
  return Status::Ok();
}

Status validate(const RescaleParams& p) {
  if (p.world < 1) return invalid("world=", p.world, ": must be >= 1");
  if (p.rank < 0 || p.rank >= p.world) return invalid("rank=", p.rank, ": must be in [0, world=", p.world, ")");
  if (p.rows < 0) return invalid("rows=", p.rows, ": must be >= 0");
  if (p.head_dim < 1) return invalid("head_dim=", p.head_dim, ": must be >= 1");
  if (!is_float_dtype(p.out_dtype))
    return invalid("out_dtype=", dtype_name(p.out_dtype), ": accepted bf16, fp16, fp32");
  if (!detail::valid_lse_base(p.base)) return invalid("base=", int(p.base), ": ", detail::kAcceptedLseBases);
  if (p.rows == 0) return Status::Ok();
  if (!p.all_lse) return invalid("all_lse: null pointer (expected [W, rows] fp32)");
  if (!p.out) return invalid("out: null pointer (expected [rows, D])");
  return Status::Ok();
}

MergeParams with_default_strides(const MergeParams& in) {
  MergeParams p = in;
  const int64_t D = p.head_dim, H = p.num_heads, T = p.num_tokens;
  if (!p.in_stride_head) p.in_stride_head = D;
  if (!p.in_stride_token) p.in_stride_token = H * p.in_stride_head;
  if (!p.in_stride_state) p.in_stride_state = T * p.in_stride_token;
  if (!p.lse_stride_token) p.lse_stride_token = H;
  if (!p.lse_stride_state) p.lse_stride_state = T * p.lse_stride_token;
  if (!p.out_stride_head) p.out_stride_head = D;
  if (!p.out_stride_token) p.out_stride_token = H * p.out_stride_head;
  if (!p.out_lse_stride_token) p.out_lse_stride_token = H;
  return p;
}

Status merge_states_host(const MergeParams& in) {
  MLADCP_RETURN_IF_ERROR(validate(in));
  const MergeParams p = with_default_strides(in);
  const int64_t D = p.head_dim, H = p.num_heads, T = p.num_tokens;

  std::vector<float> acc(D), w(p.num_states);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      lse::Combiner c(p.in_base);
      for (int n = 0; n < p.num_states; ++n)
        c.observe_max(p.in_lse[n * p.lse_stride_state + t * p.lse_stride_token + h]);
      for (int n = 0; n < p.num_states; ++n)
        c.accumulate(p.in_lse[n * p.lse_stride_state + t * p.lse_stride_token + h]);
      for (int n = 0; n < p.num_states; ++n)
        w[n] = c.weight(p.in_lse[n * p.lse_stride_state + t * p.lse_stride_token + h]);
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int n = 0; n < p.num_states; ++n) {
        if (w[n] == 0.0f) continue;
        const int64_t base = n * p.in_stride_state + t * p.in_stride_token + h * p.in_stride_head;
        for (int64_t d = 0; d < D; ++d)
          acc[d] += lse::weighted(w[n], numeric::load_as_float(p.in_out, p.in_dtype, base + d));
      }
      const int64_t ob = t * p.out_stride_token + h * p.out_stride_head;
      for (int64_t d = 0; d < D; ++d) numeric::store_from_float(p.out, p.out_dtype, ob + d, acc[d]);
      if (p.out_lse) p.out_lse[t * p.out_lse_stride_token + h] = lse::convert(c.merged_lse(), p.in_base, p.out_base);
    }
  }
  return Status::Ok();
}

Status rescale_states_host(const RescaleParams& p) {
  MLADCP_RETURN_IF_ERROR(validate(p));
  const int64_t D = p.head_dim, R = p.rows;
  for (int64_t i = 0; i < R; ++i) {
    lse::Combiner c(p.base);
    for (int n = 0; n < p.world; ++n) c.observe_max(p.all_lse[n * R + i]);
    for (int n = 0; n < p.world; ++n) c.accumulate(p.all_lse[n * R + i]);
    const float w = c.weight(p.all_lse[p.rank * R + i]);
    for (int64_t d = 0; d < D; ++d)
      numeric::store_from_float(p.out, p.out_dtype, i * D + d,
                                lse::weighted(w, numeric::load_as_float(p.out, p.out_dtype, i * D + d)));
    if (p.merged_lse) p.merged_lse[i] = c.merged_lse();
  }
  return Status::Ok();
}

}  // namespace mladcp
