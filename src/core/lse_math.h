// LSE algebra shared by every backend (CPU and CUDA). One merge primitive, used by split-KV
// combine, the DCP all-to-all combine and the DCP all-gather + reduce-scatter rescale.
//
// A partial attention state over a key set K is (o, l) with o = Σ_{j∈K} b^{s_j} v_j / b^{l} and
// l = log_b Σ_{j∈K} b^{s_j}. An empty key set has l = -inf (other kernels also use +inf or NaN;
// all three mean "empty" here) and o is ignored, whatever it holds (NaN included).
#pragma once

#include <cmath>

#include "mladcp/config.h"
#include "mladcp/dtype.h"

namespace mladcp::lse {

inline constexpr float kLn2 = 0.69314718055994530942f;
inline constexpr float kLog2e = 1.44269504088896340736f;

MLADCP_HD bool is_empty(float l) { return !(l > -INFINITY && l < INFINITY); }  // -inf, +inf, NaN

// Maps the three "empty" markers to -inf; finite values pass through.
MLADCP_HD float sanitize(float l) { return is_empty(l) ? -INFINITY : l; }

MLADCP_HD float exp_b(float x, LseBase base) { return base == LseBase::kE ? expf(x) : exp2f(x); }
MLADCP_HD float log_b(float x, LseBase base) { return base == LseBase::kE ? logf(x) : log2f(x); }

// Converts an LSE value between bases (ln Z = log2 Z · ln 2). Empty markers become -inf.
MLADCP_HD float convert(float l, LseBase from, LseBase to) {
  l = sanitize(l);
  if (from == to || l == -INFINITY) return l;
  return from == LseBase::k2 ? l * kLn2 : l * kLog2e;
}

// Streaming form of the merge: feed the LSEs once to find the max and the sum, then ask for each
// state's weight. Usable with any number of states without storing them.
struct Combiner {
  LseBase base;
  float max_l = -INFINITY;
  float sum = 0.0f;

  MLADCP_HD explicit Combiner(LseBase b) : base(b) {}

  MLADCP_HD void observe_max(float l) {
    l = sanitize(l);
    max_l = l > max_l ? l : max_l;
  }
  // Call after every observe_max.
  MLADCP_HD void accumulate(float l) {
    l = sanitize(l);
    if (l != -INFINITY) sum += exp_b(l - max_l, base);
  }
  // Merged LSE: -inf when every state is empty.
  MLADCP_HD float merged_lse() const { return sum > 0.0f ? log_b(sum, base) + max_l : -INFINITY; }
  // Weight of a state in the merged output: b^(l - merged), exactly 0 for an empty state.
  MLADCP_HD float weight(float l) const {
    l = sanitize(l);
    if (l == -INFINITY || !(sum > 0.0f)) return 0.0f;
    return exp_b(l - max_l, base) / sum;
  }
};

// out += w · o, with the guard that an exactly-zero weight contributes exactly zero even when o is
// NaN or inf (empty shards may hold garbage).
MLADCP_HD float weighted(float w, float o) { return w == 0.0f ? 0.0f : w * o; }

}  // namespace mladcp::lse
