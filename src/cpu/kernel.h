// The host decode kernel's unit of work and its ISA variants.
//
// A chunk is (sequence, a contiguous range of query rows, a contiguous range of local keys). Rows of
// a sequence are numbered r = i · H + h (query token i, head h). The kernel streams the chunk's keys
// in tiles of kTileKeys, converts each tile to fp32 once, and updates an online softmax for all of
// the chunk's rows from it. It writes the chunk's normalized partial output and its base-2 LSE; the
// backend merges the chunks of a row with the LSE primitive (core/lse_math.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "mladcp/decode.h"

namespace mladcp::cpu {

inline constexpr int kTileKeys = 64;       // keys converted and consumed together
inline constexpr int kMaxChunkRows = 128;  // query rows sharing one pass over a chunk's keys

struct ChunkArgs {
  const MlaDecodeParams* p = nullptr;  // strides filled in (with_default_strides)
  int seq = 0;
  int row_begin = 0, row_end = 0;      // rows r = i · H + h of this sequence, at most kMaxChunkRows
  int64_t key_begin = 0, key_end = 0;  // local keys [key_begin, key_end), key_end ≤ visible[q_len - 1]
  const int64_t* visible = nullptr;    // [q_len] visible local keys of each query token of this sequence
  float score_scale = 0.0f;            // softmax_scale · kv_scale · log2(e): scores in base 2
  float value_scale = 1.0f;            // kv_scale, applied to the output
  float* out = nullptr;                // [rows, 512] normalized partial output (0 for a row without keys)
  float* lse2 = nullptr;               // [rows] base-2 LSE of this chunk (-inf for a row without keys)
};

// Instruction-set variants of the kernel. kAmx uses the AMX tile unit (bf16 inputs, fp32 accumulation).
enum class Isa { kGeneric, kAvx2, kAvx512, kAmx };
const char* isa_name(Isa isa);

using ChunkKernel = void (*)(const ChunkArgs& args, float* scratch);

struct KernelVariant {
  Isa isa;
  ChunkKernel run;
  size_t scratch_floats;  // per-thread scratch, 64-byte aligned by the caller
};

// The best variant this machine runs, up to `max_isa`.
const KernelVariant& best_kernel(Isa max_isa = Isa::kAmx);
// The variant for `isa` or nullptr when this build or machine lacks it.
const KernelVariant* kernel_for(Isa isa);

namespace generic {
extern const KernelVariant kVariant;
}
namespace avx2 {
extern const KernelVariant kVariant;
}
namespace avx512 {
extern const KernelVariant kVariant;
}
namespace amx {
extern const KernelVariant kVariant;
}

}  // namespace mladcp::cpu
