// PTX wrappers shared by the Hopper (sm_90a) decode kernels: wgmma shared-memory descriptors of the
// 128-byte-swizzled tiles, wgmma fences and waits, proxy fences, named barriers, mbarriers, bulk copies, the
// base-2 exponential.
#pragma once

#include <cmath>
#include <cstdint>

namespace mladcp::cuda_impl::sm90 {

// One 64-dim column block of a 64-row swizzled tile: [64 rows][128 B].
inline constexpr int kSm90BlockBytes = 64 * 128;

// wgmma shared-memory descriptors, 128-byte swizzle, kept as their low word: the start address (bits 0-13,
// 16-byte units) and the leading byte offset (bits 16-29). The high word is the same for every operand here:
// stride byte offset 1024 (8-row groups) and the swizzle layout type. Offsets added to the low word never
// carry (shared-memory addresses < 256 KiB), so each operand of each wgmma costs one 32-bit add, in
// uniform registers when the base is warp-uniform.
constexpr uint32_t kDescHi = (1024 >> 4) | (1u << 30);
// K-major operand (64 contiguous k values per 128-byte row of a column block); the leading offset is unused.
__device__ __forceinline__ uint32_t kmajor_lo(uint32_t addr) { return ((addr & 0x3FFFF) >> 4) | (1u << 16); }
// N-major B operand (V: 64 contiguous output dims per column block, one key per 128-byte row): column blocks
// kSm90BlockBytes apart (leading offset).
__device__ __forceinline__ uint32_t nmajor_lo(uint32_t addr) {
  return ((addr & 0x3FFFF) >> 4) | (uint32_t(kSm90BlockBytes >> 4) << 16);
}
__device__ __forceinline__ uint64_t desc(uint32_t lo) { return (uint64_t(kDescHi) << 32) | lo; }

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void fence_regs(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_regs(uint32_t (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(d[i])::"memory");
}

__device__ __forceinline__ void named_bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// bar.sync that also ORs a predicate over the participating threads: every thread gets the same result.
__device__ __forceinline__ bool named_bar_sync_or(int id, int threads, bool pred) {
  uint32_t any;
  asm volatile("{\n.reg .pred p, q;\nsetp.ne.u32 p, %1, 0;\nbar.red.or.pred q, %2, %3, p;\nselp.u32 %0, 1, 0, q;\n}\n"
               : "=r"(any)
               : "r"(uint32_t(pred)), "r"(id), "r"(threads)
               : "memory");
  return any != 0;
}

// 2^x (MUFU.EX2; flushes subnormal results to zero, as probabilities below 2^-126 contribute nothing).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Two floats → f16x2 (round to nearest; lo in the low half).
__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
// Two bf16 (low half first) → two floats, exactly.
__device__ __forceinline__ float2 bf16x2_to_float2(uint32_t w) {
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}
// Four e4m3 values (low byte first) → four f16 (two words, low pair first), exactly, one instruction per two.
__device__ __forceinline__ uint2 e4m3x4_to_f16x4(uint32_t four) {
  uint2 r;
  asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %2;\ncvt.rn.f16x2.e4m3x2 %0, lo;\ncvt.rn.f16x2.e4m3x2 %1, hi;\n}\n"
      : "=r"(r.x), "=r"(r.y)
      : "r"(four));
  return r;
}

// mbarriers in shared memory (32-bit shared addresses); barrier i of an array of them.
__device__ __forceinline__ uint32_t bar_addr(uint32_t base, int i) { return base + uint32_t(8 * i); }
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
// Waits until the phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// `bytes` contiguous bytes of global memory (16-byte aligned, a multiple of 16) into shared memory, completing on
// `bar` (bulk asynchronous copy, with an L2 cache policy).
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar,
                                          uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar), "l"(policy)
      : "memory");
}
// `bytes` contiguous bytes of shared memory (16-byte aligned, a multiple of 16) out to global memory (bulk
// asynchronous copy, a bulk group of the issuing thread); the writes to shared memory it reads must be ordered
// before it by fence_proxy_async() in the writing threads and a barrier.
__device__ __forceinline__ void bulk_store(void* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(src), "r"(bytes)
               : "memory");
}
// Closes this thread's bulk stores issued so far into a group and waits until every group has read its source
// (shared memory may then be written again; the global writes complete on their own).
__device__ __forceinline__ void bulk_store_commit_and_wait_read() {
  asm volatile("cp.async.bulk.commit_group;\ncp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// An L2 policy that evicts first (each cache byte is read once per CTA).
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
// An L2 policy that evicts last (partial states: kept in L2 through the key stream until the combine kernel reads
// them, with loads that evict first).
__device__ __forceinline__ uint64_t evict_last_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ void store_evict_last(float2* dst, float2 v, uint64_t policy) {
  asm volatile("st.global.L2::cache_hint.v2.f32 [%0], {%1, %2}, %3;\n" ::"l"(dst), "f"(v.x), "f"(v.y), "l"(policy)
               : "memory");
}
__device__ __forceinline__ void store_evict_last(float4* dst, float4 v, uint64_t policy) {
  asm volatile("st.global.L2::cache_hint.v4.f32 [%0], {%1, %2, %3, %4}, %5;\n" ::"l"(dst), "f"(v.x), "f"(v.y), "f"(v.z),
               "f"(v.w), "l"(policy)
               : "memory");
}
__device__ __forceinline__ void store_evict_last(float* dst, float v, uint64_t policy) {
  asm volatile("st.global.L2::cache_hint.f32 [%0], %1, %2;\n" ::"l"(dst), "f"(v), "l"(policy) : "memory");
}

__device__ __forceinline__ float rescale_factor(float m_from, float m_to) {
  return m_from == -INFINITY ? 1.0f : fast_exp2(m_from - m_to);
}

// The lazy running maximum of both Hopper kernels: a row's maximum m (base-2 logits) is raised only for a score
// above it by more than kMaxSlack, so P = 2^(S·scale − m) ≤ 2^8 (in the range of f16 and bf16) and most tiles past a
// row's first keep m and need no rescale of O. m is −inf until the row sees a key.
constexpr float kMaxSlack = 8.0f;
__device__ __forceinline__ float raised_max(float m, float mx) { return mx > m + kMaxSlack ? fmaxf(m, mx) : m; }

}  // namespace mladcp::cuda_impl::sm90
