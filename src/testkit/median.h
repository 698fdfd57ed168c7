// The median of a sample (NaN for an empty one: nothing was measured): the statistic the tool, the
// benchmarks and the tests report for repeated timings.
#pragma once

#include <algorithm>
#include <limits>
#include <vector>

namespace mladcp::testkit {

inline double median(std::vector<double> v) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace mladcp::testkit
