// A per-CTA timeline of the Hopper kernel and its combine, to see where a CTA's time goes (its start, the first
// scores, the loop, the epilogue) without a profiler: built only with MLADCP_SM90_TIMELINE=1 (the CMake option of the
// same name; in every other build the marks compile to nothing). Consumer threads 0 and 128 and the copying thread of
// the first kCtas CTAs record %globaltimer (ns, one clock for the whole device) at the points below; the combine
// kernel records its first start and its last end. `mladcp_peer_bench --timeline` prints them after one more call
// of each case, relative to the end of its spin kernel (`tools/gpu/run.sh timeline`). Included by
// sm90_decode_kernel.cu only (the device buffer lives in that translation unit).
#pragma once

#include <cstdint>

namespace mladcp::cuda_impl::sm90_timeline {

enum Point : int {
  kStart,        // CTA start (thread 0)
  kSetup,        // barriers initialised, the first piece found
  kPieceStart,   // the consumers start their first piece (its queries loaded, or being copied)
  kScoresWg0,    // warpgroup 0's first scores retired
  kScoresWg1,    // warpgroup 1's first scores retired
  kLoopWg0,      // warpgroup 0's last pair done (of the last piece)
  kLoopWg1,      // warpgroup 1's last pair done
  kRowSums,      // row sums exchanged (the epilogue starts)
  kWrittenWg0,   // warpgroup 0's output or partial state written (last piece)
  kWrittenWg1,   // warpgroup 1's
  kFirstCopy,    // the copying thread's first tile pair issued
  kLastCopy,     // its last
  kSm,           // the SM that ran the CTA (a value, not a time)
  kPieces,       // pieces of work of the CTA (a value)
  kPoints = 16,  // points per CTA in the buffer
};
constexpr int kCtas = 4096;
// Names of the time points kSetup .. kLastCopy, as printed.
constexpr const char* kNames[] = {"start", "setup",  "piece", "scores0", "scores1", "loop0",
                                  "loop1", "rowsum", "out0",  "out1",    "copy0",   "copylast"};

}  // namespace mladcp::cuda_impl::sm90_timeline

#if MLADCP_SM90_TIMELINE
namespace mladcp::cuda_impl::sm90_timeline {
__device__ uint64_t g_points[kCtas][kPoints];
__device__ __forceinline__ uint64_t now() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ uint32_t smid() {
  uint32_t sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  return sm;
}
__device__ __forceinline__ void set(Point p, uint64_t v) {
  if (blockIdx.x < kCtas) g_points[blockIdx.x][p] = v;
}
__device__ __forceinline__ void add(Point p, uint64_t v) {
  if (blockIdx.x < kCtas) g_points[blockIdx.x][p] += v;
}
}  // namespace mladcp::cuda_impl::sm90_timeline
// The _SET and _ADD values are not evaluated in other builds.
#define MLADCP_TIMELINE(point) sm90_timeline::set(sm90_timeline::point, sm90_timeline::now())
#define MLADCP_TIMELINE_SET(point, value) sm90_timeline::set(sm90_timeline::point, uint64_t(value))
#define MLADCP_TIMELINE_ADD(point, value) sm90_timeline::add(sm90_timeline::point, uint64_t(value))
#else
#define MLADCP_TIMELINE(point) ((void)0)
#define MLADCP_TIMELINE_SET(point, value) ((void)0)
#define MLADCP_TIMELINE_ADD(point, value) ((void)0)
#endif
