// fp8 caches on the Hopper kernels multiply f16 operands: each query row is scaled by a power of two into f16 before
// the scores, and the inverse goes into the row's score scale. The choice of that power, shared by both kernels and
// checked on the host (tests/cuda/sm90_decode_test.cpp).
#pragma once

#include <cmath>

#include "mladcp/config.h"

namespace mladcp::cuda_impl {

// e such that row_max · 2^e lies in [2^14, 2^15) (every bf16 value of the row down to 2^-28 of its maximum is then
// exact in f16), bounded above by 126 so that 2^e and 2^-e are normal floats (a row below 2^-111 ends under 2^14, in
// f16's subnormal range at worst); 0 for a row of zeros, infinities or NaN. Below, 15 - e >= -113 for every float.
MLADCP_HD int f16_row_exponent(float row_max) {
  if (!(row_max > 0.0f && row_max < INFINITY)) return 0;
  int e = 0;
  frexpf(row_max, &e);  // row_max in [2^(e-1), 2^e)
  return 15 - e < 126 ? 15 - e : 126;
}

}  // namespace mladcp::cuda_impl
