#include "mladcp/attention.h"

#include "core/validate.h"

namespace mladcp {

Status MlaAttention::create(std::unique_ptr<Backend> backend, const DcpShard& shard,
                            std::unique_ptr<MlaAttention>* out) {
  if (!backend) return detail::invalid("backend: null");
  if (!out) return detail::invalid("out: null");
  MLADCP_RETURN_IF_ERROR(detail::validate_shard_fields(shard));
  const BackendCapabilities& caps = backend->capabilities();
  if (shard.world > 1 && !caps.can_return_lse_for_decode) {
    return Status::Unsupported(
        detail::cat("decode context parallelism (shard.world=", shard.world,
                    ") needs the softmax LSE for decode, but backend '", caps.name,
                    "' cannot return it (can_return_lse_for_decode=false); choose a backend with LSE support "
                    "(see `mladcp backends`) or set shard.world=1"));
  }
  if (shard.interleave > 1 && !caps.supports_dcp_interleave) {
    return Status::Unsupported(
        detail::cat("shard.interleave=", shard.interleave, ": backend '", caps.name, "' supports only interleave 1"));
  }
  const bool need = shard.world > 1 && caps.can_return_lse_for_decode;
  out->reset(new MlaAttention(std::move(backend), shard, need));
  return Status::Ok();
}

Status MlaAttention::decode(MlaDecodeParams p, const ExecContext& ctx, float* lse_scratch) {
  MLADCP_RETURN_IF_ERROR(detail::check_shard_matches(p.shard, shard_));
  p.shard = shard_;
  if (need_lse_ && !p.lse) {
    if (!lse_scratch)
      return detail::invalid("lse_scratch: null, but this DCP instance needs the LSE ([T, H] fp32) and p.lse is null");
    p.lse = lse_scratch;
    p.lse_stride_token = 0;
    p.lse_stride_group = 0;
    p.lse_base = lse_base();
  }
  return backend_->decode(p, ctx);
}

}  // namespace mladcp
