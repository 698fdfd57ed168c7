#include "cli_common.h"

#include <cmath>
#include <cstdio>

namespace mladcp::cli {

int exit_code(const Status& s) {
  if (s.ok()) return kExitOk;
  std::fprintf(stderr, "mladcp: %s\n", s.message().c_str());
  return s.code() == StatusCode::kInvalidArgument ? kExitBadArgument : kExitFailure;
}

void progress(const std::string& text) {
  std::fprintf(stderr, "mladcp: %s\n", text.c_str());
  std::fflush(stderr);
}

const char* device_name(Device d) { return d == Device::kCuda ? "cuda" : "host"; }

const char* yes_no_mark(bool v) { return v ? "✅" : "❌"; }

namespace {

std::string printf_string(const char* fmt, double v, const char* unit) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v, unit);
  return buf;
}

// v scaled to a decimal prefix (k, M, G, T) so that 1 <= value < 1000 where possible.
std::string with_prefix(double v, const char* unit) {
  static const char* const kPrefixes[] = {"", "k", "M", "G", "T", "P"};
  int i = 0;
  while (std::fabs(v) >= 1000.0 && i < 5) {
    v /= 1000.0;
    ++i;
  }
  const std::string u = std::string(kPrefixes[i]) + unit;
  return printf_string(std::fabs(v) >= 100.0 ? "%.0f %s" : std::fabs(v) >= 10.0 ? "%.1f %s" : "%.2f %s", v, u.c_str());
}

}  // namespace

std::string format_seconds(double s) {
  if (s >= 1.0) return printf_string("%.2f %s", s, "s");
  if (s >= 1e-3) return printf_string("%.3g %s", s * 1e3, "ms");
  return printf_string("%.3g %s", s * 1e6, "us");
}

std::string format_rate(double per_second, const char* unit) { return with_prefix(per_second, unit); }

std::string format_bytes(double bytes) { return with_prefix(bytes, "B"); }

std::string format_sci(double v) { return printf_string("%.1e%s", v, ""); }

}  // namespace mladcp::cli
