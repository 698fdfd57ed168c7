// Decodes one small problem with the "cpu" backend of the installed library and lists the backends
// and communicators this program has.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "mladcp/mladcp.h"
#include "mladcp/mpi.h"

int main() {
  using namespace mladcp;
  std::string names;
  for (const std::string& n : backend_names()) names += " " + n;
  std::printf("backends:%s\nmpi communicator: %s\n", names.c_str(), mpi_communicator_available() ? "yes" : "no");
  const int bs = 16, len = 40, nb = 3, H = 4;
  std::vector<uint16_t> q(H * kQkDim, 0x3f80), kv(size_t(nb) * bs * kQkDim, 0x3f00), out(H * kLatentDim);
  std::vector<int32_t> table{2, 0, 1}, lens{len};
  std::vector<float> lse(H);
  MlaDecodeParams p;
  p.num_seqs = 1;
  p.num_heads = H;
  p.q = q.data();
  p.kv_cache = kv.data();
  p.num_blocks = nb;
  p.block_size = bs;
  p.block_table = table.data();
  p.max_blocks_per_seq = nb;
  p.seq_lens = lens.data();
  p.softmax_scale = 0.1f;
  p.out = out.data();
  p.lse = lse.data();
  std::unique_ptr<Backend> backend;
  Status s = create_backend("cpu", &backend);
  if (s.ok()) s = backend->decode(p, ExecContext{});
  if (!s.ok()) {
    std::fprintf(stderr, "decode: %s\n", s.to_string().c_str());
    return 1;
  }
  // Equal keys: lse = ln(len) + score, score = 0.1 · 576 · 1.0 · 0.5.
  std::printf("lse %.4f (expected %.4f)\n", lse[0], std::log(float(len)) + 0.1f * 576 * 0.5f);
  return std::fabs(lse[0] - (std::log(float(len)) + 0.1f * 576 * 0.5f)) < 1e-3f ? 0 : 1;
}
