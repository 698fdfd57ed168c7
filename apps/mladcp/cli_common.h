// Helpers shared by the subcommands: exit codes, error and progress printing, number formatting.
#pragma once

#include <string>

#include "mladcp/backend.h"
#include "mladcp/status.h"

namespace mladcp::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;      // the work failed (a check, a device, an internal error)
inline constexpr int kExitBadArgument = 2;  // a flag or its value was not accepted

// Prints "mladcp: <message>" on stderr for an error and returns the exit code for `s`.
int exit_code(const Status& s);

// A progress line on stderr ("mladcp: <text>"), for steps that take more than a couple of seconds.
void progress(const std::string& text);

const char* device_name(Device d);  // "host", "cuda"
const char* yes_no_mark(bool v);    // "✅", "❌"

// Human-readable numbers: "12.3 ms", "45.6 GB/s", "1.23 TFLOP/s" (decimal units).
std::string format_seconds(double s);
std::string format_rate(double per_second, const char* unit);  // unit "B/s" or "FLOP/s"
std::string format_bytes(double bytes);
// Short scientific form for errors: "3.1e-03".
std::string format_sci(double v);

}  // namespace mladcp::cli
