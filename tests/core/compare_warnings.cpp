// Compiled by the test core.compare_h_warning_free at -O3 with -Werror: the comparison helpers must
// build without warnings on the supported compilers (GCC 12's -Wrestrict included).
#include "testkit/compare.h"

int main() {
  std::vector<float> got(6, 1.0f), want(6, 2.0f);
  const auto tol = mladcp::test::output_tolerance(mladcp::DType::kFP32);
  return int(mladcp::test::compare(got, want, tol, "x", {2, 3}).report.size() % 2);
}
