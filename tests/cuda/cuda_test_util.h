// Helpers of the GPU tests: skipping without a device, synthetic problems on the device, guarded
// device buffers (sentinel bands around every output), and running the "cuda" backend against the
// oracle.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "common/decode_check.h"
#include "common/status_assert.h"
#include "core/lse_math.h"
#include "cuda/cuda_backend.h"
#include "mladcp/device_memory.h"
#include "testkit/compare.h"
#include "testkit/synthetic.h"

namespace mladcp::test {

#define MLADCP_SKIP_WITHOUT_GPU()                                                            \
  do {                                                                                       \
    if (::mladcp::cuda_device_count() == 0)                                                  \
      GTEST_SKIP() << "no CUDA device visible (cuda_device_count() == 0): GPU test skipped"; \
  } while (0)

// Tolerance of the cuda decode: the P·V product takes bf16 probabilities (tensor-core operands), so
// each weight carries a relative rounding of 2^-9; over a row the error is at most 2^-9 · max|v| and
// typically far less. Hence 2^-8 relative plus 2^-8 of the output scale, for fp32 and bf16 outputs
// alike (bf16 adds one rounding of 2^-9 of the element).
// A synthetic problem for the GPU tests: `lens` global lengths, fp8 caches scaled by fp8_scale.
inline synthetic::Config config(int heads, int q_len, int block, std::vector<int32_t> lens, uint64_t seed,
                                DType kv = DType::kBF16, DcpShard shard = {}, float fp8_scale = 0.5f) {
  synthetic::Config c;
  c.num_seqs = int(lens.size());
  c.q_len = q_len;
  c.num_heads = heads;
  c.block_size = block;
  c.seq_lens = std::move(lens);
  c.kv_dtype = kv;
  c.kv_scale = kv == DType::kFP8E4M3 ? fp8_scale : 1.0f;
  c.shard = shard;
  c.seed = seed;
  return c;
}

inline Tolerance cuda_decode_tolerance() { return {1.0 / 256.0, 1.0 / 256.0, 0.0}; }

// A device buffer of `count` elements with `guard` sentinel elements on each side. data() points
// past the front band (16-byte aligned for any dtype since guard is a multiple of 16).
class GuardedBuffer {
 public:
  GuardedBuffer(DType dtype, size_t count, size_t guard = 1024) : dtype_(dtype), count_(count), guard_(guard) {
    host_.resize(total() * dtype_size(dtype));
    fill_sentinel(host_.data(), dtype, total());
    const Status s = buf_.allocate(host_.size());
    if (s.ok()) (void)copy_host_to_device(buf_.data(), host_.data(), host_.size());
  }
  void* data() const { return static_cast<uint8_t*>(buf_.data()) + guard_ * dtype_size(dtype_); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data());
  }
  // Copies back; returns the interior (count elements, raw bytes) and checks both bands.
  ::testing::AssertionResult download(std::vector<uint8_t>* interior) {
    std::vector<uint8_t> all(host_.size());
    const Status s = copy_device_to_host(all.data(), buf_.data(), all.size());
    if (!s.ok()) return ::testing::AssertionFailure() << "download: " << s.to_string();
    const size_t es = dtype_size(dtype_);
    const size_t front = count_sentinels(all.data(), dtype_, guard_);
    const size_t back = count_sentinels(all.data() + (guard_ + count_) * es, dtype_, guard_);
    interior->assign(all.begin() + ptrdiff_t(guard_ * es), all.begin() + ptrdiff_t((guard_ + count_) * es));
    if (front != guard_ || back != guard_)
      return ::testing::AssertionFailure() << "guard bands overwritten: " << (guard_ - front) << " elements before, "
                                           << (guard_ - back) << " after the buffer";
    return ::testing::AssertionSuccess();
  }
  std::vector<float> download_float(::testing::AssertionResult* ok) {
    std::vector<uint8_t> raw;
    *ok = download(&raw);
    return to_float(raw.data(), dtype_, count_);
  }
  size_t count() const { return count_; }
  DType dtype() const { return dtype_; }

 private:
  size_t total() const { return count_ + 2 * guard_; }
  DType dtype_;
  size_t count_, guard_;
  std::vector<uint8_t> host_;
  DeviceBuffer buf_;
};

template <typename T>
inline DeviceBuffer to_device(const std::vector<T>& v) {
  DeviceBuffer b;
  if (!v.empty() && b.allocate(v.size() * sizeof(T)).ok()) (void)copy_host_to_device(b.data(), v.data(), b.size());
  return b;
}

// A synthetic problem's inputs on the device.
struct DeviceProblem {
  DeviceBuffer q, kv, block_table, seq_lens;
  explicit DeviceProblem(const synthetic::Problem& p)
      : q(to_device(p.q)),
        kv(to_device(p.kv_cache)),
        block_table(to_device(p.block_table)),
        seq_lens(to_device(p.seq_lens)) {}
  // The problem's params with device pointers.
  MlaDecodeParams params(const synthetic::Problem& p, void* out, DType out_dtype, float* lse, LseBase base) const {
    MlaDecodeParams m = p.params(out, out_dtype, lse, base);
    m.q = q.data();
    m.kv_cache = kv.data();
    m.block_table = block_table.as<int32_t>();
    m.seq_lens = seq_lens.as<int32_t>();
    return m;
  }
};

// Runs backend.decode with a fresh workspace of workspace_bytes(p), then synchronizes.
// The workspace is filled with 0xFF bytes first (NaN partial states, -1 merge records and counters): the kernels
// must write or clear everything they read.
inline Status run_device_decode(Backend& backend, const MlaDecodeParams& p, DeviceStream stream = nullptr) {
  DeviceBuffer ws;
  MLADCP_RETURN_IF_ERROR(ws.allocate(backend.workspace_bytes(p)));
  if (ws.size() > 0) MLADCP_RETURN_IF_ERROR(device_memset(ws.data(), 0xFF, ws.size()));
  ExecContext ctx;
  ctx.stream = stream;
  ctx.workspace = ws.data();
  ctx.workspace_size = ws.size();
  MLADCP_RETURN_IF_ERROR(backend.decode(p, ctx));
  return stream ? stream_synchronize(stream) : device_synchronize();
}

inline std::vector<float> lse_in_base(const std::vector<float>& lse_e, LseBase base) {
  std::vector<float> v = lse_e;
  if (base == LseBase::k2)
    for (float& x : v) x = std::isfinite(x) ? x * lse::kLog2e : x;
  return v;
}

// One decode of `prob` on `cuda` (dev.params, then adjust(params)) into sentinel-guarded buffers: out in out_dtype,
// the LSE in `base`, or none asked for (then its buffer must stay untouched); checked against the oracle's `want`
// (expected_decode with a natural LSE): every element written, within cuda_decode_tolerance. `what` names the case.
template <class Adjust>
::testing::AssertionResult device_decode_matches(Backend& cuda, const synthetic::Problem& prob,
                                                 const DeviceProblem& dev, const DecodeBuffers& want, DType out_dtype,
                                                 std::optional<LseBase> base, const std::string& what, Adjust adjust) {
  const size_t T = size_t(prob.num_tokens()), H = size_t(prob.config.num_heads);
  GuardedBuffer out(out_dtype, T * H * kLatentDim), lse(DType::kFP32, T * H);
  MlaDecodeParams p =
      dev.params(prob, out.data(), out_dtype, base ? lse.as<float>() : nullptr, base.value_or(LseBase::kE));
  adjust(p);
  const Status s = run_device_decode(cuda, p);
  if (!s.ok()) return ::testing::AssertionFailure() << what << ": decode failed: " << s.to_string();
  ::testing::AssertionResult ok = ::testing::AssertionSuccess();
  const std::vector<float> got = out.download_float(&ok);
  if (!ok) return ::testing::AssertionFailure() << what << ": out " << ok.message();
  const Comparison c = compare(got, want.out_float(), cuda_decode_tolerance(), "out", want.out_dims());
  if (!c.ok) return ::testing::AssertionFailure() << what << "\n  " << c.report;
  const std::vector<float> got_lse = lse.download_float(&ok);
  if (!ok) return ::testing::AssertionFailure() << what << ": lse " << ok.message();
  if (base) {
    const Comparison l = compare(got_lse, lse_in_base(*want.lse, *base), lse_tolerance(), "lse", want.lse_dims());
    if (!l.ok) return ::testing::AssertionFailure() << what << "\n  " << l.report;
  } else if (count_sentinels(got_lse) != got_lse.size()) {
    return ::testing::AssertionFailure() << what << ": the LSE buffer was written although no LSE was asked for";
  }
  return ::testing::AssertionSuccess();
}
inline ::testing::AssertionResult device_decode_matches(Backend& cuda, const synthetic::Problem& prob,
                                                        const DeviceProblem& dev, const DecodeBuffers& want,
                                                        DType out_dtype, std::optional<LseBase> base,
                                                        const std::string& what) {
  return device_decode_matches(cuda, prob, dev, want, out_dtype, base, what, [](MlaDecodeParams&) {});
}

}  // namespace mladcp::test
