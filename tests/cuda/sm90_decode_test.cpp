// Shapes that reach the Hopper decode kernel (64-row CTAs on a bf16 cache, compute capability 9.0)
// against the oracle, and its batch invariance. On other devices the same shapes run the portable
// kernel and the tests still hold. Every shape is also run with CudaBackendOptions::hopper_kernel = false
// (portable kernel on Hopper), so both kernels are checked on one device.
#include "cuda/sm90_decode.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_test_util.h"
#include "cuda/f16_scaling.h"
#include "cuda/sm90_fp8_fragments.h"
#include "cuda/sm90_fp8_ring_layout.h"

namespace mladcp::test {
namespace {

bool device_is_sm90() {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  return major == 9 && minor == 0;
}

// A "cuda" backend; portable = true keeps the portable kernel on Hopper; fused: the Hopper kernel's fused merge.
std::unique_ptr<Backend> cuda_backend(bool portable, bool fused = false) {
  CudaBackendOptions o;
  o.hopper_kernel = !portable;
  o.fused_merge = fused;
  return make_cuda_backend(o);
}

// fp32 out with a natural LSE and bf16 out with a base-2 LSE, against the oracle.
::testing::AssertionResult matches_oracle(Backend& cuda, const synthetic::Problem& prob, const std::string& kernel) {
  const DecodeBuffers want = expected_decode(prob, LseBase::kE);
  const DeviceProblem dev(prob);
  for (const DType out_dtype : {DType::kFP32, DType::kBF16}) {
    const LseBase base = out_dtype == DType::kFP32 ? LseBase::kE : LseBase::k2;
    ::testing::AssertionResult r =
        device_decode_matches(cuda, prob, dev, want, out_dtype, base,
                              kernel + " kernel, " + describe(prob.config) + " out=" + dtype_name(out_dtype));
    if (!r) return r;
  }
  return ::testing::AssertionSuccess();
}
::testing::AssertionResult matches_oracle(Backend& cuda, const synthetic::Config& cfg, const std::string& kernel) {
  return matches_oracle(cuda, make_problem(cfg), kernel);
}

std::vector<synthetic::Config> hopper_shapes() {
  return {
      config(64, 1, 1, {0, 1, 63, 64, 65, 333}, 201),                      // block size 1: portable fallback
      config(64, 1, 48, {47, 48, 49, 700}, 202),                           // block size 48: portable fallback
      config(16, 1, 64, {4097, 0, 130, 1}, 210),                           // 16 rows: the Hopper kernel
      config(8, 1, 64, {4097, 0, 130, 1}, 221),                            // 8 rows: the portable kernel
      config(16, 4, 64, {4, 200, 2049, 0}, 211),                           // 16 heads × q_len 4 = 64 rows packed
      config(128, 2, 64, {2, 700, 4100}, 212),                             // q_len 2: four row chunks
      config(24, 3, 64, {3, 65, 1000}, 213),                               // 72 rows: two chunks, 8 in the second
      config(64, 1, 32, {31, 32, 33, 2100}, 214),                          // pages of 32 keys: two copies per tile
      config(32, 1, 16, {15, 17, 2049}, 215),                              // pages of 16 keys: four copies per tile
      config(64, 1, 128, {127, 129, 4300}, 216),                           // pages of 128 keys: half a page per tile
      config(128, 1, 64, {5000}, 217),                                     // one sequence, three splits
      config(128, 1, 64, {1, 64, 65, 640, 0, 2047, 2048, 2049}, 218),      // eight sequences, one empty
      config(64, 1, 64, {0, 1, 0}, 219),                                   // empty sequences around a one-key one
      config(128, 1, 64, {5000, 33, 777}, 220, DType::kBF16, {4, 2, 16}),  // DCP rank 2 of 4, interleave 16
      config(80, 1, 64, {5, 130, 1000}, 203),                              // two row chunks, the second 16 rows
      config(4, 16, 64, {16, 17, 80, 600}, 204),                           // 64 rows = 16 tokens × 4 heads (causal)
      config(128, 1, 64, {4096, 4097, 8200, 1, 0}, 205),                   // split boundaries, 1-3 splits, empty
      config(64, 2, 32, {3, 300, 5000}, 206, DType::kBF16, {2, 1, 1}),     // DCP rank 1 of 2, interleave 1
      config(32, 4, 64, {4, 200, 4500}, 207, DType::kBF16, {4, 3, 64}),    // DCP rank 3 of 4, interleave 64
      config(64, 3, 16, {0, 3, 4, 130}, 208, DType::kBF16, {4, 0, 2}),     // rows whose local keys are all masked
      config(128, 1, 64, {128, 192, 2048, 2111}, 209),  // whole tile pairs, an odd last split of one tile
  };
}

// Which pages the Hopper kernel's copies take; every other size runs the portable kernel (the shapes
// above with pages of 1 and 48 keys check that fallback against the oracle).
TEST(Sm90Decode, PageSizesOfTheFastPath) {
  for (int bs : {16, 32, 64, 128, 256, 1024}) EXPECT_TRUE(cuda_impl::sm90_decode_block_size_ok(bs)) << bs;
  for (int bs : {1, 2, 7, 8, 24, 48, 96, 100}) EXPECT_FALSE(cuda_impl::sm90_decode_block_size_ok(bs)) << bs;
}

TEST(Sm90Decode, MatchesReference) {
  MLADCP_SKIP_WITHOUT_GPU();
  std::printf("device %s the Hopper decode kernel\n", device_is_sm90() ? "runs" : "does not run");
  auto hopper = cuda_backend(false);
  for (const synthetic::Config& cfg : hopper_shapes()) EXPECT_TRUE(matches_oracle(*hopper, cfg, "default"));
}

TEST(Sm90Decode, PortableKernelOnTheSameShapes) {
  MLADCP_SKIP_WITHOUT_GPU();
  auto portable = cuda_backend(true);
  for (const synthetic::Config& cfg : hopper_shapes()) EXPECT_TRUE(matches_oracle(*portable, cfg, "portable"));
}

// Sequences of at most 16 query rows on the Hopper kernel (CudaBackendOptions::portable_max_rows_on_hopper = 0;
// by default at most 8 rows keep the portable 16-row kernel): 1-16 rows in a 64-row CTA, the rest empty.
TEST(Sm90Decode, FewRowsOnTheHopperKernel) {
  MLADCP_SKIP_WITHOUT_GPU();
  CudaBackendOptions o;
  o.portable_max_rows_on_hopper = 0;
  auto all = make_cuda_backend(o);
  for (const synthetic::Config& cfg : {
           config(16, 1, 64, {4097, 0, 130, 1, 2049}, 230),                    // 16 heads: DeepSeek-V3 at TP 8
           config(8, 2, 64, {2, 700, 4100}, 231),                              // 16 rows of two tokens (causal)
           config(8, 1, 32, {31, 33, 2100}, 232),                              // 8 rows, pages of 32 keys
           config(1, 1, 16, {0, 17, 900}, 233),                                // one row, pages of 16 keys
           config(16, 1, 64, {5000, 33, 777}, 234, DType::kBF16, {4, 2, 16}),  // DCP rank 2 of 4, interleave 16
       })
    EXPECT_TRUE(matches_oracle(*all, cfg, "hopper (all rows)"));
}

// fp8-e4m3 caches with at most 32 query rows per sequence reach the Hopper fp8 kernel (16 or 32 rows per CTA,
// any page size); the same shapes on the portable kernel, and 64-128 heads forced onto the fp8 kernel in row
// chunks of 32 (CudaBackendOptions::hopper_fp8_max_rows).
std::vector<synthetic::Config> fp8_shapes() {
  const DType f8 = DType::kFP8E4M3;
  return {
      config(16, 1, 64, {4097, 0, 130, 1, 2049}, 240, f8),                // 16 heads: DeepSeek-V3 at TP 8
      config(16, 2, 64, {2, 700, 4100}, 241, f8),                         // 32 rows of two tokens (causal)
      config(8, 4, 32, {4, 33, 2100}, 242, f8),                           // q_len 4, pages of 32 keys
      config(1, 1, 16, {0, 17, 900}, 243, f8),                            // one row, pages of 16 keys
      config(24, 1, 1, {1, 63, 64, 65, 333}, 244, f8),                    // pages of 1 key, 24 rows
      config(16, 1, 48, {47, 48, 49, 700}, 245, f8),                      // pages of 48 keys
      config(32, 1, 128, {127, 129, 4300}, 246, f8),                      // pages of 128 keys, 32 rows
      config(16, 1, 64, {9000}, 247, f8),                                 // one sequence, five splits
      config(16, 1, 64, {1, 64, 65, 640, 0, 2047, 2048, 2049}, 248, f8),  // eight sequences, one empty
      config(16, 1, 64, {5000, 33, 777}, 249, f8, {4, 2, 16}),            // DCP rank 2 of 4, interleave 16
      config(16, 2, 32, {3, 300, 5000}, 250, f8, {2, 1, 1}),              // DCP rank 1 of 2, interleave 1
      config(8, 4, 64, {4, 200, 4500}, 251, f8, {4, 3, 64}),              // DCP rank 3 of 4, interleave 64
      config(16, 3, 16, {0, 3, 4, 130}, 252, f8, {4, 0, 2}),              // rows whose local keys are all masked
      config(16, 1, 64, {128, 192, 2048, 2111}, 253, f8, {}, 3.0f),       // whole tiles, another scale
  };
}

TEST(Sm90Fp8Decode, MatchesReference) {
  MLADCP_SKIP_WITHOUT_GPU();
  auto hopper = cuda_backend(false);
  for (const synthetic::Config& cfg : fp8_shapes()) EXPECT_TRUE(matches_oracle(*hopper, cfg, "hopper fp8"));
}

// The same shapes under the balanced schedule, forced (kFillDevice takes it on its own only for batches that would
// run several waves of splits): a part's pieces one sequence after another in one persistent CTA, with the ring, the P
// buffers and the row sums handed on from piece to piece, and sequences cut across parts into partial states.
TEST(Sm90Fp8Decode, BalancedSchedule) {
  MLADCP_SKIP_WITHOUT_GPU();
  CudaBackendOptions o;
  o.fill_schedule = cuda_plan::Schedule::kBalanced;
  auto balanced = make_cuda_backend(o);
  for (const synthetic::Config& cfg : fp8_shapes())
    EXPECT_TRUE(matches_oracle(*balanced, cfg, "hopper fp8 (balanced)"));
}

TEST(Sm90Fp8Decode, PortableKernelOnTheSameShapes) {
  MLADCP_SKIP_WITHOUT_GPU();
  auto portable = cuda_backend(true);
  for (const synthetic::Config& cfg : fp8_shapes()) EXPECT_TRUE(matches_oracle(*portable, cfg, "portable fp8"));
}

TEST(Sm90Fp8Decode, ManyRowsInChunksOf32) {
  MLADCP_SKIP_WITHOUT_GPU();
  CudaBackendOptions o;
  o.hopper_fp8_max_rows = 1 << 30;
  auto all = make_cuda_backend(o);
  const DType f8 = DType::kFP8E4M3;
  for (const synthetic::Config& cfg : {
           config(128, 1, 64, {4097, 0, 130}, 260, f8),        // 128 heads: four chunks
           config(64, 2, 32, {2, 700, 2100}, 261, f8),         // 128 rows of two tokens
           config(40, 1, 64, {65, 1000}, 262, f8, {2, 0, 1}),  // 40 rows: a chunk of 8, DCP rank 0 of 2
       })
    EXPECT_TRUE(matches_oracle(*all, cfg, "hopper fp8 (all rows)"));
}

// The in-place fp8 → f16 expansion of the Hopper kernel's ring, replayed on the host: the converting threads run
// unordered between the points where they meet, so every fp8 block must be read in an earlier such phase than any
// f16 write that covers its bytes, no write may leave the stage half, and every block is released once, after it
// is written. Fails if the layout or the meeting points change into a race.
TEST(Sm90Fp8Ring, InPlaceExpansionReadsEveryByteBeforeItIsOverwritten) {
  namespace r = cuda_impl::sm90_fp8_ring;
  for (const int first : {0, 4}) {
    const int end = r::half_end(first);
    ASSERT_EQ(r::half_first(end - 1), first);
    // Phase of each step: the number of meetings before it. Block c's fp8 bytes are read in step c - 1 (the first
    // block's before the first step, phase 0), its f16 bytes written in step c.
    std::vector<int> phase(end + 1, 0);
    for (int c = first; c < end; ++c) phase[c + 1] = phase[c] + (r::convert_sync_after(c) ? 1 : 0);
    auto read_phase = [&](int j) { return j == first ? 0 : phase[j - 1]; };
    const int lo = first * r::kF16BlockBytes, hi = end * r::kF16BlockBytes;  // the half's bytes
    for (int j = first; j < end; ++j) {
      const int s0 = int(r::fp8_block_offset(j)), s1 = s0 + r::kF8BlockBytes;
      EXPECT_GE(s0, lo) << "fp8 block " << j;
      EXPECT_LE(s1, hi) << "fp8 block " << j;
      for (int c = first; c < end; ++c) {
        const int d0 = c * r::kF16BlockBytes, d1 = d0 + r::kF16BlockBytes;
        if (d0 < s1 && s0 < d1)
          EXPECT_LT(read_phase(j), phase[c]) << "f16 block " << c << " overwrites fp8 block " << j << " while read";
      }
      for (int j2 = first; j2 < j; ++j2)
        EXPECT_LE(int(r::fp8_block_offset(j2)) + r::kF8BlockBytes, s0) << "fp8 blocks " << j2 << ", " << j;
    }
    EXPECT_TRUE(r::convert_sync_after(end - 1)) << "the half's last block must be released";
  }
}

// The fp8 kernel's fragment maps, replayed on the host: the query rows and P are stored in the order the K and Vᵀ
// fragments take their dims and keys (so the products are those of the natural order), each thread's 16-byte reads
// hold exactly its fragments' bytes, and the reads' bank conflicts are as documented (K none, Vᵀ two-way). Fails if
// either side of a map changes alone.
TEST(Sm90Fp8Fragments, StoredOrdersMatchTheFragmentsAndReadsHitTheirBytes) {
  namespace f = cuda_impl::sm90_fp8_fragments;
  std::vector<int> seen_q(64, 0), seen_p(64, 0);
  for (int j = 0; j < 4; ++j)
    for (int n = 0; n < 16; ++n) {
      const int l = f::k_fragment_dim(j, n);
      ASSERT_TRUE(l >= 0 && l < 64) << j << " " << n;
      EXPECT_EQ(f::query_position(l), 16 * j + n) << "k-step " << j << " column " << n;
      ++seen_q[f::query_position(l)];
      for (int s = 0; s < 4; ++s) EXPECT_EQ(f::p_position(16 * s + f::v_fragment_key(n)), 16 * s + n) << s << " " << n;
    }
  for (int u = 0; u < 64; ++u) ++seen_p[f::p_position(u)];
  for (int i = 0; i < 64; ++i) EXPECT_TRUE(seen_q[i] == 1 && seen_p[i] == 1) << "position " << i;
  for (int u = 0; u < 16; ++u)
    for (int h = 0; h < 2; ++h) EXPECT_EQ(f::query_pair_position(u, h) + 1, f::query_position(4 * u + 2 * h + 1));

  // Fragment columns of lane q in a k-step (a0/a1: 2q, 2q + 1; a2/a3: 2q + 8, 2q + 9), by byte of a 4-byte group.
  auto column = [](int q, int b) { return 2 * q + (b & 1) + 8 * (b >> 1); };
  // Bank groups (16-byte slots of a 128-byte line) of one read instruction's quarter warps: the largest number of
  // lanes of a quarter warp on one slot at different addresses (1: conflict-free).
  auto worst_conflict = [](const std::vector<uint32_t>& addr) {
    int worst = 1;
    for (int q0 = 0; q0 < 32; q0 += 8)
      for (int a = q0; a < q0 + 8; ++a) {
        int same = 0;
        for (int b = q0; b < q0 + 8; ++b) same += (addr[b] / 16) % 8 == (addr[a] / 16) % 8 && addr[b] != addr[a];
        worst = std::max(worst, same + 1);
      }
    return worst;
  };
  for (int w = 0; w < 4; ++w) {
    for (int c = 0; c < 9; ++c)
      for (int h = 0; h < 2; ++h) {
        std::vector<uint32_t> addr(32);
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane >> 2, q = lane & 3;
          const uint32_t off = f::k_read_offset(w, g, q, h, c);
          addr[lane] = off;
          ASSERT_EQ(int(off / f::kKeyBytes), 16 * w + g + 8 * h) << "the key of fragment row " << g + 8 * h;
          for (int j = 0; j < 4; ++j)
            for (int b = 0; b < 4; ++b)  // byte 4j + b of the read is column column(q, b) of k-step 4c + j
              EXPECT_EQ(int(off % f::kKeyBytes) + 4 * j + b, 64 * c + f::k_fragment_dim(j, column(q, b)))
                  << "warp " << w << " lane " << lane << " block " << c;
        }
        EXPECT_EQ(worst_conflict(addr), 1) << "K reads, warp " << w << " block " << c;
      }
    for (int s = 0; s < 4; ++s)
      for (int kk = 0; kk < 4; ++kk) {
        std::vector<uint32_t> addr(32);
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane >> 2, q = lane & 3;
          const uint32_t off = f::v_read_offset(w, g, q, s, kk);
          addr[lane] = off;
          // The kk-th key of lane q is fragment column column(q, kk): registers a0 (keys of columns 2q, 2q + 1) and
          // a2 (2q + 8, 2q + 9) pair keys kk = 0, 1 and 2, 3.
          EXPECT_EQ(int(off / f::kKeyBytes), 16 * s + f::v_fragment_key(column(q, kk))) << w << " " << lane;
          EXPECT_EQ(int(off % f::kKeyBytes), 16 * (8 * w + g)) << "dims of rows " << g << ", " << g + 8;
        }
        EXPECT_LE(worst_conflict(addr), 2) << "Vᵀ reads, warp " << w << " key step " << s;
      }
  }
}

// The ring's bookkeeping: tile t in stage t % 5 with phase parity (t / 5) % 2, for the copier and both warpgroups.
TEST(Sm90Fp8Fragments, RingSlotCyclesTheStagesAndFlipsThePhase) {
  cuda_impl::sm90_fp8_fragments::RingSlot<5> slot;
  for (int t = 0; t < 23; ++t, slot.next()) {
    EXPECT_EQ(slot.st, t % 5) << "tile " << t;
    EXPECT_EQ(slot.phase, uint32_t((t / 5) % 2)) << "tile " << t;
  }
}

// The power of two that scales a query row into f16 on both Hopper kernels (fp8 caches): the row maximum lands in
// [2^14, 2^15) wherever 2^e stays a normal float, never past f16's largest value, and 2^e, 2^-e are normal.
TEST(Sm90Fp8Ring, QueryRowExponentKeepsEveryRowInF16) {
  std::vector<float> maxima = {1.0f,
                               0.75f,
                               3.0f,
                               1e-3f,
                               65504.0f,
                               1e10f,
                               3.0e38f,
                               3.3895e38f,
                               std::numeric_limits<float>::max(),
                               std::ldexp(1.0f, 125),
                               std::ldexp(1.0f, -100),
                               std::ldexp(1.0f, -111),
                               std::ldexp(1.0f, -112),
                               std::numeric_limits<float>::min(),
                               std::numeric_limits<float>::denorm_min()};
  for (int k = -140; k <= 127; k += 3) maxima.push_back(std::ldexp(1.37f, k));
  for (const float mx : maxima) {
    const int e = cuda_impl::f16_row_exponent(mx);
    EXPECT_TRUE(std::isnormal(std::ldexp(1.0f, e)) && std::isnormal(std::ldexp(1.0f, -e))) << mx << " e " << e;
    const double scaled = double(mx) * std::ldexp(1.0, e);
    EXPECT_LE(scaled, 65504.0) << mx << " e " << e;  // f16's largest value
    if (mx >= std::ldexp(1.0f, -111)) {
      EXPECT_GE(scaled, 16384.0) << mx << " e " << e;
      EXPECT_LT(scaled, 32768.0) << mx << " e " << e;
    }
  }
  for (const float mx : {0.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()})
    EXPECT_EQ(cuda_impl::f16_row_exponent(mx), 0) << mx;
}

// fp8-e4m3 caches with more than 32 query rows per sequence run the Hopper 64-row kernel (its producer converts
// the fp8 tiles in the ring) on pages of 16, 32 or a multiple of 64 keys: every shape of the bf16 list above on an
// fp8 cache (fewer rows go to the fp8 kernel, pages of 1 and 48 keys to the portable kernel), under both schedules.
TEST(Sm90Fp8Decode, ManyRowsOnTheHopperKernel) {
  MLADCP_SKIP_WITHOUT_GPU();
  std::vector<synthetic::Config> shapes = hopper_shapes();
  for (synthetic::Config& cfg : shapes) {
    cfg.kv_dtype = DType::kFP8E4M3;
    cfg.kv_scale = 0.75f;
    cfg.seed += 1000;
  }
  for (const cuda_plan::Schedule schedule : {cuda_plan::Schedule::kSplits, cuda_plan::Schedule::kBalanced}) {
    CudaBackendOptions o;
    o.fill_schedule = schedule;
    auto cuda = make_cuda_backend(o);
    const std::string name = schedule == cuda_plan::Schedule::kBalanced ? "hopper fp8 (balanced)" : "hopper fp8";
    for (const synthetic::Config& cfg : shapes) EXPECT_TRUE(matches_oracle(*cuda, cfg, name));
  }
}

// The cache row (576 values) of key `pos` of sequence `seq`, in the cache's dtype (world-1 problems).
uint8_t* key_row(synthetic::Problem& prob, int seq, int pos) {
  const int bs = prob.config.block_size;
  const int32_t block = prob.block_table[size_t(seq) * size_t(prob.max_blocks_per_seq) + size_t(pos / bs)];
  const size_t row = size_t(block) * size_t(bs) + size_t(pos % bs);
  return prob.kv_cache.data() + row * kQkDim * dtype_size(prob.config.kv_dtype);
}

// Multiplies key `pos` of every sequence that has it by `factor` (values re-rounded to the cache's dtype).
void scale_key(synthetic::Problem& prob, int pos, float factor) {
  for (int seq = 0; seq < prob.config.num_seqs; ++seq) {
    if (pos >= prob.seq_lens[size_t(seq)]) continue;
    uint8_t* row = key_row(prob, seq, pos);
    const DType t = prob.config.kv_dtype;
    for (int d = 0; d < kQkDim; ++d) numeric::store_from_float(row, t, d, numeric::load_as_float(row, t, d) * factor);
  }
}

// Whether some query row meets, past its first tile of 64 keys, a key whose base-2 logit exceeds every earlier
// key's by more than 8: the case in which the Hopper kernels raise a row's running maximum mid-sequence (otherwise
// they keep it and take P up to 2^8). Keys visible to every token of the sequence only.
bool raises_a_running_maximum(synthetic::Problem& prob) {
  const synthetic::Config& c = prob.config;
  const float scale = c.softmax_scale * lse::kLog2e * (c.kv_dtype == DType::kFP8E4M3 ? c.kv_scale : 1.0f);
  for (int seq = 0; seq < c.num_seqs; ++seq) {
    const int keys = prob.seq_lens[size_t(seq)] - c.q_len + 1;
    for (int row = 0; row < c.q_len * c.num_heads; ++row) {
      const uint16_t* q = prob.q.data() + (size_t(seq) * size_t(c.q_len * c.num_heads) + size_t(row)) * kQkDim;
      float m = -std::numeric_limits<float>::infinity();
      for (int pos = 0; pos < keys; ++pos) {
        const uint8_t* k = key_row(prob, seq, pos);
        double dot = 0.0;
        for (int d = 0; d < kQkDim; ++d)
          dot += double(numeric::bf16_to_float(q[d])) * double(numeric::load_as_float(k, c.kv_dtype, d));
        const float logit = float(dot) * scale;
        if (pos >= 64 && logit > m + 8.0f) return true;
        m = std::max(m, logit);
      }
    }
  }
  return false;
}

// Keys scaled up 3-8× at tiles 3, 9, 20 and 33 make rows' running maxima jump by more than 8 (base 2) after their
// first tile: the rare path of the kernels' lazy maximum (cross-warp maxima, O rescaled while the products of the
// previous tile may be in flight), on the 64-row kernel (bf16, fp8 at 64 heads) and the fp8 kernel (16 and 32 rows).
TEST(Sm90Decode, RunningMaximumRaisedMidSequence) {
  const DType f8 = DType::kFP8E4M3;
  std::vector<synthetic::Problem> problems;
  for (const synthetic::Config& cfg : {
           config(16, 1, 64, {3000, 2500, 700}, 270),      // bf16, 16 rows: the 64-row kernel
           config(64, 1, 32, {2200, 1400}, 271),           // bf16, 64 rows, pages of 32 keys
           config(16, 1, 64, {3000, 2500, 700}, 272, f8),  // fp8, 16 rows: the fp8 kernel
           config(16, 2, 16, {2200, 1400}, 273, f8),       // fp8, 32 rows (two tokens, causal), pages of 16 keys
           config(64, 1, 64, {2200, 900}, 274, f8),        // fp8, 64 rows: the 64-row kernel converting its ring
       }) {
    synthetic::Problem prob = make_problem(cfg);
    const int positions[] = {64 * 3 + 5, 64 * 9 + 40, 64 * 20 + 63, 64 * 33 + 1};
    const float factors[] = {3.0f, 4.5f, 6.0f, 8.0f};
    for (int i = 0; i < 4; ++i) scale_key(prob, positions[i], factors[i]);
    ASSERT_TRUE(raises_a_running_maximum(prob)) << describe(cfg) << ": the inputs do not test what they should";
    problems.push_back(std::move(prob));
  }
  MLADCP_SKIP_WITHOUT_GPU();
  auto hopper = cuda_backend(false);
  for (const synthetic::Problem& prob : problems) EXPECT_TRUE(matches_oracle(*hopper, prob, "default"));
}

// Query rows at a padded head stride in one group (q_stride_token = H · q_stride_head): the layout the producer copies
// as one matrix, which must read none of the padding (NaN); 16 rows (a box of 16) and 128 (two chunks), bf16 output
// (staged) and the LSE, under both schedules of the kernel (the balanced one copies a part's next queries behind its
// current sequence).
TEST(Sm90Decode, CopiedQueriesWithPaddedRows) {
  MLADCP_SKIP_WITHOUT_GPU();
  for (const int H : {16, 128}) {
    const synthetic::Problem prob = make_problem(config(H, 1, 64, {0, 700, 2100, 5, 64}, uint64_t(230 + H)));
    const DecodeBuffers want = expected_decode(prob, LseBase::kE);
    const std::vector<float> want_out = want.out_float();
    const int64_t T = prob.num_tokens(), qsh = kQkDim + 64;
    std::vector<uint16_t> padded(size_t(T * H * qsh), 0x7fc0);  // NaN padding: must never be read
    for (int64_t r = 0; r < T * H; ++r) std::copy_n(&prob.q[size_t(r * kQkDim)], kQkDim, &padded[size_t(r * qsh)]);
    const DeviceProblem dev(prob);
    const DeviceBuffer q_dev = to_device(padded);
    for (const cuda_plan::Schedule schedule : {cuda_plan::Schedule::kSplits, cuda_plan::Schedule::kBalanced}) {
      CudaBackendOptions o;
      o.fill_schedule = schedule;
      auto cuda = make_cuda_backend(o);
      GuardedBuffer out(DType::kBF16, size_t(T * H * kLatentDim)), lse(DType::kFP32, size_t(T * H));
      MlaDecodeParams p = dev.params(prob, out.data(), DType::kBF16, lse.as<float>(), LseBase::kE);
      p.q = q_dev.data();
      p.q_stride_head = qsh;
      p.q_stride_token = H * qsh;
      p.split_policy = SplitPolicy::kFillDevice;
      MLADCP_ASSERT_OK(run_device_decode(*cuda, p));
      const std::string what = describe(prob.config) + (schedule == cuda_plan::Schedule::kBalanced ? ", balanced" : "");
      ::testing::AssertionResult ok = ::testing::AssertionSuccess();
      const std::vector<float> got = out.download_float(&ok);
      ASSERT_TRUE(ok) << ok.message();
      const Comparison c = compare(got, want_out, cuda_decode_tolerance(), "out", want.out_dims());
      EXPECT_TRUE(c.ok) << what << "\n  " << c.report;
      const std::vector<float> got_lse = lse.download_float(&ok);
      ASSERT_TRUE(ok) << ok.message();
      const Comparison l = compare(got_lse, *want.lse, lse_tolerance(), "lse", want.lse_dims());
      EXPECT_TRUE(l.ok) << what << "\n  " << l.report;
    }
  }
}

// A sequence's result does not depend on the rest of the batch nor on max_seq_len: bitwise.
TEST(Sm90Decode, BatchInvariantAndDeterministic) {
  MLADCP_SKIP_WITHOUT_GPU();
  const int H = 64, q_len = 2;
  // 17000 keys: nine splits, so the batch's combine runs its mode for rows of many states; sequences 0 and 2 alone
  // run the mode for few (the same bits, row by row), and with the fused merge sequence 2 alone (3 splits) is merged
  // in the split kernel (the same bits again).
  const synthetic::Problem prob = make_problem(config(H, q_len, 64, {1500, 37, 4200, 0, 17000}, 211));
  const DeviceProblem dev(prob);
  auto cuda = cuda_backend(false), fused = cuda_backend(false, true);
  const size_t T = size_t(prob.num_tokens());
  auto run = [&](Backend& be, const MlaDecodeParams& base, size_t tokens, std::vector<uint8_t>* out_bytes,
                 std::vector<uint8_t>* lse_bytes) {
    GuardedBuffer out(DType::kBF16, tokens * H * kLatentDim), lse(DType::kFP32, tokens * H);
    MlaDecodeParams p = base;
    p.out = out.data();
    p.lse = lse.as<float>();
    MLADCP_ASSERT_OK(run_device_decode(be, p));
    ASSERT_TRUE(out.download(out_bytes));
    ASSERT_TRUE(lse.download(lse_bytes));
  };
  MlaDecodeParams all = dev.params(prob, nullptr, DType::kBF16, nullptr, LseBase::kE);
  all.split_policy = SplitPolicy::kBatchInvariant;  // what this test checks
  std::vector<uint8_t> out_a, lse_a, out_b, lse_b;
  run(*cuda, all, T, &out_a, &lse_a);
  run(*cuda, all, T, &out_b, &lse_b);
  EXPECT_EQ(out_a, out_b) << "two identical calls gave different bits";
  EXPECT_EQ(lse_a, lse_b) << "two identical calls gave different bits";
  for (int seq : {0, 2, 4}) {
    MlaDecodeParams one = all;
    one.num_seqs = 1;
    one.q = static_cast<const uint16_t*>(all.q) + size_t(seq) * q_len * H * kQkDim;
    one.block_table = all.block_table + size_t(seq) * prob.max_blocks_per_seq;
    one.block_table_stride = prob.max_blocks_per_seq;
    one.seq_lens = all.seq_lens + seq;
    one.max_seq_len = std::max(1, prob.seq_lens[size_t(seq)]);
    const size_t ob = size_t(seq) * q_len * H * kLatentDim * 2, lb = size_t(seq) * q_len * H * 4;
    for (Backend* b : {cuda.get(), fused.get()}) {
      std::vector<uint8_t> out_1, lse_1;
      run(*b, one, q_len, &out_1, &lse_1);
      const char* how = b == fused.get() ? " (fused merge)" : "";
      EXPECT_TRUE(std::equal(out_1.begin(), out_1.end(), out_a.begin() + ptrdiff_t(ob)))
          << "sequence " << seq << " alone differs from the same sequence in the batch" << how;
      EXPECT_TRUE(std::equal(lse_1.begin(), lse_1.end(), lse_a.begin() + ptrdiff_t(lb)))
          << "sequence " << seq << " alone differs from the same sequence in the batch" << how;
    }
  }
}

}  // namespace
}  // namespace mladcp::test
