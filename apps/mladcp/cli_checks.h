// Checks of option values shared by the subcommands (CLI11 validators).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace mladcp::cli {

// An integer option in [lo, hi]: a value that is not an integer is reported as "not a number", an
// integer outside the range as "not in range".
inline CLI::Validator int_in_range(int64_t lo, int64_t hi) {
  const std::string range = std::to_string(lo) + " to " + std::to_string(hi);
  return CLI::Validator(
      [lo, hi, range](std::string& s) -> std::string {
        int64_t v = 0;
        if (!CLI::detail::lexical_cast(s, v)) return "Value " + s + " is not a number (an integer from " + range + ")";
        if (v < lo || v > hi) return "Value " + s + " not in range " + range;
        return std::string();
      },
      "INT in [" + range + "]");
}

}  // namespace mladcp::cli
