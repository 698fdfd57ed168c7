// Element types and the LSE base.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace mladcp {

enum class DType { kBF16, kFP16, kFP32, kFP8E4M3 };

// Base of a log-sum-exp value: kE means lse = ln Σ exp(s), k2 means lse = log2 Σ exp(s).
// Every LSE buffer in the API travels with its base; merges honour it.
enum class LseBase { kE, k2 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::kBF16:
      return 2;
    case DType::kFP16:
      return 2;
    case DType::kFP32:
      return 4;
    case DType::kFP8E4M3:
      return 1;
  }
  return 0;
}

const char* dtype_name(DType t);                       // "bf16", "fp16", "fp32", "fp8_e4m3"
std::optional<DType> parse_dtype(std::string_view s);  // also accepts "fp8", "bfloat16", "float16"
const char* lse_base_name(LseBase b);                  // "e", "2"

}  // namespace mladcp
