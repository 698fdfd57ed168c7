// "cpu-reference": the oracle every other backend is tested against. Naive loops over (sequence,
// query token, head, key), fp64 accumulation, two passes (max, then sum): obviously correct, slow.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/numeric.h"
#include "cpu/cpu_backends.h"
#include "mladcp/backend.h"
#include "mladcp/sharding.h"

namespace mladcp {
namespace {

double load_q(const MlaDecodeParams& p, int64_t i) {
  return numeric::bf16_to_float(static_cast<const uint16_t*>(p.q)[i]);
}

double load_kv(const MlaDecodeParams& p, int64_t i) {
  if (p.kv_dtype == DType::kFP8E4M3)
    return double(numeric::fp8e4m3_to_float(static_cast<const uint8_t*>(p.kv_cache)[i])) * double(p.kv_scale);
  return numeric::bf16_to_float(static_cast<const uint16_t*>(p.kv_cache)[i]);
}

void store_out(const MlaDecodeParams& p, int64_t i, double v) {
  if (p.out_dtype == DType::kFP32)
    static_cast<float*>(p.out)[i] = float(v);
  else
    static_cast<uint16_t*>(p.out)[i] = numeric::float_to_bf16(float(v));
}

// Element offset of local key k of sequence `seq` in the paged cache.
int64_t key_offset(const MlaDecodeParams& p, int seq, int64_t k) {
  const int32_t block = p.block_table[seq * p.block_table_stride + k / p.block_size];
  return int64_t(block) * p.kv_stride_block + (k % p.block_size) * p.kv_stride_token;
}

// The first n local keys of a sequence, dequantized: keys[k * 576 + d].
std::vector<double> gather_keys(const MlaDecodeParams& p, int seq, int64_t n) {
  std::vector<double> keys(static_cast<size_t>(n) * kQkDim);
  for (int64_t k = 0; k < n; ++k) {
    const int64_t kv = key_offset(p, seq, k);
    for (int d = 0; d < kQkDim; ++d) keys[size_t(k) * kQkDim + d] = load_kv(p, kv + d);
  }
  return keys;
}

// One (token, head) row over its n visible keys: scores, softmax, softmax-weighted kv_c.
void reference_row(const MlaDecodeParams& p, const std::vector<double>& keys, int64_t t, int h, int64_t n) {
  const int64_t out_base = out_offset(p, t, h);
  if (n == 0) {
    for (int d = 0; d < kLatentDim; ++d) store_out(p, out_base + d, 0.0);
    if (p.lse) p.lse[lse_offset(p, t, h)] = -std::numeric_limits<float>::infinity();
    return;
  }
  double q[kQkDim];
  for (int d = 0; d < kQkDim; ++d) q[d] = load_q(p, q_offset(p, t, h) + d);
  std::vector<double> s(static_cast<size_t>(n));
  double max_s = -std::numeric_limits<double>::infinity();
  for (int64_t k = 0; k < n; ++k) {
    const double* c = &keys[size_t(k) * kQkDim];
    double dot = 0.0;
    for (int d = 0; d < kQkDim; ++d) dot += q[d] * c[d];
    s[size_t(k)] = double(p.softmax_scale) * dot;
    if (s[size_t(k)] > max_s) max_s = s[size_t(k)];
  }
  double sum = 0.0;
  for (int64_t k = 0; k < n; ++k) sum += std::exp(s[size_t(k)] - max_s);
  std::vector<double> acc(kLatentDim, 0.0);
  for (int64_t k = 0; k < n; ++k) {
    const double w = std::exp(s[size_t(k)] - max_s) / sum;
    const double* c = &keys[size_t(k) * kQkDim];
    for (int d = 0; d < kLatentDim; ++d) acc[size_t(d)] += w * c[d];
  }
  for (int d = 0; d < kLatentDim; ++d) store_out(p, out_base + d, acc[size_t(d)]);
  if (p.lse) {
    const double lse_e = max_s + std::log(sum);
    p.lse[lse_offset(p, t, h)] = float(p.lse_base == LseBase::kE ? lse_e : lse_e / std::log(2.0));
  }
}

class CpuReferenceBackend final : public Backend {
 public:
  CpuReferenceBackend() {
    caps_ = host_backend_capabilities("cpu-reference", "host oracle: naive loops, fp64 accumulation");
  }

  const BackendCapabilities& capabilities() const override { return caps_; }

  Status decode(const MlaDecodeParams& in, const ExecContext& ctx) override {
    (void)ctx;
    MLADCP_RETURN_IF_ERROR(validate_decode(in, caps_));
    MLADCP_RETURN_IF_ERROR(check_host_indices(in));
    const MlaDecodeParams p = with_default_strides(in);
    for (int seq = 0; seq < p.num_seqs; ++seq) {
      // The last query token sees the most keys (the causal rule in global coordinates).
      const std::vector<double> keys =
          gather_keys(p, seq, sharding::visible_local_keys(p.seq_lens[seq], p.q_len, p.q_len - 1, p.shard));
      for (int i = 0; i < p.q_len; ++i) {
        const int64_t t = int64_t(seq) * p.q_len + i;
        const int64_t n = sharding::visible_local_keys(p.seq_lens[seq], p.q_len, i, p.shard);
        for (int h = 0; h < p.num_heads; ++h) reference_row(p, keys, t, h, n);
      }
    }
    return Status::Ok();
  }

  Status merge(const MergeParams& p, const ExecContext& ctx) override {
    (void)ctx;
    return merge_states_host(p);
  }

  Status rescale(const RescaleParams& p, const ExecContext& ctx) override {
    (void)ctx;
    return rescale_states_host(p);
  }

 private:
  BackendCapabilities caps_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_reference_backend() { return std::make_unique<CpuReferenceBackend>(); }

}  // namespace mladcp
