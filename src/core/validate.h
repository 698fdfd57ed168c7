// Small helpers for building argument-naming error messages.
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include "mladcp/dtype.h"
#include "mladcp/sharding.h"
#include "mladcp/status.h"

namespace mladcp::detail {

template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

template <typename... Args>
Status invalid(const Args&... args) {
  return Status::InvalidArgument(cat(args...));
}

// Enum fields arrive from callers as any integer; every params struct checks each of its enums.
inline bool valid_lse_base(LseBase b) { return b == LseBase::kE || b == LseBase::k2; }
inline constexpr const char* kAcceptedLseBases = "accepted LseBase::kE (0, natural log) or LseBase::k2 (1, base 2)";

// The one check of a shard's own fields (world ≥ 1, 0 ≤ rank < world, interleave ≥ 1), named
// "shard.<field>"; validate_shard() (mladcp/kv_cache.h) adds the block size.
Status validate_shard_fields(const DcpShard& s);
// A call's shard where an object fixes the shard (MlaAttention, DcpDecoder): left default (world 1)
// or equal to the object's; any other value is an error, never silently replaced.
Status check_shard_matches(const DcpShard& given, const DcpShard& fixed);

std::string join_dtypes(const std::vector<DType>& v);
std::string join_ints(const std::vector<int>& v);
bool contains(const std::vector<DType>& v, DType t);

}  // namespace mladcp::detail
