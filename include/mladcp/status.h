// Status: the only way library code reports failure (no exceptions, no aborts).
#pragma once

#include <string>
#include <utility>

namespace mladcp {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // a caller-supplied argument is out of the accepted range
  kUnsupported,      // valid request that this backend/build does not implement
  kCudaError,        // a CUDA runtime call failed
  kCommError,        // a collective failed locally (MPI/NCCL error code)
  kTimeout,          // a collective did not complete before its deadline
  kRemoteError,      // a peer reported a failure or disappeared
  kUnavailable,      // the object is unusable (aborted communicator, missing device)
  kInternal,         // a broken invariant inside the library
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return {}; }
  static Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status Unsupported(std::string m) { return {StatusCode::kUnsupported, std::move(m)}; }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "<code name>: <message>", or "ok".
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

}  // namespace mladcp

#define MLADCP_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::mladcp::Status mladcp_status_ = (expr);        \
    if (!mladcp_status_.ok()) return mladcp_status_; \
  } while (0)
