// One MLA decode step with its log-sum-exp on the "cpu" backend, through the public API only.
// Two sequences of 1000 tokens, 16 query heads, a bf16 latent cache in blocks of 64. The README shows
// the whole program (between the markers).
// [example]
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "mladcp/mladcp.h"

// fp32 -> bf16 bits, round to nearest even (finite inputs).
static uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

int main() {
  using namespace mladcp;
  const int B = 2, H = 16, len = 1000, bs = 64, nb = (len + bs - 1) / bs;  // nb blocks per sequence
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<uint16_t> q(B * H * kQkDim), kv(size_t(B) * nb * bs * kQkDim), out(B * H * kLatentDim);
  for (auto& x : q) x = to_bf16(normal(rng));   // q [B, H, 576] = [q_nope·W_UK | q_pe], bf16
  for (auto& x : kv) x = to_bf16(normal(rng));  // cache [B·nb blocks, bs, 576] = [kv_c | k_pe], bf16
  std::vector<int32_t> block_table(B * nb), seq_lens(B, len);
  for (int i = 0; i < B * nb; ++i) block_table[i] = i;  // sequence b owns blocks b·nb .. b·nb + nb - 1
  std::vector<float> lse(B * H);                        // [B, H] fp32

  // clang-format off
  MlaDecodeParams p{.num_seqs = B, .num_heads = H, .q = q.data(),  // q_len 1, bf16 q, no DCP shard: defaults
                    .kv_cache = kv.data(), .num_blocks = B * nb, .block_size = bs,
                    .block_table = block_table.data(), .max_blocks_per_seq = nb, .seq_lens = seq_lens.data(),
                    .softmax_scale = 1.0f / std::sqrt(192.0f),
                    .out = out.data(), .lse = lse.data(), .lse_base = LseBase::kE};  // out [B, H, 512] bf16
  // clang-format on
  std::unique_ptr<Backend> backend;
  Status s = create_backend("cpu", &backend);
  if (s.ok()) s = backend->decode(p, ExecContext{});
  if (!s.ok()) {
    std::fprintf(stderr, "decode failed: %s\n", s.to_string().c_str());
    return 1;
  }
  std::printf("lse[seq 0, head 0] = %.4f (ln of the softmax denominator)\n", lse[0]);
  return std::isfinite(lse[0]) ? 0 : 1;
}
// [example]
