// The "cuda" decode beyond contiguous shapes: head groups with padded strides, strided caches and
// block tables, batch invariance, determinism, CUDA-graph capture, in-kernel clamping of bad device
// indices, and argument errors that leave every output untouched.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "cuda/cuda_capabilities.h"
#include "cuda/cuda_test_util.h"

namespace mladcp::test {
namespace {

std::vector<uint8_t> bytes_of(GuardedBuffer& b, ::testing::AssertionResult* ok) {
  std::vector<uint8_t> raw;
  *ok = b.download(&raw);
  return raw;
}

TEST(CudaDecode, Capabilities) {
  const BackendCapabilities c = cuda_backend_capabilities();
  EXPECT_EQ(c.name, "cuda");
  EXPECT_TRUE(c.can_return_lse_for_decode);
  EXPECT_TRUE(c.cuda_graph_safe);
  EXPECT_TRUE(c.lse_base_selectable);
  bool listed = false;
  for (const std::string& n : backend_names()) listed = listed || n == "cuda";
  EXPECT_TRUE(listed);
}

// q, out and lse as G groups of Hg heads with padded strides (the DCP all-gather / all-to-all
// layouts); the padding inside the output buffers must stay untouched.
void check_head_groups(int heads, int group, int q_len, std::vector<int32_t> lens, uint64_t seed, SplitPolicy policy) {
  const synthetic::Config cfg = config(heads, q_len, 32, std::move(lens), seed);
  const synthetic::Problem prob = make_problem(cfg);
  const DecodeBuffers want = expected_decode(prob, LseBase::kE);
  const std::vector<float> want_out = want.out_float();
  const int64_t T = prob.num_tokens(), H = heads, Hg = group, G = H / Hg;
  const int64_t qsh = kQkDim + 32, qst = Hg * qsh + 64, qsg = T * qst + 128;
  const int64_t osh = kLatentDim + 16, ost = Hg * osh + 8, osg = T * ost + 64;
  const int64_t lst = Hg + 3, lsg = T * lst + 5;
  std::vector<uint16_t> qg(size_t(G * qsg), 0x7fc0);  // NaN padding: must never be read
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      std::memcpy(&qg[size_t((h / Hg) * qsg + t * qst + (h % Hg) * qsh)], &prob.q[size_t((t * H + h) * kQkDim)],
                  kQkDim * 2);
  DeviceProblem dev(prob);
  DeviceBuffer q_dev = to_device(qg);
  GuardedBuffer out(DType::kFP32, size_t(G * osg)), lse(DType::kFP32, size_t(G * lsg));
  MlaDecodeParams p = dev.params(prob, out.data(), DType::kFP32, lse.as<float>(), LseBase::kE);
  p.q = q_dev.data();
  p.head_group_size = group;
  p.q_stride_head = qsh;
  p.q_stride_token = qst;
  p.q_stride_group = qsg;
  p.out_stride_head = osh;
  p.out_stride_token = ost;
  p.out_stride_group = osg;
  p.lse_stride_token = lst;
  p.lse_stride_group = lsg;
  p.split_policy = policy;
  auto cuda = make_backend("cuda");
  MLADCP_ASSERT_OK(run_device_decode(*cuda, p));
  ::testing::AssertionResult ok = ::testing::AssertionSuccess();
  const std::vector<float> o = out.download_float(&ok);
  ASSERT_TRUE(ok) << ok.message();
  const std::vector<float> l = lse.download_float(&ok);
  ASSERT_TRUE(ok) << ok.message();
  std::vector<float> got(want_out.size()), got_lse(size_t(T * H));
  std::vector<char> used_o(o.size(), 0), used_l(l.size(), 0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t ob = (h / Hg) * osg + t * ost + (h % Hg) * osh;
      for (int d = 0; d < kLatentDim; ++d) {
        got[size_t((t * H + h) * kLatentDim + d)] = o[size_t(ob + d)];
        used_o[size_t(ob + d)] = 1;
      }
      const int64_t lb = (h / Hg) * lsg + t * lst + (h % Hg);
      got_lse[size_t(t * H + h)] = l[size_t(lb)];
      used_l[size_t(lb)] = 1;
    }
  const std::string what =
      describe(cfg) + " head groups of " + std::to_string(group) + ", split_policy=" + split_policy_name(policy);
  const Comparison c = compare(got, want_out, cuda_decode_tolerance(), "out", want.out_dims());
  EXPECT_TRUE(c.ok) << what << "\n  " << c.report;
  const Comparison cl = compare(got_lse, *want.lse, lse_tolerance(), "lse", want.lse_dims());
  EXPECT_TRUE(cl.ok) << what << "\n  " << cl.report;
  size_t pad_written = 0;
  for (size_t i = 0; i < o.size(); ++i) pad_written += !used_o[i] && !is_sentinel(o[i]);
  for (size_t i = 0; i < l.size(); ++i) pad_written += !used_l[i] && !is_sentinel(l[i]);
  EXPECT_EQ(pad_written, 0u) << what << ": elements between the strided rows were written";
}

// Under both split policies (the combine kernel writes the groups when a sequence has several splits).
TEST(CudaDecode, HeadGroupsWithPaddedStrides) {
  MLADCP_SKIP_WITHOUT_GPU();
  for (const SplitPolicy policy : {SplitPolicy::kFillDevice, SplitPolicy::kBatchInvariant}) {
    check_head_groups(32, 8, 2, {0, 2, 100, 1300}, 21, policy);
    check_head_groups(16, 4, 1, {2100, 7}, 22, policy);  // several splits
    check_head_groups(128, 64, 1, {300}, 23, policy);    // two groups = the two 64-row chunks
    check_head_groups(128, 64, 1, {3100, 0, 2}, 939, policy);
    check_head_groups(32, 8, 2, {3100, 0, 2}, 843, policy);
  }
}

// Cache rows and blocks with padding (NaN), a block table with a wider row stride (huge ids in the
// padding), on an fp8 and a bf16 cache.
void check_strided_cache(DType kv, uint64_t seed) {
  const synthetic::Config cfg = config(16, 2, 16, {0, 2, 40, 1500}, seed, kv, {}, 0.25f);
  const synthetic::Problem prob = make_problem(cfg);
  const DecodeBuffers want = expected_decode(prob, LseBase::kE);
  const size_t es = dtype_size(kv);
  const int64_t bs = cfg.block_size, kst = kQkDim + 64, kbs = bs * kst + 128;
  std::vector<uint8_t> cache(size_t(prob.num_blocks * kbs) * es, es == 1 ? 0x7f : 0xc0);
  if (es == 2)
    for (size_t i = 0; i < cache.size(); i += 2) cache[i] = 0xc0, cache[i + 1] = 0x7f;  // bf16 NaN 0x7fc0
  for (int64_t b = 0; b < prob.num_blocks; ++b)
    for (int64_t k = 0; k < bs; ++k)
      std::memcpy(&cache[size_t(b * kbs + k * kst) * es], &prob.kv_cache[size_t((b * bs + k) * kQkDim) * es],
                  kQkDim * es);
  const int64_t bts = prob.max_blocks_per_seq + 3;
  std::vector<int32_t> table(size_t(cfg.num_seqs * bts), synthetic::kUnusedBlockId);
  for (int s = 0; s < cfg.num_seqs; ++s)
    for (int i = 0; i < prob.max_blocks_per_seq; ++i)
      table[size_t(s * bts + i)] = prob.block_table[size_t(s * prob.max_blocks_per_seq + i)];
  DeviceProblem dev(prob);
  DeviceBuffer cache_dev = to_device(cache), table_dev = to_device(table);
  const size_t T = size_t(prob.num_tokens()), H = 16;
  GuardedBuffer out(DType::kBF16, T * H * kLatentDim), lse(DType::kFP32, T * H);
  MlaDecodeParams p = dev.params(prob, out.data(), DType::kBF16, lse.as<float>(), LseBase::k2);
  p.kv_cache = cache_dev.data();
  p.kv_stride_token = kst;
  p.kv_stride_block = kbs;
  p.block_table = table_dev.as<int32_t>();
  p.block_table_stride = bts;
  auto cuda = make_backend("cuda");
  MLADCP_ASSERT_OK(run_device_decode(*cuda, p));
  ::testing::AssertionResult ok = ::testing::AssertionSuccess();
  const std::vector<float> o = out.download_float(&ok);
  ASSERT_TRUE(ok) << ok.message();
  const std::vector<float> l = lse.download_float(&ok);
  ASSERT_TRUE(ok) << ok.message();
  const Comparison c = compare(o, want.out_float(), cuda_decode_tolerance(), "out", want.out_dims());
  EXPECT_TRUE(c.ok) << describe(cfg) << " strided cache\n  " << c.report;
  const Comparison cl = compare(l, lse_in_base(*want.lse, LseBase::k2), lse_tolerance(), "lse", want.lse_dims());
  EXPECT_TRUE(cl.ok) << describe(cfg) << " strided cache\n  " << cl.report;
}

TEST(CudaDecode, StridedCacheAndBlockTable) {
  MLADCP_SKIP_WITHOUT_GPU();
  check_strided_cache(DType::kBF16, 31);
  check_strided_cache(DType::kFP8E4M3, 32);
}

// Runs a decode into fresh buffers and returns (out bytes, lse bytes).
struct RawResult {
  std::vector<uint8_t> out, lse;
};
RawResult run_raw(Backend& cuda, const MlaDecodeParams& base, size_t T, size_t H, DeviceStream stream = nullptr) {
  GuardedBuffer out(DType::kBF16, T * H * kLatentDim), lse(DType::kFP32, T * H);
  MlaDecodeParams p = base;
  p.out = out.data();
  p.out_dtype = DType::kBF16;
  p.lse = lse.as<float>();
  const Status s = run_device_decode(cuda, p, stream);
  EXPECT_TRUE(s.ok()) << s.to_string();
  RawResult r;
  ::testing::AssertionResult ok = ::testing::AssertionSuccess();
  r.out = bytes_of(out, &ok);
  EXPECT_TRUE(ok) << ok.message();
  r.lse = bytes_of(lse, &ok);
  EXPECT_TRUE(ok) << ok.message();
  return r;
}

// A sequence's result does not depend on the rest of the batch nor on max_seq_len: bitwise.
TEST(CudaDecode, BatchInvariantAndDeterministic) {
  MLADCP_SKIP_WITHOUT_GPU();
  const int H = 16, q_len = 2;
  // The last sequence only makes the batch's max_seq_len (the grid bound) larger than any single one, and its nine
  // splits put the batch's combine in its mode for rows of many states (the others alone: few states).
  const synthetic::Problem prob = make_problem(config(H, q_len, 64, {1500, 37, 4096, 0, 900, 17000}, 41));
  DeviceProblem dev(prob);
  auto cuda = make_backend("cuda");
  MlaDecodeParams all = dev.params(prob, nullptr, DType::kBF16, nullptr, LseBase::kE);
  all.split_policy = SplitPolicy::kBatchInvariant;  // what this test checks
  const size_t T = size_t(prob.num_tokens());
  const RawResult batch = run_raw(*cuda, all, T, H);
  const RawResult again = run_raw(*cuda, all, T, H);
  EXPECT_EQ(batch.out, again.out) << "two identical calls gave different bits";
  EXPECT_EQ(batch.lse, again.lse) << "two identical calls gave different bits";
  for (int seq : {0, 2, 3, 4}) {
    MlaDecodeParams one = all;
    one.num_seqs = 1;
    one.q = static_cast<const uint16_t*>(all.q) + size_t(seq) * q_len * H * kQkDim;
    one.block_table = all.block_table + size_t(seq) * prob.max_blocks_per_seq;
    one.block_table_stride = prob.max_blocks_per_seq;
    one.seq_lens = all.seq_lens + seq;
    one.max_seq_len = std::max(1, prob.seq_lens[size_t(seq)]);  // a tighter grid bound than the batch's
    const RawResult alone = run_raw(*cuda, one, q_len, H);
    const size_t ob = size_t(seq) * q_len * H * kLatentDim * 2, lb = size_t(seq) * q_len * H * 4;
    EXPECT_TRUE(std::equal(alone.out.begin(), alone.out.end(), batch.out.begin() + ptrdiff_t(ob)))
        << "sequence " << seq << " alone differs from the same sequence in the batch";
    EXPECT_TRUE(std::equal(alone.lse.begin(), alone.lse.end(), batch.lse.begin() + ptrdiff_t(lb)))
        << "sequence " << seq << " alone differs from the same sequence in the batch";
  }
}

// decode() captured in a CUDA graph and replayed gives the eager result, bitwise.
TEST(CudaDecode, GraphCaptureMatchesEager) {
  MLADCP_SKIP_WITHOUT_GPU();
  const int H = 64, q_len = 1;
  const synthetic::Problem prob = make_problem(config(H, q_len, 64, {9000, 100, 0}, 51));
  DeviceProblem dev(prob);
  auto cuda = make_backend("cuda");
  const size_t T = size_t(prob.num_tokens());
  GuardedBuffer out(DType::kBF16, T * H * kLatentDim), lse(DType::kFP32, T * H);
  MlaDecodeParams p = dev.params(prob, out.data(), DType::kBF16, lse.as<float>(), LseBase::kE);
  const RawResult eager = run_raw(*cuda, p, T, H);
  DeviceBuffer ws;
  MLADCP_ASSERT_OK(ws.allocate(cuda->workspace_bytes(p)));
  ASSERT_GT(ws.size(), 0u) << "the case should need the combine kernel";
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ExecContext ctx;
  ctx.stream = stream;
  ctx.workspace = ws.data();
  ctx.workspace_size = ws.size();
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  const Status s = cuda->decode(p, ctx);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  MLADCP_ASSERT_OK(s);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ::testing::AssertionResult ok = ::testing::AssertionSuccess();
  EXPECT_EQ(bytes_of(out, &ok), eager.out);
  EXPECT_TRUE(ok) << ok.message();
  EXPECT_EQ(bytes_of(lse, &ok), eager.lse);
  EXPECT_TRUE(ok) << ok.message();
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// seq_lens above max_seq_len are clamped to it in the kernel (the grid bound is never exceeded).
TEST(CudaDecode, SeqLensClampedToMaxSeqLen) {
  MLADCP_SKIP_WITHOUT_GPU();
  const synthetic::Problem prob = make_problem(config(16, 1, 16, {500, 200}, 61));
  const synthetic::Problem clamped = make_problem(config(16, 1, 16, {300, 200}, 61));
  const DecodeBuffers want = expected_decode(clamped, LseBase::kE);
  DeviceProblem dev(prob);
  GuardedBuffer out(DType::kFP32, 2 * 16 * kLatentDim), lse(DType::kFP32, 2 * 16);
  MlaDecodeParams p = dev.params(prob, out.data(), DType::kFP32, lse.as<float>(), LseBase::kE);
  p.max_seq_len = 300;
  auto cuda = make_backend("cuda");
  MLADCP_ASSERT_OK(run_device_decode(*cuda, p));
  ::testing::AssertionResult ok = ::testing::AssertionSuccess();
  const Comparison c = compare(out.download_float(&ok), want.out_float(), cuda_decode_tolerance(), "out");
  EXPECT_TRUE(ok) << ok.message();
  EXPECT_TRUE(c.ok) << c.report;
  const Comparison cl = compare(lse.download_float(&ok), *want.lse, lse_tolerance(), "lse");
  EXPECT_TRUE(cl.ok) << cl.report;
}

// Out-of-range block ids in the table are skipped in the kernel: no fault, every output written and
// finite, other sequences unaffected.
TEST(CudaDecode, OutOfRangeBlockIdsSkipped) {
  MLADCP_SKIP_WITHOUT_GPU();
  const int H = 16;
  const synthetic::Problem prob = make_problem(config(H, 1, 16, {300, 300}, 71));
  const DecodeBuffers want = expected_decode(prob, LseBase::kE);
  std::vector<int32_t> table = prob.block_table;
  table[3] = 1000000000;
  table[5] = -7;
  DeviceProblem dev(prob);
  DeviceBuffer table_dev = to_device(table);
  GuardedBuffer out(DType::kFP32, 2 * H * kLatentDim), lse(DType::kFP32, 2 * H);
  MlaDecodeParams p = dev.params(prob, out.data(), DType::kFP32, lse.as<float>(), LseBase::kE);
  p.block_table = table_dev.as<int32_t>();
  auto cuda = make_backend("cuda");
  MLADCP_ASSERT_OK(run_device_decode(*cuda, p));
  ::testing::AssertionResult ok = ::testing::AssertionSuccess();
  const std::vector<float> o = out.download_float(&ok);
  ASSERT_TRUE(ok) << ok.message();
  const std::vector<float> l = lse.download_float(&ok);
  ASSERT_TRUE(ok) << ok.message();
  size_t bad = 0;
  for (float v : o) bad += !std::isfinite(v);
  for (float v : l) bad += !std::isfinite(v);
  EXPECT_EQ(bad, 0u) << "non-finite or unwritten outputs after skipping bad block ids";
  const std::vector<float> want_out = want.out_float();
  const size_t half = size_t(H) * kLatentDim;
  const Comparison c = compare(o.data() + half, want_out.data() + half, half, cuda_decode_tolerance(), "out seq 1");
  EXPECT_TRUE(c.ok) << c.report;
}

// Every argument error returns a Status naming the argument and writes nothing.
TEST(CudaDecode, ArgumentErrorsWriteNothing) {
  MLADCP_SKIP_WITHOUT_GPU();
  const int H = 16;
  const synthetic::Problem prob = make_problem(config(H, 1, 64, {4200, 5}, 81));  // three splits: a workspace
  DeviceProblem dev(prob);
  auto cuda = make_backend("cuda");
  const size_t T = size_t(prob.num_tokens());
  GuardedBuffer out(DType::kBF16, T * H * kLatentDim + 64), lse(DType::kFP32, T * H);
  const MlaDecodeParams good = dev.params(prob, out.data(), DType::kBF16, lse.as<float>(), LseBase::kE);
  DeviceBuffer ws;
  MLADCP_ASSERT_OK(ws.allocate(cuda->workspace_bytes(good)));
  ASSERT_GT(ws.size(), 0u);
  struct Bad {
    const char* name;
    const char* mentions;
    std::function<void(MlaDecodeParams&, ExecContext&)> edit;
  };
  const std::vector<Bad> bads = {
      {"max_seq_len 0", "max_seq_len", [](MlaDecodeParams& p, ExecContext&) { p.max_seq_len = 0; }},
      {"misaligned out", "out", [](MlaDecodeParams& p, ExecContext&) { p.out = static_cast<uint16_t*>(p.out) + 4; }},
      {"q stride", "q strides", [](MlaDecodeParams& p, ExecContext&) { p.q_stride_head = 580; }},
      {"small workspace", "workspace", [](MlaDecodeParams&, ExecContext& c) { c.workspace_size -= 1; }},
      {"no workspace", "workspace",
       [](MlaDecodeParams&, ExecContext& c) {
         c.workspace = nullptr;
         c.workspace_size = 0;
       }},
      {"heads", "num_heads", [](MlaDecodeParams& p, ExecContext&) { p.num_heads = 0; }},
      {"q_len", "q_len", [](MlaDecodeParams& p, ExecContext&) { p.q_len = kMaxQLen + 1; }},
      {"kv dtype", "kv_dtype", [](MlaDecodeParams& p, ExecContext&) { p.kv_dtype = DType::kFP16; }},
      {"out dtype", "out_dtype", [](MlaDecodeParams& p, ExecContext&) { p.out_dtype = DType::kFP16; }},
      {"kv scale", "kv_scale", [](MlaDecodeParams& p, ExecContext&) { p.kv_scale = 2.0f; }},
      {"interleave", "block_size",
       [](MlaDecodeParams& p, ExecContext&) {
         p.shard = {2, 0, 3};
       }},
      {"table too short", "max_seq_len", [](MlaDecodeParams& p, ExecContext&) { p.max_seq_len = 100000; }},
  };
  for (const Bad& b : bads) {
    MlaDecodeParams p = good;
    ExecContext ctx;
    ctx.workspace = ws.data();
    ctx.workspace_size = ws.size();
    b.edit(p, ctx);
    const Status s = cuda->decode(p, ctx);
    EXPECT_FALSE(s.ok()) << b.name << ": accepted";
    EXPECT_NE(s.message().find(b.mentions), std::string::npos)
        << b.name << ": message does not name '" << b.mentions << "': " << s.to_string();
  }
  MLADCP_ASSERT_OK(device_synchronize());
  ::testing::AssertionResult ok = ::testing::AssertionSuccess();
  std::vector<uint8_t> raw;
  ok = out.download(&raw);
  EXPECT_TRUE(ok) << ok.message();
  EXPECT_EQ(count_sentinels(raw.data(), DType::kBF16, out.count()), out.count()) << "a failed call wrote out";
  ok = lse.download(&raw);
  EXPECT_EQ(count_sentinels(raw.data(), DType::kFP32, lse.count()), lse.count()) << "a failed call wrote lse";
  // An empty batch is fine and touches nothing.
  MlaDecodeParams empty = good;
  empty.num_seqs = 0;
  MLADCP_ASSERT_OK(cuda->decode(empty, ExecContext{}));
}

}  // namespace
}  // namespace mladcp::test
