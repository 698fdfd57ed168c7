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
  kStart,       // CTA start (thread 0)
  kSetup,       // barriers initialised, the first piece found
  kPieceStart,  // the consumers start their first piece (its queries loaded, or being copied)
  kScoresWg0,   // warpgroup 0's first scores retired
  kScoresWg1,   // warpgroup 1's first scores retired
  kLoopWg0,     // warpgroup 0's last pair done (of the last piece)
  kLoopWg1,     // warpgroup 1's last pair done
  kRowSums,     // row sums exchanged (the epilogue starts)
  kWrittenWg0,  // warpgroup 0's output or partial state written (last piece)
  kWrittenWg1,  // warpgroup 1's
  kCopyPiece,   // the copying thread (stage 0's) has its first piece
  kCopyPages,   // and the block ids of its first pair
  kFirstCopy,   // the copying thread's first tile pair issued
  kLastCopy,    // its last
  // a CTA's second piece of work (balanced schedule): how long the hand-over from one sequence to the next takes
  kWrittenFirst,  // warpgroup 0's output or partial state of the first piece written
  kPiece2,        // the consumers start the second piece
  kScores2,       // warpgroup 0's first scores of the second piece retired
  kCopyPiece2,    // the copying thread (stage 0's) has its second piece
  kFirstCopy2,    // and has issued its first tile pair
  kQueries2,      // the query copier has issued the second piece's query blocks (q_s released)
  kMergeStart,    // fused merge: thread 0 starts the CTA's first merge (after its last segment)
  kMergeEnd,      // and has written its rows of the last one
  kMergeGo,       // fused merge: the copying thread has the jobs
  kMergeWeights,  // consumer thread 0 has its rows' weights
  kMergeFirst,    // and its first unit (8 rows of a state) landed
  kSm,            // the SM that ran the CTA (a value, not a time)
  kPieces,        // pieces of work of the CTA (a value)
  kPoints = 27,   // points per CTA in the buffer
};
constexpr int kCtas = 4096;

// The pair trace: SM clock (clock64, low 32 bits) at the steps of pairs kTraceFirst .. kTraceFirst + kTraceWindow - 1
// of tiles (numbered across the CTA's pieces) of the first kTraceCtas CTAs, to see which wait holds the steady
// state. The events are kept in shared memory (a global store before one of the kernel's proxy fences would make
// that fence wait for it) and written out at the end of the CTA.
enum PairEvent : int {
  // warpgroup 0 (thread 0): tiles a, output columns 0-255
  kA0Start,                    // pair start: S_a retired
  kA1MaPublished,              // m_a published
  kA2PvIssued,                 // P_a·V_a,L issued
  kA3MbReceived,               // m_b received
  kA4PaStored,                 // P_a stored for warpgroup 1
  kA5PvRetired,                // P_a·V_a,L retired
  kA6PbReceived,               // P_b received from warpgroup 1
  kA7Pv2Retired,               // P_b·V_b,L retired
  kA8Block0,                   // next S_a: the wait for column block c returned, c = 0..8 (kA8Block0 + c)
  kA17Scores = kA8Block0 + 9,  // next S_a retired
  // warpgroup 1 (thread 128): tiles b, output columns 256-511
  kB0Start,                    // pair start: S_b retired
  kB1MaReceived,               // m_a received
  kB2PvIssued,                 // P_b·V_b,R issued
  kB3PbStored,                 // P_b stored for warpgroup 0
  kB4PaReceived,               // P_a received
  kB5Pv2Issued,                // P_a·V_a,R issued
  kB6PvRetired,                // P_b·V_b,R retired
  kB7Pv2Retired,               // P_a·V_a,R retired
  kB8Block4,                   // next S_b: the wait for column block 4 + j (mod 9) returned, j = 0..8
  kB17Scores = kB8Block4 + 9,  // next S_b retired
  // the copying threads (stage 0's: a, stage 1's: b; fp8: one for both): the wait for a stage half's release returned
  kC0ReleasedA03,
  kC1ReleasedB48,
  kC2ReleasedA48,
  kC3ReleasedB03,
  kPairEvents,
};
// The traced window starts at pair MLADCP_SM90_TRACE_FIRST (counted across the CTA's segments).
#ifndef MLADCP_SM90_TRACE_FIRST
#define MLADCP_SM90_TRACE_FIRST 8
#endif
constexpr int kTraceCtas = 4, kTraceFirst = MLADCP_SM90_TRACE_FIRST, kTraceWindow = 4;
constexpr int kTraceBytes = kTraceWindow * kPairEvents * 4;  // the shared-memory window
constexpr const char* kEventNames[] = {
    "a.start", "a.ma", "a.pv", "a.mb",  "a.pa",      "a.pv_done",  "a.pb",  "a.pv2_done", "a.k0",    "a.k1",
    "a.k2",    "a.k3", "a.k4", "a.k5",  "a.k6",      "a.k7",       "a.k8",  "a.s_done",   "b.start", "b.ma",
    "b.pv",    "b.pb", "b.pa", "b.pv2", "b.pv_done", "b.pv2_done", "b.k4",  "b.k5",       "b.k6",    "b.k7",
    "b.k8",    "b.k0", "b.k1", "b.k2",  "b.k3",      "b.s_done",   "c.a03", "c.b48",      "c.a48",   "c.b03"};
static_assert(sizeof(kEventNames) / sizeof(kEventNames[0]) == kPairEvents, "an event name per event");
// Names of the time points kStart .. kSm - 1, as printed (kStart is printed as the CTAs' start range).
constexpr const char* kNames[] = {"start",    "setup",  "piece",    "scores0",    "scores1",   "loop0",    "loop1",
                                  "rowsum",   "out0",   "out1",     "copypiece",  "copypages", "copy0",    "copylast",
                                  "outfirst", "piece2", "scores2",  "copypiece2", "copy2",     "queries2", "merge0",
                                  "merge1",   "mgo",    "mweights", "mfirst"};
static_assert(sizeof(kNames) / sizeof(kNames[0]) == kSm, "a name per time point");

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
__device__ uint32_t g_trace[kTraceCtas][kTraceWindow][kPairEvents];
__device__ int g_chunk0_only;        // experiment: CTAs of row chunks past the first exit at once
__device__ int g_skip_empty_writes;  // experiment: a segment without keys writes no rows (timing only)
__device__ int g_chunk_major;  // experiment: a balanced plan's CTAs in chunk-major order (part + parts · row chunk)
// The window lies at byte `offset` of the dynamic shared memory.
__device__ __forceinline__ void trace(int offset, int64_t pair, int event) {
  extern __shared__ __align__(1024) uint8_t dynamic_smem[];
  if (blockIdx.x < kTraceCtas && pair >= kTraceFirst && pair < kTraceFirst + kTraceWindow)
    reinterpret_cast<uint32_t*>(dynamic_smem + offset)[(pair - kTraceFirst) * kPairEvents + event] =
        uint32_t(clock64());
}
// One thread: the window cleared (before the CTA's first barrier), or written out (once every event is in).
__device__ __forceinline__ void trace_clear(int offset) {
  extern __shared__ __align__(1024) uint8_t dynamic_smem[];
  for (int i = 0; i < kTraceWindow * kPairEvents; ++i) reinterpret_cast<uint32_t*>(dynamic_smem + offset)[i] = 0;
}
__device__ __forceinline__ void trace_flush(int offset) {
  extern __shared__ __align__(1024) uint8_t dynamic_smem[];
  if (blockIdx.x >= kTraceCtas) return;
  for (int i = 0; i < kTraceWindow * kPairEvents; ++i)
    (&g_trace[blockIdx.x][0][0])[i] = reinterpret_cast<const uint32_t*>(dynamic_smem + offset)[i];
}
}  // namespace mladcp::cuda_impl::sm90_timeline
// The _SET, _ADD and _TRACE arguments are not evaluated in other builds.
#define MLADCP_TIMELINE(point) sm90_timeline::set(sm90_timeline::point, sm90_timeline::now())
#define MLADCP_TIMELINE_SET(point, value) sm90_timeline::set(sm90_timeline::point, uint64_t(value))
#define MLADCP_TIMELINE_ADD(point, value) sm90_timeline::add(sm90_timeline::point, uint64_t(value))
#define MLADCP_TRACE(pair, event) sm90_timeline::trace(Smem::trace, pair, event)
#else
#define MLADCP_TIMELINE(point) ((void)0)
#define MLADCP_TIMELINE_SET(point, value) ((void)0)
#define MLADCP_TIMELINE_ADD(point, value) ((void)0)
#define MLADCP_TRACE(pair, event) ((void)0)
#endif
