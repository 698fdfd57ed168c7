// Helpers shared by the GPU benchmarks: error checks, random fills (never zeros), the spin kernel
// that queues timed calls, the median.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/numeric.h"
#include "mladcp/status.h"

namespace {

#define CHECK_CUDA(call)                                                                         \
  do {                                                                                           \
    cudaError_t e_ = (call);                                                                     \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)
#define CHECK_OK(expr)                                                                           \
  do {                                                                                           \
    const mladcp::Status s_ = (expr);                                                            \
    if (!s_.ok()) {                                                                              \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, s_.to_string().c_str()); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

__device__ __forceinline__ uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
// About N(0, 1): a sum of four uniforms.
__device__ __forceinline__ float normalish(uint64_t seed, uint64_t i) {
  uint64_t h = mix(seed ^ mix(i));
  float s = 0.0f;
  for (int k = 0; k < 4; ++k) {
    s += float(h & 0xffff) / 65536.0f - 0.5f;
    h >>= 16;
  }
  return s * 1.7320508f;
}

__global__ void fill_bf16(uint16_t* p, size_t n, uint64_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = mladcp::numeric::float_to_bf16(scale * normalish(seed, i));
}
__global__ void fill_fp8(uint8_t* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = mladcp::numeric::float_to_fp8e4m3(8.0f * normalish(seed, i));
}
#if MLADCP_SM90_TIMELINE
__device__ unsigned long long g_spin_end;  // %globaltimer at the spin kernel's end: the timeline's origin
#endif
// Busy-waits for `cycles` SM clock cycles: the calls queued behind it start back to back.
__global__ void spin(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
#if MLADCP_SM90_TIMELINE
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  g_spin_end = t;
#endif
}

void fill_random_bf16(void* p, size_t n, uint64_t seed, float scale = 1.0f) {
  fill_bf16<<<1024, 256>>>(static_cast<uint16_t*>(p), n, seed, scale);
  CHECK_CUDA(cudaGetLastError());
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

}  // namespace
