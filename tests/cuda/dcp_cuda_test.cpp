// The DCP step with the "cuda" backend for every world size 1..8, in one process: W threads over the
// in-process thread communicator. The grid covers one head per rank, q_len 1..16, interleave 1..3,
// block sizes that are not powers of two, padded and strided caller buffers, both merge modes, and
// batches where every sequence is empty.
//   DcpCudaLayout (any machine with the CUDA build): the step's local decode is checked against the
//     cuda kernels' layout rules (check_cuda_decode_layout) while a host backend computes, so the
//     decoder's exchange layout is proven acceptable to the kernels without a GPU.
//   DcpCudaGrid (GPU): the same grid on device memory, every rank on the one current GPU, against a
//     single-GPU decode of the unsharded cache.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/decode_check.h"
#include "cuda/cuda_backend.h"
#include "dcp/dcp_case.h"
#include "dcp/thread_communicator.h"

namespace mladcp::test {
namespace {

void run_ranks(int world, Device memory, const std::function<void(Communicator&)>& body) {
  auto comms = make_thread_communicators(world, memory);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back([&, r] { body(*comms[size_t(r)]); });
  for (auto& t : threads) t.join();
}

// The grid of one world size: shapes whose packed head group (T · H/W rows) is not a multiple of the
// kernels' alignment, next to ordinary ones; both merge modes each.
std::vector<DcpCase> grid(int W) {
  struct Shape {
    int q_len, interleave, block, pad;
    bool strided;
  };
  const Shape shapes[] = {{1, 1, 64, 0, false}, {5, 1, 16, 0, false},  {3, 3, 12, 0, false},
                          {2, 1, 7, 8, true},   {16, 1, 64, 8, false}, {4, 2, 16, 0, true}};
  std::vector<DcpCase> cases;
  int k = 0;
  for (DcpMergeMode mode : {DcpMergeMode::kAllToAll, DcpMergeMode::kAllGatherReduceScatter}) {
    for (const Shape& s : shapes) {
      DcpCase c;
      c.local_heads = 1;
      c.q_len = s.q_len;
      c.interleave = s.interleave;
      c.block_size = s.block;
      c.pad = s.pad;
      c.strided_io = s.strided;
      for (int32_t L : {0, s.q_len, W * s.interleave + 1, 300})
        if (L == 0 || L >= s.q_len) c.seq_lens.push_back(L);
      c.mode = mode;
      c.kv_dtype = k % 3 == 2 ? DType::kFP8E4M3 : DType::kBF16;
      c.kv_scale = c.kv_dtype == DType::kFP8E4M3 ? 0.5f : 1.0f;
      c.out_dtype = k % 2 ? DType::kFP32 : DType::kBF16;
      c.lse_base = k % 4 == 3 ? LseBase::k2 : LseBase::kE;
      c.seed = 7000 + uint64_t(W) * 100 + uint64_t(k++);
      cases.push_back(c);
    }
    DcpCase empty;  // every sequence empty: out 0, lse -inf everywhere
    empty.local_heads = 1;
    empty.q_len = 2;
    empty.block_size = 16;
    empty.seq_lens = {0, 0, 0};
    empty.mode = mode;
    empty.seed = 7000 + uint64_t(W) * 100 + uint64_t(k++);
    cases.push_back(empty);
  }
  return cases;
}

// A host backend ("cpu") whose decode first applies the cuda kernels' layout rules.
class CudaLayoutCheckedBackend final : public Backend {
 public:
  CudaLayoutCheckedBackend() : inner_(make_backend("cpu")) {}
  const BackendCapabilities& capabilities() const override { return inner_->capabilities(); }
  size_t workspace_bytes(const MlaDecodeParams& p) const override { return inner_->workspace_bytes(p); }
  Status decode(const MlaDecodeParams& p, const ExecContext& ctx) override {
    if (p.num_seqs > 0) MLADCP_RETURN_IF_ERROR(check_cuda_decode_layout(with_default_strides(p)));
    return inner_->decode(p, ctx);
  }
  Status merge(const MergeParams& p, const ExecContext& ctx) override { return inner_->merge(p, ctx); }
  Status rescale(const RescaleParams& p, const ExecContext& ctx) override { return inner_->rescale(p, ctx); }

 private:
  std::unique_ptr<Backend> inner_;
};

class DcpCudaLayout : public ::testing::TestWithParam<int> {};

TEST_P(DcpCudaLayout, EveryShapeHasALayoutTheKernelsAccept) {
  const int W = GetParam();
  for (DcpCase c : grid(W)) {
    c.backend = "cpu";
    c.step_backend = [] { return std::unique_ptr<Backend>(new CudaLayoutCheckedBackend()); };
    run_ranks(W, Device::kHost, [&](Communicator& comm) { EXPECT_TRUE(dcp_matches_single_rank(comm, c)); });
  }
}

class DcpCudaGrid : public ::testing::TestWithParam<int> {};

TEST_P(DcpCudaGrid, MatchesSingleGpuDecode) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible (cuda_device_count() == 0): GPU test skipped";
  const int W = GetParam();
  for (DcpCase c : grid(W)) {
    c.backend = "cuda";
    run_ranks(W, Device::kCuda, [&](Communicator& comm) { EXPECT_TRUE(dcp_matches_single_rank(comm, c)); });
  }
}

auto world_name = [](const auto& info) { return "W" + std::to_string(info.param); };
INSTANTIATE_TEST_SUITE_P(Worlds, DcpCudaLayout, ::testing::Range(1, 9), world_name);
INSTANTIATE_TEST_SUITE_P(Worlds, DcpCudaGrid, ::testing::Range(1, 9), world_name);

}  // namespace
}  // namespace mladcp::test
