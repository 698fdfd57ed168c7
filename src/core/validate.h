// Small helpers for building argument-naming error messages.
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include "mladcp/dtype.h"
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

std::string join_dtypes(const std::vector<DType>& v);
std::string join_ints(const std::vector<int>& v);
bool contains(const std::vector<DType>& v, DType t);

}  // namespace mladcp::detail
