#include "mladcp/status.h"

#include "mladcp/dtype.h"

namespace mladcp {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kInvalidArgument:
      return "invalid_argument";
    case StatusCode::kUnsupported:
      return "unsupported";
    case StatusCode::kCudaError:
      return "cuda_error";
    case StatusCode::kCommError:
      return "comm_error";
    case StatusCode::kTimeout:
      return "timeout";
    case StatusCode::kRemoteError:
      return "remote_error";
    case StatusCode::kUnavailable:
      return "unavailable";
    case StatusCode::kInternal:
      return "internal";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  return std::string(status_code_name(code_)) + ": " + message_;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kBF16:
      return "bf16";
    case DType::kFP16:
      return "fp16";
    case DType::kFP32:
      return "fp32";
    case DType::kFP8E4M3:
      return "fp8_e4m3";
  }
  return "unknown";
}

std::optional<DType> parse_dtype(std::string_view s) {
  if (s == "bf16" || s == "bfloat16") return DType::kBF16;
  if (s == "fp16" || s == "float16" || s == "half") return DType::kFP16;
  if (s == "fp32" || s == "float32" || s == "float") return DType::kFP32;
  if (s == "fp8" || s == "fp8_e4m3" || s == "fp8e4m3" || s == "e4m3") return DType::kFP8E4M3;
  return std::nullopt;
}

const char* lse_base_name(LseBase b) {
  switch (b) {
    case LseBase::kE:
      return "e";
    case LseBase::k2:
      return "2";
  }
  return "unknown";
}

}  // namespace mladcp
