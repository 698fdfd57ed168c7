// Merge algebra: the N-way merge and the rescale form, in both bases, against an fp64 computation;
// empty states (-inf, +inf, NaN LSE) with garbage outputs; and a base-mismatch test that fails if
// the merge ignores the base its input was produced in.
#include "mladcp/merge.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "common/decode_check.h"
#include "core/lse_math.h"
#include "testkit/compare.h"

namespace mladcp::test {
namespace {

constexpr float kInf = INFINITY;

// N partial states [N, T, H, D] fp32 with random outputs and LSEs in `base`.
struct States {
  int n, t, h, d;
  std::vector<float> out, lse;
};

States random_states(uint64_t seed, int n, int t, int h, int d) {
  States s{n, t, h, d, std::vector<float>(size_t(n) * t * h * d), std::vector<float>(size_t(n) * t * h)};
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : s.out) v = normal(rng);
  for (float& v : s.lse) v = 3.0f * normal(rng);
  return s;
}

MergeParams merge_params(const States& s, LseBase in_base, float* out, float* out_lse, LseBase out_base) {
  MergeParams m;
  m.num_states = s.n;
  m.num_tokens = s.t;
  m.num_heads = s.h;
  m.head_dim = s.d;
  m.in_out = s.out.data();
  m.in_dtype = DType::kFP32;
  m.in_lse = s.lse.data();
  m.in_base = in_base;
  m.out = out;
  m.out_dtype = DType::kFP32;
  m.out_lse = out_lse;
  m.out_base = out_base;
  return m;
}

// The merge in fp64, from LSEs whose base is `base`: out and lse (in `base`).
void exact_merge(const States& s, LseBase base, std::vector<float>* out, std::vector<float>* lse) {
  const double to_e = base == LseBase::kE ? 1.0 : std::log(2.0);
  out->assign(size_t(s.t) * s.h * s.d, 0.0f);
  lse->assign(size_t(s.t) * s.h, -kInf);
  for (int t = 0; t < s.t; ++t) {
    for (int h = 0; h < s.h; ++h) {
      double mx = -HUGE_VAL;
      for (int n = 0; n < s.n; ++n) {
        const float l = s.lse[(size_t(n) * s.t + t) * s.h + h];
        if (std::isfinite(l)) mx = std::max(mx, double(l) * to_e);
      }
      if (mx == -HUGE_VAL) continue;
      double z = 0.0;
      for (int n = 0; n < s.n; ++n) {
        const float l = s.lse[(size_t(n) * s.t + t) * s.h + h];
        if (std::isfinite(l)) z += std::exp(double(l) * to_e - mx);
      }
      for (int dd = 0; dd < s.d; ++dd) {
        double acc = 0.0;
        for (int n = 0; n < s.n; ++n) {
          const float l = s.lse[(size_t(n) * s.t + t) * s.h + h];
          if (std::isfinite(l))
            acc += std::exp(double(l) * to_e - mx) / z * s.out[((size_t(n) * s.t + t) * s.h + h) * s.d + dd];
        }
        (*out)[(size_t(t) * s.h + h) * s.d + dd] = float(acc);
      }
      (*lse)[size_t(t) * s.h + h] = float((mx + std::log(z)) / to_e);
    }
  }
}

Tolerance merge_tolerance() { return {2e-6, 2e-6, 0.0}; }
Tolerance merged_lse_tolerance() { return {2e-6, 0.0, 2e-6}; }

TEST(MergeTest, MatchesFp64InBothBases) {
  for (LseBase base : {LseBase::kE, LseBase::k2}) {
    for (int n : {1, 2, 3, 7}) {
      const States s = random_states(10 + n, n, 5, 3, 64);
      std::vector<float> out(size_t(5) * 3 * 64), lse(15), want_out, want_lse;
      fill_sentinel(out);
      fill_sentinel(lse);
      ASSERT_TRUE(merge_states_host(merge_params(s, base, out.data(), lse.data(), base)).ok());
      exact_merge(s, base, &want_out, &want_lse);
      const Comparison co = compare(out, want_out, merge_tolerance(), "merged out", {5, 3, 64});
      const Comparison cl = compare(lse, want_lse, merged_lse_tolerance(), "merged lse", {5, 3});
      EXPECT_TRUE(co.ok) << "base " << lse_base_name(base) << " N=" << n << ": " << co.report;
      EXPECT_TRUE(cl.ok) << "base " << lse_base_name(base) << " N=" << n << ": " << cl.report;
    }
  }
}

TEST(MergeTest, OutputLseIsConvertedToTheRequestedBase) {
  const States s = random_states(21, 3, 4, 2, 16);
  std::vector<float> out(4 * 2 * 16), lse_e(8), lse_2(8);
  ASSERT_TRUE(merge_states_host(merge_params(s, LseBase::kE, out.data(), lse_e.data(), LseBase::kE)).ok());
  ASSERT_TRUE(merge_states_host(merge_params(s, LseBase::kE, out.data(), lse_2.data(), LseBase::k2)).ok());
  for (size_t i = 0; i < lse_e.size(); ++i) EXPECT_NEAR(lse_2[i], lse_e[i] * lse::kLog2e, 1e-5f * std::fabs(lse_2[i]));
}

// Merging with an empty state is the identity, exactly, whatever the empty state's output holds.
TEST(MergeTest, EmptyStateIsTheIdentity) {
  for (LseBase base : {LseBase::kE, LseBase::k2}) {
    for (float marker : {-kInf, kInf, NAN}) {
      States s = random_states(30, 2, 3, 4, 32);
      const size_t half = s.out.size() / 2;
      for (size_t i = half; i < s.out.size(); ++i) s.out[i] = NAN;                 // state 1: garbage
      for (size_t i = s.lse.size() / 2; i < s.lse.size(); ++i) s.lse[i] = marker;  // state 1: empty
      std::vector<float> out(half), lse(s.lse.size() / 2);
      ASSERT_TRUE(merge_states_host(merge_params(s, base, out.data(), lse.data(), base)).ok());
      for (size_t i = 0; i < half; ++i) ASSERT_EQ(out[i], s.out[i]) << "marker " << marker;
      for (size_t i = 0; i < lse.size(); ++i) ASSERT_EQ(lse[i], s.lse[i]) << "marker " << marker;
      // The empty state first gives the same.
      States swapped = s;
      std::rotate(swapped.out.begin(), swapped.out.begin() + long(half), swapped.out.end());
      std::rotate(swapped.lse.begin(), swapped.lse.begin() + long(lse.size()), swapped.lse.end());
      std::vector<float> out2(half), lse2(lse.size());
      ASSERT_TRUE(merge_states_host(merge_params(swapped, base, out2.data(), lse2.data(), base)).ok());
      EXPECT_EQ(out, out2);
      EXPECT_EQ(lse, lse2);
    }
  }
}

// Every state empty (any mix of markers, NaN outputs): out exactly 0, lse -inf, never NaN.
TEST(MergeTest, AllEmptyGivesZeroAndMinusInfinity) {
  for (LseBase base : {LseBase::kE, LseBase::k2}) {
    States s = random_states(40, 3, 2, 2, 16);
    const float markers[] = {-kInf, kInf, NAN};
    for (size_t i = 0; i < s.lse.size(); ++i) s.lse[i] = markers[i % 3];
    for (float& v : s.out) v = NAN;
    std::vector<float> out(2 * 2 * 16), lse(4);
    fill_sentinel(out);
    fill_sentinel(lse);
    ASSERT_TRUE(merge_states_host(merge_params(s, base, out.data(), lse.data(), base)).ok());
    for (float v : out) ASSERT_EQ(v, 0.0f);
    for (float v : lse) ASSERT_EQ(v, -kInf);
  }
}

// +inf / NaN / -inf markers among live states: the markers' (NaN) outputs contribute exact zeros.
TEST(MergeTest, MarkersAmongLiveStatesContributeNothing) {
  States s = random_states(45, 4, 3, 2, 8);
  const int per_state = 3 * 2;
  const float markers[] = {kInf, NAN, -kInf};
  for (int n = 1; n < 4; ++n) {
    for (int i = 0; i < per_state; ++i) s.lse[size_t(n) * per_state + i] = markers[n - 1];
    for (int i = 0; i < per_state * 8; ++i) s.out[size_t(n) * per_state * 8 + i] = NAN;
  }
  std::vector<float> out(per_state * 8), lse(per_state);
  ASSERT_TRUE(merge_states_host(merge_params(s, LseBase::kE, out.data(), lse.data(), LseBase::kE)).ok());
  for (int i = 0; i < per_state * 8; ++i) ASSERT_EQ(out[size_t(i)], s.out[size_t(i)]);
  for (int i = 0; i < per_state; ++i) ASSERT_EQ(lse[size_t(i)], s.lse[size_t(i)]);
}

// Order of the states changes the result only within fp32 rounding; merging in two steps too.
TEST(MergeTest, OrderAndGroupingIndependentWithinRounding) {
  for (LseBase base : {LseBase::kE, LseBase::k2}) {
    const int N = 6, T = 3, H = 4, D = 64;
    const States s = random_states(50, N, T, H, D);
    std::vector<float> ref(size_t(T) * H * D), ref_lse(size_t(T) * H);
    ASSERT_TRUE(merge_states_host(merge_params(s, base, ref.data(), ref_lse.data(), base)).ok());
    std::vector<int> order(N);
    std::iota(order.begin(), order.end(), 0);
    std::mt19937_64 rng(51);
    for (int trial = 0; trial < 5; ++trial) {
      std::shuffle(order.begin(), order.end(), rng);
      States p = s;
      for (int n = 0; n < N; ++n) {
        std::copy_n(&s.out[size_t(order[size_t(n)]) * T * H * D], T * H * D, &p.out[size_t(n) * T * H * D]);
        std::copy_n(&s.lse[size_t(order[size_t(n)]) * T * H], T * H, &p.lse[size_t(n) * T * H]);
      }
      std::vector<float> out(ref.size()), lse(ref_lse.size());
      ASSERT_TRUE(merge_states_host(merge_params(p, base, out.data(), lse.data(), base)).ok());
      EXPECT_TRUE(compare(out, ref, merge_tolerance(), "permuted").ok);
      EXPECT_TRUE(compare(lse, ref_lse, merged_lse_tolerance(), "permuted lse").ok);
    }
    // ((0..2) merged, (3..5) merged) merged == all six merged.
    States halves{2, T, H, D, std::vector<float>(size_t(2) * T * H * D), std::vector<float>(size_t(2) * T * H)};
    for (int half = 0; half < 2; ++half) {
      States part{3, T, H, D, {}, {}};
      part.out.assign(s.out.begin() + long(half) * 3 * T * H * D, s.out.begin() + long(half + 1) * 3 * T * H * D);
      part.lse.assign(s.lse.begin() + long(half) * 3 * T * H, s.lse.begin() + long(half + 1) * 3 * T * H);
      ASSERT_TRUE(merge_states_host(merge_params(part, base, &halves.out[size_t(half) * T * H * D],
                                                 &halves.lse[size_t(half) * T * H], base))
                      .ok());
    }
    std::vector<float> out(ref.size()), lse(ref_lse.size());
    ASSERT_TRUE(merge_states_host(merge_params(halves, base, out.data(), lse.data(), base)).ok());
    EXPECT_TRUE(compare(out, ref, merge_tolerance(), "two-step").ok);
    EXPECT_TRUE(compare(lse, ref_lse, merged_lse_tolerance(), "two-step lse").ok);
  }
}

// The bug class the LSE base exists for: base-2 LSEs merged as base 2 are right; declaring them
// natural logs gives a measurably wrong output. This test fails if the merge ignores in_base.
TEST(MergeTest, BaseMismatchIsDetected) {
  States s = random_states(60, 3, 4, 4, 64);
  std::vector<float> want_out, want_lse;
  exact_merge(s, LseBase::kE, &want_out, &want_lse);  // the truth, from natural-log LSEs
  States base2 = s;
  for (float& l : base2.lse) l *= lse::kLog2e;  // the same states, as a log2 kernel reports them

  std::vector<float> right(want_out.size()), right_lse(want_lse.size());
  ASSERT_TRUE(merge_states_host(merge_params(base2, LseBase::k2, right.data(), right_lse.data(), LseBase::kE)).ok());
  const Comparison ok_out = compare(right, want_out, {1e-5, 1e-5, 0.0}, "declared base 2");
  const Comparison ok_lse = compare(right_lse, want_lse, {1e-5, 0.0, 1e-5}, "declared base 2 lse");
  EXPECT_TRUE(ok_out.ok) << ok_out.report;
  EXPECT_TRUE(ok_lse.ok) << ok_lse.report;

  std::vector<float> wrong(want_out.size()), wrong_lse(want_lse.size());
  ASSERT_TRUE(merge_states_host(merge_params(base2, LseBase::kE, wrong.data(), wrong_lse.data(), LseBase::kE)).ok());
  const Comparison bad = compare(wrong, want_out, {1e-5, 1e-5, 0.0}, "declared base e");
  EXPECT_FALSE(bad.ok) << bad.report;
  EXPECT_GT(bad.max_rel_err, 1e-2) << bad.report;
}

// Rescale form (all-gather + reduce-scatter): each rank rescales its own output in place; the sum
// over ranks is the N-way merge. Empty ranks with NaN outputs become exact zeros.
TEST(RescaleTest, SumOfRescaledRanksEqualsTheMerge) {
  for (LseBase base : {LseBase::kE, LseBase::k2}) {
    const int W = 4, T = 3, H = 2, D = 32;
    States s = random_states(70, W, T, H, D);
    for (int i = 0; i < T * H; i += 2) s.lse[size_t(2) * T * H + i] = i % 4 ? kInf : -kInf;  // rank 2: some empty rows
    for (int i = 0; i < T * H; i += 2)
      for (int d = 0; d < D; ++d) s.out[(size_t(2) * T * H + i) * D + d] = NAN;
    std::vector<float> merged(size_t(T) * H * D), merged_lse(size_t(T) * H);
    ASSERT_TRUE(merge_states_host(merge_params(s, base, merged.data(), merged_lse.data(), base)).ok());
    std::vector<float> sum(merged.size(), 0.0f), rank_lse(merged_lse.size());
    for (int r = 0; r < W; ++r) {
      std::vector<float> mine(&s.out[size_t(r) * T * H * D], &s.out[size_t(r + 1) * T * H * D]);
      RescaleParams rp;
      rp.world = W;
      rp.rank = r;
      rp.rows = int64_t(T) * H;
      rp.head_dim = D;
      rp.all_lse = s.lse.data();
      rp.base = base;
      rp.out = mine.data();
      rp.out_dtype = DType::kFP32;
      rp.merged_lse = rank_lse.data();
      ASSERT_TRUE(rescale_states_host(rp).ok());
      for (float v : mine) ASSERT_FALSE(std::isnan(v)) << "rank " << r;
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += mine[i];
      const Comparison cl = compare(rank_lse, merged_lse, merged_lse_tolerance(), "rank lse");
      EXPECT_TRUE(cl.ok) << cl.report;
    }
    const Comparison c = compare(sum, merged, merge_tolerance(), "sum of rescaled");
    EXPECT_TRUE(c.ok) << "base " << lse_base_name(base) << ": " << c.report;
  }
}

// bf16 and fp16 inputs and outputs go through the same algebra.
TEST(MergeTest, HalfPrecisionInputsAndOutputs) {
  const States s = random_states(80, 3, 2, 3, 64);
  std::vector<float> want_out, want_lse;
  exact_merge(s, LseBase::kE, &want_out, &want_lse);
  for (DType dt : {DType::kBF16, DType::kFP16}) {
    std::vector<uint16_t> in(s.out.size()), out(want_out.size());
    for (size_t i = 0; i < in.size(); ++i)
      in[i] = dt == DType::kBF16 ? numeric::float_to_bf16(s.out[i]) : numeric::float_to_fp16(s.out[i]);
    MergeParams m = merge_params(s, LseBase::kE, nullptr, nullptr, LseBase::kE);
    m.in_out = in.data();
    m.in_dtype = dt;
    m.out = out.data();
    m.out_dtype = dt;
    ASSERT_TRUE(merge_states_host(m).ok());
    const double rel = dt == DType::kBF16 ? 1.0 / 128 : 1.0 / 512;  // two roundings (input and output)
    const Comparison c = compare(to_float(out.data(), dt, out.size()).data(), want_out.data(), out.size(),
                                 {rel, rel, 0.0}, dtype_name(dt));
    EXPECT_TRUE(c.ok) << c.report;
  }
}

}  // namespace
}  // namespace mladcp::test
