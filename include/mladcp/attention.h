// An MLA decode attention instance: a backend plus a DCP configuration, with the LSE decision
// derived once at construction (need_to_return_lse_for_decode = W > 1 && can_return_lse_for_decode).
#pragma once

#include <memory>
#include <string>

#include "mladcp/backend.h"
#include "mladcp/status.h"

namespace mladcp {

class MlaAttention {
 public:
  // Fails (kUnsupported) when shard.world > 1 and the backend cannot return the LSE, with a message
  // naming the backend and the way out. Fails (kInvalidArgument) on a malformed shard.
  static Status create(std::unique_ptr<Backend> backend, const DcpShard& shard, std::unique_ptr<MlaAttention>* out);

  const Backend& backend() const { return *backend_; }
  Backend& backend() { return *backend_; }
  const DcpShard& shard() const { return shard_; }
  bool need_to_return_lse_for_decode() const { return need_lse_; }
  LseBase lse_base() const { return backend_->capabilities().native_lse_base; }

  // Runs decode with p.shard = shard() (p.shard must be default or equal to it). The LSE is requested from the kernel
  // only when it is needed (DCP) or when the caller passes lse != nullptr itself; when it is needed and the caller
  // passed none, `lse_scratch` ([T, H] fp32, same memory as the backend) receives it.
  Status decode(MlaDecodeParams p, const ExecContext& ctx, float* lse_scratch = nullptr);

 private:
  MlaAttention(std::unique_ptr<Backend> b, const DcpShard& s, bool need)
      : backend_(std::move(b)), shard_(s), need_lse_(need) {}
  std::unique_ptr<Backend> backend_;
  DcpShard shard_;
  bool need_lse_;
};

}  // namespace mladcp
