// Reading checked fields out of a JSON object for the planner's files: every failure names the file and
// the field path ("calibration.json: kernel[3].heads: expected an integer >= 1, got -2").
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "mladcp/status.h"

namespace mladcp::plan::detail {

// Parses `text` into `root`, which must be a JSON object; errors name `origin`.
inline Status parse_object(const std::string& text, const std::string& origin, nlohmann::json* root) {
  try {
    *root = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    return Status::InvalidArgument(origin + ": not valid JSON: " + e.what());
  }
  if (!root->is_object()) return Status::InvalidArgument(origin + ": expected a JSON object at the top level");
  return Status::Ok();
}

class Fields {
 public:
  Fields(const nlohmann::json& j, std::string origin, std::string path)
      : j_(j), origin_(std::move(origin)), path_(std::move(path)) {}

  const nlohmann::json& json() const { return j_; }
  std::string where(const std::string& key) const { return origin_ + ": " + (path_.empty() ? key : path_ + "." + key); }
  Fields child(const std::string& key) const { return {j_.at(key), origin_, path_.empty() ? key : path_ + "." + key}; }
  Fields element(const std::string& key, size_t i) const {
    return {j_.at(key).at(i), origin_, (path_.empty() ? key : path_ + "." + key) + "[" + std::to_string(i) + "]"};
  }
  bool has(const std::string& key) const { return j_.is_object() && j_.contains(key) && !j_.at(key).is_null(); }

  Status object(const std::string& key) const {
    if (!has(key) || !j_.at(key).is_object()) return Status::InvalidArgument(where(key) + ": expected an object");
    return Status::Ok();
  }
  Status array(const std::string& key, size_t* size) const {
    if (!has(key) || !j_.at(key).is_array()) return Status::InvalidArgument(where(key) + ": expected an array");
    *size = j_.at(key).size();
    return Status::Ok();
  }
  Status string(const std::string& key, std::string* out, bool required = true) const {
    if (!has(key)) return required ? Status::InvalidArgument(where(key) + ": missing (a string)") : Status::Ok();
    if (!j_.at(key).is_string()) return Status::InvalidArgument(where(key) + ": expected a string");
    *out = j_.at(key).get<std::string>();
    return Status::Ok();
  }
  // A number in [lo, hi]; absent and not required: *out is left as it is.
  Status number(const std::string& key, double lo, double hi, double* out, bool required = true) const {
    if (!has(key)) return required ? Status::InvalidArgument(where(key) + ": missing (a number)") : Status::Ok();
    const nlohmann::json& v = j_.at(key);
    if (!v.is_number()) return Status::InvalidArgument(where(key) + ": expected a number, got " + v.dump());
    const double x = v.get<double>();
    if (!(x >= lo && x <= hi)) {
      return Status::InvalidArgument(where(key) + ": expected a number in [" + fmt(lo) + ", " + fmt(hi) + "], got " +
                                     v.dump());
    }
    *out = x;
    return Status::Ok();
  }
  Status integer(const std::string& key, int64_t lo, int64_t hi, int64_t* out, bool required = true) const {
    if (!has(key)) return required ? Status::InvalidArgument(where(key) + ": missing (an integer)") : Status::Ok();
    const nlohmann::json& v = j_.at(key);
    if (!v.is_number_integer()) return Status::InvalidArgument(where(key) + ": expected an integer, got " + v.dump());
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi) {
      return Status::InvalidArgument(where(key) + ": expected an integer in [" + std::to_string(lo) + ", " +
                                     std::to_string(hi) + "], got " + v.dump());
    }
    *out = x;
    return Status::Ok();
  }
  // true or false; absent and not required: *out is left as it is.
  Status boolean(const std::string& key, bool* out, bool required = true) const {
    if (!has(key)) return required ? Status::InvalidArgument(where(key) + ": missing (true or false)") : Status::Ok();
    const nlohmann::json& v = j_.at(key);
    if (!v.is_boolean()) return Status::InvalidArgument(where(key) + ": expected true or false, got " + v.dump());
    *out = v.get<bool>();
    return Status::Ok();
  }
  template <typename Int>
  Status integer_as(const std::string& key, int64_t lo, int64_t hi, Int* out, bool required = true) const {
    int64_t x = static_cast<int64_t>(*out);
    MLADCP_RETURN_IF_ERROR(integer(key, lo, hi, &x, required));
    *out = static_cast<Int>(x);
    return Status::Ok();
  }

 private:
  static std::string fmt(double x) {
    std::string s = nlohmann::json(x).dump();
    return s;
  }
  const nlohmann::json& j_;
  std::string origin_, path_;
};

}  // namespace mladcp::plan::detail
