// Running a host backend and the oracle ("cpu-reference") on one synthetic problem and comparing the
// results. Everything here works on host buffers: a device backend's test copies its inputs to the
// device and its outputs back, then calls expected_decode() and compare_decode() itself.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "mladcp/backend.h"
#include "testkit/compare.h"
#include "testkit/synthetic.h"

namespace mladcp::test {

// "seed=7 B=2 q_len=3 H=16 block=16 kv=fp8_e4m3(scale 0.5) lens=[0, 17] shard=W2/r1/I16": enough to
// rebuild the problem that failed.
inline std::string describe(const synthetic::Config& c) {
  std::ostringstream os;
  os << "seed=" << c.seed << " B=" << c.num_seqs << " q_len=" << c.q_len << " H=" << c.num_heads
     << " block=" << c.block_size << " kv=" << dtype_name(c.kv_dtype);
  if (c.kv_dtype == DType::kFP8E4M3) os << "(scale " << c.kv_scale << ")";
  os << " lens=[";
  for (size_t i = 0; i < c.seq_lens.size(); ++i) os << (i ? ", " : "") << c.seq_lens[i];
  os << "] shard=W" << c.shard.world << "/r" << c.shard.rank << "/I" << c.shard.interleave;
  if (!c.poison) os << " unpoisoned";
  return os.str();
}

// Tests may abort on a broken fixture: builds the problem or fails the process with the reason.
inline synthetic::Problem make_problem(const synthetic::Config& c) {
  synthetic::Problem p;
  const Status s = synthetic::make_problem(c, &p);
  if (!s.ok()) {
    std::fprintf(stderr, "synthetic::make_problem(%s): %s\n", describe(c).c_str(), s.to_string().c_str());
    std::abort();
  }
  return p;
}

inline std::unique_ptr<Backend> make_backend(const std::string& name) {
  std::unique_ptr<Backend> b;
  const Status s = create_backend(name, &b);
  if (!s.ok()) {
    std::fprintf(stderr, "create_backend(%s): %s\n", name.c_str(), s.to_string().c_str());
    std::abort();
  }
  return b;
}

// Output buffers of one decode over all heads of a problem, filled with the sentinel:
// out [T, H, 512] in out_dtype, lse [T, H] fp32 (present only when asked for).
struct DecodeBuffers {
  int num_tokens = 0, num_heads = 0;
  DType out_dtype = DType::kFP32;
  std::vector<uint8_t> out;
  std::optional<std::vector<float>> lse;
  LseBase lse_base = LseBase::kE;

  DecodeBuffers() = default;
  DecodeBuffers(int tokens, int heads, DType dtype, std::optional<LseBase> base)
      : num_tokens(tokens), num_heads(heads), out_dtype(dtype) {
    out.resize(out_elems() * dtype_size(dtype));
    fill_sentinel(out.data(), dtype, out_elems());
    if (base) {
      lse.emplace(size_t(tokens) * heads);
      fill_sentinel(*lse);
      lse_base = *base;
    }
  }
  size_t out_elems() const { return size_t(num_tokens) * num_heads * kLatentDim; }
  float* lse_ptr() { return lse ? lse->data() : nullptr; }
  std::vector<float> out_float() const { return to_float(out.data(), out_dtype, out_elems()); }
  std::vector<int64_t> out_dims() const { return {num_tokens, num_heads, kLatentDim}; }
  std::vector<int64_t> lse_dims() const { return {num_tokens, num_heads}; }
  // True when nothing was written (every element still the sentinel).
  bool untouched() const {
    return count_sentinels(out.data(), out_dtype, out_elems()) == out_elems() &&
           (!lse || count_sentinels(*lse) == lse->size());
  }
};

// Runs `backend` on the problem's host buffers, writing into `buf`.
inline Status run_decode(Backend& backend, const synthetic::Problem& problem, DecodeBuffers& buf,
                         const ExecContext& ctx = {}) {
  MlaDecodeParams p = problem.params(buf.out.data(), buf.out_dtype, buf.lse_ptr(), buf.lse_base);
  std::vector<uint8_t> workspace(backend.workspace_bytes(p));
  ExecContext c = ctx;
  if (!workspace.empty() && !c.workspace) {
    c.workspace = workspace.data();
    c.workspace_size = workspace.size();
  }
  return backend.decode(p, c);
}

// The oracle's answer: fp32 output (so the comparison sees the exact value, not a rounded one) and,
// when a base is given, the LSE in that base.
inline DecodeBuffers expected_decode(const synthetic::Problem& problem, std::optional<LseBase> base) {
  DecodeBuffers want(problem.num_tokens(), problem.config.num_heads, DType::kFP32, base);
  auto oracle = make_backend("cpu-reference");
  const Status s = run_decode(*oracle, problem, want);
  if (!s.ok()) {
    std::fprintf(stderr, "oracle failed on %s: %s\n", describe(problem.config).c_str(), s.to_string().c_str());
    std::abort();
  }
  return want;
}

// Compares a backend's outputs with the oracle's; the message names the problem (seed, shape).
// `out_tol`: the output tolerance when not output_tolerance(got.out_dtype).
inline ::testing::AssertionResult compare_decode(const DecodeBuffers& got, const DecodeBuffers& want,
                                                 const std::string& context,
                                                 std::optional<Tolerance> out_tol = std::nullopt) {
  const Comparison out =
      compare(got.out_float(), want.out_float(), out_tol ? *out_tol : output_tolerance(got.out_dtype),
              std::string("out (") + dtype_name(got.out_dtype) + ")", got.out_dims());
  bool ok = out.ok;
  std::string msg = out.report;
  if (got.lse && want.lse) {
    const Comparison l = compare(*got.lse, *want.lse, lse_tolerance(),
                                 std::string("lse (base ") + lse_base_name(got.lse_base) + ")", got.lse_dims());
    ok = ok && l.ok;
    msg += "\n  " + l.report;
  } else if (got.lse.has_value() != want.lse.has_value()) {
    ok = false;
    msg += "\n  lse: present in one result only";
  }
  if (ok) return ::testing::AssertionSuccess() << context << "\n  " << msg;
  return ::testing::AssertionFailure() << context << "\n  " << msg;
}

// The whole check: decode with `backend` and with the oracle, compare. `lse_base` empty: no LSE.
inline ::testing::AssertionResult matches_oracle(Backend& backend, const synthetic::Problem& problem, DType out_dtype,
                                                 std::optional<LseBase> lse_base, const ExecContext& ctx = {}) {
  const std::string context = "backend '" + backend.capabilities().name + "' on " + describe(problem.config) +
                              " out=" + dtype_name(out_dtype) +
                              (lse_base ? std::string(" lse base ") + lse_base_name(*lse_base) : " no lse");
  DecodeBuffers got(problem.num_tokens(), problem.config.num_heads, out_dtype, lse_base);
  const Status s = run_decode(backend, problem, got, ctx);
  if (!s.ok()) return ::testing::AssertionFailure() << context << ": decode failed: " << s.to_string();
  return compare_decode(got, expected_decode(problem, lse_base), context);
}

// Host backends in the registry (the ones these helpers can run directly).
inline std::vector<std::string> host_backend_names() {
  std::vector<std::string> names;
  for (const std::string& n : backend_names()) {
    std::unique_ptr<Backend> b;
    if (create_backend(n, &b).ok() && b->capabilities().device == Device::kHost) names.push_back(n);
  }
  return names;
}

}  // namespace mladcp::test
