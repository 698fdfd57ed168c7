// Device merge, rescale and cache write against their host implementations: empty markers
// (-inf, +inf, NaN over NaN outputs), both LSE bases, every storage dtype, padded strides, -1 and
// out-of-range slots.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/lse_math.h"
#include "core/numeric.h"
#include "cuda/cuda_test_util.h"
#include "mladcp/kv_cache.h"
#include "mladcp/merge.h"

namespace mladcp::test {
namespace {

std::vector<uint8_t> encode(const std::vector<float>& v, DType t) {
  std::vector<uint8_t> b(v.size() * dtype_size(t));
  for (size_t i = 0; i < v.size(); ++i) {
    switch (t) {
      case DType::kFP32:
        std::memcpy(&b[i * 4], &v[i], 4);
        break;
      case DType::kBF16: {
        const uint16_t h = numeric::float_to_bf16(v[i]);
        std::memcpy(&b[i * 2], &h, 2);
        break;
      }
      case DType::kFP16: {
        const uint16_t h = numeric::float_to_fp16(v[i]);
        std::memcpy(&b[i * 2], &h, 2);
        break;
      }
      case DType::kFP8E4M3:
        b[i] = numeric::float_to_fp8e4m3(v[i]);
        break;
    }
  }
  return b;
}

// Device and host both round an fp32 sum to the output dtype; their sums differ in the last fp32 bits
// (device and host exponentials), so the two roundings may land one unit in the last place apart:
// 2^-7 relative for bf16 (8 significant bits), 2^-10 for fp16, on top of the fp32 tolerance.
Tolerance both_rounded_tolerance(DType t) {
  Tolerance tol = output_tolerance(DType::kFP32);
  if (t == DType::kBF16) tol.rel = 1.0 / 128.0;
  if (t == DType::kFP16) tol.rel = 1.0 / 1024.0;
  return tol;
}

// An LSE that is sometimes one of the three empty markers; all states of (t=0, h=0) are empty.
float test_lse(uint64_t seed, int n, int t, int h) {
  if (t == 0 && h == 0) return -std::numeric_limits<float>::infinity();
  const int k = (n * 7 + t * 3 + h * 5) % 13;
  if (k == 0) return -std::numeric_limits<float>::infinity();
  if (k == 1) return std::numeric_limits<float>::infinity();
  if (k == 2) return std::numeric_limits<float>::quiet_NaN();
  return 3.0f * synthetic::value(seed, 7, uint64_t(n), uint64_t(t * 4096 + h));
}

::testing::AssertionResult check_merge(int N, int T, int H, int D, DType in_t, DType out_t, LseBase in_base,
                                       LseBase out_base, bool padded, uint64_t seed) {
  const std::string what = "merge N=" + std::to_string(N) + " T=" + std::to_string(T) + " H=" + std::to_string(H) +
                           " D=" + std::to_string(D) + " in=" + dtype_name(in_t) + " out=" + dtype_name(out_t) +
                           " base " + lse_base_name(in_base) + "->" + lse_base_name(out_base) +
                           (padded ? " padded" : "") + " seed=" + std::to_string(seed);
  MergeParams p;
  p.num_states = N;
  p.num_tokens = T;
  p.num_heads = H;
  p.head_dim = D;
  p.in_dtype = in_t;
  p.out_dtype = out_t;
  p.in_base = in_base;
  p.out_base = out_base;
  if (padded) {
    p.in_stride_head = D + 3;
    p.in_stride_token = H * p.in_stride_head + 5;
    p.in_stride_state = T * p.in_stride_token + 7;
    p.lse_stride_token = H + 2;
    p.lse_stride_state = T * p.lse_stride_token + 1;
    p.out_stride_head = D + 8;
    p.out_stride_token = H * p.out_stride_head + 16;
    p.out_lse_stride_token = H + 4;
  }
  const int64_t ish = p.in_stride_head ? p.in_stride_head : D, ist = p.in_stride_token ? p.in_stride_token : H * ish,
                iss = p.in_stride_state ? p.in_stride_state : T * ist;
  const int64_t lst = p.lse_stride_token ? p.lse_stride_token : H,
                lss = p.lse_stride_state ? p.lse_stride_state : T * lst;
  const int64_t osh = p.out_stride_head ? p.out_stride_head : D,
                ost = p.out_stride_token ? p.out_stride_token : H * osh;
  const int64_t olst = p.out_lse_stride_token ? p.out_lse_stride_token : H;
  std::vector<float> in(size_t(N * iss), 0.0f), lse(size_t(N * lss), 0.0f);
  for (int n = 0; n < N; ++n)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h) {
        const float l = test_lse(seed, n, t, h);
        lse[size_t(n * lss + t * lst + h)] = l;
        for (int d = 0; d < D; ++d)
          in[size_t(n * iss + t * ist + h * ish + d)] =
              lse::is_empty(l) ? std::numeric_limits<float>::quiet_NaN()
                               : synthetic::value(seed, uint64_t(n), uint64_t(t * 4096 + h), uint64_t(d));
      }
  const std::vector<uint8_t> in_bytes = encode(in, in_t);
  const size_t out_count = size_t(T * ost), lse_count = size_t(T * olst);
  // Host answer.
  std::vector<uint8_t> host_out(out_count * dtype_size(out_t));
  fill_sentinel(host_out.data(), out_t, out_count);
  std::vector<float> host_lse(lse_count);
  fill_sentinel(host_lse);
  MergeParams hp = p;
  hp.in_out = in_bytes.data();
  hp.in_lse = lse.data();
  hp.out = host_out.data();
  hp.out_lse = host_lse.data();
  const Status hs = merge_states_host(hp);
  if (!hs.ok()) return ::testing::AssertionFailure() << what << ": host merge: " << hs.to_string();
  // Device answer.
  DeviceBuffer in_dev = to_device(in_bytes), lse_dev = to_device(lse);
  GuardedBuffer out(out_t, out_count), out_lse(DType::kFP32, lse_count);
  MergeParams dp = p;
  dp.in_out = in_dev.data();
  dp.in_lse = lse_dev.as<float>();
  dp.out = out.data();
  dp.out_lse = out_lse.as<float>();
  auto cuda = make_backend("cuda");
  Status s = cuda->merge(dp, ExecContext{});
  if (s.ok()) s = device_synchronize();
  if (!s.ok()) return ::testing::AssertionFailure() << what << ": device merge: " << s.to_string();
  ::testing::AssertionResult ok = ::testing::AssertionSuccess();
  const std::vector<float> got = out.download_float(&ok);
  if (!ok) return ::testing::AssertionFailure() << what << ": " << ok.message();
  const std::vector<float> got_lse = out_lse.download_float(&ok);
  if (!ok) return ::testing::AssertionFailure() << what << ": " << ok.message();
  const std::vector<float> want = to_float(host_out.data(), out_t, out_count);
  // Addressed elements must match; padding must stay untouched on both.
  std::vector<float> g, w, gl, wl;
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      for (int d = 0; d < D; ++d) {
        g.push_back(got[size_t(t * ost + h * osh + d)]);
        w.push_back(want[size_t(t * ost + h * osh + d)]);
      }
      gl.push_back(got_lse[size_t(t * olst + h)]);
      wl.push_back(host_lse[size_t(t * olst + h)]);
    }
  const size_t addressed = size_t(T) * H * D, addressed_lse = size_t(T) * H;
  size_t pad_written = 0;
  for (float v : got) pad_written += !is_sentinel(v);
  pad_written -= std::min(pad_written, addressed);
  size_t lse_pad_written = 0;
  for (float v : got_lse) lse_pad_written += !is_sentinel(v);
  lse_pad_written -= std::min(lse_pad_written, addressed_lse);
  if (pad_written || lse_pad_written)
    return ::testing::AssertionFailure() << what << ": " << pad_written << " + " << lse_pad_written
                                         << " padding elements written";
  const Comparison c = compare(g, w, both_rounded_tolerance(out_t), "out");
  if (!c.ok) return ::testing::AssertionFailure() << what << "\n  " << c.report;
  const Comparison cl = compare(gl, wl, lse_tolerance(), "lse");
  if (!cl.ok) return ::testing::AssertionFailure() << what << "\n  " << cl.report;
  if (!(g[0] == 0.0f && gl[0] == -std::numeric_limits<float>::infinity()))
    return ::testing::AssertionFailure() << what << ": an all-empty row must merge to out = 0, lse = -inf";
  return ::testing::AssertionSuccess();
}

TEST(CudaMerge, MatchesHost) {
  MLADCP_SKIP_WITHOUT_GPU();
  uint64_t seed = 1;
  for (int n : {1, 2, 5, 40})
    for (DType in : {DType::kFP32, DType::kBF16, DType::kFP16})
      for (DType out : {DType::kFP32, DType::kBF16, DType::kFP16})
        EXPECT_TRUE(check_merge(n, 3, 5, 512, in, out, n % 2 ? LseBase::kE : LseBase::k2,
                                out == DType::kBF16 ? LseBase::k2 : LseBase::kE, n == 5, ++seed));
  EXPECT_TRUE(check_merge(3, 4, 2, 100, DType::kBF16, DType::kFP32, LseBase::k2, LseBase::kE, true, 99));
  EXPECT_TRUE(check_merge(2, 1, 130, 33, DType::kFP32, DType::kFP32, LseBase::kE, LseBase::k2, false, 98));
}

::testing::AssertionResult check_rescale(int W, int rank, int T, int H, int D, DType t, LseBase base, uint64_t seed) {
  const std::string what = "rescale W=" + std::to_string(W) + " rank=" + std::to_string(rank) +
                           " T=" + std::to_string(T) + " H=" + std::to_string(H) + " D=" + std::to_string(D) + " " +
                           dtype_name(t) + " base " + lse_base_name(base);
  std::vector<float> all_lse(size_t(W * T * H)), out(size_t(T * H * D));
  for (int n = 0; n < W; ++n)
    for (int i = 0; i < T * H; ++i) all_lse[size_t(n * T * H + i)] = test_lse(seed, n, i / H, i % H);
  for (int i = 0; i < T * H; ++i)
    for (int d = 0; d < D; ++d)
      out[size_t(i * D + d)] = lse::is_empty(all_lse[size_t(rank * T * H + i)])
                                   ? std::numeric_limits<float>::quiet_NaN()
                                   : synthetic::value(seed, 3, uint64_t(i), uint64_t(d));
  std::vector<uint8_t> host = encode(out, t);
  std::vector<float> host_lse(size_t(T * H));
  RescaleParams p;
  p.world = W;
  p.rank = rank;
  p.rows = int64_t(T) * H;
  p.head_dim = D;
  p.base = base;
  p.out_dtype = t;
  RescaleParams hp = p;
  hp.all_lse = all_lse.data();
  hp.out = host.data();
  hp.merged_lse = host_lse.data();
  const Status hs = rescale_states_host(hp);
  if (!hs.ok()) return ::testing::AssertionFailure() << what << ": host: " << hs.to_string();
  DeviceBuffer lse_dev = to_device(all_lse);
  GuardedBuffer dev_out(t, size_t(T * H * D)), dev_lse(DType::kFP32, size_t(T * H));
  const std::vector<uint8_t> init = encode(out, t);
  if (!copy_host_to_device(dev_out.data(), init.data(), init.size()).ok())
    return ::testing::AssertionFailure() << what << ": upload failed";
  RescaleParams dp = p;
  dp.all_lse = lse_dev.as<float>();
  dp.out = dev_out.data();
  dp.merged_lse = dev_lse.as<float>();
  auto cuda = make_backend("cuda");
  Status s = cuda->rescale(dp, ExecContext{});
  if (s.ok()) s = device_synchronize();
  if (!s.ok()) return ::testing::AssertionFailure() << what << ": device: " << s.to_string();
  ::testing::AssertionResult ok = ::testing::AssertionSuccess();
  const std::vector<float> got = dev_out.download_float(&ok);
  if (!ok) return ::testing::AssertionFailure() << what << ": " << ok.message();
  const std::vector<float> got_lse = dev_lse.download_float(&ok);
  if (!ok) return ::testing::AssertionFailure() << what << ": " << ok.message();
  const Comparison c = compare(got, to_float(host.data(), t, out.size()), both_rounded_tolerance(t), "out");
  if (!c.ok) return ::testing::AssertionFailure() << what << "\n  " << c.report;
  const Comparison cl = compare(got_lse, host_lse, lse_tolerance(), "merged_lse");
  if (!cl.ok) return ::testing::AssertionFailure() << what << "\n  " << cl.report;
  return ::testing::AssertionSuccess();
}

TEST(CudaRescale, MatchesHost) {
  MLADCP_SKIP_WITHOUT_GPU();
  uint64_t seed = 200;
  for (int w : {1, 2, 4})
    for (DType t : {DType::kFP32, DType::kBF16, DType::kFP16})
      for (int r = 0; r < w; ++r)
        EXPECT_TRUE(check_rescale(w, r, 3, 6, 512, t, (w + r) % 2 ? LseBase::k2 : LseBase::kE, ++seed));
  EXPECT_TRUE(check_rescale(3, 2, 2, 5, 70, DType::kFP32, LseBase::kE, 300));
}

// The device cache write equals write_kv_cache_host byte for byte; untouched slots keep their bytes.
::testing::AssertionResult check_cache_write(int N, DType src_t, DType cache_t, int block_size, int num_blocks,
                                             bool out_of_range, uint64_t seed) {
  const std::string what = std::string("cache write N=") + std::to_string(N) + " src=" + dtype_name(src_t) +
                           " cache=" + dtype_name(cache_t) + " block=" + std::to_string(block_size);
  const int64_t kv_c_stride = kLatentDim + 16, k_pe_stride = kRopeDim + 8;
  std::vector<float> kv_c(size_t(N * kv_c_stride)), k_pe(size_t(N * k_pe_stride));
  for (size_t i = 0; i < kv_c.size(); ++i) kv_c[i] = 4.0f * synthetic::value(seed, 1, i, 0);
  for (size_t i = 0; i < k_pe.size(); ++i) k_pe[i] = 4.0f * synthetic::value(seed, 2, i, 0);
  std::vector<int64_t> slots(static_cast<size_t>(N));
  const int64_t total = int64_t(num_blocks) * block_size;
  for (int i = 0; i < N; ++i) slots[size_t(i)] = i % 4 == 3 ? -1 : (int64_t(i) * 7919 + 13) % total;
  // Distinct slots (a write race would otherwise be legal).
  for (int i = 0; i < N; ++i)
    for (int j = 0; j < i; ++j)
      if (slots[size_t(i)] == slots[size_t(j)]) slots[size_t(i)] = -1;
  std::vector<int64_t> device_slots = slots;
  if (out_of_range) device_slots[1] = total + 5;  // skipped on the device; -1 in the host reference
  if (out_of_range) slots[1] = -1;
  const std::vector<uint8_t> kv_c_b = encode(kv_c, src_t), k_pe_b = encode(k_pe, src_t);
  const size_t cache_bytes = size_t(total) * kQkDim * dtype_size(cache_t);
  std::vector<uint8_t> host_cache(cache_bytes);
  for (size_t i = 0; i < cache_bytes; ++i) host_cache[i] = uint8_t(i * 31 + 7);
  const std::vector<uint8_t> initial = host_cache;
  CacheWriteParams p;
  p.num_tokens = N;
  p.src_dtype = src_t;
  p.kv_c_stride = kv_c_stride;
  p.k_pe_stride = k_pe_stride;
  p.cache_dtype = cache_t;
  p.kv_scale = cache_t == DType::kFP8E4M3 ? 0.5f : 1.0f;
  p.num_blocks = num_blocks;
  p.block_size = block_size;
  CacheWriteParams hp = p;
  hp.kv_c = kv_c_b.data();
  hp.k_pe = k_pe_b.data();
  hp.slot_mapping = slots.data();
  hp.kv_cache = host_cache.data();
  const Status hs = write_kv_cache_host(hp);
  if (!hs.ok()) return ::testing::AssertionFailure() << what << ": host: " << hs.to_string();
  DeviceBuffer kv_c_dev = to_device(kv_c_b), k_pe_dev = to_device(k_pe_b), slots_dev = to_device(device_slots),
               cache_dev = to_device(initial);
  CacheWriteParams dp = p;
  dp.kv_c = kv_c_dev.data();
  dp.k_pe = k_pe_dev.data();
  dp.slot_mapping = slots_dev.as<int64_t>();
  dp.kv_cache = cache_dev.data();
  Status s = write_kv_cache_cuda(dp, nullptr);
  if (s.ok()) s = device_synchronize();
  if (!s.ok()) return ::testing::AssertionFailure() << what << ": device: " << s.to_string();
  std::vector<uint8_t> got(cache_bytes);
  if (!copy_device_to_host(got.data(), cache_dev.data(), got.size()).ok())
    return ::testing::AssertionFailure() << what << ": download failed";
  for (size_t i = 0; i < cache_bytes; ++i)
    if (got[i] != host_cache[i])
      return ::testing::AssertionFailure() << what << ": byte " << i << " (slot " << i / dtype_size(cache_t) / kQkDim
                                           << ") differs: device " << int(got[i]) << ", host " << int(host_cache[i]);
  return ::testing::AssertionSuccess();
}

TEST(CudaCacheWrite, MatchesHost) {
  MLADCP_SKIP_WITHOUT_GPU();
  uint64_t seed = 400;
  for (DType src : {DType::kBF16, DType::kFP16, DType::kFP32})
    for (DType cache : {DType::kBF16, DType::kFP8E4M3})
      for (int bs : {1, 16, 64}) EXPECT_TRUE(check_cache_write(37, src, cache, bs, 5, bs == 16, ++seed));
}

TEST(CudaSanitize, MergeRescaleCacheWrite) {
  MLADCP_SKIP_WITHOUT_GPU();
  EXPECT_TRUE(check_merge(3, 2, 3, 512, DType::kBF16, DType::kBF16, LseBase::kE, LseBase::k2, true, 501));
  EXPECT_TRUE(check_rescale(2, 1, 2, 3, 512, DType::kFP32, LseBase::k2, 502));
  EXPECT_TRUE(check_cache_write(9, DType::kBF16, DType::kFP8E4M3, 16, 2, true, 503));
}

}  // namespace
}  // namespace mladcp::test
